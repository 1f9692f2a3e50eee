"""Evaluation output on disk, written as it is produced so that a crash or Ctrl-C loses nothing.

``<save_path>/rollouts.jsonl`` gets one line per finished episode, appended and flushed the moment the episode ends
(an infrastructure failure too, marked as such). A rerun with the same save path reads it back: every
``(domain, task_id, sample_index)`` with a valid outcome is done and is not run again; failed ones are retried, and
their newest outcome wins. ``summary.json`` and ``config.json`` are rewritten atomically (temp file + rename).
"""

import json
import logging
import os
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import orjson

from nemo_tau2.experience.rollouts import OK, RolloutResult

logger = logging.getLogger(__name__)

ROLLOUTS_FILE = "rollouts.jsonl"
SUMMARY_FILE = "summary.json"
CONFIG_FILE = "config.json"

EpisodeKey = tuple[str, str, int]


def episode_key(record: dict[str, Any]) -> EpisodeKey:
    return str(record["domain"]), str(record["task_id"]), int(record["sample_index"])


def write_json_atomic(path: Path, value: Any) -> None:
    temporary = path.with_suffix(path.suffix + ".tmp")
    temporary.write_text(json.dumps(value, indent=2, sort_keys=False) + "\n")
    os.replace(temporary, path)


def record_of(result: RolloutResult, keep_transcript: bool) -> dict[str, Any]:
    """The JSONL line for one episode: outcome, components, counts, timings and (optionally) the transcript."""
    record = asdict(result)
    record.pop("message_log")  # token ids are training data; the transcript (with them) is in full_result
    full = record.pop("full_result") or {}
    if keep_transcript and result.ok:
        record["transcript"] = (full.get("response") or {}).get("output")
        record["reward_info"] = full.get("reward_info")
    return record


class RolloutLog:
    """Append-only ``rollouts.jsonl`` with resume support."""

    def __init__(self, save_dir: Path):
        self.path = save_dir / ROLLOUTS_FILE
        save_dir.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("ab")

    def read(self) -> list[dict[str, Any]]:
        """Every record in the file, newest last; a torn last line (killed mid-write) is skipped with a warning."""
        records = []
        with self.path.open("rb") as f:
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    records.append(orjson.loads(line))
                except orjson.JSONDecodeError:
                    logger.warning(
                        "%s line %d is incomplete (interrupted write); that episode will be rerun", self.path, number
                    )
        return records

    def latest(self) -> dict[EpisodeKey, dict[str, Any]]:
        """The newest record per episode, a valid outcome preferred over a later infrastructure failure."""
        latest: dict[EpisodeKey, dict[str, Any]] = {}
        for record in self.read():
            key = episode_key(record)
            if record.get("status") == OK or latest.get(key, {}).get("status") != OK:
                latest[key] = record
        return latest

    def done(self) -> set[EpisodeKey]:
        return {key for key, record in self.latest().items() if record.get("status") == OK}

    def append(self, record: dict[str, Any]) -> None:
        self._file.write(orjson.dumps(record, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.latest().values())
