"""``cluster``: the machines a run uses (NeMo-RL's keys), and the one way this project joins or starts Ray.

``num_nodes`` and ``gpus_per_node`` are NeMo-RL's. ``ray_address`` says where Ray runs: null starts a local Ray for
the run (a single box is a one-node cluster) and stops it afterwards; ``auto`` or ``host:port`` (what
``ray start --head`` prints) connects to a running cluster and leaves it running. ``gym_placement`` says where the
Gym servers run: ``local`` forks them on this machine (one of each), ``ray`` places them on the cluster's nodes as
Ray actors (:mod:`nemo_tau2.gym.ray_servers`), ``env.nemo_gym.{agent,resources}_replicas`` of them, on the nodes
that offer ``gym_node_resource``. ``generation_placement`` says the same of the policy's generation replicas:
``local`` starts them on this machine, ``ray`` places each on a node offering a GPU (vLLM on CUDA) and
``generation_node_resource`` (:mod:`nemo_tau2.generation.ray_replicas`).
"""

import logging
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

logger = logging.getLogger(__name__)

_ADDRESS = re.compile(r"^(auto|(ray://)?[A-Za-z0-9_.\-\[\]:]+:\d{1,5})$")


class ClusterConfig(BaseModel):
    """``cluster`` (NeMo-RL's keys, the Ray address, where the Gym servers run, the GPU memory the plan checks)."""

    model_config = ConfigDict(extra="forbid")

    gpus_per_node: int | None = Field(default=None, ge=1, description="GPUs per node; null: not checked.")
    num_nodes: int = Field(default=1, ge=1)
    gpu_memory_gb: float = Field(
        default=80.0, gt=0, description="Memory of one GPU for the plan, when no GPU is visible to this process."
    )
    ray_address: str | None = Field(
        default=None,
        description="null: start a local Ray for this run; 'auto' or 'host:port' (ray start --head prints it): "
        "connect to that running cluster.",
    )
    gym_placement: Literal["local", "ray"] = Field(
        default="local",
        description="local: the Gym servers are forked on this machine, one of each; ray: Ray actors start them "
        "on the cluster's nodes (env.nemo_gym.agent_replicas / resources_replicas of them).",
    )
    gym_node_resource: str | None = Field(
        default=None,
        description="gym_placement=ray: the custom Ray resource that marks the nodes Gym servers may run on "
        "(ray start --resources='{\"gym_cpu\": 64}' on CPU nodes keeps them off the GPU nodes); null: any node.",
    )

    generation_placement: Literal["local", "ray"] = Field(
        default="local",
        description="local: the policy's generation replicas run on this machine; ray: each is a Ray-placed process "
        "on a node with room for it (its GPUs; cluster.generation_node_resource), reporting its URL back.",
    )
    generation_node_resource: str | None = Field(
        default=None,
        description="generation_placement=ray: the custom Ray resource that marks the nodes generation replicas may "
        "run on (ray start --resources='{\"generation\": 8}'); null: any node with the replica's GPUs.",
    )
    generation_replicas: int | None = Field(
        default=None,
        ge=1,
        description="generation_placement=ray, backends other than vllm (hf, llamacpp): how many replicas; null: 1. "
        "vLLM's count is policy.generation.vllm_cfg.data_parallel_size.",
    )
    generation_replica_restarts: int = Field(
        default=0,
        ge=0,
        description="generation_placement=ray: how many times a lost replica (its server died, its node left) is "
        "restarted on its bundle, same URL, latest weights; once used up (0: at once) a lost replica is dropped and "
        "the run goes on with the others.",
    )

    gym_health_interval_s: float = Field(
        default=2.0,
        gt=0,
        le=60,
        allow_inf_nan=False,
        description="gym_placement=ray: how often the head checks each Gym server (its node alive in Ray, its "
        "launcher actor answering, GET / answering).",
    )
    gym_health_timeout_s: float = Field(
        default=5.0, gt=0, le=60, allow_inf_nan=False, description="gym_placement=ray: the wait for one health probe."
    )
    gym_health_failures: int = Field(
        default=3,
        ge=1,
        le=20,
        description="gym_placement=ray: health probes failed in a row before a Gym server is declared lost (a dead "
        "node or launcher is lost at once); its in-flight episodes then end as infrastructure errors with the cause.",
    )
    gym_server_restarts: int = Field(
        default=0,
        ge=0,
        description="gym_placement=ray: how many times a lost Gym server (with the servers that depend on it: an "
        "agent and its model servers, a resources replica and its failure domain's agents) is started again, on its "
        "node if its launcher answers, else on a live Gym node; once used up (0: at once) it is dropped and new "
        "episodes go to the live replicas.",
    )
    lease_timeout_s: float = Field(
        default=60.0,
        gt=0,
        le=3600,
        allow_inf_nan=False,
        description="Ray placement: every process a run starts on a node (launcher, fork server, Gym servers) ends "
        "itself, with its children, this long after the head last renewed its node's lease (a node stopped or cut "
        "off that comes back, a head killed with -9, a run that ended while the node was unreachable); at least the "
        "watcher's detection time, gym_health_failures x (gym_health_interval_s + gym_health_timeout_s).",
    )
    gym_failure_domain: str | None = Field(
        default=None,
        description="gym_placement=ray: the Ray node label whose value names a failure domain (ray start "
        '--labels=\'{"rack": "r1"}\'); an agent uses the resources replicas of its own domain. null: its node.',
    )

    @property
    def gym_detection_s(self) -> float:
        """The longest the watcher takes to declare a silent Gym server lost: its probes failed in a row."""
        return self.gym_health_failures * (self.gym_health_interval_s + self.gym_health_timeout_s)

    @model_validator(mode="after")
    def _probes_fit_the_interval_bound(self) -> "ClusterConfig":
        detection = self.gym_detection_s
        if detection > 300:
            raise ValueError(
                f"gym_health_failures x (gym_health_interval_s + gym_health_timeout_s) = {detection:g} s: a silent "
                "Gym server would hold its episodes that long; keep it under 300 s"
            )
        if self.lease_timeout_s < detection:
            raise ValueError(
                f"cluster.lease_timeout_s={self.lease_timeout_s:g} is shorter than the watcher's detection time "
                f"({detection:g} s): a slow node would end its servers before the head declares them lost; set it "
                f"to {3 * detection:g} (3x) or more"
            )
        return self

    @field_validator("ray_address")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        if value is not None and not _ADDRESS.match(value):
            raise ValueError(
                f"{value!r} is not a Ray address; set cluster.ray_address=auto (the cluster this machine joined), "
                "host:port as 'ray start --head' prints it, or null for a local Ray"
            )
        return value

    @field_validator("gym_node_resource", "generation_node_resource")
    @classmethod
    def _resource_name(cls, value: str | None, info: Any) -> str | None:
        if value is not None and (value in ("CPU", "GPU", "memory") or not re.fullmatch(r"[A-Za-z_][\w.\-]*", value)):
            example = "gym_cpu" if info.field_name == "gym_node_resource" else "generation"
            raise ValueError(
                f"{value!r} cannot mark nodes; set cluster.{info.field_name} to a custom resource name such as "
                f"{example} (ray start --resources='{{\"{example}\": 64}}'), or null"
            )
        return value


def import_ray() -> Any:
    """Ray, with its `uv run` worker hook off unless the user turned it on (see ``nemo_tau2/__init__.py``)."""
    import ray
    import ray._private.ray_constants as ray_constants

    if os.environ.get("RAY_ENABLE_UV_RUN_RUNTIME_ENV") == "0" and ray_constants.RAY_ENABLE_UV_RUN_RUNTIME_ENV:
        # Ray was imported before nemo_tau2 and read the default; ray.init reads this flag at call time.
        ray_constants.RAY_ENABLE_UV_RUN_RUNTIME_ENV = False
    return ray


@contextmanager
def ray_connection(cluster: ClusterConfig, **local_init_kwargs: Any) -> Iterator[Any]:
    """Ray for the duration of the block: the one this process already joined, else ``cluster.ray_address``'s,
    else a local one started here (with ``local_init_kwargs``) and stopped at the end. Yields the ``ray`` module.

    Opened once by a run before anything that uses Ray (see ``training_setup.open_cluster``), every later user (the
    trainer's workers, the Gym servers) finds it joined and places its actors on that one cluster."""
    ray = import_ray()
    owned = not ray.is_initialized()
    if owned:
        kwargs: dict[str, Any] = {"include_dashboard": False, "configure_logging": False}
        # null means a Ray of this run's own: Ray's default would join whatever cluster this machine started last
        # (and refuse the local sizing); inside a Ray job, RAY_ADDRESS says which cluster is the run's
        address = cluster.ray_address or os.environ.get("RAY_ADDRESS") or "local"
        if address == "local":
            kwargs |= local_init_kwargs
        ray.init(address=address, **kwargs)
        logger.info("Ray: %s", "started locally" if address == "local" else f"joined {address}")
    try:
        yield ray
    finally:
        if owned and ray.is_initialized():
            ray.shutdown()
