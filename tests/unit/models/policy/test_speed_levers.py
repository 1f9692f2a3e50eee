"""The trainer's speed levers change nothing but speed: each gives the logprobs, loss and gradient of the path without
it, on a tiny GQA Qwen3 (4 query heads over 2 key/value heads), fp32 and bf16.

Gradients are compared through the weights after one step of plain SGD at lr 1 without clipping (the update is
minus the gradient). What only a GPU runs (the variable-length flash kernel, inductor's CUDA code) is compared on
and off by ``bench/gpu_check.py --levers``.
"""

import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import Qwen3Config, Qwen3ForCausalLM

from nemo_tau2.generation.tiny_model import TinyModel
from nemo_tau2.models.memory_plan import resolve_activation_checkpointing
from nemo_tau2.models.model_shape import model_shape
from nemo_tau2.models.policy.lm_policy import Policy
from nemo_tau2.models.policy.packed_attention import attention_plan, packed_sdpa_attention

from .conftest import NO_KL, make_sequences, policy_config, weights, with_prev_logprobs
from .test_training import SGD, assert_same_weights, perturbed

PACKED = {"enabled": True, "train_mb_tokens": 64, "logprob_mb_tokens": 70}
TOLERANCE = {"float32": 1e-5, "bfloat16": 2e-2}


@pytest.fixture(scope="module")
def qwen3(tiny) -> TinyModel:
    config = Qwen3Config(
        vocab_size=len(tiny.tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
        tie_word_embeddings=True, pad_token_id=tiny.tokenizer.pad_token_id, bos_token_id=None,
        eos_token_id=tiny.tokenizer.eos_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    return TinyModel(model=Qwen3ForCausalLM(config).eval(), tokenizer=tiny.tokenizer)


def qwen3_policy(qwen3: TinyModel, **overrides) -> Policy:
    fields = {
        "optimizer": SGD,
        "max_grad_norm": None,
        "sequence_packing": PACKED,
        "make_sequence_length_divisible_by": 8,
    }
    cfg = policy_config(**(fields | overrides))
    return Policy(cfg, model=copy.deepcopy(qwen3.model), tokenizer=qwen3.tokenizer)


def assert_same_step(lever_off: Policy, lever_on: Policy, tolerance: float) -> None:
    """Equal logprobs, then one training step with equal loss metrics and equal updated weights (the gradient)."""
    sequences = make_sequences(6)  # 21-29 tokens: two or three to a 64-token micro-batch, a padding segment each
    for got, expected in zip(lever_on.get_logprobs(sequences), lever_off.get_logprobs(sequences), strict=True):
        assert got == pytest.approx(expected, abs=tolerance)
    sequences = perturbed(with_prev_logprobs(lever_off, sequences))
    expected, got = lever_off.train(sequences, NO_KL), lever_on.train(sequences, NO_KL)
    assert expected["grad_norm"] > 0.1
    for key in ("loss", "pg_loss", "entropy", "grad_norm", "num_valid_tokens"):
        assert got[key] == pytest.approx(expected[key], rel=tolerance, abs=tolerance), key
    assert_same_weights(weights(lever_on), weights(lever_off), atol=tolerance, rtol=tolerance)


# ---- 1. variable-length attention planned once per micro-batch ----------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_planned_packed_attention_equals_dense_block_causal_attention(dtype):
    lengths = [5, 9, 3, 7]  # three sequences and a padding segment
    n = sum(lengths)
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(1, 4, n, 16, generator=generator).to(dtype)
    key, value = (torch.randn(1, 2, n, 16, generator=generator).to(dtype) for _ in range(2))
    segment = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    mask = causal & (segment[:, None] == segment[None, :])
    expected = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, enable_gqa=True)
    plan = attention_plan(lengths, torch.device("cpu"), kernel=False)
    got, _ = packed_sdpa_attention(None, query, key, value, None, **plan)
    torch.testing.assert_close(got, expected.transpose(1, 2), atol=TOLERANCE[str(dtype)[6:]], rtol=0)
    positions = torch.cat([torch.arange(length) for length in lengths])[None]
    found, _ = packed_sdpa_attention(None, query, key, value, None, position_ids=positions)  # per_sequence
    torch.testing.assert_close(found, got, atol=0, rtol=0)


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_planned_attention_gives_the_logprobs_loss_and_gradient_of_per_layer_bounds(qwen3, precision):
    per_layer = qwen3_policy(qwen3, precision=precision, sequence_packing=PACKED | {"attention": "per_sequence"})
    planned = qwen3_policy(qwen3, precision=precision, sequence_packing=PACKED | {"attention": "varlen"})
    assert_same_step(per_layer, planned, TOLERANCE[precision])


# ---- 2. torch.compile of the blocks -------------------------------------------------------------------------------


@pytest.mark.slow  # torch.compile of every block (~47 s)
def test_compiled_blocks_give_the_logprobs_loss_and_gradient_of_eager_ones(qwen3):
    eager = qwen3_policy(qwen3, dtensor_cfg={"torch_compile": False})
    compiled = qwen3_policy(qwen3, dtensor_cfg={"torch_compile": True})
    block = compiled._workers.worker.model.model.layers[0]
    assert block._compiled_call_impl is not None  # really compiled
    assert_same_step(eager, compiled, TOLERANCE["float32"])


# ---- 3. activation checkpointing: none / selective / full, auto from the memory plan ------------------------------


class _OpCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.counts[name] = self.counts.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


def _backward_ops(policy: Policy) -> dict[str, int]:
    """The aten ops one backward pass runs: a recomputed forward op shows up here."""
    worker = policy._workers.worker
    worker.model.train()
    batch = worker._collate(make_sequences(2))
    loss = worker._logits(worker.model, batch).float().logsumexp(-1).mean()
    with _OpCounter() as counter:
        loss.backward()
    worker.model.zero_grad(set_to_none=True)
    return counter.counts


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_checkpointing_modes_give_the_same_step_and_recompute_what_they_say(qwen3, precision):
    policies = {
        mode: qwen3_policy(qwen3, precision=precision, dtensor_cfg={"activation_checkpointing": mode})
        for mode in ("none", "selective", "full")
    }
    ops = {mode: _backward_ops(policy) for mode, policy in policies.items()}
    assert ops["none"].get("silu", 0) == 0  # nothing recomputed
    assert ops["selective"]["silu"] == ops["full"]["silu"] == 2  # the elementwise ops of both blocks recomputed...
    assert ops["selective"]["mm"] == ops["none"]["mm"]  # ...but not one matrix multiply
    # full: q, k, v, o, gate, up once more per block (the recompute stops once it has what the backward needs: the
    # down projection's output is not among it)
    assert ops["full"]["mm"] == ops["none"]["mm"] + 2 * 6
    for mode in ("selective", "full"):  # a fresh baseline each time: assert_same_step trains both
        baseline = qwen3_policy(qwen3, precision=precision, dtensor_cfg={"activation_checkpointing": "none"})
        assert_same_step(baseline, policies[mode], TOLERANCE[precision])


def test_nemo_rl_booleans_keep_their_meaning_and_auto_takes_the_least_recompute_that_fits(qwen3):
    assert policy_config(dtensor_cfg={"activation_checkpointing": True}).activation_checkpointing == "full"
    assert policy_config(dtensor_cfg={"activation_checkpointing": False}).activation_checkpointing == "none"
    assert policy_config().activation_checkpointing == "auto"
    cfg = policy_config(precision="bfloat16", sequence_packing={"enabled": True, "train_mb_tokens": 32768})
    shape = model_shape(qwen3.model.config, "qwen3-tiny", "test")
    chosen = [
        resolve_activation_checkpointing(cfg, shape, reference=False, budget=(gigabytes * 1e9, "test"))
        for gigabytes in (1000.0, 1.0, 0.5, 0.3, 0.01)
    ]
    assert chosen == ["none", "none", "selective", "full", "full"]  # 0.01 GB: nothing fits, full says what else


# ---- 4. FSDP2 on one rank keeps the gathered blocks from forward to backward --------------------------------------


def test_one_rank_fsdp_without_resharding_gives_the_step_of_resharding(qwen3):
    results = []
    for reshard in (True, False):
        policy = qwen3_policy(qwen3, dtensor_cfg={"enabled": True, "reshard_after_forward": reshard})
        block = policy._workers.worker.model.model.layers[0]
        kept_gathered = block._get_fsdp_state()._fsdp_param_group.post_forward_mesh_info is None
        assert kept_gathered is not reshard
        sequences = perturbed(with_prev_logprobs(policy, make_sequences(6)))
        results.append((policy.get_logprobs(sequences), policy.train(sequences, NO_KL), weights(policy)))
        policy.shutdown()
    (logprobs_a, metrics_a, weights_a), (logprobs_b, metrics_b, weights_b) = results
    for a, b in zip(logprobs_a, logprobs_b, strict=True):
        assert a == pytest.approx(b, abs=1e-6)
    assert metrics_a["loss"] == pytest.approx(metrics_b["loss"], rel=1e-6)
    assert_same_weights(weights_a, weights_b, atol=1e-6, rtol=1e-6)
