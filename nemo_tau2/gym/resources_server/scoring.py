"""``/verify`` scorings that run off the event loop (tau2 v1.0.1's, judge included), one at most per session.

A scoring that waits on the NL-assertion judge takes seconds; run on the server's event loop it would hold every
other session's tool calls that long. It runs on the release's scoring thread instead
(:attr:`~nemo_tau2.gym.resources_server.release.WorkerRelease.scoring`), and the loop serves other requests
meanwhile, a retry of the same ``/verify`` among them. So that a retry neither scores the episode twice nor
gets another answer, each session has at most one scoring in flight: an identical retry waits for that one, a
different request for the same session is a 409. The scoring and what follows it (the verdict kept, the session
ended) are one task that no client's disconnect cancels; it leaves the table when done, failed or not (a judge
fault leaves the session live, so a later retry scores it again).
"""

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import HTTPException


class InFlightScorings:
    """The scoring task of each session being verified, with the fingerprint of the request that started it."""

    def __init__(self) -> None:
        self._running: dict[str, tuple[bytes, str, asyncio.Task]] = {}

    def __len__(self) -> int:
        return len(self._running)

    def __contains__(self, session_id: str | None) -> bool:
        return session_id in self._running

    async def run(
        self, session_id: str, fingerprint: bytes, request: str, score: Callable[[], Awaitable[dict[str, Any]]]
    ) -> dict[str, Any]:
        """``score()``'s result; started unless this session's scoring is already in flight, else awaited.

        Raises:
            HTTPException: 409, a scoring of another request for this session is in flight.
        """
        running = self._running.get(session_id)
        if running is None:
            task = asyncio.ensure_future(score())
            self._running[session_id] = (fingerprint, request, task)
            task.add_done_callback(lambda done: self._forget(session_id, done))
        elif running[0] != fingerprint:
            raise HTTPException(
                status_code=409,
                detail=f"this session is being verified, for {running[1]}; a retried /verify must repeat that "
                f"request byte for byte, not {request}",
            )
        else:
            task = running[2]
        return await asyncio.shield(task)

    def _forget(self, session_id: str, task: asyncio.Task) -> None:
        if session_id in self._running and self._running[session_id][2] is task:
            del self._running[session_id]
