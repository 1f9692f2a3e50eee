"""Trained weights reach the hf generation backend: after update_weights, its logprobs are the trainer's."""

import copy

import pytest

from nemo_tau2.generation import GenerationConfig, start_generation
from nemo_tau2.generation.surface_check import call_json
from nemo_tau2.models.policy import sequence_from_message_log

from .conftest import NO_KL, make_policy, make_sequences, with_prev_logprobs

CALL_TIMEOUT_S = 300  # one call to a CPU server on a busy machine (call_json asks for its wait)

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the weather in Paris?"}]


def _sample_turn(handle, seed: int) -> list[dict]:
    """One generated turn over HTTP, as the message log of a rollout (prompt ids, generated ids + logprobs)."""
    body = {
        "model": handle.model_name, "messages": CHAT, "max_tokens": 12, "seed": seed,
        "logprobs": True, "top_logprobs": 0, "return_tokens_as_token_ids": True,
    }  # fmt: skip
    status, response = call_json("POST", f"{handle.base_urls[0]}/chat/completions", body, timeout_s=CALL_TIMEOUT_S)
    assert status == 200, response
    choice = response["choices"][0]
    return [
        {"role": "user", "token_ids": response["prompt_token_ids"]},
        {
            "role": "assistant",
            "token_ids": choice["token_ids"],
            "generation_logprobs": [entry["logprob"] for entry in choice["logprobs"]["content"]],
        },
    ]


def _largest_gap(policy, message_log) -> float:
    seq = sequence_from_message_log(message_log, advantage=1.0)
    (trainer,) = policy.get_logprobs([seq])
    return max(abs(a - b) for a, b, m in zip(trainer, seq.generation_logprobs, seq.token_mask, strict=True) if m)


def test_generation_logprobs_equal_the_trainers_after_a_weight_update(tiny):
    policy = make_policy(tiny, optimizer={"kwargs": {"lr": 1e-2}})
    for _ in range(2):
        policy.train(with_prev_logprobs(policy, make_sequences(4)), NO_KL)
    cfg = GenerationConfig(backend="hf", model_name="tiny", temperature=1.0, top_p=1.0, hf_cfg={})
    with start_generation(cfg, model=copy.deepcopy(tiny.model), tokenizer=tiny.tokenizer) as handle:
        assert _largest_gap(policy, _sample_turn(handle, seed=1)) > 1e-2  # still the initial weights
        assert handle.update_weights(policy.state_dict_for_generation()) == 1
        for seed in (1, 2):
            message_log = _sample_turn(handle, seed)
            assert _largest_gap(policy, message_log) < 1e-4
        seq = sequence_from_message_log(message_log, advantage=1.0)
        metrics = policy.train(with_prev_logprobs(policy, [seq]), NO_KL)
        assert metrics["token_mult_prob_error"] == pytest.approx(1.0, abs=1e-4)


def test_weights_saved_for_a_reloading_backend_serve_the_trainers_logprobs(tiny, tmp_path):
    policy = make_policy(tiny, optimizer={"kwargs": {"lr": 1e-2}})
    policy.train(with_prev_logprobs(policy, make_sequences(4)), NO_KL)
    exported = policy.save_hf_model(tmp_path / "weights")
    cfg = GenerationConfig(backend="hf", model_name="tiny", temperature=1.0, top_p=1.0, hf_cfg={})
    with start_generation(cfg, model=copy.deepcopy(tiny.model), tokenizer=tiny.tokenizer) as handle:
        assert handle.update_weights(checkpoint_dir=str(exported)) == 1
        assert _largest_gap(policy, _sample_turn(handle, seed=3)) < 1e-4
