"""``run_async_nemo_gym_rollout``: many tau2 episodes at once through the Gym agent, for GRPO and for evaluation.

Mirrors NeMo-RL's function of the same name (``nemo_rl/experience/rollouts.py``): the rows come already repeated
``num_generations`` times and contiguous per prompt group; each row's ``responses_create_params`` gets the
sampling parameters (``temperature``, ``top_p``, ``max_output_tokens = min(row, max_new_tokens)``; ``top_k`` and
stop strings are never sent); every episode runs concurrently (bounded) as one POST to the agent's ``/run``; and
prompt groups are yielded as soon as all their episodes finished, in completion order. The sync wrapper returns the
whole batch in input order.

Each episode becomes a :class:`RolloutResult`: NeMo-RL's ``message_log`` (per policy turn, the new prompt tokens as a
``user`` message and the generated tokens with their logprobs as an ``assistant`` message: exactly the ids the
generator saw and produced), tau2's reward and components, ``success``, termination, token counts and timings.
An episode whose servers failed is a result with ``status="infrastructure_error"`` and no reward: callers exclude
it (evaluation counts it apart, GRPO drops it), never score it 0.

A caller that wants to watch passes ``on_progress``: every ``progress_interval_s`` it gets a
:class:`RolloutProgress` (episodes done and running, and the model turns and tokens the agent servers report from
``GET /progress`` while episodes are still going). The results are the same with or without it.
"""

import asyncio
import copy
import logging
import statistics
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from nemo_tau2.experience.episode_post import post_episode
from nemo_tau2.experience.message_log import message_log_from_output
from nemo_tau2.experience.progress import ProgressWatch, RolloutProgress
from nemo_tau2.experience.row_keys import pivot_tool
from nemo_tau2.generation.config import GenerationConfig
from nemo_tau2.gym.agent.episode_record import EpisodeData, EpisodeStatus, FailureKind
from nemo_tau2.gym.episode_config import NemoGymEnvConfig
from nemo_tau2.gym.model_server.routing import ReplicaRouter
from nemo_tau2.gym.replica_health import AgentReplicas, ReplicaHealth
from nemo_tau2.request_guard import RUN_ID_HEADER

logger = logging.getLogger(__name__)

OK = EpisodeStatus.OK
INFRASTRUCTURE_ERROR = EpisodeStatus.INFRASTRUCTURE_ERROR
NORMAL_TERMINATIONS = frozenset({"user_stop", "agent_stop"})
COMPONENT_KEYS = (
    "db_match",
    "action_match_fraction",
    "write_action_match_fraction",
    "env_assertion_fraction",
    "communicate_fraction",
)


@dataclass(frozen=True)
class SamplingParams:
    """NeMo-RL's ``GenerationSamplingParams``: what every policy call of a rollout samples with."""

    temperature: float
    top_p: float
    max_new_tokens: int | None = None
    top_k: int | None = None

    @classmethod
    def from_generation(cls, generation: GenerationConfig) -> "SamplingParams":
        """The sampling parameters of a generation block (the one way eval and GRPO build them)."""
        return cls(generation.temperature, generation.top_p, generation.max_new_tokens, generation.top_k)

    def __post_init__(self) -> None:
        if self.top_k is not None:
            raise ValueError(f"top_k must be None for NeMo-Gym rollouts (not OpenAI-compatible), got {self.top_k}")


@dataclass
class RolloutResult:
    """One episode: the agent's :class:`EpisodeData` fields under the same names, tau2's verdict, and NeMo-RL's
    ``message_log``. ``reward``/``success`` are None exactly when ``status`` is an infrastructure error."""

    row_index: int
    group_index: int
    sample_index: int
    domain: str
    task_id: str
    status: EpisodeStatus
    tau2_version: str | None = None  # the release that seeded the episode (None: it failed before seeding)
    retrieval_variant: str | None = None  # banking_knowledge: tau2's retrieval variant it was played with
    pivot_id: str | None = None  # a pivot row's (PivotRL: one turn of the task, docs/pivot-rl.md)
    pivot_tool: str | None = None  # its demonstrated action: the tool called (first of a batch), or "message"
    split: str | None = None  # the row's tau2 split, where the row names it (a pivot's: "test" ones are held out)
    policy_model: str | None = None
    reward: float | None = None
    success: bool | None = None
    reward_components: dict[str, Any] = field(default_factory=dict)
    retrieval: dict[str, Any] | None = None  # a knowledge domain's searches, documents found and tools unlocked
    termination_reason: str | None = None
    truncated_by: str | None = None
    tau2_failure_kind: FailureKind | None = None  # how it ended (None only in results built before it was recorded)
    agent_tool_calls: dict[str, Any] | None = None  # the policy's calls: total, malformed, hallucinated, transfer
    # an infrastructure failure at /verify (the judge's outage): its termination and trajectory, to re-score it later
    unscored_episode: dict[str, Any] | None = None
    error: str | None = None
    cause: str | None = None  # the error without where it happened: what summaries count (see EpisodeData.cause)
    unreachable: str | None = None  # the server that gave the failed episode no answer at all, if that was it
    message_log: list[dict[str, Any]] = field(default_factory=list)
    token_contiguity_breaks: list[str] = field(default_factory=list)
    first_break_turn: int | None = None  # the first policy turn that broke contiguity; message_log stops before it
    trainable_turns: int = 0  # policy turns in message_log: what training gets (num_turns when nothing broke)
    num_turns: int = 0
    num_user_turns: int = 0
    num_steps: int = 0
    num_tool_errors: int = 0
    num_truncated_generations: int = 0
    user_simulator: dict[str, Any] = field(default_factory=dict)  # the user strategy's model calls and fallbacks
    prompt_tokens: int = 0  # the first policy turn's prompt
    total_tokens: int = 0  # the last turn's prompt + generation: the whole sequence
    generation_tokens: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    full_result: dict[str, Any] | None = None  # the agent's /run answer (transcript, reward info)

    @property
    def ok(self) -> bool:
        return self.status == OK


@dataclass
class RolloutGroup:
    """The ``num_generations`` episodes of one prompt (input order within the group)."""

    group_index: int
    results: list[RolloutResult]


def apply_sampling_params(row: dict, sampling: SamplingParams) -> dict:
    """A copy of the row whose ``responses_create_params`` carry the sampling parameters."""
    if "responses_create_params" not in row:
        raise ValueError(f"a Gym row needs responses_create_params; got keys {sorted(row)}")
    row = copy.copy(row)
    params = dict(row["responses_create_params"])
    params["temperature"] = sampling.temperature
    params["top_p"] = sampling.top_p
    if sampling.max_new_tokens is not None:
        params["max_output_tokens"] = min(
            params.get("max_output_tokens") or sampling.max_new_tokens, sampling.max_new_tokens
        )
    row["responses_create_params"] = params
    return row


# The agent's episode fields a RolloutResult takes under the same names (the row gives domain, task and sample; the
# conversation id stays in the transcript; contiguity travels as its breaks and the message log it cuts).
EPISODE_FIELDS = set(EpisodeData.model_fields) - {
    "domain", "task_id", "conversation_id", "token_contiguity"
}  # fmt: skip


def result_from_response(
    row: dict, row_index: int, group_index: int, sample_index: int, status_code: int, body: Any, keep_full_result: bool
) -> RolloutResult:
    """Turn the agent's answer into a :class:`RolloutResult` (a non-200 is an infrastructure error).

    The episode fields are read as :class:`EpisodeData` (a missing or renamed field fails loudly) and keep their
    names; an answer that is not an agent's episode at all (a connection error, a proxy's page) is an
    infrastructure error with what came back."""
    base = {
        "row_index": row_index,
        "group_index": group_index,
        "sample_index": sample_index,
        "domain": str(row.get("domain")),
        "task_id": str(row.get("task_id")),
        "pivot_id": row.get("pivot_id"),
        "pivot_tool": pivot_tool(row.get("expected_action")),
        "split": row.get("split"),
    }
    if status_code != 200 or not isinstance(body, dict) or body.get("status") != EpisodeStatus.OK:
        error = body.get("error") if isinstance(body, dict) else None
        detail = error or (body.get("detail") if isinstance(body, dict) else None) or str(body)[:500]
        said = body.get("cause") if isinstance(body, dict) else None  # ours: the error without where it happened
        answered = f"agent /run HTTP {status_code}: " if status_code else ""  # 0: the head ended it, in its words
        return RolloutResult(
            **base,
            status=EpisodeStatus.INFRASTRUCTURE_ERROR,
            tau2_failure_kind=FailureKind.INFRASTRUCTURE,
            agent_tool_calls=body.get("agent_tool_calls") if isinstance(body, dict) else None,
            unscored_episode=body.get("unscored_episode") if isinstance(body, dict) else None,
            policy_model=body.get("policy_model") if isinstance(body, dict) else None,
            tau2_version=body.get("tau2_version") if isinstance(body, dict) else None,
            retrieval_variant=body.get("retrieval_variant") if isinstance(body, dict) else None,
            error=f"{answered}{detail}",
            cause=f"{answered}{said or detail}",
            unreachable=body.get("unreachable") if isinstance(body, dict) else None,
            full_result=body if keep_full_result and isinstance(body, dict) else None,
        )
    data = EpisodeData.from_response(body)
    output = body["response"]["output"]
    return RolloutResult(
        **base,
        **data.model_dump(include=EPISODE_FIELDS),
        reward=float(body["reward"]),
        success=bool(body["success"]),
        reward_components={key: body[key] for key in COMPONENT_KEYS},
        retrieval=body.get("retrieval"),
        message_log=(log := message_log_from_output(output, data.token_contiguity.first_break_turn)),
        token_contiguity_breaks=data.token_contiguity.breaks,
        first_break_turn=data.token_contiguity.first_break_turn,
        trainable_turns=sum(message["role"] == "assistant" for message in log),
        full_result=body if keep_full_result else None,
    )


def _check_batch(rows: Sequence[dict], num_generations: int) -> None:
    if num_generations <= 0:
        raise ValueError(f"num_generations must be positive, got {num_generations}")
    if not rows:
        raise ValueError("the rollout batch is empty")
    if len(rows) % num_generations:
        raise ValueError(f"{len(rows)} rows are not a whole number of groups of num_generations={num_generations}")
    for start in range(0, len(rows), num_generations):
        group = rows[start : start + num_generations]
        keys = {(str(r.get("domain")), str(r.get("task_id")), (r.get("agent_ref") or {}).get("name")) for r in group}
        if len(keys) != 1:
            raise ValueError(
                f"rows {start}..{start + num_generations - 1} should be one prompt group (same domain, "
                f"task_id and agent_ref.name), got {sorted(keys, key=str)}"
            )


async def run_async_nemo_gym_rollout(
    rows: Sequence[dict],
    agent_urls: dict[str, str | Sequence[str]],
    sampling: SamplingParams,
    num_generations: int,
    max_concurrency: int = 256,
    keep_full_result: bool = False,
    episode_timeout_s: float | None = None,
    on_progress: Callable[[RolloutProgress], None] | None = None,
    progress_interval_s: float = 1.0,
) -> AsyncIterator[RolloutGroup]:
    """Roll out every row; yield each prompt group once all its ``num_generations`` episodes are done.

    Args:
        rows: Gym rows, repeated ``num_generations`` times, contiguous per group. A row may carry ``sample_index``
            (which sample of its task it is: the user simulator's seed and the fake's scripts use it); it defaults
            to its position in the group.
        agent_urls: agent server name (``agent_ref.name``) -> ``http://host:port`` of it, or of each of its
            replicas (a list): each episode goes to the replica with the fewest running. The environment's
            (:class:`AgentReplicas`) also carry the replicas' health, so that episodes go to live replicas only and
            those on a replica declared lost end at once, and their episodes' wall-clock limit.
        sampling: the policy's sampling parameters.
        num_generations: episodes per prompt group.
        max_concurrency: episodes in flight at once.
        keep_full_result: keep the agent's whole answer (transcript, reward info) on each result.
        episode_timeout_s: wall-clock limit of one episode (the agent has its own per-call limits); None: the
            agent replicas' own (``env.nemo_gym.episode_timeout_s``), else that key's default.
        on_progress: called every ``progress_interval_s`` (from the event loop: keep it quick) and once at the end.
    """
    _check_batch(rows, num_generations)
    routers = {
        name: ReplicaRouter([urls] if isinstance(urls, str) else list(urls), health=_health(urls))
        for name, urls in agent_urls.items()
    }
    limits = {name: _episode_timeout_s(urls, episode_timeout_s) for name, urls in agent_urls.items()}
    runs = {name: _run(urls) for name, urls in agent_urls.items()}
    gate = asyncio.Semaphore(max_concurrency)
    connector = aiohttp.TCPConnector(limit=max_concurrency + 8)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as http:

        async def episode(row_index: int) -> RolloutResult:
            group_index, position = divmod(row_index, num_generations)
            row = apply_sampling_params(rows[row_index], sampling)
            row.setdefault("sample_index", position)
            name = (row.get("agent_ref") or {}).get("name")
            if name not in routers:
                raise ValueError(f"row {row_index} names agent {name!r}; running agents: {sorted(agent_urls)}")
            async with gate:
                if watch:
                    watch.running += 1
                try:
                    status, body = await post_episode(
                        http, routers[name], str(row_index), orjson.dumps(row), limits[name], runs[name]
                    )
                finally:
                    if watch:
                        watch.running -= 1
                        watch.done += 1
                        watch.notify()
            return result_from_response(
                row, row_index, group_index, row["sample_index"], status, body, keep_full_result
            )

        watch = None
        if on_progress is not None:
            every_url = [url for router in routers.values() for url in router.urls]
            watch = ProgressWatch(http, every_url, len(rows), on_progress, progress_interval_s)
            await watch.start()
        pending: dict[int, list[RolloutResult | None]] = {}
        tasks = [asyncio.create_task(episode(i)) for i in range(len(rows))]
        watching = asyncio.create_task(watch.run_forever()) if watch else None
        try:
            for finished in asyncio.as_completed(tasks):
                result = await finished
                slots = pending.setdefault(result.group_index, [None] * num_generations)
                slots[result.row_index % num_generations] = result
                if all(slot is not None for slot in slots):
                    yield RolloutGroup(result.group_index, pending.pop(result.group_index))
            if watch:
                await watch.report()
        finally:
            for task in tasks:
                task.cancel()
            if watching:
                watching.cancel()


def _health(urls: str | Sequence[str]) -> ReplicaHealth | None:
    return urls.health if isinstance(urls, AgentReplicas) else None


def _run(urls: str | Sequence[str]) -> dict[str, str]:
    """The header naming the servers' run (Ray-placed servers refuse another run's requests)."""
    return {RUN_ID_HEADER: urls.run_id} if isinstance(urls, AgentReplicas) and urls.run_id else {}


def _episode_timeout_s(urls: str | Sequence[str], given: float | None) -> float:
    """An episode's wall-clock limit: the caller's, else its agent replicas', else ``env.nemo_gym``'s default."""
    if given is not None:
        return given
    if isinstance(urls, AgentReplicas):
        return urls.episode_timeout_s
    return NemoGymEnvConfig().episode_limit_s()


def run_nemo_gym_rollout_sync(
    rows: Sequence[dict],
    agent_urls: dict[str, str | Sequence[str]],
    sampling: SamplingParams,
    num_generations: int,
    **kwargs: Any,
) -> list[RolloutResult]:
    """Every episode of the batch, in input order (not callable from inside a running event loop)."""

    async def collect() -> list[RolloutResult]:
        results: list[RolloutResult] = []
        async for group in run_async_nemo_gym_rollout(rows, agent_urls, sampling, num_generations, **kwargs):
            results.extend(group.results)
        return sorted(results, key=lambda r: r.row_index)

    return asyncio.run(collect())


def rollout_metrics(results: Sequence[RolloutResult], wall_s: float | None = None) -> dict[str, float]:
    """Batch metrics with NeMo-RL's names where they exist (``turns_per_sample``, ``natural_termination_rate``...)."""
    valid = [r for r in results if r.ok]
    metrics: dict[str, float] = {
        "num_episodes": len(results),
        "num_infrastructure_errors": len(results) - len(valid),
    }
    if wall_s:
        metrics["episodes_per_s"] = len(results) / wall_s
    if not valid:
        return metrics
    rewards = [r.reward for r in valid]

    def mean(values):
        return statistics.fmean(values) if values else 0.0

    metrics |= {
        "total_reward/mean": mean(rewards),
        "total_reward/max": max(rewards),
        "total_reward/min": min(rewards),
        "success_rate": mean([float(r.success) for r in valid]),
        "turns_per_sample": mean([r.num_turns for r in valid]),
        # policy turns whose tokens reach the trainer: all of them unless token contiguity broke (message_log is
        # cut at the first break) or a turn generated nothing (a prompt that filled the context)
        "trained_turns_per_sample": mean([r.trainable_turns for r in valid]),
        "user_turns_per_sample": mean([r.num_user_turns for r in valid]),
        "total_tokens_per_sample": mean([r.total_tokens for r in valid]),
        "gen_tokens_per_sample": mean([r.generation_tokens for r in valid]),
        "natural_termination_rate": mean([float(r.termination_reason in NORMAL_TERMINATIONS) for r in valid]),
        "truncation_rate": mean([float(r.truncated_by is not None) for r in valid]),
        "token_contiguity_break_rate": mean([float(bool(r.token_contiguity_breaks)) for r in valid]),
        "tool_errors_per_sample": mean([r.num_tool_errors for r in valid]),
        "user_extra_model_calls_per_sample": mean([r.user_simulator.get("extra_model_calls", 0) for r in valid]),
        "user_format_fallbacks_per_sample": mean([r.user_simulator.get("format_fallbacks", 0) for r in valid]),
    }
    for reason in sorted({r.termination_reason for r in valid}):
        metrics[f"termination/{reason}"] = mean([float(r.termination_reason == reason) for r in valid])
    return metrics
