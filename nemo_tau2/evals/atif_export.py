"""An evaluation's scored episodes as ATIF v1.7 trajectories (the agent-trajectory interchange format), with the
manifest NeMo-Gym 0.7.0's tools join them by.

``examples/export_rollouts.py <results dir>`` writes ``<results dir>/atif/``: one ``<task>-<sample>.json`` per scored
episode and ``manifest.jsonl`` (``trajectory_path``, ``_ng_task_index``, ``_ng_rollout_index``, ``expected_sha256``:
the rows of ``nemo_gym/rollouts_materialized_inputs.jsonl`` they belong to, see :mod:`nemo_tau2.evals.gym_export`).

Why our own writer: 0.7.0's ``gym eval export --format atif`` converts only a trajectory whose user speaks once, before
the agent's first output (it refuses "later system or user turns"), and a tau2 episode is a conversation: the
simulated user speaks after the agent, every turn. ATIF itself has no such limit, so this writes each conversation as
it was: the system prompt, the agent's greeting (no model call: ``llm_call_count`` 0), each user message, each policy
turn (its text, its tool calls, their results, its token counts from the recorded token ids). banking_knowledge's
searches are tool calls like any other; what the episode retrieved and unlocked is in ``extra.nemo_tau2.retrieval``.
``extra.nemo_tau2`` also carries the episode's identity, verdict and tau2's own trajectory (``tau2_messages``), what a
session-less ``/verify`` of ours re-scores.
"""

import hashlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from nemo_tau2.evals.gym_export import AGENT_REF, GYM_DIR, policy_turns, scored_episodes
from nemo_tau2.gym.resources_server.in_process import message_text

ATIF_DIR = "atif"
MANIFEST = "manifest.jsonl"
SCHEMA_VERSION = "ATIF-v1.7"


def _arguments(call: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """A call's arguments as ATIF's object, and (for arguments that are not a JSON object) the text as sent."""
    try:
        value = json.loads(call.get("arguments") or "{}")
    except (json.JSONDecodeError, TypeError):
        value = None
    if isinstance(value, dict):
        return value, None
    return {}, {"nemo_tau2": {"raw_arguments": call.get("arguments")}}


def _agent_step(turn: list[dict[str, Any]], outputs: list[dict[str, Any]], model: str) -> dict[str, Any]:
    calls = [item for item in turn if item.get("type") == "function_call"]
    step: dict[str, Any] = {
        "source": "agent",
        "message": "".join(message_text(item.get("content")) for item in turn if item.get("type") == "message"),
        "model_name": model,
        "llm_call_count": 1,
    }
    if calls:
        step["tool_calls"] = []
        for call in calls:
            arguments, extra = _arguments(call)
            step["tool_calls"].append(
                {"tool_call_id": call["call_id"], "function_name": call["name"], "arguments": arguments}
                | ({"extra": extra} if extra else {})
            )
        called = {call["call_id"] for call in calls}
        step["observation"] = {
            "results": [
                {"source_call_id": out["call_id"], "content": message_text(out.get("output"))}
                for out in outputs
                if out.get("call_id") in called
            ]
        }
    for item in turn:
        prompt, generated = item.get("prompt_token_ids"), item.get("generation_token_ids")
        if isinstance(prompt, list) and isinstance(generated, list):
            step["metrics"] = {"prompt_tokens": len(prompt), "completion_tokens": len(generated)}
            break
    return step


def atif_trajectory(
    record: dict[str, Any], task_index: int, session_id: str, agent_version: str, system_prompt: str | None
) -> dict[str, Any]:
    """One scored episode of ours as an ATIF v1.7 trajectory (a JSON object)."""
    model = str(record.get("policy_model") or "policy")
    transcript = [item for item in record.get("transcript") or [] if isinstance(item, dict)]
    messages = record.get("tau2_messages") or []
    steps: list[dict[str, Any]] = []
    if system_prompt:
        steps.append({"source": "system", "message": system_prompt})
    greeting = messages[0] if messages and isinstance(messages[0], dict) else {}
    if greeting.get("role") == "assistant" and greeting.get("content") and not greeting.get("tool_calls"):
        steps.append({"source": "agent", "message": greeting["content"], "llm_call_count": 0})
    turns = {id(turn[0]): turn for turn in policy_turns(transcript)}
    index = 0
    while index < len(transcript):
        item = transcript[index]
        if id(item) in turns:
            turn = turns[id(item)]
            index += len(turn)
            outputs = []
            while index < len(transcript) and transcript[index].get("type") == "function_call_output":
                outputs.append(transcript[index])
                index += 1
            steps.append(_agent_step(turn, outputs, model))
            continue
        if item.get("type") == "message" and item.get("role") == "user":
            steps.append({"source": "user", "message": message_text(item.get("content"))})
        index += 1
    for number, step in enumerate(steps, start=1):
        step["step_id"] = number
    metrics = [step["metrics"] for step in steps if "metrics" in step]
    agent_steps = [step for step in steps if step["source"] == "agent" and step.get("llm_call_count")]
    final = {"total_steps": len(steps)}
    if metrics and len(metrics) == len(agent_steps):
        final |= {
            "total_prompt_tokens": sum(m["prompt_tokens"] for m in metrics),
            "total_completion_tokens": sum(m["completion_tokens"] for m in metrics),
        }
    return {
        "schema_version": SCHEMA_VERSION,
        "session_id": session_id,
        "trajectory_id": f"{session_id}:{task_index}:{record['sample_index']}",
        "agent": {"name": AGENT_REF["name"], "version": agent_version, "model_name": model},
        "steps": steps,
        "final_metrics": final,
        "extra": {
            "nemo_tau2": {
                key: record.get(key)
                for key in ("domain", "task_id", "sample_index", "tau2_version", "retrieval_variant", "reward")
            }
            | {
                "termination_reason": record.get("termination_reason"),
                "reward_info": record.get("reward_info"),
                "retrieval": record.get("retrieval"),
                "tau2_messages": messages,
            }
        },
    }


def export_atif(save_dir: str | Path, agent_version: str) -> tuple[Path, int]:
    """Write ``<save_dir>/atif/`` (replaced whole) from the scored episodes of ``<save_dir>/rollouts.jsonl``; returns
    the folder and the number of trajectories (0: no scored episode, nothing written). Raises ``ValueError`` when
    ``save_dir`` is not an evaluation's results folder."""
    save_dir = Path(save_dir)
    episodes = scored_episodes(save_dir)
    if not episodes:
        return save_dir / ATIF_DIR, 0
    session_id = save_dir.resolve().name
    folder = save_dir / ATIF_DIR
    staging = Path(tempfile.mkdtemp(prefix=f".{ATIF_DIR}.", dir=save_dir))
    manifest = []
    for record, task_index, prompt in episodes:
        trajectory = atif_trajectory(record, task_index, session_id, agent_version, prompt)
        encoded = (json.dumps(trajectory, ensure_ascii=False, indent=2) + "\n").encode()
        name = f"{task_index}-{record['sample_index']}.json"
        (staging / name).write_bytes(encoded)
        manifest.append(
            {
                "trajectory_path": name,
                "_ng_task_index": task_index,
                "_ng_rollout_index": int(record["sample_index"]),
                "expected_sha256": hashlib.sha256(encoded).hexdigest(),
            }
        )
    (staging / MANIFEST).write_text("".join(json.dumps(row, sort_keys=True) + "\n" for row in manifest))
    if folder.exists():
        shutil.rmtree(folder)
    staging.replace(folder)
    return folder, len(manifest)


__all__ = ["ATIF_DIR", "GYM_DIR", "MANIFEST", "atif_trajectory", "export_atif"]
