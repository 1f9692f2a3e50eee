"""Step metrics to machines: ``metrics.jsonl`` always (appended and flushed per step), TensorBoard and W&B optional.

Humans get the console view from the entry point (``examples/run_grpo.py``); the library only records.
"""

import logging
import math
import os
from pathlib import Path
from typing import Any

import orjson

logger = logging.getLogger(__name__)


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
        self._jsonl = (self.log_dir / "metrics.jsonl").open("ab")
        if self.cfg.tensorboard_enabled:
            from torch.utils.tensorboard import SummaryWriter

            self._tensorboard = SummaryWriter(log_dir=str(self.log_dir / "tensorboard"))
        if self.cfg.wandb_enabled:
            import wandb

            self._wandb = wandb.init(project=self.cfg.wandb_project, name=self.cfg.wandb_name, dir=str(self.log_dir))
        return self

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        numbers = {k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and math.isfinite(v)}
        self._jsonl.write(orjson.dumps({"step": step, **metrics}, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
        self._jsonl.flush()
        os.fsync(self._jsonl.fileno())
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
