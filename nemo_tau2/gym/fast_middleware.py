"""The middlewares of every Gym server of the project: NeMo-Gym's two, as pure ASGI, plus the request gate.

Starlette's ``BaseHTTPMiddleware`` (what NeMo-Gym's ``@app.middleware("http")`` builds) runs every request through
extra anyio tasks and memory streams; NeMo-Gym servers stack two of them. On a 2-core machine that was most of a
tool call's latency. These do the same work without the task hop; session id assignment, the cookie's name and
the error bodies are NeMo-Gym's.

Two things differ on purpose:

- **The session cookie is signed with a random per-process secret.** NeMo-Gym signs it with its own name, so
  anyone who knows a session id (a log line, a cookie seen once) can forge a cookie for that episode. A cookie
  therefore only means something to the process that issued it, which is all a Gym session needs: sessions live
  in that process's memory (stateful servers run ``num_workers: 1``). Under ``gym env start`` with
  ``num_workers > 1`` on a model server, a request served by another worker simply starts a new session (only its
  endpoint pinning is affected).
- **Request bodies pass** :class:`~nemo_tau2.request_guard.RequestBodyGuard` (size, JSON depth, Unicode) before
  any route parses them, with the limits of the server's config
  (:class:`~nemo_tau2.gym.config_keys.RequestLimitsMixin`).
"""

import logging
import secrets
from traceback import format_exc
from uuid import uuid4

from fastapi import Body, FastAPI, HTTPException
from fastapi.responses import JSONResponse
from nemo_gym.config_types import AggregateMetrics, AggregateMetricsRequest
from nemo_gym.server_utils import SESSION_ID_KEY
from starlette.middleware.sessions import SessionMiddleware

from nemo_tau2.gym.nemo_gym_compat import OwnCancellation
from nemo_tau2.request_guard import RequestBodyGuard

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


_SESSION_SECRET = secrets.token_urlsafe(32)  # per process: see the module docstring


class FastMiddlewareMixin(OwnCancellation):
    """Mix into a NeMo-Gym ``SimpleServer`` subclass (before the Gym base) to use these middlewares; its config
    must include :class:`~nemo_tau2.gym.config_keys.RequestLimitsMixin`. Cancellation on disconnect is per path
    (:meth:`cancel_on_disconnect`), under NeMo-Gym's ``run_webserver`` too."""

    def setup_session_middleware(self, app: FastAPI) -> None:
        app.add_middleware(_AssignSessionId)  # inner: runs after SessionMiddleware has loaded the session
        app.add_middleware(
            SessionMiddleware, secret_key=_SESSION_SECRET, session_cookie=self.get_session_middleware_key()
        )

    def setup_exception_middleware(self, app: FastAPI) -> None:
        app.add_middleware(
            RequestBodyGuard,
            max_bytes=self.config.max_request_bytes,
            max_depth=self.config.max_json_depth,
            lone_surrogates_allowed=self.lone_surrogates_allowed,
            cancel_on_disconnect=self.cancel_on_disconnect,
        )
        app.add_middleware(_ExceptionsAsJson, server_name=self.config.name)  # outermost

    async def aggregate_metrics(self, body: AggregateMetricsRequest = Body()) -> AggregateMetrics:
        """NeMo-Gym's ``/aggregate_metrics`` (resources servers and agents), whose profiler indexes each verify
        response by fields it does not validate: a response that lacks them is a 400 naming what is missing."""
        try:
            return await super().aggregate_metrics(body)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
            raise HTTPException(
                status_code=400,
                detail=f"verify_responses cannot be aggregated ({type(e).__name__}: {e}); each needs at least "
                "_ng_task_index (int) and reward (number)",
            ) from e

    def lone_surrogates_allowed(self, path: str) -> bool:
        """Whether the route at ``path`` answers a lone surrogate itself (default: no, the gate refuses it)."""
        return False

    def cancel_on_disconnect(self, path: str) -> bool:
        """Whether a request to ``path`` is cancelled when its client goes away (default: no, it runs to the end)."""
        return False
