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
fit is a suggestion: a person copies it into ``memory_constants.py`` with the card, date and commit
(docs/gpu-kit.md), never the code at run time.

The band is asymmetric: a plan may err towards more memory (up to 10% over the measured peak: ratio >= 1/1.10), not
towards less (at most 3% under: ratio <= 1.03), since a plan that says "fits" must not run out of memory. Two kinds
of ladder point bound the plan on one side only (:func:`ladder_points`): the first step of a process (nothing cached
yet, so AdamW's temporaries reuse the activations' freed blocks: lower than every later step, checked only for
under-estimation) and a peak at the card's memory (the allocator reserved all it could, more than the step needed:
checked only for over-estimation).
"""

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace

from nemo_tau2.models import memory_plan
from nemo_tau2.models.memory_plan import DevicePlan
from nemo_tau2.models.model_shape import ModelShape
from nemo_tau2.models.policy.config import PolicyConfig

UNDER_ESTIMATE_LIMIT = 1.03
"""Measured over estimated peak at most this: the plan under-estimates by at most 3%."""
OVER_ESTIMATE_LIMIT = 1.10
"""Estimated over measured peak at most this: the plan over-estimates by at most 10%."""
SATURATED = 0.99
"""A peak at this share of the card's memory or more is the allocator's reservation at the card's limit."""


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


def within_band(ratio: float, *, lower: bool = True, upper: bool = True) -> bool:
    """Whether a measured/estimated ``ratio`` is in the plan's band (one side only if the other is not asked)."""
    return (not lower or ratio <= UNDER_ESTIMATE_LIMIT) and (not upper or ratio >= 1 / OVER_ESTIMATE_LIMIT)


def needs_correction(measurements: Sequence[PeakMeasurement]) -> bool:
    """Whether any measured peak lies outside the band: more than 3% over the estimate or 10% under it."""
    return not all(within_band(m.ratio) for m in measurements)


def kit_policy_config(name: str, tokens: int, *, device: str, chunk: int, max_len: int,
                      activation_checkpointing: bool | str = True,
                      reshard_after_forward: bool | None = None) -> PolicyConfig:  # fmt: skip
    """The trainer config ``bench/gpu_check.py`` measures a shape with: one FSDP2 rank, packed micro-batches of
    ``tokens``, the reference model; bf16 on a GPU, fp32 on CPU (the dry run). ``reshard_after_forward``: None is the
    trainer's default (a record names what it ran with)."""
    return PolicyConfig(model_name=name, train_global_batch_size=1 << 20, train_micro_batch_size=1,
                        max_total_sequence_length=min(max_len, tokens),
                        precision="bfloat16" if device == "cuda" else "float32", logprob_chunk_size=chunk,
                        device=device,
                        dtensor_cfg={"enabled": True, "activation_checkpointing": activation_checkpointing,
                                     "reshard_after_forward": reshard_after_forward},
                        sequence_packing={"enabled": True, "train_mb_tokens": tokens})  # fmt: skip


def with_blocks(shape: ModelShape, layers: int) -> ModelShape:
    """``shape`` cut to its first ``layers`` transformer blocks (what the kit runs when the full depth cannot fit)."""
    return replace(shape, num_blocks=layers, parameters=shape.root_parameters + layers * shape.block_parameters)


@dataclass
class LadderPoint:
    """One step of a recorded ladder (``bench/gpu_check.py``) against today's plan, and the sides of the band it
    bounds (module docstring)."""

    shape: str
    tokens: int
    activation_checkpointing: str  # the mode: ``full``, ``selective`` or ``none``
    measured_bytes: float | None  # None: it ran out of memory
    estimated_bytes: float
    device_memory_bytes: float
    first_step: bool
    saturated: bool

    @property
    def ratio(self) -> float:
        return self.measured_bytes / self.estimated_bytes

    @property
    def within_band(self) -> bool:
        return within_band(self.ratio, lower=not self.saturated, upper=not self.first_step)


def ladder_points(records: Sequence[dict], shapes: dict[str, ModelShape]) -> list[LadderPoint]:
    """The ladders of ``records`` (the kit's per-shape JSON records; ``shapes`` by name, full depth) re-estimated by
    today's plan. The card's memory: ``device_memory_bytes`` where recorded, else the largest peak recorded on it."""
    ladders = [r for r in records if r.get("check") == "gpu_check" and r.get("ladder")]
    largest: dict[str, float] = {}
    for r in ladders:
        peaks = [row["peak_bytes"] for row in r["ladder"] if row["fits"]]
        largest[r["device"]] = max([largest.get(r["device"], 0.0), *peaks, r.get("device_memory_bytes", 0.0)])
    points = []
    for r in ladders:
        shape = with_blocks(shapes[r["shape"]], r["layers"])
        checkpointing = r.get("activation_checkpointing", True)  # the mode; records before modes: a boolean
        checkpointing = {True: "full", False: "none"}.get(checkpointing, checkpointing)
        resharded = r.get("reshard_after_forward", True)  # records before the key: FSDP2's default, resharding
        memory = r.get("device_memory_bytes") or largest[r["device"]]
        for index, row in enumerate(r["ladder"]):
            cfg = kit_policy_config(r["shape"], row["tokens"], device="cuda", chunk=r.get("logprob_chunk_size", 1024),
                                    max_len=32768, activation_checkpointing=checkpointing,
                                    reshard_after_forward=resharded)  # fmt: skip
            plan = memory_plan.trainer_plan(cfg, shape, reference=True, budget=(memory, r["device"]))
            peak = row.get("peak_bytes") if row["fits"] else None
            saturated = peak is not None and peak >= SATURATED * memory
            points.append(LadderPoint(r["shape"], row["tokens"], checkpointing, peak, plan.total_bytes, memory,
                                      first_step=index == 0, saturated=saturated))  # fmt: skip
    return points


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
        "band": [round(1 / OVER_ESTIMATE_LIMIT, 4), UNDER_ESTIMATE_LIMIT],
        "measurements": [m.as_dict() for m in measurements],
    }
    if measurements:
        fitted = fit_constants(measurements)
        report["suggested"] = asdict(fitted)
        report["ratios_with_suggested"] = [round(m.measured_bytes / m.estimate_with(fitted), 4) for m in measurements]
    return report
