"""One call that brings up everything a tau2 rollout needs and takes it all down again.

``Tau2Environment`` starts the policy endpoint and the user-simulator endpoint (any generation backend), then the
four NeMo-Gym servers (resources, agent, a model server in front of each endpoint) on free ports on 127.0.0.1,
waits until every one answers, and stops them in reverse order on exit, Ctrl-C or error. The Gym servers' fork
server starts first, so their imports overlap the endpoints' start-up. Everything runs from the
project's environment. GRPO passes the policy endpoint it already serves (the weights being trained) instead of a
config.

With ``cluster.gym_placement=ray`` the Gym servers are placed on a Ray cluster instead
(:mod:`nemo_tau2.gym.ray_servers`): ``env.nemo_gym.agent_replicas`` agents, each with its own model servers, and
``resources_replicas`` resources servers, each bound to its node's address; ``agent_urls`` then lists every agent
replica, and the rollout spreads episodes over them.

(The step-by-step environment researchers drive themselves is ``nemo_tau2.env_api.Tau2Env``.)
"""

import logging
import os
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_tau2.cluster import ClusterConfig, ray_connection
from nemo_tau2.generation.config import GenerationConfig
from nemo_tau2.generation.launch import GenerationHandle, register_api_key, start_generation
from nemo_tau2.generation.validation import GymGenerationConfig
from nemo_tau2.gym.episode_config import CLUSTER_FOR_REPLICAS, EpisodeSettings, NemoGymEnvConfig, UserSimulatorConfig
from nemo_tau2.gym.fork_server import ForkServer
from nemo_tau2.gym.fork_template import fork_template_path
from nemo_tau2.gym.launch import FORK_SERVER_LOG, GymServers
from nemo_tau2.gym.ray_servers import RayGymServers
from nemo_tau2.gym.replica_health import AgentReplicas
from nemo_tau2.gym.stack import AGENT, ModelEndpoint, tau2_replicas, tau2_stack, tau2_stack_classes
from nemo_tau2.ray_output import RAY_LOG_FILE, ray_output_to
from nemo_tau2.tau2_release.config import Tau2ReleaseConfig

logger = logging.getLogger(__name__)


@contextmanager
def run_ray(
    cluster: ClusterConfig,
    gym: NemoGymEnvConfig,
    policy: GenerationConfig | None,
    *,
    trainer_cpus: int = 0,
    output_log: Path | None = None,
) -> Iterator[Any]:
    """The run's Ray (:func:`~nemo_tau2.cluster.ray_connection`); a local one gets at least a CPU for each trainer
    rank and each one-CPU bundle the run places (its Gym replicas, its policy's generation replicas), so that
    everything placed finds room. Opened once, first, by an eval (here) or a training run (``open_cluster``).
    With ``output_log``, Ray's own output (its workers', the cluster's error messages) goes there instead of the
    console (:func:`~nemo_tau2.ray_output.ray_output_to`)."""
    bundles = gym.agent_replicas + gym.resources_replicas if cluster.gym_placement == "ray" else 0
    if cluster.generation_placement == "ray" and policy is not None:
        bundles += policy.ray_replica_count(cluster)
    num_cpus = max(os.cpu_count() or 1, trainer_cpus + bundles)
    with (
        ray_connection(cluster, num_cpus=num_cpus) as ray,
        ray_output_to(output_log) if output_log is not None else nullcontext(),
    ):
        yield ray


@dataclass
class Tau2EnvironmentSpec:
    """What to start. ``policy`` is a generation config, or an endpoint that is already being served; ``user``
    None puts the user simulator on the policy's endpoint (NeMo-Gym's tau2 agent does so by default)."""

    policy: GenerationConfig | GenerationHandle
    user: UserSimulatorConfig | GenerationConfig | None  # a bare generation block: the user block's defaults
    domains: list[str]
    gym: NemoGymEnvConfig = field(default_factory=NemoGymEnvConfig)  # episode limits, server kinds, timeouts
    log_dir: str | Path | None = None
    cluster: ClusterConfig = field(default_factory=ClusterConfig)  # where the Gym servers run (gym_placement)
    tau2: Tau2ReleaseConfig = field(default_factory=Tau2ReleaseConfig)  # the release the resources server serves

    def __post_init__(self) -> None:  # the gym rules hold for every block that drives these servers
        if isinstance(self.policy, GenerationConfig) and not isinstance(self.policy, GymGenerationConfig):
            self.policy = GymGenerationConfig.model_validate(self.policy.model_dump(exclude_unset=True))
        self.user_on_policy_endpoint = self.user is None
        replicas = self.gym.agent_replicas * self.gym.resources_replicas
        if replicas > 1 and self.cluster.gym_placement != "ray":
            raise ValueError(CLUSTER_FOR_REPLICAS)
        if self.user is None:
            if not isinstance(self.policy, GenerationConfig):
                raise ValueError("user=None puts the user simulator on the policy's endpoint: give a policy config")
            self.user = UserSimulatorConfig(generation=self.policy.model_dump(exclude_unset=True))
        elif not isinstance(self.user, UserSimulatorConfig):
            self.user = UserSimulatorConfig(generation=self.user.model_dump(exclude_unset=True))

    def episode_settings(self) -> EpisodeSettings:
        """The agent server's episode settings: ``gym``'s limits played with ``user``."""
        return self.user.episode_settings(self.gym)


class Tau2Environment:
    """A context manager: ``with Tau2Environment(spec) as env: env.agent_urls``."""

    def __init__(self, spec: Tau2EnvironmentSpec):
        self.spec = spec
        self._stack = ExitStack()
        self.policy: GenerationHandle | None = None
        self.user: GenerationHandle | None = None
        self.servers: GymServers | None = None

    @property
    def agent_urls(self) -> dict[str, AgentReplicas]:
        """agent name (rows' ``agent_ref.name``) -> the URLs of its replicas (their ``/run``), with their health and
        their episodes' wall-clock limit (what the rollout bounds each episode by)."""
        urls = self.servers.replica_urls(AGENT)
        limit = self.spec.gym.episode_limit_s()
        return {AGENT: AgentReplicas(urls, self.servers.health, limit, getattr(self.servers, "run_id", None))}

    def start(self) -> "Tau2Environment":
        try:
            gym = self.spec.gym
            for generation in (self.spec.policy, self.spec.user.generation):
                if isinstance(generation, GenerationConfig):
                    register_api_key(generation)  # before any process starts: none may inherit the key
            log_dir = Path(self.spec.log_dir or tempfile.mkdtemp(prefix="nemo_tau2_servers_"))
            cluster = self.spec.cluster
            if "ray" in (cluster.gym_placement, cluster.generation_placement):  # one Ray, sized for all it holds
                policy = self.spec.policy if isinstance(self.spec.policy, GenerationConfig) else None
                self._stack.enter_context(run_ray(cluster, gym, policy, output_log=log_dir / RAY_LOG_FILE))
            on_ray = cluster.gym_placement == "ray"
            fork_server = None  # local servers: started first, so that its imports overlap the endpoints' start
            if not on_ray:
                fork_server = ForkServer(
                    tau2_stack_classes(gym.policy_model_server, gym.user_model_server),
                    log_dir / FORK_SERVER_LOG,
                    template=fork_template_path(),
                )
                self._stack.callback(fork_server.stop)  # until the servers own it (stopping twice is harmless)
            if isinstance(self.spec.policy, GenerationHandle):
                self.policy = self.spec.policy  # owned by the caller
            else:
                self.policy = self._stack.enter_context(
                    start_generation(self.spec.policy, cluster=self.spec.cluster, log_dir=log_dir)
                )
            if self.spec.user_on_policy_endpoint:
                self.user = self.policy
            else:
                self.user = self._stack.enter_context(
                    start_generation(self.spec.user.generation, log_dir=log_dir / "user")
                )
            kwargs = gym.policy_chat_template_kwargs
            template_kwargs = {"chat_template_kwargs": kwargs} if kwargs else {}
            fast = gym.policy_model_server == "fast_vllm_model"
            routing = {"replica_routing": gym.replica_routing} if fast else {}
            specs = tau2_stack(
                ModelEndpoint(
                    self.policy.base_urls,
                    self.policy.model_name,
                    self.policy.api_key,
                    server=gym.policy_model_server,
                    return_token_ids=gym.return_token_ids,
                    extra=template_kwargs | routing,
                ),
                ModelEndpoint(
                    self.user.base_urls,
                    self.user.model_name,
                    self.user.api_key,
                    server=gym.user_model_server,
                    # the same model when the user shares the policy's endpoint: the same template arguments
                    extra=template_kwargs
                    if self.spec.user_on_policy_endpoint and gym.user_model_server != "openai_model"
                    else {},
                ),
                domains=self.spec.domains,
                # The server process reads its config from YAML: the one schema, dumped whole at that boundary.
                agent_config=self.spec.episode_settings().model_dump(mode="json", exclude_unset=True),
                resources_config={
                    "session_idle_timeout_s": gym.session_idle_timeout_s,
                    "tau2": self.spec.tau2.model_dump(mode="json"),  # the one schema, whole, as the agent's
                },
            )
            if on_ray:
                groups = tau2_replicas(specs, gym.agent_replicas, gym.resources_replicas)
                servers = RayGymServers(
                    groups, self.spec.cluster, log_dir=log_dir, startup_timeout_s=gym.server_startup_timeout_s
                )
            else:
                servers = GymServers(
                    specs, log_dir=log_dir, startup_timeout_s=gym.server_startup_timeout_s, fork_server=fork_server
                )
            self.servers = self._stack.enter_context(servers)
            logger.info(
                "tau2 environment up: agent at %s, server logs in %s",
                ", ".join(self.agent_urls[AGENT]),
                self.servers.log_dir,
            )
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        self._stack.close()

    def __enter__(self) -> "Tau2Environment":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
