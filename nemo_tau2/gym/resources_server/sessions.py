"""Live episodes keyed by NeMo-Gym session id, bounded in number and evicted when idle."""

import time
from collections import OrderedDict

from nemo_tau2.tau2_env.episode import Episode


class TooManySessionsError(RuntimeError):
    """The server already holds its configured maximum of live sessions."""


class SessionStore:
    """Episodes in least-recently-used order; idle ones are dropped lazily on every access (no timer)."""

    def __init__(self, idle_timeout_s: float, max_sessions: int):
        self.idle_timeout_s = idle_timeout_s
        self.max_sessions = max_sessions
        self._episodes: OrderedDict[str, Episode] = OrderedDict()
        self.evicted_idle = 0

    def __len__(self) -> int:
        return len(self._episodes)

    def evict_idle(self, now: float | None = None) -> None:
        deadline = (time.monotonic() if now is None else now) - self.idle_timeout_s
        while self._episodes:
            session_id, episode = next(iter(self._episodes.items()))
            if episode.last_used > deadline:
                break
            del self._episodes[session_id]
            self.evicted_idle += 1

    def put(self, session_id: str, episode: Episode) -> None:
        self.evict_idle()
        self._episodes.pop(session_id, None)  # re-seeding a session starts a new episode
        if len(self._episodes) >= self.max_sessions:
            raise TooManySessionsError(
                f"{len(self._episodes)} live sessions (max_live_sessions); verify finished episodes or raise the limit"
            )
        self._episodes[session_id] = episode

    def get(self, session_id: str | None) -> Episode | None:
        self.evict_idle()
        episode = self._episodes.get(session_id) if session_id else None
        if episode is not None:
            episode.last_used = time.monotonic()
            self._episodes.move_to_end(session_id)
        return episode

    def pop(self, session_id: str | None) -> Episode | None:
        self.evict_idle()
        return self._episodes.pop(session_id, None) if session_id else None
