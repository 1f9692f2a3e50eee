"""Combining the loss function's per-micro-batch metrics into the metrics of the whole batch.

Each micro-batch reports ``clipped_pg_loss`` metrics over its own valid tokens, while its ``loss`` uses the global
normalisers. So: ``loss``/``pg_loss`` and counts add up; ``*_min``/``*_max`` take the extreme; every other metric
is a per-token mean and is averaged with weights = the micro-batch's valid tokens (micro-batches without valid
tokens carry no weight, and a metric no micro-batch could measure is NaN).
"""

import math
from collections.abc import Sequence

SUMMED = frozenset({"loss", "pg_loss", "num_valid_tokens", "num_valid_samples"})
WEIGHT_KEY = "num_valid_tokens"


def combine_microbatch_metrics(parts: Sequence[dict[str, float]]) -> dict[str, float]:
    """Whole-batch metrics from the micro-batches' ``clipped_pg_loss`` metrics (see the module docstring)."""
    keys = sorted({key for part in parts for key in part})
    combined: dict[str, float] = {}
    for key in keys:
        values = [(part[key], part.get(WEIGHT_KEY, 0.0)) for part in parts if key in part]
        if key in SUMMED:
            combined[key] = math.fsum(v for v, _ in values)
            continue
        finite = [(v, w) for v, w in values if not math.isnan(v)]
        if key.endswith("_min"):
            combined[key] = min((v for v, _ in finite), default=math.nan)
        elif key.endswith("_max"):
            combined[key] = max((v for v, _ in finite), default=math.nan)
        else:
            total = math.fsum(w for _, w in finite)
            combined[key] = math.fsum(v * w for v, w in finite) / total if total > 0 else math.nan
    return combined


def combine_step_metrics(steps: Sequence[dict[str, float]]) -> dict[str, float]:
    """Metrics of a ``train`` call that made several optimizer steps: counts add up, ``lr`` is the last step's,
    everything else is the mean over steps."""
    if len(steps) == 1:
        return dict(steps[0])
    combined: dict[str, float] = {}
    for key in steps[0]:
        values = [step[key] for step in steps]
        if key in SUMMED - {"loss", "pg_loss"} or key.startswith(("global_valid_", "num_")):
            combined[key] = math.fsum(values)
        elif key == "lr":
            combined[key] = values[-1]
        else:
            combined[key] = math.fsum(values) / len(values)
    return combined
