"""Evaluation metrics over repeated episodes of each task: pass@k, pass^k and mean reward, with bootstrap CIs.

For a task with ``n`` valid episodes of which ``c`` succeeded:

- **pass@k** = 1 - C(n-c, k) / C(n, k): the chance that at least one of k episodes drawn without replacement
  succeeds. Unbiased estimator from Chen et al. 2021, "Evaluating Large Language Models Trained on Code"
  (https://arxiv.org/abs/2107.03374); NeMo-RL's ``eval_pass_k`` computes the same number.
- **pass^k** = C(c, k) / C(n, k): the chance that all k episodes succeed, the tau-bench reliability metric
  (Yao et al. 2024, https://arxiv.org/abs/2406.12045; ``tau2/metrics/agent_metrics.py::pass_hat_k``).

Both count ``success`` (tau2's binary verdict), never summed or shaped rewards: a record whose ``success`` is not
a bool is rejected. Episodes that died of an infrastructure error are excluded from ``n`` and counted apart,
so a crashed server never reads as a failed task. Domain scores are means over that domain's tasks; "overall"
is the mean over all tasks of all domains and "macro" the mean of the domain scores.
"""

import logging
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from numbers import Integral, Real
from typing import Any

import numpy as np

from nemo_tau2.evals.failure_kinds import ending_metrics, kind_key, kind_label, kinds_seen
from nemo_tau2.gym.agent.episode_record import EpisodeStatus

logger = logging.getLogger(__name__)

EPISODE_STATUSES: tuple[str, ...] = tuple(EpisodeStatus)
INFRASTRUCTURE_ERROR = EpisodeStatus.INFRASTRUCTURE_ERROR
OVERALL, MACRO = "overall", "macro"
DOMAIN_ORDER = ("airline", "retail", "telecom")


# ======================================================================================================
# Per-task estimators
# ======================================================================================================


def _check_counts(n: int, c: int, k: int) -> None:
    for name, value in (("n", n), ("c", c), ("k", k)):
        if not isinstance(value, Integral) or isinstance(value, bool):
            raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if k < 1:
        raise ValueError(f"k must be >= 1, got k={k}")
    if k > n:
        raise ValueError(f"k={k} is larger than the number of episodes n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"the number of successes c={c} must lie in [0, n={n}]")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k = 1 - C(n-c, k) / C(n, k) (Chen et al. 2021): P(at least one of k episodes succeeds).

    Args:
        n: Valid episodes of the task.
        c: Successful episodes among them.
        k: Episodes drawn, ``1 <= k <= n``.

    Raises:
        ValueError: ``k < 1``, ``k > n`` or ``c`` outside ``[0, n]``.
    """
    _check_counts(n, c, k)
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)  # comb(n - c, k) is 0 when fewer than k failures


def pass_hat_k(n: int, c: int, k: int) -> float:
    """pass^k = C(c, k) / C(n, k) (tau-bench, Yao et al. 2024): P(all of k episodes succeed).

    Args:
        n: Valid episodes of the task.
        c: Successful episodes among them.
        k: Episodes drawn, ``1 <= k <= n``.

    Raises:
        ValueError: ``k < 1``, ``k > n`` or ``c`` outside ``[0, n]``.
    """
    _check_counts(n, c, k)
    return math.comb(c, k) / math.comb(n, k)


# ======================================================================================================
# Episode records and per-task aggregation
# ======================================================================================================


@dataclass
class EpisodeRecord:
    """One finished (or failed) evaluation episode.

    ``success`` must be a bool: the caller binarises tau2's reward (``|reward - 1| <= 1e-6``); shaped or
    partial rewards never count as successes. ``success`` and ``reward`` are ignored for infrastructure errors.
    """

    domain: str
    task_id: str
    success: bool | None
    reward: float | None
    status: EpisodeStatus = EpisodeStatus.OK
    termination_reason: str | None = None
    num_turns: int | None = None
    total_tokens: int | None = None
    token_contiguity_breaks: int | None = None  # turns that broke it (a rollouts.jsonl line lists them; None: unknown)
    # a knowledge domain's searches, documents found and tools unlocked against gold (None elsewhere, and in records
    # written before it was recorded): its document_recall and unlock_recall are averaged
    retrieval: dict[str, Any] | None = None
    tau2_failure_kind: str | None = None  # how it ended (evals.failure_kinds); None in records written before it
    agent_tool_calls: dict[str, Any] | None = None  # the policy's calls: total, malformed, hallucinated, transfer

    def __post_init__(self) -> None:
        where = f"episode of task {self.domain}/{self.task_id}"
        if self.status not in EPISODE_STATUSES:
            raise ValueError(f"{where}: status must be one of {EPISODE_STATUSES}, got {self.status!r}")
        self.status = EpisodeStatus(self.status)
        if self.status == INFRASTRUCTURE_ERROR:
            return
        if not isinstance(self.success, bool | np.bool_):
            raise TypeError(
                f"{where}: success must be a bool, got {self.success!r} ({type(self.success).__name__}); "
                "binarise the reward before computing metrics (shaped rewards never count as successes)"
            )
        self.success = bool(self.success)
        if not isinstance(self.reward, Real) or isinstance(self.reward, bool) or math.isnan(self.reward):
            raise TypeError(f"{where}: reward must be a number, got {self.reward!r}")

    @classmethod
    def from_dict(cls, row: Mapping[str, Any]) -> "EpisodeRecord":
        """Build a record from a ``rollouts.jsonl`` line (a ``RolloutResult``'s fields, same names; extra keys are
        ignored, a missing field is an error: no defaults stand in for it)."""
        missing = [name for name in _RECORD_FIELDS if name not in row and name not in _OPTIONAL_FIELDS]
        if missing:
            raise ValueError(f"episode row is missing {missing}: {dict(row)!r}")
        breaks = row["token_contiguity_breaks"]
        if isinstance(breaks, list):  # a rollouts.jsonl line: None when nothing was checked (no token ids asked)
            breaks = len(breaks) if breaks or row.get("trainable_turns", 1) > 0 else None
        return cls(
            **{name: row.get(name) for name in _RECORD_FIELDS}
            | {"domain": str(row["domain"])}
            | {"task_id": str(row["task_id"])}
            | {"token_contiguity_breaks": breaks}
        )


_RECORD_FIELDS = tuple(f.name for f in fields(EpisodeRecord))
_OPTIONAL_FIELDS = ("retrieval", "tau2_failure_kind", "agent_tool_calls")  # absent from records written before them
_RETRIEVAL_MEANS = ("document_recall", "unlock_recall")  # of ``retrieval``, averaged where not None


@dataclass
class TaskResult:
    """The valid episodes of one task, reduced to what the metrics need."""

    domain: str
    task_id: str
    num_episodes: int = 0
    num_successes: int = 0
    rewards: list[float] = field(default_factory=list)
    num_infra_errors: int = 0

    def pass_at_k(self, k: int) -> float | None:
        """pass@k of this task, or None when it has fewer than k valid episodes."""
        return pass_at_k(self.num_episodes, self.num_successes, k) if self.num_episodes >= k else None

    def pass_hat_k(self, k: int) -> float | None:
        """pass^k of this task, or None when it has fewer than k valid episodes."""
        return pass_hat_k(self.num_episodes, self.num_successes, k) if self.num_episodes >= k else None

    def mean_reward(self) -> float | None:
        return float(np.mean(self.rewards)) if self.rewards else None


def aggregate_tasks(records: Iterable[EpisodeRecord]) -> list[TaskResult]:
    """Group records by (domain, task_id), excluding infrastructure errors from the counts."""
    tasks: dict[tuple[str, str], TaskResult] = {}
    for record in records:
        task = tasks.setdefault((record.domain, record.task_id), TaskResult(record.domain, record.task_id))
        if record.status == INFRASTRUCTURE_ERROR:
            task.num_infra_errors += 1
            continue
        task.num_episodes += 1
        task.num_successes += int(record.success)
        task.rewards.append(float(record.reward))
    return list(tasks.values())


def ordered_domains(domains: Iterable[str]) -> list[str]:
    """tau2's domains in their usual order (airline, retail, telecom), then any others alphabetically."""
    present = set(domains)
    return [d for d in DOMAIN_ORDER if d in present] + sorted(present - set(DOMAIN_ORDER))


# ======================================================================================================
# Summary over tasks, with bootstrap intervals
# ======================================================================================================


def _nan_mean(values: np.ndarray, axis: int = -1) -> np.ndarray:
    """Mean over non-NaN entries along ``axis``; NaN where there are none (without numpy's empty-mean warning)."""
    valid = ~np.isnan(values)
    count = valid.sum(axis=axis)
    total = np.where(valid, values, 0.0).sum(axis=axis)
    return np.divide(total, count, out=np.full(np.shape(total), np.nan), where=count > 0)


def _group_means(per_domain: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Domain means, the overall mean over all tasks and the macro mean over domains.

    Each value array has tasks on its last axis (leading axes, if any, are bootstrap resamples).
    """
    means = {domain: _nan_mean(values) for domain, values in per_domain.items()}
    means[OVERALL] = _nan_mean(np.concatenate(list(per_domain.values()), axis=-1))
    means[MACRO] = _nan_mean(np.stack([means[d] for d in per_domain], axis=-1))
    return means


def _task_values(tasks_by_domain: dict[str, list[TaskResult]], value: Callable[[TaskResult], float | None]):
    """Per domain, the metric of each task that has one (tasks below k are left out)."""
    out = {}
    for domain, tasks in tasks_by_domain.items():
        values = [value(task) for task in tasks]
        out[domain] = np.array([v for v in values if v is not None], dtype=float)
    return out


def _bootstrap_means(per_domain: dict[str, np.ndarray], num_bootstrap: int, seed: int) -> dict[str, np.ndarray]:
    """``_group_means`` of ``num_bootstrap`` stratified resamples: each domain's tasks drawn with replacement."""
    rng = np.random.default_rng(seed)
    resampled = {
        domain: values[rng.integers(0, len(values), size=(num_bootstrap, len(values)))]
        if len(values)
        else np.empty((num_bootstrap, 0))
        for domain, values in per_domain.items()
    }
    return _group_means(resampled)


def _count_summary(prefix: str, records: list[EpisodeRecord], tasks: list[TaskResult], ks: Sequence[int]) -> dict:
    valid = [r for r in records if r.status == EpisodeStatus.OK]
    out: dict[str, float] = {
        f"{prefix}/num_tasks": len(tasks),
        f"{prefix}/num_episodes": len(valid),
        f"{prefix}/num_infra_errors": len(records) - len(valid),
        f"{prefix}/num_tasks_without_valid_episodes": sum(t.num_episodes == 0 for t in tasks),
    }
    for k in ks:
        out[f"{prefix}/num_tasks_excluded@{k}"] = sum(t.num_episodes < k for t in tasks)
    for reason, count in sorted(Counter(r.termination_reason or "unknown" for r in valid).items()):
        out[f"{prefix}/termination/{reason}"] = count
    values = {name: [getattr(r, name) for r in valid] for name in ("num_turns", "total_tokens")}
    values |= {name: [(r.retrieval or {}).get(name) for r in valid] for name in _RETRIEVAL_MEANS}
    for name, found in values.items():
        known = [value for value in found if value is not None]
        if known:
            out[f"{prefix}/mean_{name}"] = float(np.mean(known))
    # episodes whose token ids stop being the sequence the model saw at some turn: training gets only the turns before
    broken = [r.token_contiguity_breaks > 0 for r in valid if r.token_contiguity_breaks is not None]
    if broken:
        out[f"{prefix}/token_contiguity_break_rate"] = float(np.mean(broken))
    return out | ending_metrics(prefix, records)


def compute_eval_metrics(
    records: Iterable[EpisodeRecord],
    ks: Sequence[int],
    *,
    num_bootstrap: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
) -> dict[str, float]:
    """pass@k, pass^k and mean reward per domain, overall and macro, with bootstrap intervals and counts.

    A task with fewer than k valid episodes is left out of that k's means and counted in
    ``eval/<domain>/num_tasks_excluded@<k>``. Intervals come from a stratified bootstrap over tasks: each
    resample draws every domain's eligible tasks with replacement, keeping the domain sizes, so the overall
    and macro intervals reflect the same task mix as the point estimates.

    Args:
        records: All episodes of the evaluation, infrastructure errors included.
        ks: The k values to report (each >= 1).
        num_bootstrap: Bootstrap resamples; 0 disables the intervals.
        confidence: Two-sided interval level (0.95 -> ``_ci95_low`` / ``_ci95_high`` keys).
        seed: Seed of the resampling RNG.

    Returns:
        Flat metrics: ``eval/<scope>/pass@<k>``, ``eval/<scope>/pass^<k>``, ``eval/<scope>/mean_reward``, their
        ``_ci<level>_low`` / ``_ci<level>_high``, and per domain and overall the task, episode, infrastructure
        error and termination-reason counts, mean turns and tokens (and a knowledge domain's ``mean_document_recall``
        and ``mean_unlock_recall``), and ``token_contiguity_break_rate`` (the share of
        episodes with a break; training gets only their turns before it). ``<scope>`` is a domain, ``overall`` or
        ``macro``. A mean with no eligible task is omitted.
    """
    ks = sorted(set(ks))
    if not ks or any(not isinstance(k, int) or k < 1 for k in ks):
        raise ValueError(f"ks must be a non-empty list of ints >= 1, got {ks!r}")
    if not 0 < confidence < 1 or num_bootstrap < 0:
        raise ValueError(f"need 0 < confidence < 1 and num_bootstrap >= 0, got {confidence=}, {num_bootstrap=}")
    records = list(records)
    if not records:
        raise ValueError("no episode records to compute metrics from")
    tasks = aggregate_tasks(records)
    domains = ordered_domains(t.domain for t in tasks)
    if {OVERALL, MACRO} & set(domains):
        raise ValueError(f"'{OVERALL}' and '{MACRO}' are reserved and cannot be domain names")
    tasks_by_domain = {d: [t for t in tasks if t.domain == d] for d in domains}

    metrics: dict[str, float] = {}
    metrics.update(_count_summary(f"eval/{OVERALL}", records, tasks, ks))
    for domain in domains:
        domain_records = [r for r in records if r.domain == domain]
        metrics.update(_count_summary(f"eval/{domain}", domain_records, tasks_by_domain[domain], ks))

    level = f"ci{round(confidence * 100):d}"
    tail = 100 * (1 - confidence) / 2
    estimators: list[tuple[str, Callable[[TaskResult], float | None]]] = [
        *((f"pass@{k}", lambda task, k=k: task.pass_at_k(k)) for k in ks),
        *((f"pass^{k}", lambda task, k=k: task.pass_hat_k(k)) for k in ks),
        ("mean_reward", TaskResult.mean_reward),
    ]
    for name, estimator in estimators:
        values = _task_values(tasks_by_domain, estimator)
        point = _group_means(values)
        boot = _bootstrap_means(values, num_bootstrap, seed) if num_bootstrap else {}
        for scope, estimate in point.items():
            if np.isnan(estimate):
                continue
            metrics[f"eval/{scope}/{name}"] = float(estimate)
            if num_bootstrap:
                low, high = np.percentile(boot[scope], [tail, 100 - tail])
                metrics[f"eval/{scope}/{name}_{level}_low"] = float(low)
                metrics[f"eval/{scope}/{name}_{level}_high"] = float(high)
    for k in ks:
        if metrics[f"eval/{OVERALL}/num_tasks_excluded@{k}"]:
            logger.warning(
                "%d task(s) have fewer than %d valid episodes and are left out of pass@%d / pass^%d",
                metrics[f"eval/{OVERALL}/num_tasks_excluded@{k}"], k, k, k,
            )  # fmt: skip
    return metrics


# ======================================================================================================
# Readable table
# ======================================================================================================


def format_summary_table(metrics: Mapping[str, float], *, show_ci: bool = False) -> str:
    """Render ``compute_eval_metrics`` output as a plain-text table (percentages, as in the slime tau2 cookbook).

    Columns: Overall, then each domain present; rows: pass@k and pass^k for each k, mean reward, then counts.
    A cell with no eligible task shows ``-``.
    """
    domains = ordered_domains(
        key.split("/")[1] for key in metrics if key.endswith("/num_tasks") and key.split("/")[1] != OVERALL
    )
    scopes = [OVERALL, *domains]
    ks = sorted(int(key.rsplit("@", 1)[1]) for key in metrics if key.startswith(f"eval/{OVERALL}/num_tasks_excluded@"))
    ci_suffix = next((key.rsplit("_", 2)[1] for key in metrics if key.endswith("_low")), None)

    def cell(scope: str, name: str, scale: float, fmt: str) -> str:
        value = metrics.get(f"eval/{scope}/{name}")
        if value is None:
            return "-"
        text = format(value * scale, fmt)
        if show_ci and ci_suffix and f"eval/{scope}/{name}_{ci_suffix}_low" in metrics:
            low, high = (metrics[f"eval/{scope}/{name}_{ci_suffix}_{end}"] * scale for end in ("low", "high"))
            text += f" [{low:{fmt}}, {high:{fmt}}]"
        return text

    rows = [["Metric", *(s.capitalize() for s in scopes)]]
    for name in [f"pass@{k}" for k in ks] + [f"pass^{k}" for k in ks]:
        rows.append([name, *(cell(s, name, 100.0, ".1f") for s in scopes)])
    rows.append(["mean reward", *(cell(s, "mean_reward", 1.0, ".3f") for s in scopes)])
    for label, key in (("tasks", "num_tasks"), ("episodes", "num_episodes"), ("infra errors", "num_infra_errors")):
        rows.append([label, *(str(int(metrics[f"eval/{s}/{key}"])) for s in scopes)])
    if any(metrics.get(f"eval/{s}/token_contiguity_break_rate") for s in scopes):  # shown only when there are any
        rows.append(["contiguity breaks %", *(cell(s, "token_contiguity_break_rate", 100.0, ".1f") for s in scopes)])
    for kind in kinds_seen(metrics, scopes):  # how episodes ended: the kinds that occur
        rows.append([f"{kind_label(kind)} %", *(cell(s, kind_key(kind), 100.0, ".1f") for s in scopes)])

    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
