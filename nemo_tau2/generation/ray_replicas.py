"""Generation replicas as Ray-placed processes (``cluster.generation_placement: ray``).

Placement is Ray's. The replicas are one placement group, a bundle per replica, strategy ``SPREAD`` (a node lost
takes as few replicas with it as the cluster allows): ``{"GPU": tensor_parallel_size, "CPU": 1}`` for vLLM on
CUDA (Ray then sets the replica's ``CUDA_VISIBLE_DEVICES``), ``{"CPU": 1}`` otherwise, plus one unit of
``cluster.generation_node_resource`` when set, so that only the nodes offering it can hold one. Each bundle holds
one :class:`GenerationReplica` actor, which starts one replica of ``policy.generation`` on its node through the
starter it is given (:func:`~nemo_tau2.generation.launch.start_generation`, the one every local run uses), bound to
the node's address, and reports its URL back: the head's handle lists every replica's URL, as a local run's does.
What a replica runs, and the handle around them, belong to ``launch.py``, which calls this module (never back).

Weights: ``update_weights(checkpoint_dir=...)`` reaches every replica on every node. Each replica reloads the folder
the trainer wrote, so that folder (under ``checkpointing.checkpoint_dir``) must be on a filesystem every generation
node mounts; a replica that cannot see it refuses the update naming its node, before any replica loads anything.

Faults: a watcher thread asks each replica for its health every ``HEALTH_INTERVAL_S``. A replica whose server died
(refused, or ``HEALTH_MISSES`` probes in a row unanswered: one slow answer on a busy machine is no death), or whose
actor or node is gone, is restarted on its bundle (same port, which it waits a minute for; the latest weights
loaded) while ``cluster.generation_replica_restarts`` allows, else dropped: its URL leaves ``base_urls`` (weight
updates skip it) and the Gym model servers' routers send its sessions elsewhere once it stops answering.

Logs: with a log folder (a run's ``server_logs/``) each replica's server logs into a folder of its own on its node
(vLLM: ``vllm_replica0.log``); the head appends its last ``LOG_TAIL_BYTES`` to ``<server_logs>/<backend>_replica<i>``
``.log`` (``i``: its index on the head) and removes the node's folder, when the run stops and when a replica is lost
while its node answers. A zero-CPU task pinned to the node reads it (a dead actor's too); a node gone keeps it.

Lifetimes: a replica's processes die with its actor (``PR_SET_PDEATHSIG``), Ray ends the actors of a driver that
exits, and a replica the head stops renewing ends itself (:mod:`nemo_tau2.lease`).
"""

import contextlib
import logging
import os
import tempfile
import threading
import urllib.request
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from nemo_tau2.cluster import ClusterConfig, import_ray, ray_connection
from nemo_tau2.generation.config import GenerationConfig
from nemo_tau2.generation.errors import GenerationStartupError, WeightUpdateError
from nemo_tau2.generation.replica_logs import head_log_name, read_log_tails
from nemo_tau2.generation.serving import bind_socket, kill_managed_processes
from nemo_tau2.lease import LeaseRenewer, end_process, hold_lease

logger = logging.getLogger(__name__)

HEALTH_INTERVAL_S = 2.0
HEALTH_MISSES = 3  # probes in a row a replica may leave unanswered (5 s each); a refused one loses it at once
LOG_TAIL_BYTES = 4 * 1024**2
"""How much of a replica's log (its end) the head copies back: a vLLM log that ran for days stays on its node."""
LOG_FETCH_TIMEOUT_S = 30.0
_HOST_BLOCKS = {"vllm": "vllm_cfg", "hf": "hf_cfg", "llamacpp": "llamacpp_cfg"}
_PORT_KEYS = {"vllm_cfg": "base_port", "hf_cfg": "port", "llamacpp_cfg": "port", "fake_cfg": "port"}


def replica_bundle(cfg: GenerationConfig, cluster: ClusterConfig) -> dict[str, float]:
    """The resources one replica reserves (see the module docstring)."""
    bundle: dict[str, float] = {"CPU": 1}
    block = cfg.backend_block if cfg.backend in ("vllm", "hf") else None
    if cfg.backend == "vllm" and block.device == "cuda":
        bundle["GPU"] = block.tensor_parallel_size
    elif cfg.backend == "hf" and block.device.startswith("cuda"):
        bundle["GPU"] = 1
    if cluster.generation_node_resource:
        bundle[cluster.generation_node_resource] = 1
    return bundle


def replica_config(cfg: GenerationConfig, index: int, host: str, port: int | None = None) -> GenerationConfig:
    """``cfg`` as one replica on a node: one server (vLLM: data-parallel size 1), bound to ``host``; ``port`` (a
    restart keeps its URL), else the configured port + ``index``, else a free one."""
    data = cfg.model_dump(exclude_unset=True)
    block = "fake_cfg" if cfg.backend == "fake" else _HOST_BLOCKS[cfg.backend]
    settings = dict(data.get(block) or {})
    settings["host"] = host
    configured = settings.get(_PORT_KEYS[block])
    if port is not None or configured:
        settings[_PORT_KEYS[block]] = port if port is not None else configured + index
    if block == "vllm_cfg":
        settings["data_parallel_size"] = 1
    return GenerationConfig.model_validate(data | {block: settings})


class GenerationReplica:
    """On one node (a Ray actor): one replica of ``policy.generation``, started by ``start_replica`` (the local
    launcher: ``GenerationConfig`` and ``log_dir`` -> a handle with ``base_urls``, ``update_weights`` and
    ``shutdown``); ``keep_log``: its server logs into a folder of its own on this node, which the head reads."""

    def __init__(
        self,
        cfg_data: dict[str, Any],
        index: int,
        port: int | None,
        omp_threads: str | None,
        start_replica: Callable[..., Any],
        keep_log: bool,
        lease: tuple[str, float],
    ) -> None:
        # Ray sets OMP_NUM_THREADS to the CPUs an actor reserved (1 here); an engine sizes its own threads (vLLM's
        # CPU build, llama.cpp, torch): it gets the head's setting, else none, as a local replica does
        os.environ.pop("OMP_NUM_THREADS", None)
        if omp_threads is not None:
            os.environ["OMP_NUM_THREADS"] = omp_threads
        ray = import_ray()
        self.node_id = ray.get_runtime_context().get_node_id()
        self.ip = ray.util.get_node_ip_address()
        cfg = GenerationConfig.model_validate(cfg_data)
        self.log_dir = tempfile.mkdtemp(prefix=f"nemo_tau2_generation_replica{index}_") if keep_log else None
        log_dir = None if self.log_dir is None else Path(self.log_dir)
        if port is not None:  # a restart at its URL: the lost server's process may still be going away
            bind_socket(self.ip, port, key=f"generation replica {index}", wait_s=60.0).close()
        self.handle = start_replica(replica_config(cfg, index, self.ip, port), log_dir=log_dir)
        (self.base_url,) = self.handle.base_urls
        run_id, timeout_s = lease  # the head renews it from now on; unrenewed, the replica ends itself
        self.lease = hold_lease(f"{run_id}_generation{index}_{self.node_id[:12]}", timeout_s, _end_replica)

    def renew(self, sent_at: float) -> float:
        return self.lease.renew(sent_at)

    def where(self) -> dict[str, Any]:
        return {
            "node_id": self.node_id, "ip": self.ip, "base_url": self.base_url, "pid": os.getpid(),
            "log_dir": self.log_dir,
        }  # fmt: skip

    def health(self) -> str:
        """ "ok", "slow" (no answer within 5 s) or "down"."""
        try:
            with urllib.request.urlopen(self.base_url.removesuffix("/v1") + "/health", timeout=5) as response:
                return "ok" if response.status == 200 else "down"
        except OSError as e:  # a read timeout is a TimeoutError, a connect timeout a URLError around one
            return "slow" if TimeoutError in (type(e), type(getattr(e, "reason", None))) else "down"

    def can_read(self, checkpoint_dir: str) -> bool:
        return os.path.isdir(checkpoint_dir)

    def update_weights(self, checkpoint_dir: str, weight_version: int | None, recompute_kv_cache: bool) -> int:
        return self.handle.update_weights(
            checkpoint_dir=checkpoint_dir, weight_version=weight_version, recompute_kv_cache=recompute_kv_cache
        )

    def stop(self) -> None:
        self.handle.shutdown()
        self.lease.release()


def _end_replica() -> None:
    kill_managed_processes()
    end_process()  # not its group: a Ray worker's is the raylet's


class RayGeneration:
    """The head's side: the placement group, one actor per replica, the watcher, weight updates to all of them."""

    def __init__(
        self,
        cfg: GenerationConfig,
        cluster: ClusterConfig,
        start_replica: Callable[..., Any],
        log_dir: Path | None = None,
    ) -> None:
        problems = cfg.ray_placement_problems(cluster)
        if problems:
            raise GenerationStartupError("; ".join(problems))
        data = cfg.model_dump(exclude_unset=True)
        if cfg.model_name and os.path.isdir(cfg.model_name):  # a replica's working directory is not ours
            data["model_name"] = os.path.abspath(cfg.model_name)
        self.cfg, self.cluster, self._data, self._start_replica = cfg, cluster, data, start_replica
        self.log_dir = log_dir  # the head's folder for the replicas' logs (None: each node's log is temporary)
        self._claimed: set[str | None] = {None}  # node log folders already brought back (None: a replica keeps none)
        self._claim_lock = threading.Lock()
        self.count = cfg.ray_replica_count(cluster)
        self.bundle = replica_bundle(cfg, cluster)
        self.base_urls: list[str] = []  # shared with the handle: a dropped replica leaves it
        self.replicas: list[dict[str, Any] | None] = []  # index -> actor, node, URL, restarts (None: dropped)
        self.lost: list[dict[str, Any]] = []
        self._lock = threading.RLock()  # one of: a weight update, a restart
        self._last_update: tuple[str, int | None] | None = None
        self._stopping = threading.Event()
        self._ray_stack = ExitStack()
        self._group: Any = None
        self._watcher: threading.Thread | None = None
        self.run_id = uuid.uuid4().hex
        self._starting: list[Any] = []  # the replicas' actors while they start: each holds its lease once up
        self._renewer = LeaseRenewer(
            cluster.lease_timeout_s, lambda: [r["actor"] for r in self.replicas if r] or list(self._starting)
        )

    def start(self) -> "RayGeneration":
        ray = self._ray = self._ray_stack.enter_context(ray_connection(self.cluster))
        try:
            self._check_room()
            self._group = ray.util.placement_group([self.bundle] * self.count, strategy="SPREAD", name="generation")
            timeout = self._startup_timeout_s()
            try:
                ray.get(self._group.ready(), timeout=timeout)
            except ray.exceptions.GetTimeoutError:
                raise GenerationStartupError(
                    f"the Ray cluster has no room for {self.count} generation replicas of {self.bundle} after "
                    f"{timeout:g} s; free GPUs, add nodes offering cluster.generation_node_resource, or lower the "
                    "replica count"
                ) from None
            actors = self._starting = [self._actor(index, port=None) for index in range(self.count)]
            # renewed from now on: a replica up first holds its lease while the others still start (minutes for
            # an engine), which would otherwise run out before the first renewal
            self._renewer.start()
            reports = self._reports(actors, timeout)
            for index, (actor, report) in enumerate(zip(actors, reports, strict=True)):
                self.replicas.append({"actor": actor, "restarts": 0} | report)
                self.base_urls.append(report["base_url"])
                node, url = report["node_id"][:12], report["base_url"]
                logger.info("generation replica %d on node %s at %s", index, node, url)
            self._starting = []
        except BaseException:
            self.stop()
            raise
        self._watcher = threading.Thread(target=self._watch, name="nemo-tau2-generation-watch", daemon=True)
        self._watcher.start()
        return self

    def _startup_timeout_s(self) -> float:
        block = self.cfg.backend_block if self.cfg.backend in _HOST_BLOCKS else None
        return float(getattr(block, "startup_timeout_s", 300.0))

    def _check_room(self) -> None:
        total = self._ray.cluster_resources()
        short = {k: v * self.count for k, v in self.bundle.items() if total.get(k, 0) < v * self.count}
        if short:
            raise GenerationStartupError(
                f"the Ray cluster cannot hold {self.count} generation replicas of {self.bundle}: it has "
                f"{ {k: total.get(k, 0) for k in short} } in all, {short} are needed; add GPU nodes (or nodes "
                "offering cluster.generation_node_resource), or lower the replica count"
            )

    def _actor(self, index: int, port: int | None) -> Any:
        ray = self._ray
        strategy = ray.util.scheduling_strategies.PlacementGroupSchedulingStrategy(
            self._group, placement_group_bundle_index=index
        )
        custom = {k: v for k, v in self.bundle.items() if k not in ("CPU", "GPU")}
        remote = ray.remote(max_restarts=0, concurrency_groups={"lease": 1})(GenerationReplica)
        return remote.options(
            num_cpus=self.bundle["CPU"], num_gpus=self.bundle.get("GPU", 0), resources=custom,
            scheduling_strategy=strategy, name=None,
        ).remote(
            self._data, index, port, os.environ.get("OMP_NUM_THREADS"), self._start_replica, self.log_dir is not None,
            (self.run_id, self.cluster.lease_timeout_s),
        )  # fmt: skip

    def _collect_logs(self, replicas: list[tuple[int, dict[str, Any]]]) -> None:
        """Bring the tails of these replicas' logs from their nodes to ``log_dir`` (their actors stopped)."""
        ray = self._ray
        with self._claim_lock:  # a replica lost while the run stops: the watcher and stop() may both ask
            wanted = [(i, r) for i, r in replicas if r.get("log_dir") not in self._claimed]
            self._claimed.update(r["log_dir"] for _, r in wanted)
        if not wanted or self.log_dir is None:
            return
        read = ray.remote(num_cpus=0, max_retries=0)(read_log_tails)
        tasks = []
        for _, replica in wanted:
            node = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(replica["node_id"], soft=False)
            tasks.append(read.options(scheduling_strategy=node).remote(replica["log_dir"], LOG_TAIL_BYTES))
        Path(self.log_dir).mkdir(parents=True, exist_ok=True)
        for (index, replica), task in zip(wanted, tasks, strict=True):
            try:
                tails = ray.get(task, timeout=LOG_FETCH_TIMEOUT_S)
            except ray.exceptions.RayError as e:
                with contextlib.suppress(ray.exceptions.RayError, ValueError, TypeError):
                    ray.cancel(task, force=True)
                logger.warning(
                    "generation replica %d's log stays on node %s at %s (%s)",
                    index, replica["ip"], replica["log_dir"], type(e).__name__,
                )  # fmt: skip
                continue
            for name, tail in tails.items():
                with open(Path(self.log_dir) / head_log_name(name, index), "ab") as f:
                    f.write(tail)

    def _reports(self, actors: list[Any], timeout: float) -> list[dict[str, Any]]:
        ray = self._ray
        try:
            return ray.get([actor.where.remote() for actor in actors], timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise GenerationStartupError(f"generation replicas did not start within {timeout:g} s") from None
        except ray.exceptions.RayError as e:
            cause = getattr(e, "cause", None) or e  # an actor's error: the original, not Ray's traceback
            raise GenerationStartupError(f"a generation replica could not start on the Ray cluster: {cause}") from None

    def update_weights(self, checkpoint_dir: str, weight_version: int | None, recompute_kv_cache: bool) -> int:
        """Every live replica loads the folder. Refused before any loads if a replica's node cannot read it; the
        first replica loads alone, so that a folder its backend refuses (wrong tensors: nothing sent) leaves every
        replica on the old weights; a failure after that stops them all (none may serve mixed weights)."""
        ray = self._ray
        path = os.path.abspath(checkpoint_dir)
        with self._lock:
            live = [(i, r) for i, r in enumerate(self.replicas) if r is not None]
            seen = ray.get([r["actor"].can_read.remote(path) for _, r in live])
            blind = [r["ip"] for (_, r), ok in zip(live, seen, strict=True) if not ok]
            if blind:
                raise WeightUpdateError(
                    f"{path} cannot be read on the generation node(s) {', '.join(sorted(set(blind)))}: put "
                    "checkpointing.checkpoint_dir on a filesystem every node mounts; the previous weights keep serving"
                )
            versions: list[int] = []
            for first, batch in ((True, live[:1]), (False, live[1:])):
                calls = [r["actor"].update_weights.remote(path, weight_version, recompute_kv_cache) for _, r in batch]
                for (index, _), call in zip(batch, calls, strict=True):
                    try:
                        versions.append(ray.get(call))
                    except ray.exceptions.RayActorError:  # gone while loading: a lost replica, not a bad load
                        self._replace(index, "its actor died during a weight update")
                    except ray.exceptions.RayTaskError as e:
                        if not first:
                            self.stop()
                        raise (getattr(e, "cause", None) or e) from None
            version = versions[0] if versions else int(weight_version or 0)
            self._last_update = (path, version)
            return version

    def _watch(self) -> None:
        ray = self._ray
        while not self._stopping.wait(HEALTH_INTERVAL_S):
            for index, replica in enumerate(list(self.replicas)):
                if replica is None or self._stopping.is_set():
                    continue
                reason = None
                try:
                    health = ray.get(replica["actor"].health.remote(), timeout=30)
                    replica["slow_probes"] = replica.get("slow_probes", 0) + 1 if health == "slow" else 0
                    replica["probes"] = replica.get("probes", 0) + 1  # a fresh answer can be told from an old one
                    if health == "down" or replica["slow_probes"] >= HEALTH_MISSES:
                        misses = f", {replica['slow_probes']} probes in a row" if health == "slow" else ""
                        reason = f"its server stopped answering /health ({health}{misses})"
                except ray.exceptions.GetTimeoutError:
                    reason = "its actor did not answer for 30 s"
                except ray.exceptions.RayError:
                    reason = "its actor or node is gone"
                if reason is not None:
                    with self._lock:  # stop() may have emptied the list meanwhile
                        live = not self._stopping.is_set() and index < len(self.replicas)
                        if live and self.replicas[index] is replica:
                            self._replace(index, reason)

    def _replace(self, index: int, reason: str) -> None:
        """Restart replica ``index`` on its bundle (same port, latest weights) if allowed, else drop it."""
        ray, replica = self._ray, self.replicas[index]
        assert replica is not None
        with contextlib.suppress(ray.exceptions.RayError, ValueError):
            ray.kill(replica["actor"])
        self._collect_logs([(index, replica)])  # before its restart logs to the same file
        self.lost.append({"index": index, "node_id": replica["node_id"], "base_url": replica["base_url"]})
        if replica["restarts"] < self.cluster.generation_replica_restarts:
            logger.warning("generation replica %d at %s lost (%s): restarting it", index, replica["base_url"], reason)
            actor = None
            try:
                port = int(replica["base_url"].removesuffix("/v1").rsplit(":", 1)[1])
                actor = self._actor(index, port)
                report = self._reports([actor], self._startup_timeout_s())[0]
                if self._last_update is not None:
                    path, version = self._last_update
                    ray.get(actor.update_weights.remote(path, version, True))
                if report["base_url"] == replica["base_url"]:
                    self.replicas[index] = {"actor": actor, "restarts": replica["restarts"] + 1} | report
                    return
                ray.kill(actor)  # moved to another node: the Gym model servers only know the old URL
                reason += f"; its restart came up at {report['base_url']}, not its URL"
            except (GenerationStartupError, ray.exceptions.RayError) as e:
                reason += f"; its restart failed: {e}"
                if actor is not None:
                    with contextlib.suppress(ray.exceptions.RayError, ValueError):
                        ray.kill(actor)
        logger.warning("generation replica %d at %s dropped (%s)", index, replica["base_url"], reason)
        self.replicas[index] = None
        with contextlib.suppress(ValueError):
            self.base_urls.remove(replica["base_url"])

    def stop(self) -> None:
        """Stop every replica, remove the placement group, leave Ray (idempotent)."""
        self._stopping.set()
        self._renewer.stop()
        ray = getattr(self, "_ray", None)
        if ray is not None and ray.is_initialized():
            live = [(index, r) for index, r in enumerate(self.replicas) if r is not None]
            actors = [r["actor"] for _, r in live]
            with contextlib.suppress(ray.exceptions.RayError):
                ray.wait([a.stop.remote() for a in actors], num_returns=len(actors), timeout=60)
            for actor in actors:
                with contextlib.suppress(ray.exceptions.RayError, ValueError):
                    ray.kill(actor)
            self._collect_logs(live)
            if self._group is not None:
                with contextlib.suppress(ray.exceptions.RayError, ValueError):
                    ray.util.remove_placement_group(self._group)
        self.replicas, self._group = [], None
        self._ray_stack.close()
