"""Pure-ASGI versions of the two per-request middlewares NeMo-Gym adds with ``@app.middleware("http")``.

Starlette's ``BaseHTTPMiddleware`` (what ``@app.middleware`` builds) runs every request through extra anyio
tasks and memory streams; NeMo-Gym servers stack two of them. On a 2-core machine that was most of a tool call's
latency. These do the same work without the task hop; behaviour (cookie name and signing, session id
assignment, error bodies) is NeMo-Gym's.
"""

import logging
from traceback import format_exc
from uuid import uuid4

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from nemo_gym.server_utils import SESSION_ID_KEY
from starlette.middleware.sessions import SessionMiddleware

logger = logging.getLogger(__name__)


class _AssignSessionId:
    """Give every request a session id (kept across requests by the signed session cookie)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            session = scope["session"]
            # Always assign, as NeMo-Gym does, so the cookie is (re)sent with every response.
            session[SESSION_ID_KEY] = session.get(SESSION_ID_KEY, str(uuid4()))
        await self.app(scope, receive, send)


class _ExceptionsAsJson:
    """An unexpected exception becomes HTTP 500 with ``repr(e)`` as the JSON body (NeMo-Gym's contract)."""

    def __init__(self, app, server_name: str):
        self.app = app
        self.server_name = server_name

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as e:
            if started:
                raise
            logger.error("unhandled exception in %s:\n%s", self.server_name, format_exc())
            await JSONResponse(content=repr(e), status_code=500)(scope, receive, send)


class FastMiddlewareMixin:
    """Mix into a NeMo-Gym ``SimpleServer`` subclass (before the Gym base) to use the pure-ASGI middlewares."""

    def setup_session_middleware(self, app: FastAPI) -> None:
        app.add_middleware(_AssignSessionId)  # inner: runs after SessionMiddleware has loaded the session
        key = self.get_session_middleware_key()
        app.add_middleware(SessionMiddleware, secret_key=key, session_cookie=key)

    def setup_exception_middleware(self, app: FastAPI) -> None:
        app.add_middleware(_ExceptionsAsJson, server_name=self.config.name)
