"""Data parallelism on Ray: 2 CPU workers (gloo) give the update of 1 process, stay identical, and resume exactly.

Ray is started once for the module (its startup dominates the cost of these tests).
"""

import copy

import pytest
import ray
import torch

from nemo_tau2.models.policy import step_dir
from nemo_tau2.models.policy.lm_policy import Policy
from tests.sigterm import wait_for

from .conftest import NO_KL, make_sequences, policy_config, with_prev_logprobs

SGD = {"name": "torch.optim.SGD", "kwargs": {"lr": 1.0}}  # the update is the (clipped) gradient itself


@pytest.fixture(scope="module")
def ray_policy(tiny):
    assert not ray.is_initialized()
    policy = Policy(
        policy_config(num_workers=2, train_micro_batch_size=1, optimizer=SGD),
        model=copy.deepcopy(tiny.model),
        tokenizer=tiny.tokenizer,
        init_reference_model=True,
    )
    yield policy
    policy.shutdown()
    assert not ray.is_initialized()  # the Policy started Ray, so it stopped it
    policy.shutdown()  # a second shutdown is harmless


def replica_weights(policy: Policy) -> list[dict[str, torch.Tensor]]:
    return policy._workers.run("local_state_dict", [()] * policy._workers.world_size)


def test_two_ray_workers_give_the_logprobs_and_update_of_one_process(tiny, ray_policy):
    local = Policy(policy_config(train_micro_batch_size=1, optimizer=SGD), model=copy.deepcopy(tiny.model),
                   tokenizer=tiny.tokenizer)  # fmt: skip
    sequences = make_sequences(5)  # shards of 3 and 2 sequences
    local_logprobs = local.get_logprobs(sequences)
    assert ray_policy.get_logprobs(sequences) == local_logprobs
    with_prev_logprobs(local, sequences)
    for seq in sequences:  # off-policy ratios, so that clipping matters
        seq.prev_logprobs = [lp - 0.2 * m for lp, m in zip(seq.prev_logprobs, seq.token_mask, strict=True)]
    expected, got = local.train(sequences, NO_KL), ray_policy.train(sequences, NO_KL)
    for key in ("loss", "clip_fraction", "entropy", "grad_norm", "global_valid_toks", "num_valid_samples"):
        assert got[key] == pytest.approx(expected[key], rel=1e-5), key
    assert expected["grad_norm"] > 1.0  # max_grad_norm 1.0 clipped the update
    first, second = replica_weights(ray_policy)
    reference = local.state_dict_for_generation()
    for name, tensor in reference.items():
        assert torch.equal(first[name], second[name]), f"replicas differ at {name}"
        torch.testing.assert_close(first[name], tensor, atol=1e-7, rtol=1e-6)
    assert not torch.equal(first["model.norm.weight"], tiny.model.state_dict()["model.norm.weight"])
    assert ray_policy.get_reference_policy_logprobs(sequences) == local_logprobs  # the initial weights


def test_ray_workers_resume_from_a_checkpoint_exactly(ray_policy, tmp_path):
    sequences = with_prev_logprobs(ray_policy, make_sequences(4, seed=3))
    saved = ray_policy.save_checkpoint(step_dir(tmp_path, 7), {"step": 7})
    assert len(torch.load(saved / "rng_state.pt", weights_only=False)["workers"]) == 2
    loss = ray_policy.train(sequences, NO_KL)["loss"]
    after = replica_weights(ray_policy)
    assert ray_policy.load_checkpoint(saved) == {"step": 7}
    assert ray_policy.train(sequences, NO_KL)["loss"] == loss
    for replica, expected in zip(replica_weights(ray_policy), after, strict=True):
        assert all(torch.equal(replica[name], expected[name]) for name in expected)


def test_a_shutdown_lets_each_worker_exit_as_a_process_does(ray_policy, tmp_path):
    """``ray.kill`` alone skips an actor's atexit handlers (coverage's save of the ranks' code among them): the workers
    that answered ``close`` exit through ``__ray_terminate__`` first. Ends the module's policy (its second shutdown in
    the fixture is harmless), so it comes after the tests that use it."""

    def note_at_exit(_worker, folder: str) -> int:
        import atexit
        import os

        atexit.register(lambda: open(os.path.join(folder, str(os.getpid())), "w").close())
        return os.getpid()

    pids = ray.get([actor.__ray_call__.remote(note_at_exit, str(tmp_path)) for actor in ray_policy._workers.actors])
    ray_policy.shutdown()
    wait_for(lambda: len(list(tmp_path.iterdir())) >= len(pids), 30, "a worker's atexit handler did not run")
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(map(str, pids))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bf16_training_on_a_gpu_stays_close_to_fp32_on_cpu(tiny):
    sequences = make_sequences(4)
    cpu = Policy(policy_config(optimizer=SGD), model=copy.deepcopy(tiny.model), tokenizer=tiny.tokenizer)
    gpu = Policy(
        policy_config(
            optimizer=SGD, device="cuda", precision="bfloat16", dtensor_cfg={"activation_checkpointing": True}
        ),
        model=copy.deepcopy(tiny.model),
        tokenizer=tiny.tokenizer,
    )
    cpu_logprobs, gpu_logprobs = cpu.get_logprobs(sequences), gpu.get_logprobs(sequences)
    assert (
        max(abs(a - b) for ra, rb in zip(cpu_logprobs, gpu_logprobs, strict=True) for a, b in zip(ra, rb, strict=True))
        < 0.15
    )
    with_prev_logprobs(cpu, sequences)
    expected, got = cpu.train(sequences, NO_KL), gpu.train(sequences, NO_KL)
    assert got["grad_norm"] == pytest.approx(expected["grad_norm"], rel=0.1)
    state = gpu.state_dict_for_generation()
    assert all(t.device.type == "cpu" and t.dtype == torch.float32 for t in state.values())


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs (one per NCCL worker)")
def test_two_gpu_workers_with_nccl_give_the_update_of_one_gpu(tiny):
    sequences = make_sequences(4)
    one = Policy(
        policy_config(optimizer=SGD, device="cuda"), model=copy.deepcopy(tiny.model), tokenizer=tiny.tokenizer
    )
    with_prev_logprobs(one, sequences)
    expected = one.train(sequences, NO_KL)
    with Policy(
        policy_config(optimizer=SGD, device="cuda", num_workers=2),
        model=copy.deepcopy(tiny.model),
        tokenizer=tiny.tokenizer,
    ) as two:
        assert two.train(sequences, NO_KL)["loss"] == pytest.approx(expected["loss"], rel=1e-5)
        first, second = replica_weights(two)
        for name, tensor in one.state_dict_for_generation().items():
            assert torch.equal(first[name], second[name])
            torch.testing.assert_close(first[name], tensor, atol=1e-6, rtol=1e-5)
