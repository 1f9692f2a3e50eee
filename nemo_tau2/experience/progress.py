"""Progress of a running rollout, inside episodes too: :class:`RolloutProgress` snapshots for a caller's callback.

``/run`` answers only when an episode ends, which for a long airline episode on a small CPU model is minutes. The
agent server counts model turns and generated tokens as they happen (``GET /progress``); :class:`ProgressWatch`
polls those counters and adds what the rollout side knows (episodes done and in flight).
"""

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RolloutProgress:
    """A snapshot of a running rollout. Turn and token counts come from the agent servers' ``/progress`` counters
    since this rollout began (all their callers'); None when no agent answered it."""

    episodes_total: int
    episodes_done: int
    episodes_running: int
    elapsed_s: float
    policy_turns: int | None = None
    user_turns: int | None = None
    generation_tokens: int | None = None

    @property
    def tokens_per_s(self) -> float | None:
        return None if self.generation_tokens is None else self.generation_tokens / max(self.elapsed_s, 1e-9)

    def describe(self) -> str:
        """``"3 running, 41 turns, 52 tok/s"``: for a progress bar's postfix."""
        parts = [f"{self.episodes_running} running"]
        if self.policy_turns is not None:
            parts.append(f"{self.policy_turns} turns")
            parts.append(f"{self.tokens_per_s:.0f} tok/s")
        return ", ".join(parts)


_PROGRESS_COUNTERS = ("policy_turns", "user_turns", "generation_tokens")


class ProgressWatch:
    """Polls the agents' ``/progress`` and reports :class:`RolloutProgress` to the caller's callback."""

    def __init__(self, http: aiohttp.ClientSession, urls: Sequence[str], total: int, callback, interval_s: float):
        self.http, self.urls, self.total = http, sorted(set(urls)), total
        self.callback, self.interval_s = callback, interval_s
        self.done = self.running = 0
        self.started = time.perf_counter()
        self._baseline: dict[str, dict[str, int]] = {}
        self._warned = False
        self._last_counters: dict[str, int] = {}

    async def _counters(self) -> dict[str, int] | None:
        totals = dict.fromkeys(_PROGRESS_COUNTERS, 0)
        answered = False
        for url in self.urls:
            try:
                async with self.http.get(f"{url}/progress", timeout=aiohttp.ClientTimeout(total=5)) as response:
                    body = await response.json() if response.status == 200 else None
            except (aiohttp.ClientError, TimeoutError, ValueError):
                body = None
            if not isinstance(body, dict) or not all(isinstance(body.get(k), int) for k in _PROGRESS_COUNTERS):
                if not self._warned:
                    logger.info("agent at %s has no /progress: turn counts are not shown", url)
                    self._warned = True
                continue
            base = self._baseline.setdefault(url, {key: body[key] for key in _PROGRESS_COUNTERS})
            for key in _PROGRESS_COUNTERS:
                totals[key] += body[key] - base[key]
            answered = True
        return totals if answered else None

    async def start(self) -> None:
        await self._counters()  # the baseline: counters before this rollout's first episode

    async def report(self) -> None:
        """Poll the agents, then call back."""
        self._last_counters = await self._counters() or {}
        self.notify()

    def notify(self) -> None:
        """Call back with the episode counts as they are now and the agents' counters as last polled."""
        elapsed = time.perf_counter() - self.started
        self.callback(RolloutProgress(self.total, self.done, self.running, elapsed, **self._last_counters))

    async def run_forever(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.report()
