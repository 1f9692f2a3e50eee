"""Shared fixtures of the policy tests: the tiny Llama, its config, and reproducible batches of episodes."""

import copy

import pytest
import torch

from nemo_tau2.algorithms.loss import ClippedPGLossConfig, ClippedPGLossFn
from nemo_tau2.generation.tiny_model import TinyModel, build_tiny_model
from nemo_tau2.models.policy import PolicyConfig, TrainingSequence
from nemo_tau2.models.policy.lm_policy import Policy
from tests.torch_threads import _one_torch_thread  # noqa: F401  (autouse)

NO_KL = ClippedPGLossFn(ClippedPGLossConfig(reference_policy_kl_penalty=0.0))


@pytest.fixture(scope="session")
def tiny() -> TinyModel:
    """The untrained tiny Llama; tests copy its model before training it."""
    return build_tiny_model(seed=0)


def policy_config(**overrides) -> PolicyConfig:
    fields = {
        "model_name": "tiny",
        "train_global_batch_size": 4,
        "train_micro_batch_size": 2,
        "max_total_sequence_length": 64,
        "optimizer": {"name": "torch.optim.AdamW", "kwargs": {"lr": 1e-3, "weight_decay": 0.01}},
    }
    return PolicyConfig(**(fields | overrides))


def make_policy(tiny: TinyModel, **overrides) -> Policy:
    """An in-process Policy over a fresh copy of the tiny model."""
    kwargs = {key: overrides.pop(key) for key in ("init_reference_model",) if key in overrides}
    return Policy(policy_config(**overrides), model=copy.deepcopy(tiny.model), tokenizer=tiny.tokenizer, **kwargs)


def make_sequences(count: int = 4, seed: int = 0, prompt_len: int = 6) -> list[TrainingSequence]:
    """Episodes of different lengths: a prompt, a generated turn, a tool-output turn, a generated turn."""
    generator = torch.Generator().manual_seed(seed)
    sequences = []
    for i in range(count):
        turns = [(0, prompt_len + i), (1, 5 + i), (0, 3), (1, 4 + (i % 3))]
        ids, mask = [], []
        for generated, length in turns:
            ids += torch.randint(5, 500, (length,), generator=generator).tolist()
            mask += [generated] * length
        gen_logprobs = [-(1 + torch.rand((), generator=generator).item()) * m for m in mask]
        sequences.append(TrainingSequence(ids, mask, gen_logprobs, advantage=1.0 if i % 2 else -0.5))
    return sequences


def with_prev_logprobs(policy: Policy, sequences: list[TrainingSequence]) -> list[TrainingSequence]:
    for seq, logprobs in zip(sequences, policy.get_logprobs(sequences), strict=True):
        seq.prev_logprobs = logprobs
    return sequences


def weights(policy: Policy) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in policy.state_dict_for_generation().items()}
