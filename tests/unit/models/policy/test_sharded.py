"""FSDP2 on 2 gloo ranks (Ray actors) against 1 unsharded process: the same update, weights served and exported
from shards, and sharded checkpoints that resume bit for bit and reshard onto 1 and 4 ranks.

Precision is float32 throughout (``policy.precision``'s default): bf16 compute would make the comparisons
meaningless. One Ray instance serves the module; each Policy's actors are its main cost.
"""

import copy
import os

import pytest
import ray
import torch
from transformers import AutoModelForCausalLM

from nemo_tau2.algorithms.loss import ClippedPGLossConfig, ClippedPGLossFn
from nemo_tau2.generation import GenerationConfig, start_generation
from nemo_tau2.generation.surface_check import call_json
from nemo_tau2.generation.vllm_launcher import VllmReplicas, served_model_layout
from nemo_tau2.models.policy import step_dir
from nemo_tau2.models.policy.lm_policy import Policy

from .conftest import NO_KL, make_sequences, policy_config, with_prev_logprobs
from .test_training import assert_same_weights, perturbed

CALL_TIMEOUT_S = 300  # one call to a CPU server on a busy machine (call_json asks for its wait)

SHARDED = {"enabled": True, "activation_checkpointing": True}
OPTIMIZER = {"name": "torch.optim.SGD", "kwargs": {"lr": 0.5, "momentum": 0.9}}  # state to checkpoint, no Adam noise
WARMUP = [{"name": "torch.optim.lr_scheduler.LinearLR", "kwargs": {"start_factor": 0.5, "total_iters": 4}}]
SEQUENCE_LEVEL = ClippedPGLossFn(ClippedPGLossConfig(reference_policy_kl_penalty=0.0, token_level_loss=False))


@pytest.fixture(scope="module")
def ray_cluster():
    assert not ray.is_initialized()
    # logical CPUs: 2 ranks + 4 ranks at once; "local": never another test process's cluster (xdist runs two)
    ray.init(address="local", num_cpus=6, include_dashboard=False, configure_logging=False)
    yield
    ray.shutdown()


def sharded_policy(tiny, num_workers: int, **overrides) -> Policy:
    cfg = policy_config(
        num_workers=num_workers, train_micro_batch_size=1, optimizer=OPTIMIZER, scheduler=WARMUP, dtensor_cfg=SHARDED
    )
    return Policy(cfg.model_copy(update=overrides), model=copy.deepcopy(tiny.model), tokenizer=tiny.tokenizer,
                  init_reference_model=True)  # fmt: skip


@pytest.fixture(scope="module")
def two_ranks(tiny, ray_cluster):
    policy = sharded_policy(tiny, 2)
    yield policy
    policy.shutdown()


def shards(policy: Policy) -> list[dict[str, torch.Tensor]]:
    return policy._workers.run("local_state_dict", [()] * policy._workers.world_size)


def _niceness(_worker) -> int:
    return os.nice(0)


def test_the_ranks_run_at_the_drivers_priority(two_ranks):
    """Ray's default (nice 15) starves the ranks beside any busy process: nemo_tau2 sets RAY_worker_niceness=0."""
    actors = two_ranks._workers.actors
    assert ray.get([actor.__ray_call__.remote(_niceness) for actor in actors]) == [os.nice(0)] * len(actors)


def test_two_fsdp_ranks_give_the_update_of_one_unsharded_process(tiny, two_ranks):
    unsharded = Policy(policy_config(train_micro_batch_size=2, optimizer=OPTIMIZER, scheduler=WARMUP),
                       model=copy.deepcopy(tiny.model), tokenizer=tiny.tokenizer)  # fmt: skip
    first, second = shards(two_ranks)
    embeddings = tiny.model.state_dict()["model.embed_tokens.weight"]
    assert first["model.embed_tokens.weight"].shape[0] + second["model.embed_tokens.weight"].shape[0] == len(
        embeddings
    )  # really sharded: each rank holds half the rows
    sequences = make_sequences(5)  # 3 and 2 on the ranks: micro-batches of 1, rank 1 runs a dummy third
    initial = unsharded.get_logprobs(sequences)
    for got, expected in zip(two_ranks.get_logprobs(sequences), initial, strict=True):
        assert got == pytest.approx(expected, abs=1e-6)
    for loss_fn in (NO_KL, SEQUENCE_LEVEL):  # token-level, then sequence-level loss: two steps
        batch = perturbed(with_prev_logprobs(unsharded, make_sequences(5, seed=len(initial))))
        expected, got = unsharded.train(batch, loss_fn), two_ranks.train(batch, loss_fn)
        for key in ("loss", "clip_fraction", "entropy", "grad_norm", "global_valid_toks", "num_valid_samples"):
            assert got[key] == pytest.approx(expected[key], rel=1e-5), key
        assert expected["grad_norm"] > 1.0  # max_grad_norm 1.0 clipped the update
        assert_same_weights(two_ranks.state_dict_for_generation(), unsharded.state_dict_for_generation(),
                            atol=1e-6, rtol=1e-5)  # fmt: skip
    for got, expected in zip(two_ranks.get_reference_policy_logprobs(sequences), initial, strict=True):
        assert got == pytest.approx(expected, abs=1e-6)  # the reference shards kept the initial weights


def _sample(handle, seed: int) -> tuple[list[int], list[float]]:
    body = {
        "model": "tiny", "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "max_tokens": 8, "seed": seed, "logprobs": True, "top_logprobs": 0,
    }  # fmt: skip
    status, response = call_json("POST", f"{handle.base_urls[0]}/chat/completions", body, timeout_s=CALL_TIMEOUT_S)
    assert status == 200, response
    choice = response["choices"][0]
    return choice["token_ids"], [entry["logprob"] for entry in choice["logprobs"]["content"]]


def test_weights_from_shards_update_the_hf_engine_in_place_like_a_fresh_load_and_export_to_hf(tiny, two_ranks,
                                                                                               tmp_path):  # fmt: skip
    two_ranks.train(with_prev_logprobs(two_ranks, make_sequences(4, seed=9)), NO_KL)
    trained = two_ranks.state_dict_for_generation()
    exported = two_ranks.save_hf_model(tmp_path / "hf")
    loaded = AutoModelForCausalLM.from_pretrained(exported, local_files_only=True)
    assert loaded.state_dict().keys() == trained.keys()
    assert all(torch.equal(tensor, trained[name]) for name, tensor in loaded.state_dict().items())
    tiny.model.save_pretrained(tmp_path / "served")  # what vLLM would have started from (tied lm_head left out)
    replicas = VllmReplicas.__new__(VllmReplicas)  # no server: vLLM's refusal of a folder it cannot load in place
    replicas.layout = served_model_layout(str(tmp_path / "served"))
    assert replicas.check_checkpoint(str(exported)) == replicas.layout  # exactly the served tensor names and shapes

    cfg = GenerationConfig(backend="hf", model_name="tiny", temperature=1.0, top_p=1.0, hf_cfg={})
    with (
        start_generation(cfg, model=copy.deepcopy(tiny.model), tokenizer=tiny.tokenizer) as updated,
        start_generation(cfg, model=loaded, tokenizer=tiny.tokenizer) as fresh,
    ):
        before = _sample(updated, seed=5)
        assert updated.update_weights(two_ranks.stream_weights_for_generation()) == 1
        for seed in (5, 6):
            (tokens, logprobs), (fresh_tokens, fresh_logprobs) = _sample(updated, seed), _sample(fresh, seed)
            assert tokens == fresh_tokens
            assert logprobs == pytest.approx(fresh_logprobs, abs=1e-5)  # same weights; kernels may round apart
        assert _sample(updated, 5) != before  # the update changed what is served


def test_a_sharded_checkpoint_resumes_bit_for_bit_and_reshards_onto_1_and_4_ranks(tiny, two_ranks, tmp_path):
    two_ranks.train(with_prev_logprobs(two_ranks, make_sequences(4, seed=11)), NO_KL)
    saved = two_ranks.save_checkpoint(step_dir(tmp_path, 2), {"step": 2})
    at_save = two_ranks.state_dict_for_generation()
    batch = perturbed(with_prev_logprobs(two_ranks, make_sequences(6, seed=12)))
    uninterrupted = two_ranks.train(batch, NO_KL)
    after = two_ranks.state_dict_for_generation()

    with sharded_policy(tiny, 2) as restarted:  # new processes, built from the initial model, as a restarted run
        assert restarted.load_checkpoint(saved) == {"step": 2}
        assert restarted.train(batch, NO_KL)["loss"] == uninterrupted["loss"]
        resumed = restarted.state_dict_for_generation()
        assert all(torch.equal(resumed[name], after[name]) for name in after)

    resharded = [sharded_policy(tiny, 1), sharded_policy(tiny, 4)]  # in-process one-rank group; 4 Ray ranks
    unsharded = policy_config(optimizer=OPTIMIZER, scheduler=WARMUP)
    resharded.append(Policy(unsharded, model=copy.deepcopy(tiny.model), tokenizer=tiny.tokenizer))
    for policy in resharded:
        try:
            policy.load_checkpoint(saved)
            restored = policy.state_dict_for_generation()
            assert all(torch.equal(restored[name], at_save[name]) for name in at_save)  # resharded exactly
            metrics = policy.train(batch, NO_KL)
            assert metrics["lr"] == uninterrupted["lr"]  # the scheduler's state came back
            assert metrics["loss"] == pytest.approx(uninterrupted["loss"], rel=1e-6)
            assert metrics["grad_norm"] == pytest.approx(uninterrupted["grad_norm"], rel=1e-5)
            assert_same_weights(policy.state_dict_for_generation(), after, atol=1e-6, rtol=1e-5)
        finally:
            policy.shutdown()
