"""The fake server's HTTP layer (aiohttp): routes, injected faults, latency and the control routes.

aiohttp rather than uvicorn because a fault must be able to drop a connection without answering (the handler
closes the transport), and because its server runs on any event loop, so one server can live in a test's own
loop, in a background thread or in a subprocess. All waiting (latency, held requests) is ``asyncio.sleep``: no
thread per request.

Routes: ``POST /v1/chat/completions``, ``POST /tokenize``, ``POST /v1/embeddings``, ``GET /v1/models``,
``GET /health``, and for tests ``POST /fake/control`` (body: :class:`ControlRequest`) and ``GET /fake/stats``.
"""

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web
from pydantic import ValidationError

from nemo_tau2.testing.chat_tokens import TemplateError
from nemo_tau2.testing.config import ControlRequest
from nemo_tau2.testing.engine import FakeEngine, RequestError
from nemo_tau2.testing.faults import HTTP_FAULT_STATUS, FaultSpec
from nemo_tau2.testing.scripts import ScriptError

logger = logging.getLogger(__name__)

_GARBAGE = b'{"id": "chatcmpl-garbage", "object": "chat.completion", "choices": [{"index": 0, "message": {"ro'
_CLIENT_ERRORS = (RequestError, ScriptError, TemplateError)


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


def _error(message: str, status: int = 400, error_type: str = "BadRequestError") -> web.Response:
    return _json({"object": "error", "message": message, "type": error_type, "param": None, "code": status}, status)


class FakeHTTPServer:
    """Binds a :class:`FakeEngine` to an aiohttp application."""

    def __init__(self, engine: FakeEngine) -> None:
        self.engine = engine
        self._closing = asyncio.Event()

    def build_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024**2, middlewares=[self._count_statuses])
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_post("/v1/embeddings", self._embeddings)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_post("/fake/control", self._control)
        app.router.add_get("/fake/stats", self._stats)
        return app

    def begin_close(self) -> None:
        """Release held (timeout-fault) requests so shutdown does not wait for them."""
        self._closing.set()

    @web.middleware
    async def _count_statuses(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        response = await handler(request)
        self.engine.stats.responses_by_status[response.status] += 1
        return response

    async def _read_json(self, request: web.Request) -> Any:
        raw = await request.read()
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            raise RequestError(f"the request body is not valid JSON: {e}") from e

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "chat", self.engine.complete)

    async def _tokenize(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "tokenize", self.engine.tokenize)

    async def _embeddings(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "embeddings", self.engine.embed)

    async def _serve(self, request: web.Request, route: str, answer: Callable[[Any], dict]) -> web.StreamResponse:
        stats = self.engine.stats
        stats.requests_by_route[route] += 1
        try:
            body = await self._read_json(request)
            key = self.engine.key_of(body) if route == "chat" and isinstance(body, dict) else None
        except _CLIENT_ERRORS as e:  # a malformed key, or a keyless request that names no task
            return _error(str(e))
        if route == "chat":
            stats.requests_by_key[key or ""] += 1
        faulted = await self._fault(request, route, key)
        if faulted is not None:
            return faulted
        if route == "chat" and self.engine.latency_s:
            await asyncio.sleep(self.engine.latency_s)
        try:
            return _json(answer(body))
        except _CLIENT_ERRORS as e:
            return _error(str(e))

    async def _fault(self, request: web.Request, route: str, key: str | None) -> web.StreamResponse | None:
        """The faulty response if a fault rule takes this request (counted by kind), else None: answer normally."""
        fault = self.engine.faults.take(route, key)
        if fault is None:
            return None
        self.engine.stats.faults_by_kind[fault.kind] += 1
        return await self._apply_fault(request, fault)

    async def _apply_fault(self, request: web.Request, fault: FaultSpec) -> web.StreamResponse | None:
        """The faulty response, or None when the request should then be answered normally (after a hold)."""
        if fault.kind in HTTP_FAULT_STATUS:
            status = HTTP_FAULT_STATUS[fault.kind]
            return _error(f"injected fault: {fault.kind}", status, "InternalServerError" if status == 500 else "Busy")
        if fault.kind == "garbage":
            return web.Response(body=_GARBAGE, content_type="application/json")
        if fault.kind == "timeout":
            try:
                await asyncio.wait_for(self._closing.wait(), timeout=fault.hold_s)
            except TimeoutError:
                return None
            # Shutting down: drop the held request rather than answer it.
        assert fault.kind in ("drop", "timeout"), fault.kind
        if request.transport is not None:
            request.transport.abort()
        return web.Response(status=499)  # never sent: the connection is gone

    async def _models(self, request: web.Request) -> web.Response:
        self.engine.stats.requests_by_route["models"] += 1
        return _json(self.engine.models())

    async def _health(self, request: web.Request) -> web.StreamResponse:
        faulted = await self._fault(request, "health", None)  # not counted: waits and watchers probe at their pace
        return faulted if faulted is not None else _json({"status": "ok"})

    async def _control(self, request: web.Request) -> web.Response:
        self.engine.stats.requests_by_route["control"] += 1
        try:
            control = ControlRequest.model_validate(await self._read_json(request))
            self.engine.apply(control)
        except ValidationError as e:
            return _error(f"invalid control request: {e}")
        except RequestError as e:
            return _error(str(e))
        return _json({"ok": True, "active_faults": len(self.engine.faults.active())})

    async def _stats(self, request: web.Request) -> web.Response:
        return _json(self.engine.stats.to_json())
