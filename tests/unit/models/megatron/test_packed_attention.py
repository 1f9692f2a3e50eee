"""Packed rows in the Megatron backend without an ``N x N`` mask (``packed_attention``): one packed row through the
stage gives transformers' logprobs and gradients of each sequence run alone, at TP=1 and TP=2 (gloo); no tensor
over the whole row's ``N x N`` is ever made (forward, backward, the training step); and the choice between the
per-sequence SDPA attention and Transformer Engine's THD path (which cannot run here: no CPU build of TE).

The spawned scenarios are the shared ones (``conftest``): ``packed_attention`` in the one-process spawn,
``packed_attention_tp2`` and ``training_tp2_packed`` in the two-process one.
"""

import importlib.util

import pytest
import torch

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("megatron") is None, reason="needs the megatron extra (uv sync --extra megatron)"
)

LOGPROB_TOLERANCE = 1e-5  # fp32; SDPA per sequence vs transformers' eager attention (measured ~2e-6)
GRAD_TOLERANCE = 1e-5  # fp32, each parameter's max |difference| relative to its largest gradient


@pytest.fixture(scope="module", params=["tp1", "tp2"])
def packed_row(request, one_process, two_processes) -> dict:
    return one_process["packed_attention"] if request.param == "tp1" else two_processes["packed_attention_tp2"]


def test_a_packed_row_gives_each_sequences_own_logprobs_and_gradients(packed_row):
    """4 sequences (7, 12, 5, 9 tokens) in one row through the stage = each alone through transformers: logprobs
    and every parameter's gradient (HF names, TP slices gathered). Sequences attending to the ones before them in
    the row, or RoPE continuing across them, would move both."""
    assert packed_row["logprob_max_abs_diff"] < LOGPROB_TOLERANCE
    assert packed_row["logprob_scale"] > 1.0  # real logprobs of a 96-token vocabulary, not near-zero ones
    assert packed_row["grad_names_equal"]
    assert packed_row["grad_max_rel_diff"] < GRAD_TOLERANCE
    assert packed_row["grad_scale"] > 1e-3  # every parameter got a gradient worth comparing


def test_no_tensor_over_the_whole_rows_n_by_n_is_made(packed_row, one_process, two_processes):
    """Every op's output during the stage's forward and backward (TP=1 and TP=2, a row of 33 tokens), and during
    ``get_logprobs`` and 3 training steps on packed rows (TP=1, rows of 48 tokens): none ends in ``N x N`` for the
    row's width ``N`` (a dense block-causal mask is ``[1, 1, N, N]``, dense scores ``[heads, N, N]``); the recorder
    did see the row (its logits, hidden states). Not the TP=2 training run: there a rank's attention output,
    flattened for its matmul, is ``[48 tokens, 2 heads x 24]``, a 48 x 48 that is no mask."""
    for run in (packed_row, one_process["training_packed"]):
        assert run["row_squares"] == []
        assert run["row_tensors"] > 10


def test_the_tp2_packed_trajectory_is_the_single_process_one(one_process, two_processes):
    packed, single = two_processes["training_tp2_packed"], one_process["training_single"]
    assert packed["losses"] == pytest.approx(single["losses"], abs=1e-5)
    assert packed["grad_norms"] == pytest.approx(single["grad_norms"], rel=1e-5)
    assert (packed["export_logits"] - single["export_logits"]).abs().max().item() < 1e-5


def test_the_backend_is_transformer_engines_thd_only_with_te_on_cuda():
    from nemo_tau2.models.megatron.packed_attention import SDPA, THD, SequenceAttention, attention_backend
    from nemo_tau2.models.megatron.packed_attention import core_attention_module as module

    assert attention_backend("cuda", transformer_engine=True) == THD
    assert attention_backend("cuda", transformer_engine=False) == SDPA
    assert attention_backend("cpu", transformer_engine=True) == SDPA  # TE has no CPU kernels
    assert attention_backend("cpu") == SDPA and module(SDPA) is SequenceAttention
    if importlib.util.find_spec("transformer_engine") is None:
        with pytest.raises(ImportError, match="needs Transformer Engine"):
            module(THD)


def test_the_packed_seq_params_of_each_backend():
    """THD (Transformer Engine): int32 cumulative lengths and the longest sequence (what TE's kernels and fused RoPE
    read). SDPA: the same boundaries, the lengths on the host (no layer reads them back from the device), and the
    row's width as megatron-core's RoPE length (the row keeps its sbhd layout)."""
    from nemo_tau2.models.megatron import packed_attention as pa
    from nemo_tau2.models.megatron.packed_attention import SDPA, THD, RowSequences

    positions = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3, 0]])
    lengths = pa.sequence_lengths(positions)
    assert lengths == [3, 2, 4, 1]
    thd = pa.packed_seq_params(lengths, "cpu", THD)
    assert thd.qkv_format == "thd" and thd.cu_seqlens_q.dtype == torch.int32
    assert thd.cu_seqlens_q.tolist() == thd.cu_seqlens_kv.tolist() == [0, 3, 5, 9, 10]
    assert thd.max_seqlen_q == thd.max_seqlen_kv == 4 and not isinstance(thd, RowSequences)
    sdpa = pa.packed_seq_params(lengths, "cpu", SDPA)
    assert isinstance(sdpa, RowSequences) and sdpa.qkv_format == "sbhd" and sdpa.lengths == (3, 2, 4, 1)
    assert sdpa.cu_seqlens_q.tolist() == [0, 3, 5, 9, 10] and sdpa.max_seqlen_q == sdpa.max_seqlen_kv == 10
