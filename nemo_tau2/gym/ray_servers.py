"""The Gym servers as Ray-placed processes: replicas reserved by placement groups, started on their nodes.

Placement is Ray's. Each role (``resources``, ``agent``) is one placement group with a bundle per replica, strategy
``SPREAD``; a bundle is ``{"CPU": 1}`` plus one unit of ``cluster.gym_node_resource`` when set, so that only the
nodes offering that resource (the CPU nodes, not the GPU nodes) can hold one. An agent replica's bundle holds the
agent and its own policy and user model servers (:func:`~nemo_tau2.gym.stack.tau2_replicas`).

Once the groups are placed, each node that holds a bundle gets one :class:`GymNodeLauncher`, a small actor pinned
there by node affinity. It runs a fork server (:mod:`nemo_tau2.gym.fork_server`: the server classes imported once
per node, one process per server) and starts that node's servers, each bound to the node's address on a port free
there. The launcher reports the address, ports and pids back: every URL in the NeMo-Gym global config the servers
share comes from the node the server runs on.

Locality: each agent uses the resources replicas of its own failure domain (its node, or the nodes sharing the value
of the label ``cluster.gym_failure_domain``), so that a lost node fails the episodes it held and no others.

Faults: a watcher (:mod:`nemo_tau2.gym.ray_watch`) declares a server lost when Ray marks its node dead, its launcher
actor dies, its process exits, or it fails ``cluster.gym_health_failures`` health probes in a row (a server that
keeps its port open but stops answering: a stopped or partitioned node). Its URL, and those of the servers that
depend on it, go to :attr:`RayGymServers.health`, which the head's rollouts read (new episodes to live agents only,
in-flight ones on a lost agent ended as infrastructure errors naming the cause); the servers are then started again
while ``cluster.gym_server_restarts`` allows, else dropped.

Lifetimes: the fork server stops its servers and exits when its launcher dies (its control socket closes; and
``PR_SET_PDEATHSIG``); :meth:`RayGymServers.stop` (also on exit, Ctrl-C or error) stops them, kills the launchers
and removes the placement groups. What the head cannot reach (a node stopped or cut off, the head killed) ends on its
own when its node's lease runs out (:mod:`nemo_tau2.lease`); each server refuses another run's requests (409).
"""

import contextlib
import logging
import os
import signal
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from nemo_tau2.cluster import ClusterConfig, import_ray, ray_connection
from nemo_tau2.gym.fork_server import ForkServer, ForkServerError, ServerExit
from nemo_tau2.gym.launch import GymServers, ServerStartError, gym_global_config
from nemo_tau2.gym.ray_watch import GymServerWatch
from nemo_tau2.gym.serving import CONFIG_DICT_ENV
from nemo_tau2.gym.stack import ServerGroup, tau2_local_resources
from nemo_tau2.lease import LEASE_FILE_ENV, RUN_ID_ENV, LeaseRenewer, end_process, hold_lease
from nemo_tau2.ports import free_port

logger = logging.getLogger(__name__)

LOG_TAIL_BYTES = 1 << 20


class GymNodeLauncher:
    """On one node (a Ray actor): a fork server that starts the Gym servers placed on this node."""

    def __init__(
        self, server_classes: list[str], log_dir: str, env: dict[str, str], run_id: str, lease_timeout_s: float
    ) -> None:
        ray = import_ray()
        self.node_id = ray.get_runtime_context().get_node_id()
        self.ip = ray.util.get_node_ip_address()
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        # the node's lease, on its own disk; the fork server and every server forked from it read it too
        self.lease = hold_lease(f"{run_id}_{self.node_id[:12]}", lease_timeout_s, self._lease_expired)
        env = env | {LEASE_FILE_ENV: str(self.lease.path), RUN_ID_ENV: run_id}
        self.fork_server = ForkServer(server_classes, Path(log_dir) / f"fork_server_{self.node_id[:12]}.log", env)

    def renew(self, sent_at: float) -> float:
        """The head's renewal, sent at ``sent_at`` (its ``lease`` concurrency group: no call holds it up)."""
        return self.lease.renew(sent_at)

    def _lease_expired(self) -> None:
        """The head stopped renewing: end the fork server and its servers (each also ends on its own), then this
        actor's process."""
        for pid in [self.fork_server.process.pid, *self.fork_server.server_pids()]:  # each its own group
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
        end_process()  # not its group: a Ray worker's is the raylet's

    def where(self) -> dict[str, Any]:
        """This node's id and address, and the pid of its fork server."""
        return {"node_id": self.node_id, "ip": self.ip, "fork_server_pid": self.fork_server.process.pid}

    def free_ports(self, count: int) -> list[int]:
        return [free_port(self.ip) for _ in range(count)]

    def spawn(
        self, name: str, server_class: str, config_yaml: str, secrets: dict, log_path: str, timeout_s: float
    ) -> int:
        """Start one server from the fork server; its pid (on this node)."""
        env = {CONFIG_DICT_ENV: config_yaml}
        return self.fork_server.spawn(name, [name, server_class], env, secrets, Path(log_path), timeout_s)

    def exits(self) -> list[ServerExit]:
        return self.fork_server.exits()

    def kill(self, pids: list[int]) -> None:
        """SIGKILL servers declared lost (a stopped process ends too); the fork server reaps them."""
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    def log_tail(self, path: str, max_bytes: int) -> dict[str, Any] | None:
        """The last ``max_bytes`` of a log file as this node's disk has it, and the file's identity (device, inode):
        the head copies it only where its own file at that path is another one (a node-local disk). None: no file."""
        try:
            with open(path, "rb") as f:
                stat = os.fstat(f.fileno())
                f.seek(max(0, stat.st_size - max_bytes))
                return {"data": f.read(), "size": stat.st_size, "file": [stat.st_dev, stat.st_ino], "ip": self.ip}
        except OSError:
            return None

    def stop(self) -> None:
        self.fork_server.stop()
        self.lease.release()


class RayGymServers(GymServers):
    """:class:`GymServers` placed on a Ray cluster (see the module docstring); the same interface (``url``,
    ``replica_urls``, ``pid``, ``log_path``, ``exited``), plus ``placement``: server name -> its node's id and IP.

    Uses the Ray this process joined, else ``cluster.ray_address``'s, else starts a local one (stopped on ``stop``).
    """

    def __init__(
        self,
        groups: list[ServerGroup],
        cluster: ClusterConfig,
        log_dir: str | Path | None = None,
        startup_timeout_s: float = 180.0,
        env: dict[str, str] | None = None,
    ) -> None:
        specs = [spec for group in groups for spec in group.specs]
        super().__init__(specs, log_dir=log_dir, startup_timeout_s=startup_timeout_s, env=env)
        self.groups = groups
        self.cluster = cluster
        self.health.detection_s = cluster.gym_detection_s
        self.placement: dict[str, dict[str, Any]] = {}
        self._ray: Any = None
        self._ray_stack = ExitStack()
        self._placement_groups: list[Any] = []
        self.launchers: dict[str, Any] = {}  # node id -> its GymNodeLauncher
        self.resources_of: dict[str, list[str]] = {}  # agent name -> the resources replicas it uses (locality)
        self._secrets: dict[str, dict] = {}
        self.watch: GymServerWatch | None = None  # from start on: what was lost, what was started again
        self.run_id = uuid.uuid4().hex  # what each server checks requests against (409 for another run's)
        self._renewer: LeaseRenewer | None = None

    def start(self) -> "RayGymServers":
        began = time.perf_counter()
        secrets = self._secrets = self._prepare()
        ray = import_ray()
        try:
            self._ray = self._ray_stack.enter_context(ray_connection(self.cluster))
            # renewing from the first launcher on: each holds its node's lease from its start, and a start that
            # outlasts cluster.lease_timeout_s (many servers, a loaded box) had its launchers end themselves
            self._renewer = LeaseRenewer(self.cluster.lease_timeout_s, lambda: list(self.launchers.values())).start()
            nodes = self._place()
            for node_id in sorted(set(nodes.values())):
                self.launchers[node_id] = self._launcher(node_id)
            reports = ray.get([launcher.where.remote() for launcher in self.launchers.values()])
            where = {report["node_id"]: report for report in reports}
            for group_index, group in enumerate(self.groups):
                node = where[nodes[group_index]]
                ports = ray.get(self.launchers[node["node_id"]].free_ports.remote(len(group.specs)))
                for spec, port in zip(group.specs, ports, strict=True):
                    spec.host, spec.port = node["ip"], port
                    self.placement[spec.name] = node
            self.resources_of = tau2_local_resources(self.groups, self._failure_domains())
            self.global_config = gym_global_config(self.specs, "127.0.0.1")
            config_yaml = OmegaConf.to_yaml(self.global_config)
            spawned = [
                self.launchers[self.placement[spec.name]["node_id"]].spawn.remote(
                    spec.name,
                    spec.server_class,
                    config_yaml,
                    secrets[spec.name],
                    str(self.log_path(spec.name)),
                    self.startup_timeout_s,
                )
                for spec in self.specs
            ]
            self._pids = dict(zip((spec.name for spec in self.specs), ray.get(spawned), strict=True))
            self._wait_healthy(began)
        except (ForkServerError, ray.exceptions.RayError) as e:
            self.stop()
            cause = getattr(e, "cause", None) or e  # an actor's error: the original, not Ray's traceback
            raise ServerStartError(
                f"the Gym servers could not start on the Ray cluster: {type(cause).__name__}: {cause}"
            ) from None
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.perf_counter() - began
        logger.info(
            "%d Gym servers up on %d Ray nodes in %.1f s", len(self.specs), len(self.launchers), self.startup_s
        )
        self.watch = GymServerWatch(self).start()
        return self

    def _launcher(self, node_id: str) -> Any:
        ray = self._ray
        launcher_class = ray.remote(num_cpus=0, max_restarts=0, concurrency_groups={"lease": 1})(GymNodeLauncher)
        classes = sorted({spec.server_class for spec in self.specs})
        affinity = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(node_id, soft=False)
        return launcher_class.options(scheduling_strategy=affinity).remote(
            classes, str(self.log_dir), self.extra_env, self.run_id, self.cluster.lease_timeout_s
        )

    def _failure_domains(self) -> dict[str, str]:
        """Server name -> its failure domain: its node, or its node's value of the ``cluster.gym_failure_domain``
        label (a node without the label is a domain of its own)."""
        label = self.cluster.gym_failure_domain
        labels = {node["NodeID"]: node.get("Labels") or {} for node in self._ray.nodes()} if label else {}
        domains = {}
        for name, node in self.placement.items():
            value = labels.get(node["node_id"], {}).get(label) if label else None
            domains[name] = f"{label}={value}" if value is not None else node["node_id"]
        return domains

    def restart(self, group_indices: list[int], avoid: set[str]) -> None:
        """Start these server groups again, together (an agent next to the resources replica it uses), on new ports
        (the URLs in :attr:`global_config` follow): on their node when its launcher answers, else on the live Gym
        node with the fewest servers (a launcher is started there if it has none); resources groups first, since
        the agents read their URLs at start. Raises (Ray's or :class:`ServerStartError`) when none can."""
        ray = self._ray
        home = self.placement[self.groups[group_indices[0]].specs[0].name]["node_id"]
        resource = self.cluster.gym_node_resource
        alive = [n["NodeID"] for n in ray.nodes() if n.get("Alive") and (not resource or n["Resources"].get(resource))]
        load = {n: sum(p["node_id"] == n for p in self.placement.values()) for n in alive if n not in avoid}
        node = None
        for node_id in sorted(load, key=lambda n: (n != home, load[n])):
            new = node_id not in self.launchers
            launcher = self._launcher(node_id) if new else self.launchers[node_id]
            timeout = self.startup_timeout_s if new else self.cluster.gym_health_timeout_s
            try:
                node = ray.get(launcher.where.remote(), timeout=timeout) | {"node_id": node_id}
            except ray.exceptions.RayError:
                continue
            self.launchers[node_id] = launcher
            break
        if node is None:
            raise ServerStartError("no live Gym node's launcher answers")
        order = sorted(group_indices, key=lambda i: self.groups[i].role != "resources")
        started = [spec for index in order for spec in self.groups[index].specs]
        ports = ray.get(
            self.launchers[node["node_id"]].free_ports.remote(len(started)), timeout=self.startup_timeout_s
        )
        for spec, port in zip(started, ports, strict=True):
            spec.host, spec.port = node["ip"], port
            self.placement[spec.name] = node
        self.global_config = gym_global_config(self.specs, "127.0.0.1")
        config_yaml = OmegaConf.to_yaml(self.global_config)
        launcher = self.launchers[node["node_id"]]
        for spec in started:
            log = str(self.log_path(spec.name))
            call = launcher.spawn.remote(
                spec.name, spec.server_class, config_yaml, self._secrets[spec.name], log, self.startup_timeout_s
            )
            self._pids[spec.name] = ray.get(call, timeout=self.startup_timeout_s)
        self._wait_answering([spec.name for spec in started])
        for node_id in set(self.launchers) - {p["node_id"] for p in self.placement.values()}:  # nothing left there
            with contextlib.suppress(ray.exceptions.RayError, ValueError):
                ray.kill(self.launchers.pop(node_id))
        logger.warning("Gym servers %s started again on %s", [spec.name for spec in started], node["ip"])

    def _wait_answering(self, names: list[str]) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        pending = set(names)
        while pending:
            pending = {name for name in pending if not self.watch.answers(self.url(name))}
            if pending and time.monotonic() > deadline:
                raise ServerStartError(f"{sorted(pending)} did not answer within {self.startup_timeout_s:g} s")
            time.sleep(0.2)

    def _place(self) -> dict[int, str]:
        """Reserve a bundle per server group (a placement group per role); group index -> the node holding it."""
        ray = self._ray
        bundle = {"CPU": 1} | ({self.cluster.gym_node_resource: 1} if self.cluster.gym_node_resource else {})
        _check_room(ray, bundle, len(self.groups))
        roles = sorted({group.role for group in self.groups})
        indices = {role: [i for i, group in enumerate(self.groups) if group.role == role] for role in roles}
        for role in roles:
            self._placement_groups.append(
                ray.util.placement_group([bundle] * len(indices[role]), strategy="SPREAD", name=f"gym_{role}")
            )
        try:
            ray.get([pg.ready() for pg in self._placement_groups], timeout=self.startup_timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise ServerStartError(
                f"the Ray cluster has no room for {len(self.groups)} Gym server bundles of {bundle} after "
                f"{self.startup_timeout_s:g} s (nodes: {_node_resources(ray)}); lower env.nemo_gym.agent_replicas / "
                "resources_replicas, or add nodes offering cluster.gym_node_resource"
            ) from None
        nodes = {}
        for role, pg in zip(roles, self._placement_groups, strict=True):
            table = ray.util.placement_group_table(pg)["bundles_to_node_id"]
            for bundle_index, group_index in enumerate(indices[role]):
                nodes[group_index] = table[bundle_index]
        return nodes

    def exited(self) -> list[ServerExit]:
        """Servers that exited, and every server of a launcher (node) that is gone."""
        if self._ray is None:
            return []
        exits = []
        for node_id, launcher in self.launchers.items():
            try:
                exits.extend(self._ray.get(launcher.exits.remote(), timeout=self.cluster.gym_health_timeout_s))
            except self._ray.exceptions.RayError:
                gone = [name for name, node in self.placement.items() if node["node_id"] == node_id]
                exits.extend(ServerExit(name, self._pids.get(name, -1), -9) for name in gone)
        return exits

    def copy_remote_log_tails(self, max_bytes: int = LOG_TAIL_BYTES) -> list[Path]:
        """Bring the servers' logs that live on other nodes' disks to this process's log folder: the last
        ``max_bytes`` of each, as ``<name>.from_<node ip>.log`` beside where the head expects it. A server whose
        file the head already sees (one box, a shared filesystem) is skipped; one whose node is gone cannot be read.
        Called by :meth:`stop` while the launchers live; the copies' paths."""
        if self._ray is None or not self._ray.is_initialized():
            return []
        copied = []
        for name, node in self.placement.items():
            launcher = self.launchers.get(node["node_id"])
            if launcher is None:
                continue
            path = Path(self.log_path(name))
            try:
                tail = self._ray.get(launcher.log_tail.remote(str(path), max_bytes), timeout=15)
            except self._ray.exceptions.RayError as e:
                logger.info("the log of %s on %s cannot be read (%s)", name, node["ip"], type(e).__name__)
                continue
            if tail is None or (path.exists() and [path.stat().st_dev, path.stat().st_ino] == tail["file"]):
                continue
            target = path.with_name(f"{path.stem}.from_{tail['ip']}.log")
            cut = f"[the last {len(tail['data'])} of {tail['size']} bytes of {path} on {tail['ip']}]\n".encode()
            target.write_bytes((cut if len(tail["data"]) < tail["size"] else b"") + tail["data"])
            copied.append(target)
        return copied

    def process_ids(self) -> list[int]:
        """Every process started for these servers: the servers and the fork servers (pids on their nodes)."""
        fork_servers = {node["fork_server_pid"] for node in self.placement.values()}
        return list(self._pids.values()) + sorted(fork_servers)

    def stop(self) -> None:
        """Stop every server, kill the launchers, remove the placement groups (idempotent; a lost node is skipped)."""
        if self.watch is not None:
            self.watch.stop()
        if self._renewer is not None:
            self._renewer.stop()
        ray = self._ray
        if ray is not None and ray.is_initialized():
            with contextlib.suppress(OSError):
                self.copy_remote_log_tails()  # before the launchers go: they read their nodes' disks
            stopping = [launcher.stop.remote() for launcher in self.launchers.values()]
            with contextlib.suppress(ray.exceptions.RayError):
                ray.wait(stopping, num_returns=len(stopping), timeout=15)
            for launcher in self.launchers.values():
                with contextlib.suppress(ray.exceptions.RayError, ValueError):
                    ray.kill(launcher)
            for pg in self._placement_groups:
                with contextlib.suppress(ray.exceptions.RayError, ValueError):
                    ray.util.remove_placement_group(pg)
        self.launchers, self._placement_groups = {}, []
        self._ray_stack.close()


def _check_room(ray: Any, bundle: dict[str, float], count: int) -> None:
    """Refuse at once a placement the whole cluster could never hold (Ray would wait for nodes forever)."""
    total = ray.cluster_resources()
    short = {key: amount * count for key, amount in bundle.items() if total.get(key, 0) < amount * count}
    if short:
        raise ServerStartError(
            f"the Ray cluster cannot hold {count} Gym server bundles of {bundle}: it has "
            f"{ {key: total.get(key, 0) for key in short} } in all, {short} are needed; start Gym nodes with "
            "ray start --resources='{\"<cluster.gym_node_resource>\": N}' (and CPUs), or lower "
            "env.nemo_gym.agent_replicas / resources_replicas"
        )


def _node_resources(ray: Any) -> str:
    alive = [node for node in ray.nodes() if node.get("Alive")]
    return "; ".join(f"{node['NodeManagerAddress']} {node['Resources']}" for node in alive) or "none alive"
