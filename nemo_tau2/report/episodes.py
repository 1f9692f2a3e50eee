"""One episode as the report shows it: its outcome (success, the way it failed, or an infrastructure error), its
reward components, and its transcript for the viewer, with secrets taken out.

The failure kind is the first reason tau2's verdict gives, in the order a researcher asks: the episode was cut
short (a limit or an error ended it, not the user or the agent), the final database was wrong, an environment
assertion failed, a gold action was missed, the agent did not communicate what it had to, an NL assertion failed.
Components come from tau2's ``reward_breakdown`` (only what the task's ``reward_basis`` counts) when the record
kept it, else from the record's ``reward_components``.
"""

import json
import os
import re
from typing import Any

from nemo_tau2.config import REDACTED, redact_secrets
from nemo_tau2.experience.rollouts import NORMAL_TERMINATIONS
from nemo_tau2.processes import is_secret_key, registered_secrets

SUCCESS = "success"
INFRASTRUCTURE_ERROR = "infrastructure error"
CUT_SHORT = "cut short"
OTHER_FAILURE = "other failure"
# tau2's reward_breakdown keys, the names the report shows and the failure kind each one's miss means.
COMPONENTS = {
    "DB": ("DB", "wrong DB state"),
    "ENV_ASSERTION": ("env assertions", "env assertion failed"),
    "ACTION": ("actions", "missed gold action"),
    "COMMUNICATE": ("communicate", "missed communication"),
    "NL_ASSERTION": ("NL assertions", "NL assertion failed"),
}
OUTCOMES = [SUCCESS, CUT_SHORT, *(kind for _, kind in COMPONENTS.values()), OTHER_FAILURE, INFRASTRUCTURE_ERROR]
OUTCOME_COLORS = {
    SUCCESS: "#2e9e5b",
    CUT_SHORT: "#8e44ad",
    "wrong DB state": "#d7301f",
    "env assertion failed": "#f16913",
    "missed gold action": "#fdae6b",
    "missed communication": "#e7298a",
    "NL assertion failed": "#c994c7",
    OTHER_FAILURE: "#7f0000",
    INFRASTRUCTURE_ERROR: "#9e9e9e",
}


def components(record: dict[str, Any]) -> dict[str, float]:
    """Each reward component scored for the episode, in [0, 1], keyed as tau2's ``reward_breakdown``."""
    if record["status"] != "ok":
        return {}
    breakdown = (record.get("reward_info") or {}).get("reward_breakdown")
    if breakdown:
        return {key: float(value) for key, value in breakdown.items() if key in COMPONENTS and value is not None}
    raw = record.get("reward_components") or {}
    out = {}
    if raw.get("db_match") is not None:
        out["DB"] = float(bool(raw["db_match"]))
    for key, name in (
        ("ENV_ASSERTION", "env_assertion_fraction"),
        ("ACTION", "action_match_fraction"),
        ("COMMUNICATE", "communicate_fraction"),
    ):
        if raw.get(name) is not None:
            out[key] = float(raw[name])
    return out


def outcome(record: dict[str, Any]) -> str:
    """``success``, the failure kind (see the module docstring) or ``infrastructure error``."""
    if record["status"] != "ok":
        return INFRASTRUCTURE_ERROR
    if record.get("success"):
        return SUCCESS
    if record.get("truncated_by") or (record.get("termination_reason") or "") not in NORMAL_TERMINATIONS:
        return CUT_SHORT
    scored = components(record)
    for key, (_, kind) in COMPONENTS.items():
        if scored.get(key, 1.0) < 1.0:
            return kind
    return OTHER_FAILURE


def wall_seconds(record: dict[str, Any]) -> float | None:
    total = (record.get("timings") or {}).get("total")
    return float(total) if total is not None else None


# ---------------------------------------------------------------- secrets


_SECRET_PATTERNS = re.compile(
    r"\b(sk-[A-Za-z0-9_\-]{16,}|hf_[A-Za-z0-9]{20,}|nvapi-[A-Za-z0-9_\-]{16,})|(?i:bearer)\s+[A-Za-z0-9._\-]{16,}"
)


def secret_values() -> set[str]:
    """Values to scrub from any text the report embeds: secrets this process registered and every environment
    variable whose name looks like a secret's (``OPENAI_API_KEY``, ``HF_TOKEN``)."""
    values = set(registered_secrets())
    values |= {v for k, v in os.environ.items() if is_secret_key(k.lower()) and len(v) >= 8}
    return values


class Redactor:
    """Removes secrets from what the report embeds: by key (``redact_secrets``' rule, for configs and tool
    arguments), by value (:func:`secret_values`) and by shape (API keys and bearer tokens in free text)."""

    def __init__(self, values: set[str] | None = None):
        self.values = sorted(values if values is not None else secret_values(), key=len, reverse=True)

    def text(self, text: str) -> str:
        for value in self.values:
            text = text.replace(value, REDACTED)
        return _SECRET_PATTERNS.sub(REDACTED, text)

    def value(self, value: Any) -> Any:
        """A JSON value with secret keys redacted and every string scrubbed."""
        value = redact_secrets(value) if isinstance(value, dict) else value
        if isinstance(value, dict):
            return {k: self.value(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.value(v) for v in value]
        return self.text(value) if isinstance(value, str) else value


# ---------------------------------------------------------------- the transcript viewer's data


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


def _arguments(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw


def transcript_items(transcript: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The Responses items of a transcript as the viewer's turns (token ids and log-probs left out)."""
    items = []
    for item in transcript or []:
        kind = item.get("type")
        if kind == "function_call":
            items.append({"kind": "call", "name": item.get("name"), "args": _arguments(item.get("arguments"))})
        elif kind == "function_call_output":
            items.append({"kind": "output", "text": _text_of(item.get("output"))})
        elif kind == "reasoning":
            summary = item.get("summary") or item.get("content") or []
            items.append({"kind": "reasoning", "text": _text_of(summary)})
        elif item.get("role") in ("user", "assistant", "system", "developer"):
            items.append({"kind": item["role"], "text": _text_of(item.get("content"))})
    return items


def gold_actions(record: dict[str, Any]) -> list[dict[str, Any]]:
    """tau2's expected actions with whether the episode matched each (from ``reward_info.action_checks``)."""
    checks = (record.get("reward_info") or {}).get("action_checks") or []
    return [
        {"name": c["action"].get("name"), "args": c["action"].get("arguments"), "matched": bool(c.get("action_match"))}
        for c in checks
        if isinstance(c, dict) and isinstance(c.get("action"), dict)
    ]


def episode_payload(record: dict[str, Any], redactor: Redactor) -> dict[str, Any]:
    """Everything the viewer shows of one episode, secrets removed."""
    reward_info = record.get("reward_info") or {}
    payload = {
        "domain": str(record["domain"]),
        "task_id": str(record["task_id"]),
        "sample": int(record["sample_index"]),
        "outcome": outcome(record),
        "reward": record.get("reward"),
        "termination": record.get("termination_reason"),
        "truncated_by": record.get("truncated_by"),
        "turns": record.get("num_turns"),
        "tokens": record.get("total_tokens"),
        "wall_s": wall_seconds(record),
        "error": record.get("error"),
        "components": components(record),
        "reward_basis": reward_info.get("reward_basis"),
        "checks": {
            key: reward_info.get(key)
            for key in ("db_check", "env_assertions", "communicate_checks", "nl_assertions")
            if reward_info.get(key)
        },
        "items": transcript_items(record.get("transcript") or []),
        "gold": gold_actions(record),
        "contiguity_breaks": record.get("token_contiguity_breaks") or [],
    }
    return redactor.value(payload)
