"""JSON over HTTP between Gym servers, with bounded retries, and failures reported as infrastructure errors.

NeMo-Gym's own client retries dropped connections forever and has no timeout; an episode must instead end, after
a configurable number of attempts with exponential backoff, as an infrastructure failure that names its cause
(never as a zero reward). Cookies are passed explicitly per call: every episode has its own NeMo-Gym session on
each server, and one pooled connection set serves all episodes.
"""

import asyncio
import logging
import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson
from pydantic import BaseModel, ConfigDict, Field

from nemo_tau2.lease import run_headers

logger = logging.getLogger(__name__)

RETRYABLE_STATUSES = frozenset({429, 500, 502, 503, 504})


class InfrastructureError(RuntimeError):
    """A server the episode depends on failed (after retries); the episode has no valid outcome.

    ``cause``: the message without where it happened (addresses, ports, ids), the same words for every episode one
    failure hits: what the records, a GRPO step's line and an eval summary count. Where a message names a place, the
    raiser passes both; otherwise the message is the cause. ``unreachable``: the last attempt got no answer at all
    (connection refused or dropped), as from a server that is gone, which a caller with replicas may route around."""

    def __init__(self, message: str, unreachable: bool = False, cause: str | None = None, server: str | None = None):
        super().__init__(message)
        self.unreachable = unreachable
        self.cause = cause if cause is not None else message
        self.server = server  # unreachable: the server (scheme://host:port) that gave no answer


def exception_cause(e: BaseException) -> str:
    """An exception in words with no address in them: a socket error by its errno's text (asyncio writes the peer's
    address into the message itself), an HTTP error by its status, anything else as it says."""
    os_error = getattr(e, "os_error", None) if isinstance(e, aiohttp.ClientConnectorError) else e
    errno = getattr(os_error, "errno", None)
    if isinstance(os_error, OSError) and errno:
        return f"{type(e).__name__}: {os.strerror(errno)}"
    if isinstance(e, aiohttp.ClientResponseError):
        return f"{type(e).__name__}: HTTP {e.status} {e.message}"
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


def answer_cause(raw: bytes, limit: int = 300) -> str:
    """An error answer's words: ours carry them as ``cause`` when their ``detail`` names a place; else a FastAPI
    ``detail``; anyone else's body as sent, cut at ``limit`` characters."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        body = None
    for key in ("cause", "detail"):
        if isinstance(body, dict) and isinstance(body.get(key), str):
            return body[key][:limit]
    return raw[:limit].decode(errors="replace")


class RetryConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    timeout_s: float = Field(
        default=600.0, gt=0, allow_inf_nan=False, description="Per attempt, connect to last byte."
    )
    max_attempts: int = Field(default=4, ge=1, description="Attempts per call, the first one included.")
    backoff_s: float = Field(
        default=1.0, ge=0, allow_inf_nan=False, description="Sleep before the 2nd attempt; doubles each time."
    )
    max_backoff_s: float = Field(default=30.0, ge=0, allow_inf_nan=False)


@dataclass
class JsonResponse:
    status: int
    body: Any  # parsed JSON, or the raw text when the body is not JSON
    raw: bytes
    headers: dict[str, str]  # names lower-cased
    cookies: dict[str, str]

    @property
    def text(self) -> str:
        """The body as text (decoded on demand: a policy turn's answer with token ids is ~100 KB)."""
        return self.raw.decode(errors="replace")

    def failure(self, what: str) -> InfrastructureError:
        """This error answer as the episode's failure: ``what answered HTTP <status>: <its words>``."""
        said = f"{what} answered HTTP {self.status}"
        return InfrastructureError(f"{said}: {self.raw[:500].decode(errors='replace')}", cause=f"{said}: "
                                   f"{answer_cause(self.raw, 500)}")  # fmt: skip


class GymHttpClient:
    """One aiohttp session (connection pool) shared by every episode of an agent server."""

    def __init__(self, connection_limit: int = 4096):
        self._session: aiohttp.ClientSession | None = None
        self._connection_limit = connection_limit
        self._run_headers = run_headers()  # the server's run (fixed for its life): read once, not per request

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self._connection_limit, keepalive_timeout=30)
            self._session = aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar())
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def post(
        self,
        url: str,
        payload: Any,
        retry: RetryConfig,
        cookies: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        what: str = "request",
        retry_statuses: frozenset[int] = RETRYABLE_STATUSES,
        expect_json: bool = True,
    ) -> JsonResponse:
        """POST JSON; retry timeouts, connection errors, ``retry_statuses`` and (``expect_json``) a 2xx whose body is
        not JSON; return the final response.

        Statuses not retried come back to the caller (a tool error is a valid answer); what is still failing after
        ``retry.max_attempts`` raises :class:`InfrastructureError` naming ``what`` and the last cause.
        """
        data = orjson.dumps(payload)
        request_headers = {"Content-Type": "application/json", **self._run_headers, **(headers or {})}
        cause = ""
        unreachable = False
        for attempt in range(1, retry.max_attempts + 1):
            if attempt > 1:
                await asyncio.sleep(min(retry.backoff_s * 2 ** (attempt - 2), retry.max_backoff_s))
            unreachable = False
            try:
                async with self._http().post(
                    url,
                    data=data,
                    headers=request_headers,
                    cookies=cookies,
                    timeout=aiohttp.ClientTimeout(total=retry.timeout_s),
                ) as response:
                    raw = await response.read()
                    returned_cookies = {key: morsel.value for key, morsel in response.cookies.items()}
                    if response.status in retry_statuses:
                        cause = f"HTTP {response.status}: {answer_cause(raw)}"
                    else:
                        try:
                            body = orjson.loads(raw) if raw else None
                        except orjson.JSONDecodeError:
                            body = raw.decode(errors="replace")
                        if not (expect_json and response.ok and not isinstance(body, dict | list)):
                            headers = {key.lower(): value for key, value in response.headers.items()}
                            return JsonResponse(response.status, body, raw, headers, returned_cookies)
                        cause = f"HTTP {response.status} with a body that is not a JSON object: {raw[:200]!r}"
            except TimeoutError:
                cause = f"no answer within {retry.timeout_s:g} s"
            except aiohttp.ClientError as e:
                cause = exception_cause(e)
                unreachable = isinstance(e, aiohttp.ClientConnectionError)
            logger.warning("%s to %s failed (attempt %d/%d): %s", what, url, attempt, retry.max_attempts, cause)
        failed = f"{what} failed after {retry.max_attempts} attempts: {cause}"
        server = "{0.scheme}://{0.netloc}".format(urlsplit(url)) if unreachable else None
        raise InfrastructureError(f"{failed} ({url})", unreachable=unreachable, cause=failed, server=server)
