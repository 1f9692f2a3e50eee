"""Which tau2 tasks a model was trained on, so that an evaluation of it can say which of its tasks were not held out.

banking_knowledge has no train/test split in tau2: a run trains on a split of ours or a list, and a later eval of the
same domain may well play tasks the checkpoint trained on. So the weights a training run exports (SFT's and RFT's
``final_hf``) carry :data:`TRAINED_ON_FILE`: the release, the retrieval variant and every ``domain/task_id`` the run
trained on, those of the model it started from included (SFT then RFT: both stages' tasks). An eval whose policy is
such a folder reports, in its summary and table, which of the tasks it played are among them.
"""

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

TRAINED_ON_FILE = "nemo_tau2_trained_on.json"


def task_keys(rows: Iterable[dict]) -> set[str]:
    """``domain/task_id`` of each row (Gym rows, SFT rows and episode records all carry both)."""
    return {f"{row['domain']}/{row['task_id']}" for row in rows if "domain" in row and "task_id" in row}


def read_trained_on(model: str | Path | None) -> dict[str, Any] | None:
    """The record in ``model``'s folder, or None: a model name, a folder without one, or a file that is not a record
    (written by hand, cut short) tells nothing about what was trained on."""
    if not model:
        return None
    path = Path(model) / TRAINED_ON_FILE
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("train_tasks"), list):
        return None
    return record | {"path": str(path)}


def trained_on_record(played: dict[str, Any], train_rows: Iterable[dict], start_model: str | Path | None) -> dict:
    """What an export records: ``played`` (release and variant), the tasks of ``train_rows`` and those the starting
    model's own record names."""
    tasks = task_keys(train_rows)
    inherited = read_trained_on(start_model)
    if inherited is not None:
        tasks |= {str(task) for task in inherited["train_tasks"]}
    return dict(played) | {"train_tasks": sorted(tasks)}


def write_trained_on(directory: str | Path, record: dict[str, Any]) -> None:
    (Path(directory) / TRAINED_ON_FILE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")


def evaluated_tasks_trained_on(
    model: str | Path | None, played_tasks: Iterable[str], played_variant: str | None
) -> dict[str, Any] | None:
    """For an eval's summary: of the tasks it played (``domain/task_id``), those ``model``'s record says it trained
    on, and the retrieval variant it trained with beside the one played (``played_variant``: None without a knowledge
    domain); None when the model has no record."""
    record = read_trained_on(model)
    if record is None:
        return None
    played = sorted(set(played_tasks))
    trained = set(record["train_tasks"])
    return {
        "record": record["path"],
        "tau2_version": record.get("tau2_version"),
        "retrieval_variant": record.get("retrieval_variant"),
        "played_retrieval_variant": played_variant,
        "num_eval_tasks": len(played),
        "eval_tasks_trained_on": [task for task in played if task in trained],
    }


def describe(found: dict[str, Any]) -> str:
    """One line for the eval's table (and a second when it trained with another retrieval variant); a summary written
    by an older version, without some of the keys, is described as far as it goes."""
    seen = list(found.get("eval_tasks_trained_on") or [])
    if not seen:
        line = f"checkpoint: none of these {found.get('num_eval_tasks')} tasks was trained on ({found.get('record')})"
    else:
        listed = ", ".join(seen[:5]) + (f", ... ({len(seen) - 5} more)" if len(seen) > 5 else "")
        line = (
            f"checkpoint: trained on {len(seen)} of these {found.get('num_eval_tasks')} tasks, not held out: {listed} "
            f"({found.get('record')})"
        )
    trained, played = found.get("retrieval_variant"), found.get("played_retrieval_variant")
    if played is not None and trained != played:
        line += f"\ncheckpoint: trained with retrieval variant {trained}, evaluated on {played}"
    return line
