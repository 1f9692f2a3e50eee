"""How many Gym server replicas a run's generation throughput needs: the capacity section of ``--plan``.

Generation produces policy turns at ``GPUs x tokens/s per GPU / tokens per turn``; each policy turn costs the Gym
servers CPU (measured by ``bench/rollout_scaling.py``). A replica is planned as the one CPU its Ray bundle reserves
(:mod:`nemo_tau2.gym.ray_servers`): an agent replica (the agent and its policy and user model servers) carries
``1 / cpu_s_per_turn`` turns/s, and so does a resources replica with its own figure. Fewer replicas than that and
the GPUs wait on our CPU.
"""

import math
from dataclasses import dataclass
from typing import Any

CPU_S_PER_POLICY_TURN = {"agent": 0.00581, "resources": 0.00240}
"""CPU seconds per policy turn of one agent replica (agent 2.57 ms + its policy and user model servers 3.24 ms) and of
one resources replica (2.40 ms), measured by ``bench/rollout_scaling.py`` at one replica (BENCHMARKS.md, "Rollout
scaling on Ray", 2026-11-26, the 2-core box, fake engine at 0 ms). The one place these constants live."""

GENERATION_TOKENS_PER_S_PER_GPU = 10_000.0
"""Tokens/s one vLLM GPU serves for Qwen3-4B (bf16, H100, many concurrent episodes, prefix caching): a stated
assumption, not measured in this project (BENCHMARKS.md's GPU table has no vLLM row yet); measure yours and pass
it to the benchmark."""

TOKENS_PER_POLICY_TURN = 135.0
"""Tokens a policy turn adds to the sequence (its reply, the tool results and user message that follow; the prompt
before it is a prefix-cache hit): ``bench/data/tau2_test_episode_lengths.json`` (``bench/tau2_episode_lengths.py``),
mean of (total - first prompt) / policy turns over the test split, 511 bytes, / 3.8 bytes per BPE token."""


@dataclass(frozen=True)
class GymCapacity:
    """The capacity plan: what generation produces, what the configured replicas carry, what is needed."""

    generation_gpus: int
    policy_turns_per_s: float
    agent_replicas: int
    resources_replicas: int
    agent_turns_per_s_per_replica: float
    resources_turns_per_s_per_replica: float

    @property
    def agent_replicas_needed(self) -> int:
        return max(1, math.ceil(self.policy_turns_per_s / self.agent_turns_per_s_per_replica))

    @property
    def resources_replicas_needed(self) -> int:
        return max(1, math.ceil(self.policy_turns_per_s / self.resources_turns_per_s_per_replica))

    @property
    def warnings(self) -> list[str]:
        short = []
        for role, have, need, each in (
            ("agent", self.agent_replicas, self.agent_replicas_needed, self.agent_turns_per_s_per_replica),
            (
                "resources",
                self.resources_replicas,
                self.resources_replicas_needed,
                self.resources_turns_per_s_per_replica,
            ),
        ):
            if have < need:
                short.append(
                    f"warning: {have} {role} replica(s) carry {have * each:.0f} of the "
                    f"{self.policy_turns_per_s:.0f} policy turns/s generation produces; set "
                    f"env.nemo_gym.{role}_replicas={need} (cluster.gym_placement=ray)"
                )
        return short


def plan_gym_capacity(
    generation_gpus: int,
    agent_replicas: int,
    resources_replicas: int,
    *,
    tokens_per_s_per_gpu: float = GENERATION_TOKENS_PER_S_PER_GPU,
    tokens_per_turn: float = TOKENS_PER_POLICY_TURN,
    cpu_s_per_turn: dict[str, float] = CPU_S_PER_POLICY_TURN,
) -> GymCapacity:
    """The plan for ``generation_gpus`` vLLM GPUs and the configured replicas (one CPU each)."""
    return GymCapacity(
        generation_gpus=generation_gpus,
        policy_turns_per_s=generation_gpus * tokens_per_s_per_gpu / tokens_per_turn,
        agent_replicas=agent_replicas,
        resources_replicas=resources_replicas,
        agent_turns_per_s_per_replica=1.0 / cpu_s_per_turn["agent"],
        resources_turns_per_s_per_replica=1.0 / cpu_s_per_turn["resources"],
    )


def gym_capacity_of(cfg: Any) -> GymCapacity | None:
    """The plan for a training config (``policy.generation`` and ``env.nemo_gym``), or None when it has no Gym
    environment or its generation is not vLLM on GPUs (then no GPU throughput to plan for)."""
    generation = cfg.policy.generation
    env = getattr(cfg, "env", None)
    if env is None or generation is None or generation.backend != "vllm" or generation.backend_block.device != "cuda":
        return None
    vllm, gym = generation.backend_block, env.nemo_gym
    gpus = vllm.data_parallel_size * vllm.tensor_parallel_size
    return plan_gym_capacity(gpus, gym.agent_replicas, gym.resources_replicas)


def format_gym_capacity(capacity: GymCapacity) -> str:
    """The ``--plan`` section: one line per figure, then a warning line per role that is short of replicas."""
    c = capacity
    lines = [
        "Gym capacity (CPU per policy turn measured by bench/rollout_scaling.py):",
        f"  generation: {c.generation_gpus} GPU(s) x {GENERATION_TOKENS_PER_S_PER_GPU:,.0f} tokens/s / "
        f"{TOKENS_PER_POLICY_TURN:.0f} tokens per turn = {c.policy_turns_per_s:.0f} policy turns/s",
        f"  agent replicas: {c.agent_replicas} configured x {c.agent_turns_per_s_per_replica:.0f} turns/s each, "
        f"{c.agent_replicas_needed} needed",
        f"  resources replicas: {c.resources_replicas} configured x {c.resources_turns_per_s_per_replica:.0f} "
        f"turns/s each, {c.resources_replicas_needed} needed",
    ]
    return "\n".join(lines + [f"  {line}" for line in c.warnings])
