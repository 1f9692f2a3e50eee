"""JSON over HTTP between Gym servers, with bounded retries, and failures reported as infrastructure errors.

NeMo-Gym's own client retries dropped connections forever and has no timeout; an episode must instead end, after
a configurable number of attempts with exponential backoff, as an infrastructure failure that names its cause
(never as a zero reward). Cookies are passed explicitly per call: every episode has its own NeMo-Gym session on
each server, and one pooled connection set serves all episodes.
"""

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from pydantic import BaseModel, ConfigDict, Field

logger = logging.getLogger(__name__)

RETRYABLE_STATUSES = frozenset({429, 500, 502, 503, 504})


class InfrastructureError(RuntimeError):
    """A server the episode depends on failed (after retries); the episode has no valid outcome.

    ``unreachable``: the last attempt got no answer at all (connection refused or dropped), as from a server that
    is gone, which a caller with replicas may route around."""

    def __init__(self, message: str, unreachable: bool = False) -> None:
        super().__init__(message)
        self.unreachable = unreachable


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


class GymHttpClient:
    """One aiohttp session (connection pool) shared by every episode of an agent server."""

    def __init__(self, connection_limit: int = 4096):
        self._session: aiohttp.ClientSession | None = None
        self._connection_limit = connection_limit

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
        request_headers = {"Content-Type": "application/json", **(headers or {})}
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
                        cause = f"HTTP {response.status}: {raw[:300].decode(errors='replace')}"
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
                cause = f"{type(e).__name__}: {e}"
                unreachable = isinstance(e, aiohttp.ClientConnectionError)
            logger.warning("%s to %s failed (attempt %d/%d): %s", what, url, attempt, retry.max_attempts, cause)
        raise InfrastructureError(
            f"{what} failed after {retry.max_attempts} attempts: {cause} ({url})", unreachable=unreachable
        )
