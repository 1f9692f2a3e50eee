"""HF <-> Megatron weights on tiny Qwen3 and Llama models: the exact round trip, Megatron's logits equal to
transformers' (fp32), a wrong QKV layout caught, tensor-parallel slices that reassemble, and the export reloaded.

Megatron runs in a spawned gloo process (its parallel state must not leak into the pytest process, where other tests
make their own process groups); the spawns (see ``conftest``) compute everything the assertions read.
"""

import importlib.util

import pytest
import torch

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("megatron") is None, reason="needs the megatron extra (uv sync --extra megatron)"
)

LOGITS_TOLERANCE = 1e-5  # fp32, absolute, on logits of order 1


@pytest.fixture(scope="module")
def single_process(one_process) -> dict:
    return one_process["conversion_single"]


@pytest.mark.parametrize("model_type", ["qwen3", "llama"])
def test_round_trip_is_exact(single_process, model_type):
    result = single_process[model_type]
    assert result["round_trip_names_equal"]
    assert result["round_trip_max_abs_diff"] == 0.0


@pytest.mark.parametrize("model_type", ["qwen3", "llama"])
def test_megatron_logits_equal_transformers(single_process, model_type):
    result = single_process[model_type]
    assert result["logits_max_abs_diff"] < LOGITS_TOLERANCE, result
    assert result["logits_scale"] > 0.1  # the comparison is about real logits, not near-zero ones


def test_a_wrong_qkv_layout_is_caught(single_process):
    """Fusing q/k/v as three blocks instead of per query group is a plausible bug: the logits test must see it."""
    assert single_process["qwen3"]["wrong_qkv_logits_max_abs_diff"] > 100 * LOGITS_TOLERANCE


@pytest.mark.parametrize("model_type", ["qwen3", "llama"])
def test_export_reloads_in_transformers_with_equal_logits(single_process, model_type):
    result = single_process[model_type]
    assert result["export_files"] == ["config.json", "model.safetensors"]
    assert result["export_reload_max_abs_diff"] == 0.0  # the same weights in the same transformers model


def test_tp_slices_reassemble_exactly():
    from nemo_tau2.models.megatron.conversion import hf_to_megatron, tp_merge, tp_shard
    from tests.unit.models.megatron.scenarios import tiny_hf_model

    model, config = tiny_hf_model("qwen3")
    full = hf_to_megatron(model.state_dict(), config)
    for name, tensor in full.items():
        shards = [tp_shard(name, tensor, rank, 2) for rank in range(2)]
        assert torch.equal(tp_merge(name, shards), tensor), name
    fc1 = full["decoder.layers.0.mlp.linear_fc1.weight"]
    gate, up = fc1.chunk(2)
    first = tp_shard("decoder.layers.0.mlp.linear_fc1.weight", fc1, 0, 2)
    assert torch.equal(first, torch.cat([gate.chunk(2)[0], up.chunk(2)[0]]))  # each rank: its gate, then its up


def test_tensor_parallel_logits_equal_transformers(two_processes):
    """TP=2 (2 gloo processes): each rank holds half the query groups and half the MLP; logits unchanged."""
    result = two_processes["conversion_tp2"]
    assert result["logits_max_abs_diff"] < LOGITS_TOLERANCE, result
    assert result["export_max_abs_diff"] == 0.0


@pytest.mark.parametrize("model_type", ["qwen3", "llama"])
def test_a_padded_vocabulary_converts_with_zero_rows_and_exports_without_them(model_type):
    """Megatron pads the embedding and output rows so TP splits any vocabulary (here 591 -> 768 for TP=2 at the
    default 128): the padding is zeros in, dropped out, so the HF export is exactly the HF state."""
    from nemo_tau2.models.megatron.conversion import hf_to_megatron, megatron_to_hf, tp_merge, tp_shard
    from nemo_tau2.models.policy.megatron_config import MegatronConfig
    from tests.unit.models.megatron.scenarios import tiny_hf_model

    model, config = tiny_hf_model(model_type, vocab_size=591)
    padded = MegatronConfig(tensor_model_parallel_size=2).padded_vocab_size(591)
    full = hf_to_megatron(model.state_dict(), config, padded_vocab_size=padded)
    heads = ["embedding.word_embeddings.weight"] + ([] if model_type == "qwen3" else ["output_layer.weight"])
    for name in heads:
        assert full[name].shape[0] == 768 and not full[name][591:].any(), name
        shards = [tp_shard(name, full[name], rank, 2) for rank in range(2)]
        assert [shard.shape[0] for shard in shards] == [384, 384] and torch.equal(tp_merge(name, shards), full[name])
    state = dict(model.state_dict())
    if config.tie_word_embeddings:  # save_pretrained's keys: no lm_head
        del state["lm_head.weight"]
    back = megatron_to_hf(full, config)
    assert sorted(back) == sorted(state)
    assert all(torch.equal(back[name], state[name]) for name in state)


def test_transformers_5_rope_parameters_are_read_and_scaled_rope_refused():
    """transformers 5 keeps RoPE in ``rope_parameters`` (``rope_type`` "default": plain RoPE, with its theta);
    every released Qwen3 has it, so it must build; a scaled RoPE is refused in one line."""
    from transformers import LlamaConfig, Qwen3Config

    from nemo_tau2.models.megatron.model import UnsupportedArchitecture, check_supported, rope_theta

    qwen3 = Qwen3Config(rope_theta=1_000_000.0, head_dim=24)
    check_supported(qwen3)
    assert rope_theta(qwen3) == 1_000_000.0
    scaled = LlamaConfig(max_position_embeddings=16384, rope_scaling={"rope_type": "linear", "factor": 2.0})
    with pytest.raises(UnsupportedArchitecture, match="rope_type 'linear'"):
        check_supported(scaled)
