"""Correcting the memory plan's measured constants from the peaks a GPU recorded (``bench/gpu_check.py``).

For a micro-batch of ``T`` tokens the plan of a trainer rank (:func:`~nemo_tau2.models.memory_plan.trainer_plan`) is

    estimate(T) = fixed + overhead + token_bytes(T)

- ``fixed``: parameters, gradients, optimizer state, gathered weights, reference model: arithmetic on the parameter
  count, not a model of anything;
- ``token_bytes(T)``: activations and logits, a first-principles model of what autograd keeps, times
  ``TOKEN_BYTES_SCALE``;
- ``overhead``: ``RUNTIME_OVERHEAD_BYTES`` on a GPU (CUDA context, NCCL, allocator slack).

Peaks measured at several token budgets (and shapes) give the least-squares line
``measured - fixed = overhead' + scale' * token_bytes(T) / TOKEN_BYTES_SCALE``: ``overhead'`` and ``scale'`` are the
constants the plan should carry. From a single token budget only ``scale'`` is solved and the overhead kept. The
fit is a suggestion: a person copies it into ``memory_plan.py`` with the card, date and commit (README: "The GPU
kit"), never the code at run time.
"""

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from nemo_tau2.models import memory_plan
from nemo_tau2.models.memory_plan import DevicePlan

CORRECTION_THRESHOLD = 0.10
"""A measured peak further than this from the estimate (relative) calls for corrected constants."""


@dataclass
class PlanConstants:
    """The two constants of the plan that a measurement corrects."""

    runtime_overhead_bytes: float
    token_bytes_scale: float

    @classmethod
    def current(cls) -> "PlanConstants":
        return cls(memory_plan.RUNTIME_OVERHEAD_BYTES, memory_plan.TOKEN_BYTES_SCALE)


@dataclass
class PeakMeasurement:
    """One measured training step: its plan, split into parts, and the peak the device recorded (bytes)."""

    shape: str
    tokens: int
    measured_bytes: float
    fixed_bytes: float  # plan items independent of the tokens, without the runtime overhead
    token_bytes: float  # plan items that grow with the tokens, as planned (TOKEN_BYTES_SCALE applied)
    overhead_bytes: float  # the plan's runtime overhead (0 for a rank on CPU)
    token_bytes_scale: float  # the TOKEN_BYTES_SCALE the plan used

    @classmethod
    def of(cls, plan: DevicePlan, *, shape: str, tokens: int, measured_bytes: float) -> "PeakMeasurement":
        overhead = memory_plan.RUNTIME_OVERHEAD_BYTES if plan.on_gpu else 0.0
        token_bytes = sum(plan.items[name] for name in plan.token_items)
        return cls(shape, tokens, float(measured_bytes), plan.total_bytes - token_bytes - overhead, token_bytes,
                   overhead, memory_plan.TOKEN_BYTES_SCALE)  # fmt: skip

    @property
    def estimated_bytes(self) -> float:
        return self.fixed_bytes + self.overhead_bytes + self.token_bytes

    @property
    def ratio(self) -> float:
        """Measured over estimated peak."""
        return self.measured_bytes / self.estimated_bytes

    def estimate_with(self, constants: PlanConstants) -> float:
        """The estimate had the plan carried ``constants``."""
        unscaled = self.token_bytes / self.token_bytes_scale
        return self.fixed_bytes + constants.runtime_overhead_bytes + constants.token_bytes_scale * unscaled

    def as_dict(self) -> dict[str, float | int | str]:
        return asdict(self) | {"estimated_bytes": self.estimated_bytes, "ratio": round(self.ratio, 4)}


def needs_correction(measurements: Sequence[PeakMeasurement], threshold: float = CORRECTION_THRESHOLD) -> bool:
    """Whether any measured peak is further than ``threshold`` from the plan's estimate."""
    return any(abs(m.ratio - 1.0) > threshold for m in measurements)


def fit_constants(measurements: Sequence[PeakMeasurement]) -> PlanConstants:
    """The least-squares constants of the module docstring's line through ``measurements`` (at least one)."""
    if not measurements:
        raise ValueError("fit_constants: no measurement to fit (every step ran out of memory or failed)")
    xs = [m.token_bytes / m.token_bytes_scale for m in measurements]
    ys = [m.measured_bytes - m.fixed_bytes for m in measurements]
    mean_x, mean_y = math.fsum(xs) / len(xs), math.fsum(ys) / len(ys)
    spread = math.fsum((x - mean_x) ** 2 for x in xs)
    if spread <= 1e-12 * max(mean_x, 1.0) ** 2:  # one token size: keep the overhead, solve the scale
        overhead = measurements[0].overhead_bytes
        return PlanConstants(overhead, (mean_y - overhead) / mean_x)
    scale = math.fsum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread
    return PlanConstants(mean_y - scale * mean_x, scale)


def calibration_report(measurements: Sequence[PeakMeasurement]) -> dict:
    """What the check prints and ``--write-calibration`` stores: ratios now, the fitted constants, ratios with them."""
    current = PlanConstants.current()
    report: dict = {
        "current": asdict(current),
        "ratios": [round(m.ratio, 4) for m in measurements],
        "needs_correction": needs_correction(measurements),
        "threshold": CORRECTION_THRESHOLD,
        "measurements": [m.as_dict() for m in measurements],
    }
    if measurements:
        fitted = fit_constants(measurements)
        report["suggested"] = asdict(fitted)
        report["ratios_with_suggested"] = [round(m.measured_bytes / m.estimate_with(fitted), 4) for m in measurements]
    return report
