"""Which Gym server replicas were declared lost, and why: what the head's rollouts read to route and to cut.

The watcher of Ray-placed Gym servers (:mod:`nemo_tau2.gym.ray_servers`) writes here from its thread when a server's
node or launcher actor is gone or the server stops answering its health probes; the rollout (an event loop in the
head process) reads it to send new episodes to live agent replicas only, and to end at once, as infrastructure errors
naming the cause, the episodes in flight on an agent replica that was declared lost (an agent on a silent node never
answers: nothing else would end them). Local servers have no watcher: nothing is ever declared lost there.
"""

import threading


class ReplicaHealth:
    """URL -> why that server was declared lost (thread-safe: one thread writes, an event loop reads)."""

    def __init__(self) -> None:
        self._lost: dict[str, str] = {}
        self._lock = threading.Lock()

    def mark_lost(self, url: str, cause: str) -> None:
        with self._lock:
            self._lost.setdefault(url, cause)  # the first cause is the true one

    def cause(self, url: str) -> str | None:
        """Why ``url`` was declared lost; None while it is not."""
        with self._lock:
            return self._lost.get(url)

    def lost(self) -> dict[str, str]:
        with self._lock:
            return dict(self._lost)


class AgentReplicas(list[str]):
    """The URLs of an agent's replicas (a list, as every caller of the rollout passes them), with what the head
    needs to bound their episodes: the servers' :class:`ReplicaHealth` and each episode's wall-clock limit."""

    def __init__(self, urls: list[str], health: ReplicaHealth, episode_timeout_s: float) -> None:
        super().__init__(urls)
        self.health = health
        self.episode_timeout_s = episode_timeout_s
