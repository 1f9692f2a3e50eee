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


ROLES = ("agent", "resources")


@dataclass(frozen=True)
class GymCapacity:
    """The capacity plan: what generation produces, what the configured replicas carry, what is needed."""

    generation_gpus: int
    tokens_per_s_per_gpu: float
    tokens_per_turn: float
    configured: dict[str, int]  # role -> replicas in the config
    turns_per_s_per_replica: dict[str, float]  # role -> what one replica (one CPU) carries

    @property
    def policy_turns_per_s(self) -> float:
        return self.generation_gpus * self.tokens_per_s_per_gpu / self.tokens_per_turn

    def replicas_busy(self, role: str) -> float:
        """Replicas of ``role`` that generation keeps fully busy (a fraction: the benchmark reports it per GPU)."""
        return self.policy_turns_per_s / self.turns_per_s_per_replica[role]

    def replicas_needed(self, role: str) -> int:
        return max(1, math.ceil(self.replicas_busy(role)))

    @property
    def warnings(self) -> list[str]:
        short = []
        for role in ROLES:
            have, need, each = self.configured[role], self.replicas_needed(role), self.turns_per_s_per_replica[role]
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
        tokens_per_s_per_gpu=tokens_per_s_per_gpu,
        tokens_per_turn=tokens_per_turn,
        configured={"agent": agent_replicas, "resources": resources_replicas},
        turns_per_s_per_replica={role: 1.0 / cpu_s_per_turn[role] for role in ROLES},
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
        f"  generation: {c.generation_gpus} GPU(s) x {c.tokens_per_s_per_gpu:,.0f} tokens/s / "
        f"{c.tokens_per_turn:.0f} tokens per turn = {c.policy_turns_per_s:.0f} policy turns/s",
    ]
    for role in ROLES:
        lines.append(
            f"  {role} replicas: {c.configured[role]} configured x {c.turns_per_s_per_replica[role]:.0f} turns/s "
            f"each, {c.replicas_needed(role)} needed"
        )
    return "\n".join(lines + [f"  {line}" for line in c.warnings])
