"""What a training micro-batch's activations hold on a trainer rank, by activation-checkpointing mode: the arithmetic
of autograd's saved tensors for one Llama/Qwen block, apart from the plan that adds them to the rest of a rank's
memory (:mod:`nemo_tau2.models.memory_plan`). The measured corrections come from
:mod:`nemo_tau2.models.memory_constants`."""

from nemo_tau2.models.memory_constants import ACTIVATION_BYTES_SCALE, CHECKPOINT_RECOMPUTE_FRACTION
from nemo_tau2.models.model_shape import ModelShape


def block_activation_parts(m: ModelShape, c: int) -> tuple[float, float]:
    """What autograd keeps for one token through one Llama/Qwen block (c: bytes of the compute dtype), in two parts:
    the norms and the attention and MLP inputs (whole on every Megatron TP rank), and the outputs of the matrices
    tensor parallelism splits (q/k/v, q/k norms, attention out; gate, act(gate), up, down input)."""
    h, i, q, kv = m.hidden_size, m.intermediate_size, m.attention_width, m.kv_width
    norms = 2 * (4 * h + c * h)  # two RMSNorms: fp32 input and the normalised output
    inputs = 2 * c * h  # of qkv and of gate/up
    return norms + inputs, c * (q + 2 * kv) + 4 * (q + kv) + 2 * c * q + 4 * c * i


def activation_bytes_per_token_per_block(m: ModelShape, c: int) -> float:
    return sum(block_activation_parts(m, c))


def trainer_activation_bytes(m: ModelShape, c: int, tokens: int, checkpointing: str) -> tuple[float, str]:
    """Bytes of activations live at the peak for ``tokens`` tokens (c: bytes of the compute dtype) under
    ``checkpointing`` (none, selective or full), and the plan's label for them. Full: each block's input plus the
    part of one block's worth being recomputed that is live at the peak; selective: each block's input and its matmul
    and attention outputs (what :mod:`nemo_tau2.models.policy.blocks` keeps) plus one block's worth; none: every
    block's saved tensors, scaled by the measured correction."""
    per_block = activation_bytes_per_token_per_block(m, c)
    if checkpointing == "full":
        activations = tokens * (m.num_blocks * c * m.hidden_size + CHECKPOINT_RECOMPUTE_FRACTION * per_block)
        return activations, f"activations, {tokens} tokens (checkpointed: block inputs + part of 1 block)"
    if checkpointing == "selective":
        kept = c * (3 * m.hidden_size + 2 * m.attention_width + 2 * m.kv_width + 2 * m.intermediate_size)
        return tokens * (m.num_blocks * kept + per_block), f"activations, {tokens} tokens (selective)"
    activations = tokens * m.num_blocks * per_block * ACTIVATION_BYTES_SCALE
    return activations, f"activations, {tokens} tokens ({m.num_blocks} blocks)"
