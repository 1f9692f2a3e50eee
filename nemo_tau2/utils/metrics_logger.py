"""Step metrics to machines: ``metrics.jsonl`` always (one whole line per step, through
:class:`~nemo_tau2.utils.jsonl_log.JsonlLog`, so a torn line from a crash is set aside on resume), TensorBoard and
W&B optional.

Humans get the console view from the entry point (``examples/run_grpo.py``); the library only records.
"""

import logging
import math
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from nemo_tau2.utils.jsonl_log import JsonlLog

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"


class LoggerConfig(BaseModel):
    """``logger``: NeMo-RL's logger keys (GRPO and evaluation)."""

    model_config = ConfigDict(extra="forbid")

    log_dir: str = Field(default="results/grpo/logs", description="metrics.jsonl (always) and TensorBoard files.")
    tensorboard_enabled: bool = False
    wandb_enabled: bool = False
    wandb_project: str = "nemo-tau2"
    wandb_name: str | None = None
    report: bool = Field(
        default=True,
        description="At the end, write report.html (examples/report.py's self-contained report) into the "
        "results folder (an evaluation's eval.save_path, a training run's log_dir) and print its path.",
    )


class MetricsLogger:
    """A context manager; ``log(step, metrics)`` writes one JSON line and forwards numbers to the enabled sinks."""

    def __init__(self, cfg: Any):
        self.cfg = cfg
        self.log_dir = Path(cfg.log_dir)
        self._jsonl = None
        self._tensorboard = None
        self._wandb = None

    def __enter__(self) -> "MetricsLogger":
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._jsonl = JsonlLog(self.log_dir / METRICS_FILE, consequence="their steps are re-logged when rerun")
        if self.cfg.tensorboard_enabled:
            from torch.utils.tensorboard import SummaryWriter

            self._tensorboard = SummaryWriter(log_dir=str(self.log_dir / "tensorboard"))
        if self.cfg.wandb_enabled:
            import wandb

            self._wandb = wandb.init(project=self.cfg.wandb_project, name=self.cfg.wandb_name, dir=str(self.log_dir))
        return self

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        numbers = {k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and math.isfinite(v)}
        self._jsonl.append({"step": step, **metrics})
        self._jsonl.sync()  # a step is minutes of work, and a checkpoint taken after this line must not outlive it
        if self._tensorboard is not None:
            for key, value in numbers.items():
                self._tensorboard.add_scalar(key, value, step)
            self._tensorboard.flush()
        if self._wandb is not None:
            self._wandb.log(numbers, step=step)

    def __exit__(self, *exc: object) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
        if self._tensorboard is not None:
            self._tensorboard.close()
        if self._wandb is not None:
            self._wandb.finish()
