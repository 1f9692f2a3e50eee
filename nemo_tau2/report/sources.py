"""What a report reads: an evaluation folder or a training run folder, read-only, as typed runs.

An **evaluation** folder is an ``eval.save_path``: ``rollouts.jsonl`` (one record per episode, newest wins, as a
resumed run reads it), ``summary.json`` (the metrics with their bootstrap intervals), ``config.json`` and
``system_prompts.json``. A **training run** folder is a ``logger.log_dir`` (or the folder above it holding
``logs/``): ``metrics.jsonl`` (one line per step) and ``validation/step_<n>/`` folders in the evaluation format.

Nothing here writes: a torn last line (a run still going, or killed mid-write) is skipped, not set aside.
Bad input is a :class:`ReportInputError` whose message names the folder and what to pass instead.
"""

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from nemo_tau2.evals.metrics import EpisodeRecord, compute_eval_metrics
from nemo_tau2.evals.results import (
    CONFIG_FILE,
    ROLLOUTS_FILE,
    SUMMARY_FILE,
    SYSTEM_PROMPTS_FILE,
    episode_key,
    latest_records,
)
from nemo_tau2.utils.metrics_logger import METRICS_FILE

DEFAULT_TAU2_VERSION = "v0.2.1"  # what a config without a tau2 block runs (Tau2ReleaseConfig's default)


class ReportInputError(ValueError):
    """A folder that holds no results, or runs that cannot be compared; the message is one line with the fix."""


@dataclass
class EvalRun:
    """One evaluation's episodes and metrics (also a training run's validation at one step)."""

    name: str
    path: Path
    records: list[dict[str, Any]]  # rollouts.jsonl, newest record per episode, in (domain, task, sample) order
    metrics: dict[str, float]  # summary.json's metrics (pass@k, pass^k with intervals, counts)
    k_values: list[int]
    tau2_version: str
    config: dict[str, Any]
    system_prompts: dict[str, str]  # "<domain>/<task_id>" -> the policy's system prompt
    trained_on: dict[str, Any] | None = None  # summary.json's checkpoint_trained_on: tasks the model trained on

    @property
    def domains(self) -> list[str]:
        return sorted({str(r["domain"]) for r in self.records})

    @property
    def task_keys(self) -> set[tuple[str, str]]:
        return {(str(r["domain"]), str(r["task_id"])) for r in self.records}

    @property
    def retrieval_variants(self) -> list[str]:
        """The knowledge-retrieval variants its episodes were played with (banking_knowledge's; empty elsewhere)."""
        return sorted({str(r["retrieval_variant"]) for r in self.records if r.get("retrieval_variant")})


@dataclass
class TrainingRun:
    """One GRPO, SFT or RFT run: its step metrics and the validation episodes of each validated step."""

    name: str
    path: Path
    steps: list[dict[str, Any]]  # metrics.jsonl, newest line per step, by step
    validations: dict[int, EvalRun] = field(default_factory=dict)  # step -> its validation episodes
    config: dict[str, Any] = field(default_factory=dict)
    tau2_version: str = DEFAULT_TAU2_VERSION

    @property
    def domains(self) -> list[str]:
        """The config's ``data.domains``; else those its validation episodes or per-domain metrics name."""
        configured = (self.config.get("data") or {}).get("domains")
        if configured:
            return sorted(configured)
        found = {d for run in self.validations.values() for d in run.domains}
        found |= {m.group(1) for row in self.steps for key in row if (m := _DOMAIN_METRIC.match(key))}
        return sorted(found)


_DOMAIN_METRIC = re.compile(r"^train/([^/]+)/success_rate$")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every whole JSON object line of ``path``; a torn or foreign line is skipped (the file is left as it is)."""
    records = []
    with path.open("rb") as f:
        for line in f:
            try:
                record = orjson.loads(line)  # a 400-episode log with token ids is ~150 MB: orjson reads it 3x faster
            except orjson.JSONDecodeError:
                continue
            if isinstance(record, dict):
                records.append(record)
    return records


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text())
    except ValueError as e:
        raise ReportInputError(f"{path} is not valid JSON ({e}); rerun the run that wrote it") from None
    return value if isinstance(value, dict) else {}


def _system_prompts(folder: Path) -> dict[str, str]:
    stored = _read_json(folder / SYSTEM_PROMPTS_FILE)
    prompts = stored.get("prompts") or []
    return {task: prompts[index] for task, index in (stored.get("tasks") or {}).items() if index < len(prompts)}


def load_eval(folder: Path, name: str | None = None, config: dict[str, Any] | None = None) -> EvalRun:
    """The evaluation in ``folder`` (it must hold ``rollouts.jsonl``); metrics from ``summary.json``, or computed
    from the episodes (no intervals) when the run has not written one yet."""
    lines = read_jsonl(folder / ROLLOUTS_FILE)
    if not lines:
        raise ReportInputError(f"{folder}/{ROLLOUTS_FILE} holds no episode; run the evaluation first")
    records = sorted(latest_records(lines).values(), key=lambda r: _sortable(episode_key(r)))
    summary = _read_json(folder / SUMMARY_FILE)
    config = config if config is not None else _read_json(folder / CONFIG_FILE)
    k_values = summary.get("k_values") or (config.get("eval") or {}).get("k_values") or [1]
    metrics = summary.get("metrics")
    if not metrics:
        n = min(_samples_per_task(records).values())
        ks = [k for k in k_values if k <= n] or [1]
        metrics = compute_eval_metrics([EpisodeRecord.from_dict(r) for r in records], ks=ks, num_bootstrap=0)
    version = summary.get("tau2_version") or next((r["tau2_version"] for r in records if r.get("tau2_version")), None)
    return EvalRun(
        name=name or folder.name,
        path=folder,
        records=records,
        metrics=metrics,
        k_values=sorted(int(k) for k in k_values),
        tau2_version=version or _tau2_version(config),
        config=config,
        system_prompts=_system_prompts(folder),
        trained_on=summary.get("checkpoint_trained_on"),
    )


def _sortable(key: tuple[str, str, int]) -> tuple:
    domain, task_id, sample = key
    return domain, (0, int(task_id), "") if task_id.isdigit() else (1, 0, task_id), sample


def _samples_per_task(records: list[dict[str, Any]]) -> dict[tuple[str, str], int]:
    counts: dict[tuple[str, str], int] = {}
    for record in records:
        if record["status"] == "ok":
            key = (str(record["domain"]), str(record["task_id"]))
            counts[key] = counts.get(key, 0) + 1
    return counts or {("", ""): 1}


def _tau2_version(config: dict[str, Any]) -> str:
    return str((config.get("tau2") or {}).get("version") or DEFAULT_TAU2_VERSION)


def load_training(folder: Path, name: str | None = None) -> TrainingRun:
    """The training run whose ``metrics.jsonl`` is in ``folder``, each ``validation/step_<n>`` an :class:`EvalRun`."""
    by_step: dict[int, dict[str, Any]] = {}
    for row in read_jsonl(folder / METRICS_FILE):
        if isinstance(row.get("step"), int):
            by_step[row["step"]] = row  # a step re-logged after a resume: the newest line wins
    if not by_step:
        raise ReportInputError(f"{folder}/{METRICS_FILE} holds no step; wait for the run's first step")
    config = _read_json(folder / CONFIG_FILE)
    validations = {}
    for step_dir in sorted((folder / "validation").glob("step_*")):
        step = step_dir.name.removeprefix("step_")
        if step.isdigit() and read_jsonl(step_dir / ROLLOUTS_FILE):
            validations[int(step)] = load_eval(step_dir, name=f"step {step}", config=config)
    return TrainingRun(
        name=name or _run_name(folder),
        path=folder,
        steps=[by_step[step] for step in sorted(by_step)],
        validations=dict(sorted(validations.items())),
        config=config,
        tau2_version=_tau2_version(config),
    )


def _run_name(folder: Path) -> str:
    """A log_dir's name is usually ``logs``: the run is the folder above it."""
    return folder.parent.name if folder.name == "logs" else folder.name


def load_results(path: str | Path) -> EvalRun | TrainingRun:
    """An evaluation folder or a training run folder (its ``logger.log_dir`` or the folder holding ``logs/``)."""
    folder = Path(path)
    if not folder.is_dir():
        raise ReportInputError(f"{folder} is not a folder; pass an evaluation's eval.save_path or a run's log_dir")
    if (folder / ROLLOUTS_FILE).is_file():
        return load_eval(folder)
    for candidate in (folder, folder / "logs"):
        if (candidate / METRICS_FILE).is_file():
            return load_training(candidate)
    raise ReportInputError(
        f"{folder} holds no results (no {ROLLOUTS_FILE} of an evaluation, no {METRICS_FILE} of a training run); "
        "pass an evaluation's eval.save_path or a training run's logger.log_dir"
    )


def check_comparable(runs: list[EvalRun | TrainingRun]) -> None:
    """Runs shown together must be of one kind and measure the same thing: same tau2 release and domains, and for
    evaluations the same tasks (a pass rate over other tasks is another number)."""
    if len(runs) < 2:
        return
    first = runs[0]
    for run in runs[1:]:
        if type(run) is not type(first):
            raise ReportInputError(
                f"cannot compare {first.path} ({_kind(first)}) with {run.path} ({_kind(run)}); "
                "compare evaluations with evaluations, training runs with training runs"
            )
        if run.tau2_version != first.tau2_version:
            raise ReportInputError(
                f"cannot compare {first.path} (tau2 {first.tau2_version}) with {run.path} (tau2 {run.tau2_version}); "
                "compare runs of the same tau2 release"
            )
        if run.domains != first.domains:
            raise ReportInputError(
                f"cannot compare {first.path} (domains {', '.join(first.domains)}) with {run.path} (domains "
                f"{', '.join(run.domains)}); compare runs over the same domains"
            )
        if isinstance(run, EvalRun) and run.task_keys != first.task_keys:
            only = len(run.task_keys - first.task_keys) + len(first.task_keys - run.task_keys)
            raise ReportInputError(
                f"cannot compare {first.path} with {run.path}: their task sets differ ({only} task(s) in only one); "
                "evaluate the same data.task_ids / data.num_tasks"
            )


def _kind(run: EvalRun | TrainingRun) -> str:
    return "an evaluation" if isinstance(run, EvalRun) else "a training run"
