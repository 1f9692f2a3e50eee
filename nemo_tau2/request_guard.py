"""One gate in front of every JSON server of the project: request bodies too large, too deep or not valid text get a
4xx naming the limit, before any route parses them.

Python's JSON stack fails on hostile input in ways a route cannot catch well: ``json.loads`` of an array nested
100,000 deep raises ``RecursionError``; a lone UTF-16 surrogate escape (``"\\ud800"``) parses into a string that
cannot be encoded again, so the answer that echoes it fails (a 500). The gate answers them all the same way:

- a body over ``max_bytes`` (declared or streamed): 413;
- JSON nested deeper than ``max_depth`` arrays/objects (:data:`MAX_JSON_DEPTH` by default): 400;
- bytes that are not UTF-8: 400;
- ``NaN`` / ``Infinity`` (Python reads them, no other JSON parser does, and the answer echoing them fails): 400;
- a lone surrogate escape: 400, except on paths where the route treats it as a model mistake (the tau2 tool
  routes answer it with a tool error, so the episode goes on).

Bodies are read whole here (they are bounded by ``max_bytes``) and handed on unchanged. Once a body is read, the
gate also listens for the client going away: on the paths ``cancel_on_disconnect`` names (long work whose answer
nobody else can use: a generation, a whole episode) the request is cancelled then, so that a client that timed out,
was stopped or crashed does not leave the server generating for nobody. Short routes whose effects are recorded for
retries (the tau2 tools) always run to the end.
"""

import asyncio
import contextlib
import json
import logging
import os
import re
from collections.abc import Callable
from typing import Any

import orjson

logger = logging.getLogger(__name__)

MAX_JSON_DEPTH = 64
"""Arrays and objects nested deeper than this are refused. The deepest body the project sends is a Responses request
whose tool schemas nest about a dozen levels."""
MAX_REQUEST_BYTES = 64 * 1024 * 1024

_CURLY_AS_SQUARE = bytes.maketrans(b"{}", b"[]")
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))
# A high surrogate escape not followed by a low one, or a low one not preceded by a high one.
_LONE_SURROGATE_ESCAPE = re.compile(
    rb"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
    rb"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}"
)


def outside_strings(body: bytes) -> bytes:
    """The JSON text ``body`` with every string literal cut out (C-speed: no per-character Python loop).

    Inside a JSON string every backslash starts an escape, so dropping escaped backslashes and then escaped quotes
    leaves only the quotes that open and close strings; every other piece between them is outside a string.
    """
    if b"\\" in body:
        body = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    return b"".join(body.split(b'"')[0::2])


def json_depth_exceeds(body: bytes, limit: int, outside: bytes | None = None) -> bool:
    """Whether the JSON text ``body`` nests arrays/objects more than ``limit`` deep (C-speed passes, no parsing).

    Strings are cut out, the brackets kept, and innermost ``[]`` pairs removed once per level: a body still holding
    brackets after ``limit`` rounds is deeper than ``limit``. Unbalanced (invalid) JSON is left to the parser.
    """
    if body.count(b"[") + body.count(b"{") <= limit:
        return False
    brackets = (outside_strings(body) if outside is None else outside).translate(_CURLY_AS_SQUARE, _NOT_BRACKETS)
    if b"[" * (limit + 1) in brackets:
        return True  # limit + 1 openers in a row: deep for sure (the usual attack), no passes needed
    for _ in range(limit):
        shorter = brackets.replace(b"[]", b"")
        if not shorter or len(shorter) == len(brackets):
            return False
        brackets = shorter
    return b"[]" in brackets


def lax_json_problem(body: bytes, outside: bytes | None = None) -> str | None:
    """What makes ``body`` JSON only to Python's lax parser: a lone surrogate escape or a non-standard literal
    (``NaN``, ``Infinity``), either of which fails later when the value is encoded again; None if neither.
    Cheap look-ups decide whether the (slower) parse that confirms it is needed."""
    outside = outside_strings(body) if outside is None else outside
    literal = b"NaN" in outside or b"Infinity" in outside
    if not literal and not (b"\\u" in body and _LONE_SURROGATE_ESCAPE.search(body)):
        return None
    try:
        orjson.loads(body)  # strict: refuses both
        return None
    except orjson.JSONDecodeError:
        pass
    try:
        json.loads(body, parse_constant=_refuse_constant)
    except _NonStandardLiteral as e:
        return f"the JSON body holds the non-standard literal {e.args[0]}; JSON has no NaN or Infinity"
    except (ValueError, RecursionError):
        return None  # not JSON at all: the route's parser says so
    match = _LONE_SURROGATE_ESCAPE.search(body)
    where = f" ({match.group().decode()} at offset {match.start()})" if match else ""
    return (
        f"the JSON body holds a lone UTF-16 surrogate escape{where}, which is not valid Unicode; "
        "escape characters outside the BMP as surrogate pairs"
    )


class _NonStandardLiteral(ValueError):
    pass


def _refuse_constant(name: str) -> None:
    raise _NonStandardLiteral(name)


# A server started for one run (a Ray-placed one: ``nemo_tau2.lease``) knows the run's id; a request naming another
# run is refused with 409 naming both, so that a server woken after its run never answers the next one.
RUN_ID_ENV = "NEMO_TAU2_RUN_ID"
RUN_ID_HEADER = "X-NeMo-Tau2-Run"
_RUN_HEADER_KEY = RUN_ID_HEADER.lower().encode()


def _default_error_body(message: str, status: int) -> dict[str, Any]:
    return {"detail": message}


class RequestBodyGuard:
    """Pure ASGI middleware applying the checks of the module docstring.

    Args:
        app: The ASGI app to protect.
        max_bytes: Larger bodies get a 413.
        max_depth: Deeper JSON gets a 400.
        lone_surrogates_allowed: Path predicate; True where the route itself answers lone surrogates.
        error_body: Builds the JSON error body from (message, status), in the server's own error format.
        cancel_on_disconnect: Path predicate; True where a request is cancelled once its client has gone.
    """

    def __init__(
        self,
        app,
        max_bytes: int = MAX_REQUEST_BYTES,
        max_depth: int = MAX_JSON_DEPTH,
        lone_surrogates_allowed: Callable[[str], bool] = lambda path: False,
        error_body: Callable[[str, int], dict[str, Any]] = _default_error_body,
        cancel_on_disconnect: Callable[[str], bool] = lambda path: False,
    ):
        self.app = app
        self.max_bytes = max_bytes
        self.max_depth = max_depth
        self.lone_surrogates_allowed = lone_surrogates_allowed
        self.error_body = error_body
        self.cancel_on_disconnect = cancel_on_disconnect
        self.run_id = os.environ.get(RUN_ID_ENV)  # set in the server's environment before it builds its app

    async def _refuse(self, send, status: int, message: str) -> None:
        body = orjson.dumps(self.error_body(message, status))
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def _problem(self, body: bytes, path: str) -> str | None:
        outside = outside_strings(body)
        if json_depth_exceeds(body, self.max_depth, outside):
            return f"the JSON body nests deeper than {self.max_depth} arrays/objects (max_json_depth)"
        if not body.isascii():
            try:
                body.decode("utf-8")
            except UnicodeDecodeError as e:
                return f"the body is not UTF-8 text: byte {body[e.start]:#04x} at offset {e.start} ({e.reason})"
        problem = lax_json_problem(body, outside)
        if problem is not None and not (self.lone_surrogates_allowed(path) and "surrogate" in problem):
            return problem
        return None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        sender = headers.get(_RUN_HEADER_KEY)
        if self.run_id and sender is not None and sender.decode(errors="replace") != self.run_id:
            theirs = sender.decode(errors="replace")[:64]
            await self._refuse(send, 409, f"this server belongs to run {self.run_id}, not to run {theirs}")
            return
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(send, 413, self._too_large(int(declared)))
            return
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                await self.app(scope, _replay([message], receive), send)
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._refuse(send, 413, self._too_large(size))
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        problem = self._problem(body, scope.get("path", "")) if body else None
        if problem is not None:
            await self._refuse(send, 400, problem)
            return
        request = {"type": "http.request", "body": body, "more_body": False}
        if self.cancel_on_disconnect(scope.get("path", "")):
            await _run_until_client_leaves(self.app, scope, request, receive, send, self._refuse)
        else:
            await self.app(scope, _replay([request], receive), send)

    def _too_large(self, size: int) -> str:
        return f"request body of {size}+ bytes exceeds the limit of {self.max_bytes} bytes (max_request_bytes)"


def _replay(messages: list[dict], receive):
    """A ``receive`` that first gives back ``messages``, then waits on the real one (for the disconnect)."""
    pending = list(messages)

    async def replayed():
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed


async def _run_until_client_leaves(app, scope, request: dict, receive, send, refuse) -> None:
    """Serve ``request`` with ``app``, cancelling it if the client disconnects before the whole answer is sent.

    The real ``receive`` is ours alone from here (the body is already read): a watcher waits on it for
    ``http.disconnect``, and the app's own ``receive`` calls get the body, then that disconnect when it happens.
    A request the server itself cancels (it is stopping: its node is going away) is answered 503 with why, in the
    server's error shape, rather than the bare "Internal Server Error" its framework would send.
    """
    gone = asyncio.Event()
    pending = [request]
    answered = started = False

    async def app_receive() -> dict:
        if pending:
            return pending.pop()
        await gone.wait()
        return {"type": "http.disconnect"}

    async def app_send(message: dict) -> None:
        nonlocal answered, started
        started = True
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            answered = True
        await send(message)

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        gone.set()

    serving = asyncio.ensure_future(app(scope, app_receive, app_send))
    watcher = asyncio.ensure_future(watch())
    try:
        await asyncio.wait({serving, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if not serving.done() and not answered:
            logger.info("client of %s %s went away: request cancelled", scope.get("method"), scope.get("path"))
            serving.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await serving
            return
        await serving
    except asyncio.CancelledError:
        serving.cancel()  # the server itself is stopping
        if not started:
            with contextlib.suppress(Exception):
                await refuse(send, 503, "the server stopped before it answered (it is shutting down); retry elsewhere")
        raise
    finally:
        watcher.cancel()
