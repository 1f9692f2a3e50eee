"""Progress of a running rollout, inside episodes too: :class:`RolloutProgress` snapshots for a caller's callback.

``/run`` answers only when an episode ends, which for a long airline episode on a small CPU model is minutes. The
agent server counts model turns and generated tokens as they happen (``GET /progress``); :class:`ProgressWatch`
polls those counters and adds what the rollout side knows (episodes done and in flight).

An agent that does not answer the poll (connection refused, or silent: a hung or stopped host, a partition) is
reported once as unreachable and is then left out of every watch in this process, so that it costs no poll's
timeout at each step; a probe in the background (every :data:`UNREACHABLE_RECHECK_S`, never awaited by a report)
finds out when it answers again, which is said once too. An agent that answers without counters (NeMo-Gym's own
agents have no ``/progress``) is named once and not polled again.
"""

import asyncio
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

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
POLL_TIMEOUT_S = 5.0
UNREACHABLE_RECHECK_S = 30.0
"""How often an unreachable agent is probed (in the background) to find out that it answers again."""


class _Unanswered(Exception):
    """The agent gave no answer at all (refused, cut, timed out): its cause."""


@dataclass
class _AgentStates:
    """What this process knows of the agents' ``/progress``, across watches (each rollout call has its own watch)."""

    unreachable: dict[str, float] = field(default_factory=dict)  # url -> when it was last probed
    without_counters: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)  # async GRPO's collector watches from its thread

    def pollable(self, urls: Sequence[str]) -> list[str]:
        with self.lock:
            return [url for url in urls if url not in self.unreachable and url not in self.without_counters]

    def due_for_recheck(self, urls: Sequence[str]) -> list[str]:
        now = time.monotonic()
        with self.lock:
            due = [url for url in urls if now - self.unreachable.get(url, now) >= UNREACHABLE_RECHECK_S]
            for url in due:
                self.unreachable[url] = now
            return due

    def mark_unreachable(self, url: str, cause: str) -> None:
        with self.lock:
            known = url in self.unreachable
            self.unreachable[url] = time.monotonic()
        if not known:
            logger.warning(
                "agent at %s is unreachable (%s): its turn counts are left out, and it is not polled again until it "
                "answers", url, cause,
            )  # fmt: skip

    def mark_answering(self, url: str) -> None:
        with self.lock:
            was_unreachable = self.unreachable.pop(url, None) is not None
        if was_unreachable:
            logger.warning("agent at %s answers again: its turn counts are shown again", url)

    def mark_without_counters(self, url: str) -> None:
        with self.lock:
            known = url in self.without_counters
            self.without_counters.add(url)
        if not known:
            logger.info("agent at %s has no /progress: its turn counts are not shown", url)


AGENTS = _AgentStates()


class ProgressWatch:
    """Polls the agents' ``/progress`` and reports :class:`RolloutProgress` to the caller's callback."""

    def __init__(self, http: aiohttp.ClientSession, urls: Sequence[str], total: int, callback, interval_s: float):
        self.http, self.urls, self.total = http, sorted(set(urls)), total
        self.callback, self.interval_s = callback, interval_s
        self.done = self.running = 0
        self.started = time.perf_counter()
        self._baseline: dict[str, dict[str, int]] = {}
        self._last_counters: dict[str, int] = {}
        self._probes: set[asyncio.Task] = set()

    async def _poll(self, url: str) -> dict[str, int] | None:
        """The agent's counters; None when it answered without them. Raises :class:`_Unanswered`."""
        try:
            timeout = aiohttp.ClientTimeout(total=POLL_TIMEOUT_S)
            async with self.http.get(f"{url}/progress", timeout=timeout) as response:
                body = await response.json(content_type=None) if response.status == 200 else None
        except (aiohttp.ClientConnectionError, TimeoutError) as e:
            raise _Unanswered(
                f"{type(e).__name__}: {e}" if str(e) else f"no answer within {POLL_TIMEOUT_S:g} s"
            ) from e
        except (aiohttp.ClientError, ValueError):  # an answer, but not counters (not JSON, a bad status line)
            body = None
        if isinstance(body, dict) and all(isinstance(body.get(key), int) for key in _PROGRESS_COUNTERS):
            return {key: body[key] for key in _PROGRESS_COUNTERS}
        return None

    async def _poll_and_classify(self, url: str) -> dict[str, int] | None:
        try:
            counters = await self._poll(url)
        except _Unanswered as e:
            AGENTS.mark_unreachable(url, str(e))
            return None
        AGENTS.mark_answering(url)
        if counters is None:
            AGENTS.mark_without_counters(url)
        return counters

    async def _counters(self) -> dict[str, int] | None:
        urls = AGENTS.pollable(self.urls)
        answers = await asyncio.gather(*(self._poll_and_classify(url) for url in urls))
        totals = dict.fromkeys(_PROGRESS_COUNTERS, 0)
        answered = False
        for url, counters in zip(urls, answers, strict=True):
            if counters is None:
                continue
            base = self._baseline.setdefault(url, counters)
            for key in _PROGRESS_COUNTERS:
                totals[key] += counters[key] - base[key]
            answered = True
        return totals if answered else None

    def _recheck_unreachable(self) -> None:
        """Probe the unreachable agents that are due, in the background: a report never waits for them."""
        for url in AGENTS.due_for_recheck(self.urls):
            probe = asyncio.create_task(self._poll_and_classify(url))
            self._probes.add(probe)
            probe.add_done_callback(self._probes.discard)

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
        try:
            while True:
                await asyncio.sleep(self.interval_s)
                self._recheck_unreachable()
                await self.report()
        finally:  # cancelled when the rollout ends: so are the probes still waiting
            for probe in list(self._probes):
                probe.cancel()
