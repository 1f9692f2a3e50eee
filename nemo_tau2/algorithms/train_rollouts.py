"""A training run's episodes on disk, step by step, and the causes of the failed ones in one line.

Each GRPO step writes its episodes to ``<logger.log_dir>/train/step_<N>/rollouts.jsonl`` (``N`` the step as
``metrics.jsonl`` numbers it), in the evaluator's record shape and through its writer
(:class:`~nemo_tau2.evals.results.RolloutLog`: one whole line per episode, the moment its group finishes): the
infrastructure errors with their cause always (``logger.save_rollouts=failed``, the default), every episode with its
transcript and token ids with ``all`` (``prepare_sft_data.py --rollouts`` and the report read it like an eval's
folder), nothing with ``none``. One file per step, as NeMo-RL writes ``train_data_step<N>.jsonl`` and as this
project writes ``validation/step_<N>/rollouts.jsonl``: a step's episodes are one ``cat`` away, and a step rerun after
a resume replaces exactly its own file.

**Resume.** A run resumed from the checkpoint of step ``S`` reruns the steps after it. Their files (and their
validation files) hold episodes of an attempt whose training was lost: on start each is moved aside whole to
``rollouts.jsonl.superseded-<k>`` beside it, so that every ``rollouts.jsonl`` holds exactly the episodes of the
attempt that trained, none twice and none lost. A torn last line (a kill mid-write) is set aside by the writer.

In async GRPO an episode goes to the step the trainer is working towards when it finishes (the step whose
``take`` reports it, as ``train/rollout/*`` counts it).
"""

import logging
import re
import threading
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from nemo_tau2.evals.results import ROLLOUTS_FILE, RolloutLog, infrastructure_causes, record_of
from nemo_tau2.experience.rollouts import RolloutResult

logger = logging.getLogger(__name__)

SaveRollouts = Literal["failed", "all", "none"]
TRAIN_DIR = "train"
SUPERSEDED_SUFFIX = ".superseded"
_STEP_DIR = re.compile(r"^step_(\d+)$")


def train_step_dir(log_dir: str | Path, step: int) -> Path:
    """Where a training run keeps the episodes of ``step`` (numbered as ``metrics.jsonl`` numbers it)."""
    return Path(log_dir) / TRAIN_DIR / f"step_{step}"


def set_aside_steps_after(root: Path, step: int) -> list[Path]:
    """Move each ``<root>/step_<N>/rollouts.jsonl`` with ``N > step`` aside (see the module docstring); the moved
    files' new paths."""
    moved = []
    if not root.is_dir():
        return moved
    for folder in sorted(root.iterdir()):
        match = _STEP_DIR.match(folder.name)
        path = folder / ROLLOUTS_FILE
        if match is None or int(match[1]) <= step or not path.is_file():
            continue
        number = 1
        while (target := path.with_name(f"{ROLLOUTS_FILE}{SUPERSEDED_SUFFIX}-{number}")).exists():
            number += 1
        path.rename(target)
        moved.append(target)
    if moved:
        logger.info(
            "%d step file(s) of %s from an attempt after step %d's checkpoint set aside as %s-<k>",
            len(moved), root, step, SUPERSEDED_SUFFIX,
        )  # fmt: skip
    return moved


class TrainRolloutLog:
    """The per-step episode files of a training run (module docstring). Thread-safe: async GRPO's collector writes
    from its own thread. ``close()`` at the end."""

    def __init__(self, log_dir: str | Path, save: SaveRollouts, start_step: int) -> None:
        self.log_dir, self.save = Path(log_dir), save
        self._lock = threading.Lock()
        self._open: dict[int, RolloutLog] = {}
        for root in (self.log_dir / TRAIN_DIR, self.log_dir / "validation"):
            set_aside_steps_after(root, start_step)

    @property
    def keeps_transcripts(self) -> bool:
        """Whether the rollouts must keep the agents' whole answers (``all``: the records carry transcripts)."""
        return self.save == "all"

    def path(self, step: int) -> Path:
        return train_step_dir(self.log_dir, step) / ROLLOUTS_FILE

    def write(self, step: int, results: Iterable[RolloutResult]) -> None:
        """Append the episodes ``save`` keeps to ``step``'s file, and free their transcripts."""
        for result in results:
            if self.save == "all" or (self.save == "failed" and not result.ok):
                record = record_of(result, keep_transcript=True)
                with self._lock:
                    log = self._log(step)
                    log.append(record)
            result.full_result = None  # written: the trainer needs only the message log

    def _log(self, step: int) -> RolloutLog:
        log = self._open.get(step)
        if log is None:
            for older in [s for s in self._open if s < step]:  # a step's episodes are all in once the next begins
                self._open.pop(older).close()
            log = self._open[step] = RolloutLog(train_step_dir(self.log_dir, step))
        return log

    def close(self) -> None:
        with self._lock:
            for log in self._open.values():
                log.close()
            self._open.clear()


# ================================================================================================ causes


def failure_causes(results: Iterable[RolloutResult]) -> Counter[str]:
    """How many of the episodes failed with each cause (see :func:`~nemo_tau2.evals.results.infrastructure_causes`)."""
    return infrastructure_causes({"status": r.status, "cause": r.cause, "error": r.error} for r in results)
