"""Weights leaving the trainer: streamed safetensors files, and the hf engine's in-place update from a stream."""

import copy
import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from nemo_tau2.generation import GenerationConfig, start_generation
from nemo_tau2.generation.surface_check import call_json
from nemo_tau2.generation.weight_stream import WeightStream
from nemo_tau2.models.policy.weights import iter_full_state_dict, write_safetensors

from .conftest import NO_KL, make_policy, make_sequences, weights, with_prev_logprobs

CALL_TIMEOUT_S = 300  # one call to a CPU server on a busy machine (call_json asks for its wait)

HF = GenerationConfig(backend="hf", model_name="tiny", temperature=1.0, top_p=1.0, hf_cfg={})


def test_streamed_safetensors_shards_load_in_transformers_with_tied_embeddings(tiny, tmp_path):
    policy = make_policy(tiny, optimizer={"kwargs": {"lr": 1e-2}})
    policy.train(with_prev_logprobs(policy, make_sequences(4)), NO_KL)
    trained = weights(policy)
    stream = iter_full_state_dict(policy._workers.worker.model, rank=0, compute_device=torch.device("cpu"))
    files = write_safetensors(stream, tmp_path, max_shard_bytes=40_000)  # a few tensors per file
    assert len(files) > 3 and all(f.name.endswith(f"-of-{len(files):05d}.safetensors") for f in files)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert "lm_head.weight" not in index["weight_map"]  # tied to the embeddings: written once, as save_pretrained
    tiny.model.config.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, local_files_only=True)
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    assert all(torch.equal(tensor, trained[name]) for name, tensor in loaded.state_dict().items())
    assert write_safetensors(iter(trained.items()), tmp_path) == [tmp_path / "model.safetensors"]  # replaced
    assert sorted(p.name for p in tmp_path.glob("model*")) == ["model.safetensors"]


def _chat(handle) -> tuple[int, dict]:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 3, "seed": 1}
    return call_json("POST", f"{handle.base_urls[0]}/chat/completions", body, timeout_s=CALL_TIMEOUT_S)


def test_the_hf_engine_checks_a_stream_before_copying_and_refuses_to_serve_a_torn_update(tiny):
    trained = {name: tensor + 0.5 for name, tensor in tiny.model.state_dict().items()}
    with start_generation(HF, model=copy.deepcopy(tiny.model), tokenizer=tiny.tokenizer) as handle:
        served = handle.engine.model.state_dict()
        shapes = {name: tuple(t.shape) for name, t in trained.items()}
        wrong = WeightStream(shapes | {"model.norm.weight": (3,)}, iter(trained.items()))
        with pytest.raises(ValueError, match=r"state_dict\['model.norm.weight'\] has shape \(3,\)"):
            handle.update_weights(wrong)
        assert torch.equal(served["model.norm.weight"], tiny.model.state_dict()["model.norm.weight"])  # untouched

        def breaks_off():
            for index, item in enumerate(trained.items()):
                if index == 3:
                    raise RuntimeError("a trainer rank died")
                yield item

        with pytest.raises(RuntimeError, match="a trainer rank died"):
            handle.update_weights(WeightStream(shapes, breaks_off()))
        status, body = _chat(handle)
        assert status == 500 and "incomplete after a failed update" in json.dumps(body)
        assert handle.update_weights(WeightStream(shapes, iter(trained.items()))) == 1
        assert _chat(handle)[0] == 200
        assert all(torch.equal(served[name], trained[name]) for name in trained)
