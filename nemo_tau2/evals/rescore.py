"""Re-score a finished evaluation in place, from the trajectories it stored, without playing any episode again.

``examples/run_eval.py --rescore <results dir>``: each line of ``rollouts.jsonl`` that carries its trajectory goes
to the run's resources server as a stored rollout (``/verify`` without a session: the task's start state rebuilt,
the trajectory replayed and scored by the release's own evaluator and judge; :mod:`nemo_tau2.gym.resources_server.
rescoring`). A scored line gets the new verdict, and the old one beside it (``rescored.previous``); an episode whose
judge failed (an infrastructure error at ``/verify``, which keeps its trajectory as ``unscored_episode``) gets its
first verdict. Every episode whose reward changed is named.

A line that cannot be re-scored is left as it is and refused with its reason, counted by reason: a line that is not
JSON (torn), no trajectory (an episode that failed before it ended, or a line written before trajectories were kept),
another release's episode, or the server's refusal (a trajectory the replay contradicts). Never a crash, never a
silent zero: a judge that fails again leaves the line as it was, counted as ``judge or server failed``.
"""

import asyncio
import json
import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from omegaconf import OmegaConf
from pydantic import ValidationError

from nemo_tau2.config import ConfigError, apply_overrides
from nemo_tau2.evals.metrics import EpisodeRecord, compute_eval_metrics
from nemo_tau2.evals.results import (
    CONFIG_FILE,
    ROLLOUTS_FILE,
    SUMMARY_FILE,
    infrastructure_causes,
    latest_records,
    write_json_atomic,
)
from nemo_tau2.experience.rollouts import COMPONENT_KEYS, OK
from nemo_tau2.gym.agent.episode_record import AgentToolCalls, failure_kind
from nemo_tau2.gym.launch import GymServers
from nemo_tau2.gym.stack import RESOURCES_SERVER, resources_server_spec
from nemo_tau2.tau2_env import ALL_DOMAINS, domain_problem
from nemo_tau2.tau2_release.config import Tau2ReleaseConfig
from nemo_tau2.utils.jsonl_log import replace_lines

logger = logging.getLogger(__name__)

TORN = "torn line (not a JSON object)"
NO_TRAJECTORY = "no trajectory (tau2_messages not stored)"
NOT_PLAYED = "not played to its end (an infrastructure failure before /verify): rerun the eval to retry it"
SERVER_FAILED = "judge or server failed"
_VERDICT_KEYS = ("reward", "success", "termination_reason", "reward_components", "reward_info", "retrieval", "status")


@dataclass
class RescoreReport:
    """What a re-scoring did: lines re-scored (``recovered``: infrastructure errors that now have a verdict), the
    episodes whose reward changed (``domain/task_id#sample: before -> after``), and the refused lines by reason."""

    rescored: int = 0
    recovered: int = 0
    changed: list[str] = field(default_factory=list)
    refused: Counter[str] = field(default_factory=Counter)
    refused_lines: list[str] = field(default_factory=list)  # "line <n> (<episode>): <reason>"

    def as_dict(self) -> dict[str, Any]:
        return {
            "rescored": self.rescored,
            "recovered": self.recovered,
            "reward_changed": self.changed,
            "refused": dict(self.refused.most_common()),
            "refused_lines": self.refused_lines,
        }


def _name(record: dict[str, Any]) -> str:
    return f"{record.get('domain')}/{record.get('task_id')}#{record.get('sample_index')}"


def stored_episode(record: Any, version: str) -> tuple[dict[str, Any] | None, str | None]:
    """``(verify body, None)`` for a line that can be re-scored by a server of ``version``, else ``(None, reason)``."""
    if not isinstance(record, dict):
        return None, TORN
    played = record if record.get("status") == OK else (record.get("unscored_episode") or {})
    if record.get("status") != OK and not played:
        return None, NOT_PLAYED
    if not played.get("tau2_messages"):
        return None, NO_TRAJECTORY
    if record.get("tau2_version") not in (None, version):
        return None, f"another release's episode (tau2 {record.get('tau2_version')}; this run's server: {version})"
    body = {
        "domain": record.get("domain"),
        "task_id": record.get("task_id"),
        "tau2_version": record.get("tau2_version") or version,
        "retrieval_variant": record.get("retrieval_variant"),
        "responses_create_params": {"input": []},
        "response": {"id": "stored", "created_at": 0, "model": "", "object": "response", "output": [],
                     "parallel_tool_calls": True, "tool_choice": "auto", "tools": []},
        "tau2_messages": played["tau2_messages"],
        "termination_reason": played.get("termination_reason"),
    }  # fmt: skip
    return body, None


def apply_verdict(record: dict[str, Any], verdict: dict[str, Any]) -> dict[str, Any]:
    """The line with the new verdict, and the old one beside it (``rescored.previous``)."""
    previous = {key: record.get(key) for key in _VERDICT_KEYS}
    updated = dict(record)
    updated.update(
        status=OK,
        reward=float(verdict["reward"]),
        success=bool(verdict["success"]),
        termination_reason=verdict["termination_reason"],
        reward_components={key: verdict.get(key) for key in COMPONENT_KEYS},
        reward_info=verdict.get("reward_info"),
        retrieval=verdict.get("retrieval"),
        error=None,
        cause=None,
    )
    if record.get("status") != OK:  # recovered: how it ended, now that it has a verdict
        updated["tau2_messages"] = record["unscored_episode"]["tau2_messages"]
        updated["transcript"] = record["unscored_episode"].get("transcript")
        updated.pop("unscored_episode", None)
        calls = record.get("agent_tool_calls")
        if calls is not None:
            updated["tau2_failure_kind"] = failure_kind(False, verdict["termination_reason"], AgentToolCalls(**calls))
    updated["rescored"] = {"previous": previous, "reward_changed": previous["reward"] != updated["reward"]}
    return updated


async def _verify_all(url: str, bodies: dict[int, dict], concurrency: int, timeout_s: float) -> dict[int, tuple]:
    gate = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as http:

        async def one(index: int, body: dict) -> tuple[int, tuple[int, Any]]:
            async with gate:
                try:
                    async with http.post(f"{url}/verify", json=body) as answer:
                        text = await answer.text()
                        return index, (answer.status, json.loads(text) if text.strip().startswith("{") else text)
                except (aiohttp.ClientError, TimeoutError) as e:
                    return index, (0, f"{type(e).__name__}: {e}")

        return dict(await asyncio.gather(*(one(index, body) for index, body in bodies.items())))


def _detail(answer: Any) -> str:
    detail = answer.get("detail") if isinstance(answer, dict) else answer
    return str(detail)[:300]


def rescore_file(save_dir: Path, url: str, version: str, concurrency: int = 8, timeout_s: float = 600.0):
    """Re-score ``save_dir/rollouts.jsonl`` in place against the resources server at ``url`` (serving tau2
    ``version``); returns the :class:`RescoreReport`. The file is replaced whole, atomically: each line that was
    re-scored gets its new verdict, every other line stays byte for byte."""
    path = save_dir / ROLLOUTS_FILE
    raw = path.read_bytes().splitlines(keepends=True)
    records: dict[int, dict] = {}
    bodies: dict[int, dict] = {}
    report = RescoreReport()
    for index, line in enumerate(raw):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            record = None
        body, reason = stored_episode(record, version)
        if body is None:
            report.refused[reason] += 1
            report.refused_lines.append(f"line {index + 1} ({_name(record) if record else '?'}): {reason}")
            continue
        records[index], bodies[index] = record, body
    answers = asyncio.run(_verify_all(url, bodies, concurrency, timeout_s)) if bodies else {}
    for index, (status, answer) in sorted(answers.items()):
        record = records[index]
        if status != 200 or not isinstance(answer, dict):
            reason = SERVER_FAILED if status in (0, 502, 503, 504) or status >= 500 else "refused by the server"
            report.refused[reason] += 1
            report.refused_lines.append(f"line {index + 1} ({_name(record)}): {reason}: {_detail(answer)}")
            continue
        updated = apply_verdict(record, answer)
        report.rescored += 1
        report.recovered += record.get("status") != OK
        if updated["rescored"]["reward_changed"]:
            report.changed.append(f"{_name(record)}: {record.get('reward')} -> {updated['reward']}")
        raw[index] = (json.dumps(updated, ensure_ascii=False) + "\n").encode()
    replace_lines(path, raw)
    return report


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path}: cannot read it ({e}); --rescore takes an evaluation's results folder") from e
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: not a JSON object; --rescore takes an evaluation's results folder")
    return value


def _records(save_dir: Path) -> list[dict[str, Any]]:
    """Every whole record of ``rollouts.jsonl``, in file order (a torn line is skipped here, and left in place)."""
    records = []
    for line in (save_dir / ROLLOUTS_FILE).read_bytes().splitlines():
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        if isinstance(record, dict) and {"domain", "task_id", "sample_index", "status"} <= record.keys():
            records.append(record)
    return records


def rescore_eval(save_dir: str | Path, overrides: list[str]) -> tuple[dict[str, Any], RescoreReport]:
    """Re-score the evaluation in ``save_dir`` in place (its ``rollouts.jsonl``, then ``summary.json``) on a
    resources server of the release its ``config.json`` names (``overrides``: ``tau2.*`` keys changed for this, a
    judge's new address). Returns the new summary (with ``rescore``: the report) and the report.

    Raises:
        ConfigError: not a results folder, or overrides that do not apply.
    """
    save_dir = Path(save_dir)
    if not (save_dir / ROLLOUTS_FILE).is_file():
        raise ConfigError(f"{save_dir}: no {ROLLOUTS_FILE}; --rescore takes an evaluation's results folder")
    config = _read_json(save_dir / CONFIG_FILE)
    saved = OmegaConf.create({"tau2": config.get("tau2") or {}})
    try:
        tau2 = Tau2ReleaseConfig.model_validate(OmegaConf.to_container(apply_overrides(saved, overrides))["tau2"])
    except ValidationError as e:
        raise ConfigError(f"tau2: {e.errors()[0]['loc']}: {e.errors()[0]['msg']}") from e
    summary = _read_json(save_dir / SUMMARY_FILE) if (save_dir / SUMMARY_FILE).exists() else {}
    domains = sorted({str(r.get("domain")) for r in _records(save_dir)} & set(ALL_DOMAINS))
    domains = [domain for domain in domains if domain_problem(domain, tau2.version) is None]
    spec = resources_server_spec(domains or ["airline"], {"tau2": tau2.model_dump(mode="json")})
    with GymServers([spec], log_dir=save_dir / "server_logs" / "rescore") as servers:
        report = rescore_file(save_dir, servers.url(RESOURCES_SERVER), tau2.version)
    records = list(latest_records(_records(save_dir)).values())
    settings = config.get("eval") or {}
    ks, bootstrap = settings.get("k_values") or [1], int(settings.get("bootstrap_samples") or 0)
    seed = int(settings.get("seed") or 0)
    summary["metrics"] = compute_eval_metrics(
        [EpisodeRecord.from_dict(r) for r in records], ks=ks, num_bootstrap=bootstrap, seed=seed
    )
    summary["infrastructure_causes"] = dict(infrastructure_causes(records).most_common())
    summary["rescore"] = report.as_dict()
    write_json_atomic(save_dir / SUMMARY_FILE, summary)
    return summary, report


def describe(report: RescoreReport) -> str:
    """The console's account of a re-scoring: counts, each changed episode, each refused line (first 20)."""
    lines = [
        f"re-scored {report.rescored} episode(s) ({report.recovered} recovered from an infrastructure error); "
        f"reward changed: {len(report.changed)}; refused: {sum(report.refused.values())}"
    ]
    lines += [f"  changed {name}" for name in report.changed]
    lines += [f"  refused {count}x: {reason}" for reason, count in report.refused.most_common()]
    lines += [f"    {line}" for line in report.refused_lines[:20]]
    return "\n".join(lines)
