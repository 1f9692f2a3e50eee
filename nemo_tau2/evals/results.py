"""Evaluation output on disk, written as it is produced so that a crash or Ctrl-C loses nothing.

``<save_path>/rollouts.jsonl`` gets one whole line per finished episode the moment the episode ends (an
infrastructure failure too, marked as such), through :class:`~nemo_tau2.utils.jsonl_log.JsonlLog`. A rerun with
the same save path reads it back: every ``(domain, task_id, sample_index)`` with a valid outcome is done and is not
run again; failed ones are retried, and their newest outcome wins. A torn last line (a crash mid-write) is set
aside on open, so its episode is rerun. ``summary.json`` and ``config.json`` are rewritten atomically.
"""

import logging
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import orjson

from nemo_tau2.experience.rollouts import OK, RolloutResult
from nemo_tau2.experience.row_keys import episode_task
from nemo_tau2.utils.jsonl_log import JsonlLog, replace_lines, write_json_atomic  # noqa: F401  (re-exported)

logger = logging.getLogger(__name__)

ROLLOUTS_FILE = "rollouts.jsonl"
SUMMARY_FILE = "summary.json"
CONFIG_FILE = "config.json"
EVALUATION_DATA_FILE = "evaluation_data.json"
SYSTEM_PROMPTS_FILE = "system_prompts.json"

EpisodeKey = tuple[str, str, int]


def episode_key(record: dict[str, Any]) -> EpisodeKey:
    """(domain, task (a pivot's: task@pivot), sample index) of a record or a row with its ``sample_index``."""
    task = episode_task(record["task_id"], record.get("pivot_id"))
    return str(record["domain"]), task, int(record["sample_index"])


def record_of(result: RolloutResult, keep_transcript: bool) -> dict[str, Any]:
    """The JSONL line for one episode: outcome, components, counts, timings and (optionally) the transcript."""
    # token ids are training data (message_log), and the transcript (with them) is taken from full_result as it is:
    # asdict would copy both, int by int, only for them to be dropped or written at once
    record = asdict(replace(result, message_log=[], full_result=None))
    del record["message_log"], record["full_result"]
    full = result.full_result or {}
    if keep_transcript and result.ok:
        record["transcript"] = (full.get("response") or {}).get("output")
        record["reward_info"] = full.get("reward_info")
        if full.get("tau2_messages") is not None:  # tau2's own trajectory: what a stateless /verify re-scores
            record["tau2_messages"] = full["tau2_messages"]
    return record


def latest_records(records: Iterable[dict[str, Any]]) -> dict[EpisodeKey, dict[str, Any]]:
    """The newest record per episode (records in file order), a valid outcome preferred over a later infrastructure
    failure: what a resumed run keeps, and what a report shows."""
    latest: dict[EpisodeKey, dict[str, Any]] = {}
    for record in records:
        key = episode_key(record)
        if record["status"] == OK or key not in latest or latest[key]["status"] != OK:
            latest[key] = record
    return latest


def system_prompt(row: dict[str, Any]) -> str | None:
    """A Gym row's system prompt: its first input item when that is a system message with text (None otherwise)."""
    first = (row.get("responses_create_params") or {}).get("input") or [{}]
    if not isinstance(first[0], dict) or first[0].get("role") != "system":
        return None
    text = first[0].get("content")
    return text if isinstance(text, str) else None


def write_system_prompts(save_dir: Path, rows: Iterable[dict[str, Any]]) -> None:
    """``system_prompts.json``: each task's system prompt (the rows' first input message), stored once per distinct
    prompt, so that a report can show what the policy was told without the rows (``{"prompts": [...], "tasks":
    {"<domain>/<task_id>": index}}``)."""
    prompts: list[str] = []
    tasks: dict[str, int] = {}
    for row in rows:
        text = system_prompt(row)
        if text is None:
            continue
        if text not in prompts:
            prompts.append(text)
        tasks[f"{row['domain']}/{row['task_id']}"] = prompts.index(text)
    write_json_atomic(save_dir / SYSTEM_PROMPTS_FILE, {"prompts": prompts, "tasks": tasks})


class RolloutLog:
    """Append-only ``rollouts.jsonl`` with resume support."""

    def __init__(self, save_dir: Path):
        self._log = JsonlLog(save_dir / ROLLOUTS_FILE, consequence="their episodes will be rerun")
        self.path = self._log.path

    def read(self) -> list[dict[str, Any]]:
        """Every record in the file, newest last."""
        return list(self._log.records())

    def latest(self) -> dict[EpisodeKey, dict[str, Any]]:
        """The newest record per episode, a valid outcome preferred over a later infrastructure failure."""
        return latest_records(self.read())

    def done(self) -> set[EpisodeKey]:
        return {key for key, record in self.latest().items() if record["status"] == OK}

    def append(self, record: dict[str, Any]) -> None:
        self._log.append(record)

    def close(self) -> None:
        self._log.close()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.latest().values())


def write_evaluation_data(
    save_dir: Path, records: list[dict[str, Any]], rows: list[dict[str, Any]], n: int, full_result: bool
) -> None:
    """NeMo-RL's ``evaluation_data.json`` for tools that read it: one entry per scored sample.

    Each entry has NeMo-RL's keys: ``reward``, ``message_log`` (here the episode's whole transcript, the Responses
    items the agent saw), ``agent_ref``, ``extra_env_info`` (the Gym row), ``sample_index`` (task index x n +
    sample, as NeMo-RL numbers repeated rows) and, with ``eval.save_full_gym_result``, ``full_result`` (transcript
    and tau2's reward breakdown). Infrastructure failures are not samples: they are in ``rollouts.jsonl`` with
    their cause.

    Training's message log is cut at the first turn whose prompt does not extend the turn before (token
    contiguity): the transcript is not. So each entry marks the cut: ``first_break_turn`` (None: no break) and
    ``trainable_turns`` beside the transcript, and each policy turn of ``message_log`` (an item with generated
    token ids) carries ``"trainable"``: false from the cut on.
    """
    index = {(str(row["domain"]), str(row["task_id"])): (i, row) for i, row in enumerate(rows)}
    entries = []
    for record in records:
        key = episode_key(record)
        if record["status"] != OK or key[:2] not in index:
            continue
        task_index, row = index[key[:2]]
        transcript = _with_the_cut_marked(record.get("transcript") or [], record.get("first_break_turn"))
        entry = {
            "reward": record["reward"],
            "message_log": transcript,
            "first_break_turn": record.get("first_break_turn"),
            "trainable_turns": record.get("trainable_turns"),
            "agent_ref": row.get("agent_ref"),
            "extra_env_info": row,
            "sample_index": task_index * n + key[2],
        }
        if full_result:
            entry["full_result"] = {"transcript": transcript, "reward_info": record.get("reward_info")}
        entries.append(entry)
    entries.sort(key=lambda entry: entry["sample_index"])
    # one entry a line, as rollouts.jsonl writes its records: indented, every token id of every turn's prompt was a
    # line of its own (a banking eval of 97 episodes: 827 MB, 25-50 s in json's indenting encoder; now 173 MB, 0.5 s)
    options = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
    entry_lines = [orjson.dumps(entry, option=options) + b",\n" for entry in entries]
    if entry_lines:
        entry_lines[-1] = entry_lines[-1].removesuffix(b",\n") + b"\n"
    replace_lines(save_dir / EVALUATION_DATA_FILE, [b'{"evaluation_data": [\n', *entry_lines, b"]}\n"])


def _with_the_cut_marked(transcript: list[dict[str, Any]], first_break_turn: int | None) -> list[dict[str, Any]]:
    """The transcript with ``trainable`` on each policy turn (numbered as the agent's contiguity check numbers
    them: the items with generated token ids, in order): false from ``first_break_turn`` on."""
    marked, turn = [], 0
    for item in transcript:
        if isinstance(item, dict) and item.get("generation_token_ids"):
            item = item | {"trainable": first_break_turn is None or turn < first_break_turn}
            turn += 1
        marked.append(item)
    return marked


MAX_CAUSE_CHARS = 200


def infrastructure_causes(records: Iterable[dict[str, Any]]) -> Counter[str]:
    """How many of the failed episodes failed with each cause: a record's ``cause`` (its error without where it
    happened, written apart by the server that failed), so that one failure over many episodes, replicas or nodes
    counts once; a record without one (written before causes were recorded) by its error as it stands."""
    return Counter(r.get("cause") or r.get("error") or "no cause reported" for r in records if r["status"] != OK)


def describe_causes(causes: Counter[str], top: int = 3) -> str:
    """``"8x HTTP 503: ...; 4x HTTP 502: ...; 1 more cause(s)"``: the most frequent first, each cut at
    ``MAX_CAUSE_CHARS``."""
    shown = [f"{count}x {_shortened(cause)}" for cause, count in causes.most_common(top)]
    if len(causes) > top:
        shown.append(f"{len(causes) - top} more cause(s)")
    return "; ".join(shown)


def _shortened(cause: str) -> str:
    return cause if len(cause) <= MAX_CAUSE_CHARS else cause[: MAX_CAUSE_CHARS - 3] + "..."
