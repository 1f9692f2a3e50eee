"""Which replica serves a model call: the same one for every turn of an episode, balanced across episodes.

A multi-turn episode's prompt at turn t+1 starts with everything of turn t; on the replica that served turn t
vLLM's prefix cache already holds that history, on any other replica it is computed again. So the model server
keeps each session (one episode on one server) on one replica, chosen when the session first calls: the live
replica with the fewest calls in flight, then the fewest sessions (NeMo-RL's native path round-robins per request,
which ``round_robin`` reproduces for comparison). A replica that cannot be reached (connection refused or dropped)
is set aside for ``retry_after_s``; the session's next call (the agent retries a failed turn) goes to a live one,
where it only misses the cache. Given a :class:`ReplicaHealth`, a replica the watcher declared lost gets nothing
more; with every replica lost, :meth:`ReplicaRouter.route` raises :class:`NoLiveReplica`.
"""

import itertools
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Literal

from nemo_tau2.gym.replica_health import ReplicaHealth, ServerLoss

ReplicaRouting = Literal["sticky", "round_robin"]


class NoLiveReplica(LookupError):
    """Every replica was declared lost; the message names the causes and where, ``cause`` the causes alone."""

    def __init__(self, losses: list[ServerLoss]) -> None:
        self.cause = "every replica was declared lost: " + "; ".join(sorted({loss.cause for loss in losses}))
        super().__init__(f"{self.cause} ({'; '.join(loss.where for loss in losses)})")


class ReplicaRouter:
    """Session -> replica URL (see the module docstring); not thread-safe: one event loop calls it."""

    def __init__(
        self,
        urls: list[str],
        routing: ReplicaRouting = "sticky",
        retry_after_s: float = 30.0,
        max_sessions: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
        health: ReplicaHealth | None = None,
    ) -> None:
        if not urls:
            raise ValueError("a model server needs at least one endpoint URL")
        self.urls = list(urls)
        self.routing = routing
        self.retry_after_s = retry_after_s
        self.max_sessions = max_sessions
        self._clock = clock
        self.health = health
        self._sessions: OrderedDict[str, str] = OrderedDict()  # least recently used first, bounded
        self._session_count = dict.fromkeys(self.urls, 0)
        self._in_flight = dict.fromkeys(self.urls, 0)
        self._down_until = dict.fromkeys(self.urls, 0.0)
        self._round_robin = itertools.cycle(self.urls)
        self.moved_sessions = 0
        """Sessions that left their replica because it could not be reached."""

    def _live(self) -> list[str]:
        now = self._clock()
        lost = self.health.lost() if self.health is not None else {}
        kept = [url for url in self.urls if url not in lost]
        if not kept:
            raise NoLiveReplica([lost[url] for url in self.urls])
        live = [url for url in kept if self._down_until[url] <= now]
        return live or kept  # all set aside: try them all again rather than refuse

    def route(self, session_id: str) -> str:
        """The replica for this session's next call."""
        if len(self.urls) == 1:
            self._live()  # raises once the only replica was declared lost
            return self.urls[0]
        if self.routing == "round_robin":
            live = set(self._live())
            return next(url for url in self._round_robin if url in live)
        live = self._live()
        url = self._sessions.get(session_id)
        if url is not None:
            self._sessions.move_to_end(session_id)
            if url in live:
                return url
            self.moved_sessions += 1
            self._session_count[url] -= 1
        url = min(live, key=lambda u: (self._in_flight[u], self._session_count[u]))
        self._sessions[session_id] = url
        self._session_count[url] += 1
        if len(self._sessions) > self.max_sessions:
            _, oldest = self._sessions.popitem(last=False)
            self._session_count[oldest] -= 1
        return url

    @contextmanager
    def call(self, session_id: str) -> Iterator[str]:
        """Route one call and count it in flight while it runs."""
        url = self.route(session_id)
        self._in_flight[url] += 1
        try:
            yield url
        finally:
            self._in_flight[url] -= 1

    def unreachable(self, url: str) -> None:
        """``url`` did not answer at all: send no session there for ``retry_after_s``."""
        if len(self.urls) > 1:
            self._down_until[url] = self._clock() + self.retry_after_s

    def sessions_on(self, url: str) -> int:
        return self._session_count[url]
