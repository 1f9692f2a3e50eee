"""The memory plan's calibration: measured peaks against the plan's parts, the constants fitted from them, and the
plan against every ladder point a GPU recorded (``shared/measurements/`` beside the checkout, and
``bench/data/gpu_records/``)."""

import json
from pathlib import Path

import pytest

from nemo_tau2.models import memory_plan
from nemo_tau2.models.memory_calibration import (
    PeakMeasurement,
    PlanConstants,
    calibration_report,
    fit_constants,
    ladder_points,
    needs_correction,
)
from nemo_tau2.models.memory_plan import GB, ClusterConfig, make_plan
from nemo_tau2.models.model_shape import find_model_config, model_shape
from nemo_tau2.models.policy import PolicyConfig


@pytest.fixture(scope="module")
def qwen3_0_6b():
    config, source = find_model_config("Qwen/Qwen3-0.6B")
    return model_shape(config, "Qwen/Qwen3-0.6B", source)


def _trainer_plan(shape, tokens: int):
    cfg = PolicyConfig(
        model_name=shape.name, train_global_batch_size=64, train_micro_batch_size=1,
        max_total_sequence_length=min(tokens, 32768), precision="bfloat16", logprob_chunk_size=1024, device="cuda",
        dtensor_cfg={"enabled": True, "activation_checkpointing": True},
        sequence_packing={"enabled": True, "train_mb_tokens": tokens},
    )  # fmt: skip
    return make_plan(cfg, ClusterConfig(), reference=True, shape=shape).devices[0]


def test_shipped_small_qwen3_configs_count_their_published_sizes(qwen3_0_6b):
    assert qwen3_0_6b.parameters == pytest.approx(0.596e9, rel=0.01)  # "Qwen3-0.6B": 0.6 B, tied embeddings
    assert qwen3_0_6b.num_blocks == 28
    config, _ = find_model_config("Qwen/Qwen3-1.7B")
    assert model_shape(config, "Qwen/Qwen3-1.7B", "").parameters == pytest.approx(1.72e9, rel=0.01)


def test_measurement_splits_the_plan_into_fixed_token_and_overhead_parts(qwen3_0_6b):
    plan = _trainer_plan(qwen3_0_6b, 8192)
    m = PeakMeasurement.of(plan, shape="q", tokens=8192, measured_bytes=plan.total_bytes * 1.2)
    assert m.estimated_bytes == pytest.approx(plan.total_bytes)
    assert m.overhead_bytes == memory_plan.RUNTIME_OVERHEAD_BYTES
    assert m.token_bytes == pytest.approx(
        sum(v for k, v in plan.items.items() if k.startswith(("activations", "logits")))
    )
    assert m.ratio == pytest.approx(1.2)
    assert needs_correction([m]) and not needs_correction(
        [PeakMeasurement.of(plan, shape="q", tokens=8192, measured_bytes=plan.total_bytes)]
    )


def test_fit_recovers_the_constants_that_produced_the_peaks(qwen3_0_6b):
    truth = PlanConstants(runtime_overhead_bytes=4.5 * GB, token_bytes_scale=0.7)
    measurements = []
    for tokens in (4096, 8192, 16384, 32768):
        m = PeakMeasurement.of(_trainer_plan(qwen3_0_6b, tokens), shape="q", tokens=tokens, measured_bytes=0.0)
        m.measured_bytes = m.estimate_with(truth)
        measurements.append(m)
    fitted = fit_constants(measurements)
    assert fitted.runtime_overhead_bytes == pytest.approx(truth.runtime_overhead_bytes, rel=1e-6)
    assert fitted.token_bytes_scale == pytest.approx(truth.token_bytes_scale, rel=1e-6)
    report = calibration_report(measurements)
    assert report["needs_correction"] and report["ratios_with_suggested"] == [1.0] * 4


def test_fit_from_one_token_budget_keeps_the_overhead_and_solves_the_scale(qwen3_0_6b):
    m = PeakMeasurement.of(_trainer_plan(qwen3_0_6b, 8192), shape="q", tokens=8192, measured_bytes=0.0)
    m.measured_bytes = m.estimate_with(PlanConstants(memory_plan.RUNTIME_OVERHEAD_BYTES, 1.3))
    assert fit_constants([m]) == PlanConstants(memory_plan.RUNTIME_OVERHEAD_BYTES, pytest.approx(1.3))
    with pytest.raises(ValueError, match="no measurement"):
        fit_constants([])


MEASUREMENTS = Path(__file__).resolve().parents[3].parent / "shared" / "measurements"
"""The first loan's records (2026-11-27), in the shared folder beside the checkout."""
RECORDS = Path(__file__).resolve().parents[3] / "bench" / "data" / "gpu_records"
"""Later loans' records, kept with the code they measured (the shared folder is read-only to a session)."""


def _recorded_ladders() -> tuple[list[dict], dict]:
    paths = sorted(MEASUREMENTS.glob("*.jsonl")) + sorted(RECORDS.glob("*.jsonl"))
    records = [json.loads(line) for path in paths for line in path.read_text().splitlines() if line.strip()]
    assert any(p.parent == MEASUREMENTS for p in paths), f"no GPU records in {MEASUREMENTS} (the shared folder)"
    assert any(p.parent == RECORDS for p in paths), f"no GPU records in {RECORDS}"
    names = {r["shape"] for r in records if r.get("ladder")}
    return records, {name: model_shape(find_model_config(name)[0], name, "") for name in names}


def test_the_plan_stays_within_its_band_at_every_ladder_point_a_gpu_recorded():
    """No recorded peak more than 3% over the plan's estimate, none more than 10% under it (a first step only on the
    first side, a peak at the card's memory only on the second: module docstring of memory_calibration); and every
    micro-batch that ran out of memory was planned not to fit."""
    records, shapes = _recorded_ladders()
    points = ladder_points(records, shapes)
    measured = [p for p in points if p.measured_bytes is not None]
    assert len(measured) >= 30 and {p.activation_checkpointing for p in measured} == {"full", "none"}
    outside = [f"{p.shape} {p.tokens} tokens (checkpointing {p.activation_checkpointing}): {p.ratio:.3f}"
               for p in measured if not p.within_band]  # fmt: skip
    assert outside == [], "measured/estimated outside [1/1.10, 1.03]"
    assert sum(p.first_step and p.saturated for p in measured) == 0  # no point escapes both sides
    out_of_memory = [p for p in points if p.measured_bytes is None]
    assert out_of_memory and all(p.estimated_bytes > p.device_memory_bytes for p in out_of_memory)
