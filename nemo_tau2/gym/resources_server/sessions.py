"""Live episodes keyed by NeMo-Gym session id, bounded in number, evicted when idle; and the verdicts of verified
episodes, kept a while so that a retried ``/verify`` gets the same answer.

Eviction happens on every access and, so that a quiet server gives its memory back, on a timer
(:meth:`SessionStore.sweep_interval_s`, run by the server).
"""

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from nemo_tau2.gym.resources_server.replay import RecordedAnswer
from nemo_tau2.tau2_env.episode import Episode


class TooManySessionsError(RuntimeError):
    """The server already holds its configured maximum of live sessions."""


@dataclass
class Session:
    """One live episode and the answers recorded for its requests (see :mod:`.replay`)."""

    episode: Episode
    seed_key: str | None = None
    seed_answer: RecordedAnswer | None = None
    answers: dict[str, RecordedAnswer] = field(default_factory=dict)  # tool calls, by idempotency key


@dataclass(frozen=True)
class Verdict:
    """What ``/verify`` answered, without the request echo (rebuilt from the identical retried request)."""

    request: str
    fingerprint: bytes
    fields: dict[str, Any]
    expires: float


class SessionStore:
    """Sessions in least-recently-used order, verdicts in order of expiry."""

    def __init__(self, idle_timeout_s: float, max_sessions: int, verdict_ttl_s: float = 900.0):
        self.idle_timeout_s = idle_timeout_s
        self.max_sessions = max_sessions
        self.verdict_ttl_s = verdict_ttl_s
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        self._verdicts: OrderedDict[str, Verdict] = OrderedDict()
        self._seed_keys: dict[str, str] = {}  # idempotency key of the seed -> session id
        self.evicted_idle = 0
        self.replayed_answers = 0

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session_id: object) -> bool:
        """Whether the session is live (without marking it used)."""
        return session_id in self._sessions

    @property
    def num_verdicts(self) -> int:
        return len(self._verdicts)

    def sweep_interval_s(self) -> float:
        """How often the server's timer should call :meth:`evict_idle`."""
        return min(60.0, self.idle_timeout_s / 4, self.verdict_ttl_s / 4)

    def evict_idle(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        deadline = now - self.idle_timeout_s
        while self._sessions:
            session_id, session = next(iter(self._sessions.items()))
            if session.episode.last_used > deadline:
                break
            self._forget(session_id)
            self.evicted_idle += 1
        while self._verdicts and next(iter(self._verdicts.values())).expires <= now:
            self._verdicts.popitem(last=False)

    def put(
        self, session_id: str, episode: Episode, seed_key: str | None = None, seed_answer: RecordedAnswer | None = None
    ) -> None:
        self.evict_idle()
        self._forget(session_id)  # re-seeding a session starts a new episode
        self._verdicts.pop(session_id, None)
        if len(self._sessions) >= self.max_sessions:
            raise TooManySessionsError(
                f"{len(self._sessions)} live sessions (max_live_sessions); verify finished episodes or raise the limit"
            )
        self._sessions[session_id] = Session(episode, seed_key, seed_answer)
        if seed_key is not None:
            self._seed_keys[seed_key] = session_id

    def session(self, session_id: str | None) -> Session | None:
        """The live session (marked as used now), or None."""
        self.evict_idle()
        session = self._sessions.get(session_id) if session_id else None
        if session is not None:
            session.episode.last_used = time.monotonic()
            self._sessions.move_to_end(session_id)
        return session

    def get(self, session_id: str | None) -> Episode | None:
        session = self.session(session_id)
        return session.episode if session is not None else None

    def seeded(self, seed_key: str) -> tuple[str, Session] | None:
        """The live session an earlier ``/seed_session`` with this idempotency key created."""
        session_id = self._seed_keys.get(seed_key)
        session = self.session(session_id)
        return (session_id, session) if session is not None else None

    def finish(self, session_id: str, request: str, fingerprint: bytes, fields: dict[str, Any]) -> None:
        """The episode is verified: drop it, keep its verdict for ``verdict_ttl_s``."""
        self._forget(session_id)
        self._verdicts.pop(session_id, None)
        self._verdicts[session_id] = Verdict(request, fingerprint, fields, time.monotonic() + self.verdict_ttl_s)

    def verdict(self, session_id: str | None) -> Verdict | None:
        self.evict_idle()
        return self._verdicts.get(session_id) if session_id else None

    def pop(self, session_id: str | None) -> Episode | None:
        """Drop the session and any verdict it has; its episode, if it was live."""
        self.evict_idle()
        if not session_id:
            return None
        self._verdicts.pop(session_id, None)
        session = self._forget(session_id)
        return session.episode if session is not None else None

    def _forget(self, session_id: str) -> Session | None:
        session = self._sessions.pop(session_id, None)
        if session is not None and session.seed_key is not None:
            self._seed_keys.pop(session.seed_key, None)
        if session is not None and hasattr(session.episode, "close"):  # an episode in a release's worker
            session.episode.close()
        return session
