"""The watcher of Ray-placed Gym servers: each server checked every ``cluster.gym_health_interval_s``, as
:mod:`nemo_tau2.generation.ray_replicas` watches generation replicas.

A server is declared lost, with a cause its episodes' errors name, when

- Ray marks its node dead (a crashed node: lost at the next check, within ``gym_health_interval_s``);
- its node's launcher actor is gone, or its process exited (the fork server reports it);
- it fails ``gym_health_failures`` HTTP probes in a row, each waiting ``gym_health_timeout_s`` (a server that keeps
  its port open but never answers, as on a stopped or partitioned node, long before Ray gives its node up).

A lost server takes the servers that depend on it along: an agent's model servers are its group, and a resources
replica takes the agents that use it alone (their episodes' sessions lived there). Their URLs go to the servers'
:class:`~nemo_tau2.gym.replica_health.ReplicaHealth` (the rollouts stop sending there and end the episodes in flight
there); what still runs of them is killed, and they are started again while ``gym_server_restarts`` allows, else
dropped. A node Ray marked dead has its lease renewed no more, so whatever still runs there ends with it.
"""

import contextlib
import logging
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from nemo_tau2.gym.replica_health import ServerLoss
from nemo_tau2.request_guard import RUN_ID_HEADER

logger = logging.getLogger(__name__)

# the order servers found lost in one round are declared in: a resources replica first (it takes the agents that
# used it along, into one restart), then each group by its lead server (an agent before its model servers)
SERVER_KINDS = {"resources_servers": "resources server", "responses_api_agents": "agent", "responses_api_models":
                "model server"}  # fmt: skip


class GymServerWatch:
    """The watcher thread of one :class:`~nemo_tau2.gym.ray_servers.RayGymServers` (see the module docstring)."""

    def __init__(self, servers: Any) -> None:
        self.servers = servers
        self.cluster = servers.cluster
        self.lost_groups: dict[int, ServerLoss] = {}  # group index -> the cause it was dropped for
        self.restarts: dict[int, int] = {}
        self._failures: dict[str, int] = {}  # server name -> probes failed in a row
        self._dead_nodes: set[str] = set()  # the nodes Ray marked dead at the last check
        self._stopping = threading.Event()
        self._probes = ThreadPoolExecutor(max_workers=min(32, len(servers.specs)), thread_name_prefix="gym-probe")
        self._thread = threading.Thread(target=self._run, name="nemo-tau2-gym-watch", daemon=True)

    def start(self) -> "GymServerWatch":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=2 * self.cluster.gym_health_timeout_s + 5)
        self._probes.shutdown(wait=False, cancel_futures=True)

    def answers(self, url: str) -> bool:
        """Any HTTP answer to ``GET /`` within the probe timeout (an error status is an answer: the server is up)."""
        try:
            probe = urllib.request.Request(url + "/", headers={RUN_ID_HEADER: self.servers.run_id or ""})
            with urllib.request.urlopen(probe, timeout=self.cluster.gym_health_timeout_s):
                return True
        except urllib.error.HTTPError:
            return True
        except OSError:
            return False

    def _run(self) -> None:
        while not self._stopping.wait(self.cluster.gym_health_interval_s):
            try:
                found = self._check()
                for name in sorted(found, key=self._declared_first):
                    url, _ = found[name]
                    if self._stopping.is_set():
                        return
                    if self.servers.url(name) == url:  # not started again meanwhile (with a group lost before it)
                        self._lose(name, found)
                self._release_dead_nodes()
            except Exception:  # the watcher must outlive any one bad check
                logger.exception("Gym server health check failed")

    def _declared_first(self, name: str) -> int:
        return list(SERVER_KINDS).index(self._spec(name).server_type)

    def _spec(self, name: str) -> Any:
        return next(spec for spec in self.servers.specs if spec.name == name)

    def _loss(self, name: str, how: str) -> ServerLoss:
        """``name``'s loss as its group's episodes read it: which server it is, how it was found, and where."""
        servers = self.servers
        where = f"{name} at {servers.url(name)} on {servers.placement[name]['ip']}"
        return ServerLoss(f"its {SERVER_KINDS[self._spec(name).server_type]} {how}", where)

    def _groups_of(self) -> dict[str, int]:
        return {spec.name: i for i, group in enumerate(self.servers.groups) for spec in group.specs}

    def _check(self) -> dict[str, tuple[str, str]]:
        """Server name -> its URL and how it was found lost (what the server did, without a place: "exited with
        code -9"), for the live servers found lost in this round."""
        servers, ray = self.servers, self.servers._ray
        group_of = self._groups_of()
        live = [name for name in servers.placement if group_of[name] not in self.lost_groups]
        found: dict[str, str] = {}
        dead = self._dead_nodes = {node["NodeID"] for node in ray.nodes() if not node.get("Alive")}
        for name in live:
            node = servers.placement[name]
            if node["node_id"] in dead:
                found[name] = "was on a node Ray marked dead"
        urls = {name: servers.url(name) for name in live if name not in found}
        probes = {name: self._probes.submit(self.answers, url) for name, url in urls.items()}  # meanwhile: launchers
        nodes = {servers.placement[name]["node_id"] for name in live}
        calls = {
            node_id: launcher.exits.remote() for node_id, launcher in servers.launchers.items() if node_id in nodes
        }
        timeout = self.cluster.gym_health_timeout_s
        ready = ray.wait(list(calls.values()), num_returns=len(calls), timeout=timeout)[0] if calls else []
        for node_id, call in calls.items():
            if call not in ready:
                continue  # a silent node: the probes decide
            try:
                exits = {(exit.name, exit.pid): exit.returncode for exit in ray.get(call)}
            except ray.exceptions.RayError:
                for name in live:
                    if servers.placement[name]["node_id"] == node_id:
                        found.setdefault(name, "lost its node's launcher actor")
                continue
            for name in live:
                code = exits.get((name, servers._pids.get(name)))
                if code is not None:
                    found.setdefault(name, f"exited with code {code}")
        for name, probe in probes.items():
            self._failures[name] = 0 if probe.result() else self._failures.get(name, 0) + 1
            if self._failures[name] >= self.cluster.gym_health_failures and name not in found:
                found[name] = (
                    f"did not answer {self._failures[name]} health probes in a row "
                    f"({self.cluster.gym_health_timeout_s:g} s each)"
                )
        return {name: (servers.url(name), cause) for name, cause in found.items()}

    def _lose(self, name: str, found: dict[str, tuple[str, str]]) -> None:
        """Declare ``name``'s group lost, and the agent groups that used only lost resources replicas (each named by
        its own lead server when that was found lost in this round too: a node lost whole); then restart them all if
        allowed, else drop them."""
        servers, group_of = self.servers, self._groups_of()
        index = group_of[name]
        if index in self.lost_groups:
            return
        cause = self._loss(name, found[name][1])
        affected = {index: cause}
        if servers.groups[index].role == "resources":
            lost_resources = {spec.name for i in [*self.lost_groups, index] for spec in servers.groups[i].specs} & {
                spec.name for group in servers.groups if group.role == "resources" for spec in group.specs
            }
            for agent, uses in servers.resources_of.items():
                if set(uses) <= lost_resources and group_of[agent] not in self.lost_groups:
                    own = [spec.name for spec in servers.groups[group_of[agent]].specs if spec.name in found]
                    lead = min(own, key=self._declared_first, default=None)
                    affected.setdefault(group_of[agent], self._loss(lead, found[lead][1]) if lead else cause)
        for i, why in affected.items():
            self.lost_groups[i] = why
            for spec in servers.groups[i].specs:
                servers.health.mark_lost(servers.url(spec.name), why)
            logger.warning("Gym servers %s lost: %s", [spec.name for spec in servers.groups[i].specs], why)
        self._kill([spec.name for i in affected for spec in servers.groups[i].specs])
        if all(self.restarts.get(i, 0) < self.cluster.gym_server_restarts for i in affected):
            dead_nodes = {servers.placement[name]["node_id"]} if "node" in found[name][1] else set()
            try:
                servers.restart(sorted(affected), avoid=dead_nodes)
            except Exception as e:
                logger.warning("Gym servers %s not restarted (%s): dropped", sorted(affected), e)
                return
            for i in affected:
                self.restarts[i] = self.restarts.get(i, 0) + 1
                del self.lost_groups[i]
                for spec in servers.groups[i].specs:
                    self._failures.pop(spec.name, None)
            logger.warning("Gym server groups %s restarted", sorted(affected))

    def _release_dead_nodes(self) -> None:
        """Release the launcher of each node Ray marked dead, once its servers were declared lost (and killed where
        that could reach them): it leaves ``servers.launchers``, which the head's lease renewer reads, so the node's
        lease is renewed no more and whatever still runs there ends within ``lease_timeout_s``. Ray schedules
        nothing there again. Before, only a restart elsewhere released it: a group dropped (no restart left) kept
        its dead node's launcher, and the head renewed that node's lease until the run ended."""
        servers, ray = self.servers, self.servers._ray
        for node_id in self._dead_nodes & set(servers.launchers):
            launcher = servers.launchers.pop(node_id)
            with contextlib.suppress(ray.exceptions.RayError, ValueError):
                ray.kill(launcher)
            logger.warning("Ray node %s is dead: its Gym launcher released, its lease no longer renewed", node_id)

    def _kill(self, names: list[str]) -> None:
        """Best effort: a lost server still running (stopped, hung) is killed through its node's launcher."""
        servers, ray = self.servers, self.servers._ray
        by_node: dict[str, list[int]] = {}
        for name in names:
            by_node.setdefault(servers.placement[name]["node_id"], []).append(servers._pids.get(name, -1))
        for node_id, pids in by_node.items():
            launcher = servers.launchers.get(node_id)
            if launcher is not None:
                with contextlib.suppress(ray.exceptions.RayError):
                    ray.wait([launcher.kill.remote(pids)], timeout=self.cluster.gym_health_timeout_s)
