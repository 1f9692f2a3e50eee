"""Reject request bodies above a size limit with a 413 that says so."""

import json


class BodySizeLimitMiddleware:
    """Pure ASGI middleware: rejects a too-large Content-Length up front; a streamed (chunked) body that grows past
    the limit is cut off, and whatever the app answers to the truncated body is replaced by the 413."""

    def __init__(self, app, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def _reject(self, send, size: int) -> None:
        detail = f"request body of {size}+ bytes exceeds the limit of {self.max_bytes} bytes (max_request_bytes)"
        body = json.dumps({"detail": detail}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._reject(send, int(declared))
            return
        received = 0
        too_large = False

        async def limited_receive():
            nonlocal received, too_large
            if too_large:
                return {"type": "http.request", "body": b"", "more_body": False}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    too_large = True
                    return {"type": "http.request", "body": b"", "more_body": False}
            return message

        async def guarded_send(message):
            if not too_large:
                await send(message)
            elif message["type"] == "http.response.start":
                await self._reject(send, received)

        await self.app(scope, limited_receive, guarded_send)
