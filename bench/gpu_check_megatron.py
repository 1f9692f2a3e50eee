"""The GPU kit's Megatron measurement (``bench/gpu_check.py --backends megatron``): the Megatron backend's GRPO step
on the one device, beside the FSDP2 one, from the same initial weights.

A lent GPU machine has no Ray, so not :class:`~nemo_tau2.models.policy.Policy` (its Megatron ranks are Ray actors):
one :class:`~nemo_tau2.models.megatron.worker.MegatronPolicyWorker` in this process, in a one-rank
``torch.distributed`` group (NCCL on CUDA; gloo on CPU, where ``cpu_mode`` applies), TP = PP = 1, built from the
shape's initial weights written as an HF folder. The step is the torch path's: ``get_logprobs``,
``get_reference_logprobs`` (the worker swaps its initial weights in), ``train_global_batch`` with the recipe's
``ClippedPGLossFn``, clip and optimizer step, the timed micro-batch as one packed micro-batch
(``policy.sequence_packing``: one row, each sequence attending within itself: ``attention``, the stage's core
attention, ``sdpa`` (torch's varlen flash attention on CUDA) or ``thd`` (Transformer Engine), see
``nemo_tau2/models/megatron/packed_attention.py``), the torch path's ``logprob_chunk_size``. A micro-batch that runs
out of memory is retried at the next smaller budget (``timed_tokens``).

Figures (prefixed ``megatron_`` in the shape's record): ``step_s`` (logprobs, reference logprobs and the training
step) and ``train_s`` (the training step alone), the median of ``--steps`` steps after one untimed step that also
gives ``peak_bytes``, beside it ``estimated_bytes``, the memory plan's estimate for this backend at this micro-batch
(``nemo_tau2/models/memory_plan.py``), and ``memory_ratio`` = peak / estimate; ``train_vs_torch``, its ``train_s``
over the torch path's at the same micro-batch (absent when that differs); tokens/s and MFU by the torch path's
formula; ``params_dtype``, what the stage computes
in: the torch path's precision (bf16 on GPUs: megatron-core's ``Float16Module`` with fp32 masters in the optimizer);
``logprob_max_abs_diff``, the largest |difference| between its logprobs on the initial weights and the torch path's
reference logprobs of the same batch (the torch reference model holds those same weights; both compute in bf16 on
GPUs, with different kernels, so expect bf16 rounding there: the CPU test measured a mean 0.016, max 0.075 between
the two backends in bf16 on a tiny model), a correctness figure. Without megatron-core, one ``megatron_note``
instead.
"""

import dataclasses
import gc
import importlib.util
import math
import statistics
import sys
import time
from collections.abc import Callable

import torch

from nemo_tau2.models.policy import PolicyConfig, TrainingSequence
from nemo_tau2.models.policy.lm_policy import global_normalisers

MEGATRON_SUMMARY = ("megatron_train_tokens_per_s", "megatron_train_mfu", "megatron_logprob_max_abs_diff",
                    "megatron_timed_tokens", "megatron_step_s", "megatron_train_s", "megatron_train_vs_torch",
                    "megatron_peak_bytes", "megatron_estimated_bytes", "megatron_memory_ratio", "megatron_attention",
                    "megatron_error", "megatron_note")  # fmt: skip
"""The Megatron fields the summary line repeats per shape."""
HEADER = f"{'meg tok/s':>10} {'meg MFU':>7} {'meg/torch':>9} {'meg mem':>7} {'meg |dlp|':>9}"


def megatron_missing() -> str | None:
    """Why the Megatron measurement cannot run here (one line), or None when megatron-core is importable."""
    try:
        found = importlib.util.find_spec("megatron.core") is not None
    except (ImportError, ValueError):  # no ``megatron`` package, or one without a spec
        found = False
    return None if found else "megatron-core is not importable here: Megatron not measured (carry its wheel)"


def megatron_config(cfg: PolicyConfig, folder: str) -> PolicyConfig:
    """``cfg`` (the torch path's packing, sizes and precision: bf16 on GPUs) on the Megatron backend, TP = PP = 1."""
    fields = cfg.model_dump() | {"model_name": folder, "dtensor_cfg": {"enabled": False}}
    fields |= {"megatron_cfg": {"enabled": True, "activation_checkpointing": True}}
    return PolicyConfig(**fields)


def plan_estimate(cfg: PolicyConfig, folder: str, tokens: int) -> float:
    """The memory plan's bytes for one Megatron rank of ``cfg`` at a ``tokens`` micro-batch (the shape: ``folder``'s
    config, the layers the check runs), the reference model included as the check runs it."""
    from transformers import AutoConfig

    from nemo_tau2.cluster import ClusterConfig
    from nemo_tau2.models.memory_plan import make_plan
    from nemo_tau2.models.model_shape import model_shape

    shape = model_shape(AutoConfig.from_pretrained(folder, local_files_only=True), cfg.model_name, folder)
    budget = cfg.model_copy(update={"sequence_packing": cfg.sequence_packing.model_copy(
        update={"train_mb_tokens": tokens})})  # fmt: skip
    return make_plan(budget, ClusterConfig(), reference=True, shape=shape).devices[0].total_bytes


def _step(worker, sequences: list[TrainingSequence], loss) -> tuple[float, float]:
    started = time.perf_counter()
    for seq, lp, ref in zip(sequences, worker.get_logprobs([sequences]), worker.get_reference_logprobs([sequences]),
                            strict=True):  # fmt: skip
        seq.prev_logprobs, seq.reference_logprobs = lp, ref
    scored = time.perf_counter()
    result = worker.train_global_batch([sequences], loss, *global_normalisers(sequences))
    if not math.isfinite(result["grad_norm"]):
        raise RuntimeError(f"the Megatron training step gave a gradient norm of {result['grad_norm']}")
    return scored - started, time.perf_counter() - scored


def _max_abs_diff(ours: list[list[float]], theirs: list[list[float] | None]) -> float | None:
    if any(t is None for t in theirs):
        return None
    return max(abs(a - b) for o, t in zip(ours, theirs, strict=True) for a, b in zip(o, t, strict=True))


def measure_megatron(cfg: PolicyConfig, folder: str, tokenizer, batches: list[list[TrainingSequence]], loss,
                     steps: int, figures: Callable[[list[int], float, float], dict], meter,
                     torch_record: dict | None = None) -> dict:  # fmt: skip
    """The ``megatron_`` fields of a shape's record (``megatron_error``, one line, if it failed); logged.
    ``torch_record``: the torch path's fields of the shape (its ``timed_tokens`` and ``train_s``), when measured."""
    try:
        fields = _measure(cfg, folder, tokenizer, batches, loss, steps, figures, meter)
    except Exception as e:  # the torch path's figures still count
        fields = {"megatron_error": f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}"}
    torch_record = torch_record or {}
    if torch_record.get("train_s") and fields.get("megatron_timed_tokens") == torch_record.get("timed_tokens"):
        fields["megatron_train_vs_torch"] = round(fields["megatron_train_s"] / torch_record["train_s"], 3)
    print(
        f"{cfg.model_name}: megatron: "
        + (
            fields.get("megatron_error")
            or f"{fields['megatron_train_tokens_per_s']} tokens/s at {fields['megatron_timed_tokens']} tokens, train"
            f" {fields.get('megatron_train_vs_torch', '-')}x the torch path's, peak"
            f" {fields['megatron_peak_bytes'] / 1e9:.2f} GB (plan {fields['megatron_estimated_bytes'] / 1e9:.2f} GB),"
            f" logprob max |diff| {fields['megatron_logprob_max_abs_diff']}"
        ),
        file=sys.stderr,
        flush=True,
    )
    return fields


def _measure(cfg: PolicyConfig, folder: str, tokenizer, batches: list[list[TrainingSequence]], loss, steps: int,
             figures: Callable[[list[int], float, float], dict], meter) -> dict:  # fmt: skip
    """``batches`` largest first (the timed one, then fallbacks on out
    of memory), their ``reference_logprobs`` the torch path's (or None); ``folder`` the initial weights (HF);
    ``figures(lengths, score_s, train_s)`` the torch path's speed figures."""
    from nemo_tau2.models.megatron.worker import MegatronPolicyWorker

    _free(meter.device)  # the torch path's cached blocks, so that the peak below is this backend's
    mcfg = megatron_config(cfg, folder)
    worker = MegatronPolicyWorker(mcfg, tokenizer=tokenizer, init_reference_model=True)
    try:
        worker.init_distributed(worker.rendezvous_address())
        dtype = next(worker.stack.model.parameters()).dtype
        for batch in batches:
            sequences = [dataclasses.replace(s) for s in batch]  # the torch path's reference logprobs stay
            meter.start()
            try:
                agreement = _max_abs_diff(worker.get_logprobs([sequences]), [s.reference_logprobs for s in batch])
                _step(worker, sequences, loss)  # untimed: warm-up and the peak
            except torch.OutOfMemoryError:
                _free(meter.device)
                continue
            peak = meter.peak()
            times = [_step(worker, sequences, loss) for _ in range(steps)]
            score_s, train_s = statistics.median(s for s, _ in times), statistics.median(t for _, t in times)
            measured = figures([len(s) for s in sequences], score_s, train_s)
            estimate = plan_estimate(mcfg, folder, sum(map(len, sequences)))
            return {f"megatron_{k}": v for k, v in measured.items()} | {
                "megatron_peak_bytes": peak, "megatron_estimated_bytes": estimate,
                "megatron_memory_ratio": round(peak / estimate, 4),
                "megatron_attention": worker.stack.attention_backend,
                "megatron_params_dtype": str(dtype).removeprefix("torch."),
                "megatron_logprob_max_abs_diff": agreement}  # fmt: skip
        return {"megatron_error": f"out of memory at every micro-batch down to {sum(map(len, batches[-1]))} tokens"}
    finally:
        worker.close()
        _free(meter.device)


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def megatron_columns(record: dict) -> str:
    """The table's Megatron columns of one shape's record (``HEADER``)."""
    mfu, ratio = record.get("megatron_train_mfu"), record.get("megatron_train_vs_torch")
    memory, diff = record.get("megatron_memory_ratio"), record.get("megatron_logprob_max_abs_diff")
    return (f"{record.get('megatron_train_tokens_per_s', '-'):>10} {f'{mfu:.1%}' if mfu is not None else '-':>7} "
            f"{f'{ratio:.2f}x' if ratio is not None else '-':>9} {f'{memory:.2f}' if memory is not None else '-':>7} "
            f"{f'{diff:.1e}' if diff is not None else '-':>9}")  # fmt: skip
