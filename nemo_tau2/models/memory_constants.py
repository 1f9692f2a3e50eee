"""The memory plan's measured constants (:mod:`nemo_tau2.models.memory_plan`): how much of each first-principles term
is live at the peak the CUDA caching allocator reserves, and where each figure comes from. A GPU measurement
(``bench/gpu_check.py --write-calibration``) corrects them; ``tests/unit/models/test_memory_calibration.py`` holds the
plan to every recorded ladder point (docs/gpu-kit.md)."""

# Measured constants: one NVIDIA H200, torch 2.11 + transformers 5.17, bench/gpu_check.py at 0ec1e71, 2026-11-27
# (shared/measurements/gpu_check_h200_2026-11-27.jsonl: Qwen3 0.6B..8B, 4k..64k-token micro-batches, activation
# checkpointing on and off). Fitted by a linear program that keeps every ladder point in [-3%, +10%] of its estimate
# (the largest margin: 0.3%); the first principles (2 bytes per logit and 2 per logit gradient in bf16, a block's
# input per token and layer under checkpointing) held as they are. Refitted with the second loan's records (one H200,
# d9058bc, 2026-12-04, bench/data/gpu_records/): Qwen3-8B at 8k tokens was 3.1% over its estimate, so AdamW's step
# bytes 3.5 -> 3.6 per parameter and the overhead 2.25 -> 2.1 GB, the pair whose smaller margin to the band's edges
# is largest over every recorded point (0.19% on the under side, 0.23% on the over side). To recalibrate:
# docs/gpu-kit.md.
RUNTIME_OVERHEAD_BYTES = 2.1e9
"""CUDA context, NCCL communicators, cuBLAS workspace and the fp32 log-softmax chunks' cache, per GPU."""
OPTIMIZER_STEP_BYTES_PER_PARAM = 3.6
"""AdamW's foreach step: one fp32 temporary per parameter (4 bytes), of which the allocator keeps 3.6 reserved on
average beside the next step's activations (some of its blocks are reused for them)."""
CHECKPOINT_RECOMPUTE_FRACTION = 0.3
"""With activation checkpointing: the share of one block's activations (being recomputed) live at the peak, which
falls at the start of the backward pass, while the logits' gradient is live."""
ACTIVATION_BYTES_SCALE = 1.175
"""Without checkpointing: measured over first-principles activations per token and block (RoPE's rotated copies,
dtype casts and the attention kernel's saved statistics the first-principles count leaves out)."""
TOKEN_BYTES_SCALE = 1.0
"""Measured over estimated bytes of what grows with the micro-batch's tokens (activations, logits): a correction a
future measurement suggests (``memory_calibration``), 1.0 while the constants above hold."""
