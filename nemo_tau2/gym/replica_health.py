"""Which Gym server replicas were declared lost, and why: what the head's rollouts read to route and to cut.

The watcher of Ray-placed Gym servers (:mod:`nemo_tau2.gym.ray_servers`) writes here from its thread when a server's
node or launcher actor is gone or the server stops answering its health probes; the rollout (an event loop in the
head process) reads it to send new episodes to live agent replicas only, and to end at once, as infrastructure errors
naming the cause, the episodes in flight on an agent replica that was declared lost (an agent on a silent node never
answers: nothing else would end them). Local servers have no watcher: nothing is ever declared lost there.
"""

import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class ServerLoss:
    """Why a server replica was declared lost, as two fields: ``cause``, which server of the replica and how the
    watcher found it (its node dead in Ray, its node's launcher actor gone, its process gone, its health probes
    failed), in words that are the same for every episode it cut; ``where``, the place (server name, URL, node),
    kept apart so that counting causes needs no rewriting of words."""

    cause: str
    where: str

    def __str__(self) -> str:
        return f"{self.cause} ({self.where})"


class ReplicaHealth:
    """URL -> why that server was declared lost (thread-safe: one thread writes, an event loop reads).

    ``detection_s``: the longest the watcher takes to declare a server lost (0: nothing watches, as locally), what
    an episode whose replica went away waits for the verdict that says why."""

    def __init__(self, detection_s: float = 0.0) -> None:
        self._lost: dict[str, ServerLoss] = {}
        self._lock = threading.Lock()
        self.detection_s = detection_s

    def mark_lost(self, url: str, loss: ServerLoss) -> None:
        with self._lock:
            self._lost.setdefault(url, loss)  # the first cause is the true one

    def cause(self, url: str) -> ServerLoss | None:
        """Why ``url`` was declared lost; None while it is not."""
        with self._lock:
            return self._lost.get(url)

    def lost(self) -> dict[str, ServerLoss]:
        with self._lock:
            return dict(self._lost)


class AgentReplicas(list[str]):
    """The URLs of an agent's replicas (a list, as every caller of the rollout passes them), with what the head
    needs to bound their episodes: the servers' :class:`ReplicaHealth` and each episode's wall-clock limit; and the
    run id the servers check each request against (Ray-placed servers; None locally)."""

    def __init__(
        self, urls: list[str], health: ReplicaHealth, episode_timeout_s: float, run_id: str | None = None
    ) -> None:
        super().__init__(urls)
        self.health = health
        self.episode_timeout_s = episode_timeout_s
        self.run_id = run_id
