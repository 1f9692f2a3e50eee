"""An evaluation's episodes in NeMo-Gym 0.7.0's run layout, so that its stored-rollout tools work on them.

``examples/export_rollouts.py <results dir>`` writes ``<results dir>/nemo_gym/``, the files ``gym eval run --output
nemo_gym/rollouts.jsonl`` would have written:

- ``rollouts.jsonl``: one line per scored episode, with NeMo-Gym's identity (``_ng_task_index``: the eval's row,
  ``_ng_rollout_index``: the sample), ``agent_ref``, ``reward``, the final ``response`` (its output items; its
  ``metadata`` carries the tau2 trajectory, as our agent's answers do, so ``/verify`` re-scores it with no session)
  and ``ng_trajectory``, 0.7.0's canonical evidence (one invocation, one turn and one model call per policy turn,
  token counts from the recorded token ids), which ``gym eval health-check`` reads;
- ``rollouts_failures.jsonl``: the episodes that have no verdict, classed as 0.7.0 classes failures
  (``judge_failed``: the NL judge's outage at ``/verify``, whose played episode is kept, so ``gym eval reverify
  --judge-failed-only`` re-judges it; ``agent_request_failed``: any other infrastructure failure);
- ``rollouts_materialized_inputs.jsonl``: the task row of each episode, what ``gym eval reverify --inputs`` joins;
- ``resources_server.yaml``: the eval's resources server alone (:mod:`nemo_tau2.evals.reverify_config`).

The export is faithful to the file it reads, faults included, so that 0.7.0's checks see them: a line that is not a
JSON object is copied as it is (0.7.0 reports it unreadable), two scored lines of one episode stay two (0.7.0
reports a duplicate identity), a scored line without its transcript has no agent turn (0.7.0 reports it). Superseded
lines are left out as our own readers leave them out: an infrastructure failure a later line of the same episode
retried. A line without an episode's identity is refused, with its reason.
"""

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_tau2.evals.results import CONFIG_FILE, ROLLOUTS_FILE, SYSTEM_PROMPTS_FILE
from nemo_tau2.evals.reverify_config import write_resources_server_config
from nemo_tau2.experience.rollouts import OK
from nemo_tau2.gym.agent.episode_record import trajectory_metadata

GYM_DIR = "nemo_gym"
GYM_ROLLOUTS = "rollouts.jsonl"
GYM_FAILURES = "rollouts_failures.jsonl"  # 0.7.0's failures sidecar: <rollouts stem>_failures.jsonl
GYM_INPUTS = "rollouts_materialized_inputs.jsonl"  # and its materialized inputs
AGENT_REF = {"type": "responses_api_agents", "name": "tau2_agent"}
POLICY_REF_TYPE = "responses_api_models"
JUDGE_FAILED, REQUEST_FAILED = "judge_failed", "agent_request_failed"
TRAINING_FIELDS = (
    "prompt_token_ids",
    "generation_token_ids",
    "generation_log_probs",
    "weight_version",
    "routed_experts",
)
IDENTITY = frozenset({"domain", "task_id", "sample_index", "status"})


@dataclass
class GymExport:
    """What an export wrote (lines per file) and refused (``line <n>: <reason>``)."""

    folder: Path
    rollouts: int = 0
    failures: int = 0
    inputs: int = 0
    passed_through: int = 0  # lines that are not JSON objects, copied as they are
    refused: list[str] = field(default_factory=list)


def _clean(item: dict[str, Any]) -> dict[str, Any]:
    """A transcript item without the training fields (token ids, log probabilities): Responses as a client sees it."""
    return {key: value for key, value in item.items() if key not in TRAINING_FIELDS}


def _is_policy_output(item: dict[str, Any]) -> bool:
    return item.get("type") == "function_call" or (item.get("type") == "message" and item.get("role") == "assistant")


def policy_turns(transcript: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The transcript's policy turns: each a maximal run of consecutive policy output items (its calls and text)."""
    turns: list[list[dict[str, Any]]] = []
    previous_was_output = False
    for item in transcript:
        output = isinstance(item, dict) and _is_policy_output(item)
        if output and previous_was_output:
            turns[-1].append(item)
        elif output:
            turns.append([item])
        previous_was_output = output
    return turns


def _turn_tokens(turn: list[dict[str, Any]]) -> tuple[int, int] | None:
    """(prompt, completion) tokens of a turn from its recorded token ids; None when none were recorded."""
    for item in turn:
        if isinstance(item.get("prompt_token_ids"), list) and isinstance(item.get("generation_token_ids"), list):
            return len(item["prompt_token_ids"]), len(item["generation_token_ids"])
    return None


def ng_trajectory(record: dict[str, Any], task_index: int, transcripts_kept: bool) -> dict[str, Any]:
    """0.7.0's ``ng_trajectory`` (TrajectoryRecord v1.0) of one scored episode of ours.

    One root invocation (the agent's ``/run``), one turn per policy turn with its one model call (the policy's), the
    calls' token counts from the token ids our transcript records. Where the eval kept no transcripts, the turns and
    calls are declared unavailable, and where it recorded no token ids (``env.nemo_gym.return_token_ids`` false, the
    eval's default) the calls' capture incomplete: 0.7.0's gaps, for which its checks say unobserved, not
    unhealthy."""
    rollout_id = f"{task_index}-{record['sample_index']}"
    invocation_id = f"{rollout_id}:run"
    transcript = [item for item in record.get("transcript") or [] if isinstance(item, dict)]
    model_ref = {"type": POLICY_REF_TYPE, "name": str(record.get("policy_model") or "policy")}
    turns, calls = [], []
    tool_calls = 0
    for number, turn in enumerate(policy_turns(transcript), start=1):
        call_id = f"{rollout_id}:policy:{number}"
        tool_calls += sum(item.get("type") == "function_call" for item in turn)
        tokens = _turn_tokens(turn)
        stats = {} if tokens is None else {"prompt_tokens": tokens[0], "completion_tokens": tokens[1]}
        if tokens is not None:
            stats["total_tokens"] = tokens[0] + tokens[1]
        calls.append(
            {
                "model_call_id": call_id,
                "response_metadata": {"model": model_ref["name"], "model_ref": model_ref, "status_code": 200},
                "token_stats": stats,
            }
        )
        turns.append(
            {
                "invocation_id": invocation_id,
                "task_id": str(record["task_id"]),
                "rollout_id": rollout_id,
                "turn_no": number,
                "timestamp": 0.0,  # not recorded per turn
                "answer": [_clean(item) for item in turn],
                "step_count": tool_calls,
                "model_calls": [{"model_call_id": call_id}],
            }
        )
    outputs = {item.get("call_id"): item for item in transcript if item.get("type") == "function_call_output"}
    executions = [
        {
            "kind": "tool_call",
            "invocation_id": invocation_id,
            "tool_call_id": item["call_id"],
            "tool_name": item.get("name"),
            "status": "completed" if item["call_id"] in outputs else "incomplete",
            "output": (outputs.get(item["call_id"]) or {}).get("output"),
        }
        for item in transcript
        if item.get("type") == "function_call" and item.get("call_id")
    ]
    gaps = [] if transcripts_kept else [{"code": "turns_unavailable"}, {"code": "model_calls_unavailable"}]
    if any(not call["token_stats"] for call in calls):  # an eval without token ids (return_token_ids false)
        gaps.append({"code": "model_call_capture_incomplete", "detail": "token counts not recorded per call"})
    return {
        "schema_version": "1.0",
        "task_id": str(record["task_id"]),
        "rollout_id": rollout_id,
        "invocations": [
            {
                "kind": "agent_invocation",
                "invocation_id": invocation_id,
                "status": "completed",
                "model_calls": [{"model_call_id": call["model_call_id"]} for call in calls],
                "conversation": [_clean(item) for item in transcript],
            }
        ],
        "turns": turns,
        "model_calls": calls,
        "tool_calls": executions,
        "gaps": gaps,
    }


def stored_response(record: dict[str, Any], played: dict[str, Any], trajectory: dict[str, Any]) -> dict[str, Any]:
    """The episode's final ``response`` as our agent answered it: output items, usage summed over the policy's calls,
    and the tau2 trajectory in ``metadata`` (what a session-less ``/verify`` re-scores)."""
    stats = [call["token_stats"] for call in trajectory["model_calls"]]
    usage = None
    if stats and all("prompt_tokens" in s for s in stats):
        prompt, completion = sum(s["prompt_tokens"] for s in stats), sum(s["completion_tokens"] for s in stats)
        usage = {
            "input_tokens": prompt,
            "output_tokens": completion,
            "total_tokens": prompt + completion,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        }
    return {
        "id": f"resp_{trajectory['rollout_id']}",
        "created_at": 0,
        "model": str(record.get("policy_model") or "policy"),
        "object": "response",
        "output": [_clean(item) for item in played.get("transcript") or [] if isinstance(item, dict)],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "status": "completed",
        "usage": usage,
        "metadata": trajectory_metadata(played.get("tau2_messages") or [], played.get("termination_reason")),
    }


def task_input(record: dict[str, Any], task_index: int, system_prompt: str | None) -> dict[str, Any]:
    """The materialized input row of an episode: its task's identity (what ``/verify`` rebuilds the task from)."""
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    played = record.get("tau2_messages") or (record.get("unscored_episode") or {}).get("tau2_messages") or [{}]
    first = played[0] if isinstance(played[0], dict) else {}
    if first.get("role") == "assistant" and first.get("content") and not first.get("tool_calls"):
        messages.append({"role": "assistant", "content": first["content"]})  # tau2's greeting, part of the row
    return {
        "_ng_task_index": task_index,
        "_ng_rollout_index": int(record["sample_index"]),
        "agent_ref": AGENT_REF,
        "responses_create_params": {"input": messages},
        "domain": record["domain"],
        "task_id": str(record["task_id"]),
        "tau2_version": record.get("tau2_version"),
        "retrieval_variant": record.get("retrieval_variant"),
    }


def _identity(record: dict[str, Any], task_index: int) -> dict[str, Any]:
    """What names an episode in NeMo-Gym's layout (its task and rollout indices) and in ours."""
    return {
        "_ng_task_index": task_index,
        "_ng_rollout_index": int(record["sample_index"]),
        "agent_ref": AGENT_REF,
        "domain": record["domain"],
        "task_id": str(record["task_id"]),
        "sample_index": int(record["sample_index"]),
    }


def _rollout_row(record: dict[str, Any], task_index: int, transcripts_kept: bool) -> dict[str, Any]:
    trajectory = ng_trajectory(record, task_index, transcripts_kept)
    return _identity(record, task_index) | {
        "tau2_version": record.get("tau2_version"),
        "reward": record.get("reward"),
        "success": record.get("success"),
        "termination_reason": record.get("termination_reason"),
        "response": stored_response(record, record, trajectory),
        "ng_trajectory": trajectory,
    }


def _failure_row(record: dict[str, Any], task_index: int) -> dict[str, Any]:
    played = record.get("unscored_episode") or {}
    judged = bool(played) and "judge" in str(record.get("error") or "")
    row = _identity(record, task_index) | {
        "_ng_failure_class": JUDGE_FAILED if judged else REQUEST_FAILED,
        "_ng_failure_terminal": False,
        "_ng_failure_message": record.get("cause") or record.get("error"),
    }
    if played.get("tau2_messages"):
        row["response"] = stored_response(record, played, ng_trajectory(record | played, task_index, True))
    return row


def _read(save_dir: Path, name: str) -> dict[str, Any]:
    path = save_dir / name
    try:
        value = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, json.JSONDecodeError):
        value = {}
    return value if isinstance(value, dict) else {}


def _system_prompts(save_dir: Path) -> dict[str, str]:
    saved = _read(save_dir, SYSTEM_PROMPTS_FILE)
    prompts = saved.get("prompts") or []
    return {task: prompts[index] for task, index in (saved.get("tasks") or {}).items() if index < len(prompts)}


@dataclass
class StoredRun:
    """An evaluation's ``rollouts.jsonl`` as the export reads it: each line (a record, or the bytes of a line that is
    not a JSON object), which are kept, each task's index, the tasks' system prompts, the lines refused."""

    entries: list[tuple[int, Any]]
    kept: set[int]
    task_indices: dict[tuple[str, str], int]
    prompts: dict[str, str]
    transcripts_kept: bool
    refused: list[str]

    def task_index(self, record: dict[str, Any]) -> int:
        return self.task_indices[(record["domain"], str(record["task_id"]))]

    def prompt(self, record: dict[str, Any]) -> str | None:
        return self.prompts.get(f"{record['domain']}/{record['task_id']}")


def read_run(save_dir: str | Path) -> StoredRun:
    """Read ``<save_dir>/rollouts.jsonl``. Raises ``ValueError`` when ``save_dir`` is not an evaluation's results
    folder."""
    save_dir = Path(save_dir)
    source = save_dir / ROLLOUTS_FILE
    if not source.is_file():
        raise ValueError(f"{save_dir}: no {ROLLOUTS_FILE}; give an evaluation's results folder (its save_path)")
    refused: list[str] = []
    entries: list[tuple[int, Any]] = []  # (line number, parsed record or the raw bytes of a line that is not one)
    for number, line in enumerate(source.read_bytes().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            record = None
        if not isinstance(record, dict):
            entries.append((number, line))
        elif not record.keys() >= IDENTITY or not isinstance(record.get("sample_index"), int):
            missing = sorted(IDENTITY - record.keys()) or ["sample_index (an integer)"]
            refused.append(f"line {number}: no episode identity (missing {', '.join(missing)})")
        else:
            entries.append((number, record))
    episodes: dict[tuple, list[int]] = defaultdict(list)
    task_indices: dict[tuple[str, str], int] = {}
    for position, (_, record) in enumerate(entries):
        if isinstance(record, dict):
            episodes[(record["domain"], str(record["task_id"]), record["sample_index"])].append(position)
            key = (record["domain"], str(record["task_id"]))
            task_indices.setdefault(key, record.get("row_index", len(task_indices)))
    kept: set[int] = set()
    for positions in episodes.values():
        scored = [p for p in positions if entries[p][1]["status"] == OK]
        kept.update(scored or positions[-1:])  # every scored line (two are a fault to show); else the last failure
    return StoredRun(
        entries=entries,
        kept=kept,
        task_indices=task_indices,
        prompts=_system_prompts(save_dir),
        transcripts_kept=bool((_read(save_dir, CONFIG_FILE).get("eval") or {}).get("keep_transcripts", True)),
        refused=refused,
    )


def scored_episodes(save_dir: str | Path) -> list[tuple[dict[str, Any], int, str | None]]:
    """``(record, task index, system prompt)`` of each scored episode, once each (its first scored line)."""
    run = read_run(save_dir)
    seen: set[tuple] = set()
    episodes = []
    for position, (_, record) in enumerate(run.entries):
        if position not in run.kept or not isinstance(record, dict) or record["status"] != OK:
            continue
        key = (record["domain"], str(record["task_id"]), record["sample_index"])
        if key not in seen:
            seen.add(key)
            episodes.append((record, run.task_index(record), run.prompt(record)))
    return episodes


def export_gym_run(save_dir: str | Path) -> GymExport:
    """Write ``<save_dir>/nemo_gym/`` from ``<save_dir>/rollouts.jsonl`` (each file replaced whole); returns what
    was written and refused. Raises ``ValueError`` when ``save_dir`` is not an evaluation's results folder."""
    run = read_run(save_dir)
    report = GymExport(folder=Path(save_dir) / GYM_DIR, refused=run.refused)
    rollouts, failures, inputs = [], [], {}
    for position, (_, record) in enumerate(run.entries):
        if not isinstance(record, dict):
            rollouts.append(record)
            report.passed_through += 1
            continue
        if position not in run.kept:
            continue
        task_index = run.task_index(record)
        row = _rollout_row(record, task_index, run.transcripts_kept) if record["status"] == OK else None
        target = rollouts if row is not None else failures
        target.append(json.dumps(row or _failure_row(record, task_index), ensure_ascii=False).encode())
        inputs.setdefault((task_index, record["sample_index"]), task_input(record, task_index, run.prompt(record)))
    report.folder.mkdir(parents=True, exist_ok=True)
    for name, lines in (
        (GYM_ROLLOUTS, rollouts),
        (GYM_FAILURES, failures),
        (GYM_INPUTS, [json.dumps(row, ensure_ascii=False).encode() for row in inputs.values()]),
    ):
        partial = report.folder / f"{name}.partial"
        partial.write_bytes(b"".join(line + b"\n" for line in lines))
        partial.replace(report.folder / name)
    domains = sorted({record["domain"] for _, record in run.entries if isinstance(record, dict)})
    write_resources_server_config(Path(save_dir), report.folder, domains)
    report.rollouts = len(rollouts) - report.passed_through
    report.failures, report.inputs = len(failures), len(inputs)
    return report


def describe(report: GymExport) -> str:
    """One paragraph: what was written where, and each refused line."""
    counts = Counter(reason.split(": ", 1)[1] for reason in report.refused)
    lines = [
        f"{report.folder}: {report.rollouts} scored rollout(s) in {GYM_ROLLOUTS}, {report.failures} failure(s) in "
        f"{GYM_FAILURES}, {report.inputs} task input(s) in {GYM_INPUTS}"
        + (f"; {report.passed_through} line(s) not JSON copied as they are" if report.passed_through else "")
    ]
    lines += [f"  refused {count}x: {reason}" for reason, count in counts.most_common()]
    return "\n".join(lines)
