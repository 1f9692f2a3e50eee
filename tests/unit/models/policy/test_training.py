"""In-process training: logprobs, gradient accumulation, masking, a real learning signal, clipping, precision."""

import copy
import math

import pytest
import torch

from nemo_tau2.algorithms.loss import ClippedPGLossConfig, ClippedPGLossFn
from nemo_tau2.models.policy import TrainingSequence
from nemo_tau2.models.policy.lm_policy import Policy

from .conftest import NO_KL, make_policy, make_sequences, policy_config, weights, with_prev_logprobs


def perturbed(sequences: list[TrainingSequence], scale: float = 0.3, seed: int = 1) -> list[TrainingSequence]:
    """Sequences whose prev_logprobs differ from the current policy on generated tokens (ratios != 1, clipping)."""
    generator = torch.Generator().manual_seed(seed)
    for seq in sequences:
        noise = (torch.rand(len(seq), generator=generator) - 0.5) * 2 * scale
        seq.prev_logprobs = [
            lp + n.item() * m for lp, n, m in zip(seq.prev_logprobs, noise, seq.token_mask, strict=True)
        ]
    return sequences


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], **tolerance) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], msg=lambda m, name=name: f"{name}: {m}", **tolerance)


def test_get_logprobs_equals_an_unpadded_forward_pass_in_the_token_frame(tiny):
    policy = make_policy(tiny, logprob_batch_size=3)  # 5 sequences of different lengths: padded micro-batches
    sequences = make_sequences(5)
    got = policy.get_logprobs(sequences)
    for seq, logprobs in zip(sequences, got, strict=True):
        with torch.no_grad():
            logits = tiny.model(torch.tensor([seq.token_ids])).logits[0]
        expected = torch.log_softmax(logits[:-1], -1).gather(1, torch.tensor(seq.token_ids[1:])[:, None])[:, 0]
        assert len(logprobs) == len(seq) and logprobs[0] == 0.0
        torch.testing.assert_close(torch.tensor(logprobs[1:]), expected, atol=1e-5, rtol=0)


SGD = {"name": "torch.optim.SGD", "kwargs": {"lr": 1.0}}
"""With plain SGD at lr 1 and no clipping the update is exactly minus the gradient (Adam would amplify the
float-rounding noise of near-zero gradients into lr-sized differences)."""


@pytest.mark.parametrize("token_level_loss", [True, False])
def test_micro_batches_accumulate_to_the_update_of_one_full_batch(tiny, token_level_loss):
    loss_cfg = ClippedPGLossFn(ClippedPGLossConfig(reference_policy_kl_penalty=0.0, token_level_loss=token_level_loss))
    one_at_a_time = make_policy(tiny, train_micro_batch_size=1, optimizer=SGD, max_grad_norm=None)
    all_at_once = make_policy(tiny, train_micro_batch_size=4, optimizer=SGD, max_grad_norm=None)
    sequences = perturbed(with_prev_logprobs(one_at_a_time, make_sequences(4)))
    metrics_1 = one_at_a_time.train(sequences, loss_cfg)
    metrics_4 = all_at_once.train(sequences, loss_cfg)
    assert metrics_1["clip_fraction"] > 0  # the perturbation makes the clipping matter
    for key in ("loss", "pg_loss", "clip_fraction", "probs_ratio_mean", "probs_ratio_max", "entropy", "grad_norm"):
        assert metrics_1[key] == pytest.approx(metrics_4[key], rel=1e-5, abs=1e-7), key
    assert metrics_1["num_valid_tokens"] == metrics_4["num_valid_tokens"] == metrics_1["global_valid_toks"]
    assert_same_weights(weights(one_at_a_time), weights(all_at_once), atol=1e-7, rtol=1e-6)
    assert not torch.equal(weights(all_at_once)["model.norm.weight"], tiny.model.state_dict()["model.norm.weight"])


def test_values_at_masked_out_positions_change_nothing(tiny):
    base = perturbed(with_prev_logprobs(make_policy(tiny), make_sequences(4)))
    base[3].loss_multiplier = 0.0
    scrambled = copy.deepcopy(base)
    for seq in scrambled:
        seq.advantage = [seq.advantage if m else 1e6 for m in seq.token_mask]
        seq.prev_logprobs = [lp if m else math.nan for lp, m in zip(seq.prev_logprobs, seq.token_mask, strict=True)]
        seq.generation_logprobs = [
            lp if m else -math.inf for lp, m in zip(seq.generation_logprobs, seq.token_mask, strict=True)
        ]
    scrambled[3].advantage = [-1e6] * len(scrambled[3])  # a removed episode: even its generated tokens
    scrambled[3].prev_logprobs = [math.nan] * len(scrambled[3])
    a, b = make_policy(tiny, train_micro_batch_size=4), make_policy(tiny, train_micro_batch_size=4)
    metrics_a, metrics_b = a.train(base, NO_KL), b.train(scrambled, NO_KL)
    assert metrics_a["loss"] == metrics_b["loss"] and metrics_a["num_valid_samples"] == 3
    assert_same_weights(weights(a), weights(b), atol=0, rtol=0)


def _sample(model, prompt: list[int], count: int, length: int, generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` completions of ``length`` tokens sampled from ``model`` and their logprobs (the raw distribution)."""
    ids, tokens, logprobs = torch.tensor([prompt] * count), [], []
    with torch.no_grad():
        for _ in range(length):
            step_logprobs = torch.log_softmax(model(ids).logits[:, -1], -1)
            sampled = torch.multinomial(step_logprobs.exp(), 1, generator=generator)
            tokens.append(sampled[:, 0])
            logprobs.append(step_logprobs.gather(1, sampled)[:, 0])
            ids = torch.cat([ids, sampled], 1)
    return torch.stack(tokens, 1), torch.stack(logprobs, 1)


def test_grpo_steps_raise_the_probability_of_rewarded_tokens(tiny):
    """Reward = fraction of even token ids among 3 sampled tokens; on-policy GRPO moves mass onto even ids."""
    group, length = 16, 3
    policy = make_policy(
        tiny, train_global_batch_size=group, train_micro_batch_size=8, optimizer={"kwargs": {"lr": 2e-2}}
    )
    sampler = copy.deepcopy(tiny.model)
    prompt = tiny.tokenizer("What is the weather in Paris?").input_ids
    generator = torch.Generator().manual_seed(0)

    def even_mass() -> float:
        with torch.no_grad():
            return torch.softmax(sampler(torch.tensor([prompt])).logits[0, -1], -1)[0::2].sum().item()

    before, rewards_per_step = even_mass(), []
    for _ in range(12):
        sampler.load_state_dict(policy.state_dict_for_generation())
        tokens, logprobs = _sample(sampler, prompt, group, length, generator)
        rewards = (tokens % 2 == 0).float().mean(1)
        advantages = (rewards - rewards.mean()) / (rewards.std() + 1e-6)
        sequences = [
            TrainingSequence(
                prompt + tokens[i].tolist(), [0] * len(prompt) + [1] * length,
                [0.0] * len(prompt) + logprobs[i].tolist(), advantage=advantages[i].item(),
            )
            for i in range(group)
        ]  # fmt: skip
        metrics = policy.train(with_prev_logprobs(policy, sequences), NO_KL)
        assert metrics["token_mult_prob_error"] == pytest.approx(1.0, abs=1e-4)  # generator == trainer
        rewards_per_step.append(rewards.mean().item())
    sampler.load_state_dict(policy.state_dict_for_generation())
    assert before < 0.55 and even_mass() > 0.9, (before, even_mass())
    assert sum(rewards_per_step[-3:]) / 3 > sum(rewards_per_step[:3]) / 3 + 0.25, rewards_per_step


def _unique(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    seen, unique = set(), {}
    for name, tensor in state.items():  # tied embeddings appear under two names
        if tensor.data_ptr() not in seen:
            seen.add(tensor.data_ptr())
            unique[name] = tensor
    return unique


@pytest.mark.parametrize("max_grad_norm", [None, 1e-3])
def test_the_update_is_the_gradient_clipped_to_max_grad_norm(tiny, max_grad_norm):
    policy = make_policy(tiny, optimizer=SGD, max_grad_norm=max_grad_norm)
    names = list(_unique(policy.state_dict_for_generation()))
    before = weights(policy)
    metrics = policy.train(perturbed(with_prev_logprobs(policy, make_sequences(4))), NO_KL)
    after = weights(policy)
    update_norm = torch.sqrt(sum(((after[n] - before[n]).double() ** 2).sum() for n in names)).item()
    expected = metrics["grad_norm"] if max_grad_norm is None else max_grad_norm
    assert metrics["grad_norm"] > 1e-3
    assert update_norm == pytest.approx(expected, rel=1e-4)


def test_activation_checkpointing_gives_the_same_update(tiny):
    plain, checkpointed = make_policy(tiny), make_policy(tiny, dtensor_cfg={"activation_checkpointing": True})
    sequences = perturbed(with_prev_logprobs(plain, make_sequences(4)))
    assert plain.train(sequences, NO_KL)["loss"] == pytest.approx(checkpointed.train(sequences, NO_KL)["loss"])
    assert_same_weights(weights(plain), weights(checkpointed), atol=1e-6, rtol=1e-5)


def test_bfloat16_precision_autocasts_the_forward_and_keeps_fp32_master_weights(tiny):
    fp32, bf16 = make_policy(tiny), make_policy(tiny, precision="bfloat16")
    sequences = make_sequences(4)
    exact, approx = fp32.get_logprobs(sequences), bf16.get_logprobs(sequences)
    differences = [
        abs(a - b) for row_a, row_b in zip(exact, approx, strict=True) for a, b in zip(row_a, row_b, strict=True)
    ]
    assert 0 < max(differences) < 0.15  # bf16 compute really happened, and stays close
    metrics = bf16.train(perturbed(with_prev_logprobs(bf16, sequences)), NO_KL)
    assert math.isfinite(metrics["loss"]) and metrics["num_optimizer_steps"] == 1
    assert {t.dtype for t in weights(bf16).values()} == {torch.float32}


def test_a_batch_larger_than_the_global_batch_makes_one_step_per_global_batch(tiny):
    split, stepwise = make_policy(tiny, train_global_batch_size=2), make_policy(tiny, train_global_batch_size=2)
    sequences = perturbed(with_prev_logprobs(split, make_sequences(4)))
    metrics = split.train(sequences, NO_KL)
    first, second = stepwise.train(sequences[:2], NO_KL), stepwise.train(sequences[2:], NO_KL)
    assert metrics["num_optimizer_steps"] == 2 and metrics["num_sequences"] == 4
    assert metrics["loss"] == pytest.approx((first["loss"] + second["loss"]) / 2)
    assert metrics["global_valid_toks"] == first["global_valid_toks"] + second["global_valid_toks"]
    assert_same_weights(weights(split), weights(stepwise), atol=0, rtol=0)


def test_lr_scheduler_steps_once_per_optimizer_step(tiny):
    warmup = [{"name": "torch.optim.lr_scheduler.LinearLR", "kwargs": {"start_factor": 0.5, "total_iters": 2}}]
    policy = make_policy(tiny, scheduler=warmup)
    sequences = with_prev_logprobs(policy, make_sequences(4))
    lrs = [policy.train(sequences, NO_KL)["lr"] for _ in range(3)]
    assert lrs == pytest.approx([5e-4, 7.5e-4, 1e-3])


def test_reference_model_keeps_the_initial_weights_for_the_kl_penalty(tiny):
    policy = make_policy(tiny, init_reference_model=True)
    loss_cfg = ClippedPGLossFn(ClippedPGLossConfig(reference_policy_kl_penalty=0.1))
    sequences = make_sequences(4)
    initial = policy.get_logprobs(sequences)
    kl_per_step = []
    for _ in range(2):
        with_prev_logprobs(policy, sequences)
        for seq, ref in zip(sequences, policy.get_reference_policy_logprobs(sequences), strict=True):
            seq.reference_logprobs = ref
        kl_per_step.append(policy.train(sequences, loss_cfg)["kl_penalty"])
    assert policy.get_reference_policy_logprobs(sequences) == initial
    assert policy.get_logprobs(sequences) != initial
    assert kl_per_step[0] == pytest.approx(0.0, abs=1e-9) and kl_per_step[1] > 0


def test_state_dict_for_generation_is_the_models_own_keys_on_cpu(tiny):
    state = make_policy(tiny).state_dict_for_generation()
    assert state.keys() == tiny.model.state_dict().keys()
    assert all(t.device.type == "cpu" and t.dtype == torch.float32 for t in state.values())


def test_bad_training_input_is_an_error_that_says_what_is_wrong(tiny):
    policy = make_policy(tiny, max_total_sequence_length=20)
    sequences = make_sequences(2)
    with pytest.raises(
        ValueError, match=r"sequences\[1\] has 2\d tokens, more than policy.max_total_sequence_length 20"
    ):
        policy.get_logprobs(sequences)
    short = make_sequences(2, prompt_len=1)
    with pytest.raises(ValueError, match=r"sequences\[0\].prev_logprobs is None"):
        policy.train(short, NO_KL)
    with_prev_logprobs(policy, short)
    with pytest.raises(
        ValueError,
        match=r"reference_logprobs is None but the loss has a KL penalty .*reference_policy_kl_penalty=0.01",
    ):
        policy.train(short, ClippedPGLossFn(ClippedPGLossConfig()))
    for seq in short:
        seq.loss_multiplier = 0.0
    with pytest.raises(ValueError, match="no policy-generated token with a nonzero loss_multiplier"):
        policy.train(short, NO_KL)
    with pytest.raises(ValueError, match="init_reference_model=True"):
        policy.get_reference_policy_logprobs(short)
    with pytest.raises(ValueError, match="empty"):
        policy.get_logprobs([])


def test_a_missing_model_is_reported_without_downloading(tmp_path):
    with pytest.raises(ValueError, match=r"policy.model_name: cannot load .*nothing is downloaded"):
        Policy(policy_config(model_name=str(tmp_path / "no-such-model")))


def test_active_dropout_is_warned_about(tiny, caplog):
    model = copy.deepcopy(tiny.model)
    model.config.attention_dropout = 0.1
    Policy(policy_config(), model=model, tokenizer=tiny.tokenizer)
    assert "active dropout (attention_dropout=0.1)" in caplog.text
