"""``policy.megatron_cfg``: NeMo-RL's keys parse; each misconfiguration is refused with one line naming the fix."""

import pytest
from pydantic import ValidationError

from nemo_tau2.models.policy import PolicyConfig

from .conftest import policy_config

QWEN3_0_6B = "Qwen/Qwen3-0.6B"  # shipped config: 16 heads, 8 KV heads, 28 layers, vocab 151936


def megatron(**megatron_cfg) -> dict:
    return {"megatron_cfg": {"enabled": True, **megatron_cfg}}


def test_nemo_rl_megatron_block_parses_with_its_keys():
    cfg = policy_config(
        model_name=QWEN3_0_6B,
        num_workers=8,
        device="cuda",
        precision="bfloat16",
        megatron_cfg={
            "enabled": True,
            "tensor_model_parallel_size": 2,
            "pipeline_model_parallel_size": 2,
            "context_parallel_size": 1,
            "sequence_parallel": True,
            "activation_checkpointing": True,
            "optimizer": {
                "optimizer": "adam",
                "lr": 5e-6,
                "min_lr": 5e-7,
                "weight_decay": 0.01,
                "adam_beta1": 0.9,
                "adam_beta2": 0.999,
                "adam_eps": 1e-8,
                "use_distributed_optimizer": True,
            },  # fmt: skip
            "scheduler": {
                "lr_decay_style": "cosine",
                "lr_decay_iters": 1000,
                "lr_warmup_iters": 13,
                "lr_warmup_init": 5e-7,
            },  # fmt: skip
            "distributed_data_parallel_config": {
                "grad_reduce_in_fp32": False,
                "overlap_grad_reduce": True,
                "overlap_param_gather": True,
            },  # fmt: skip
        },
    )
    assert cfg.megatron_cfg.model_parallel_size == 4
    assert cfg.megatron_cfg.scheduler.lr_decay_iters == 1000
    assert not PolicyConfig(**{"model_name": "tiny", "train_global_batch_size": 1, "train_micro_batch_size": 1,
                               "max_total_sequence_length": 8}).megatron_cfg.enabled  # fmt: skip


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({**megatron(), "dtensor_cfg": {"enabled": True}}, "both true: pick one training backend"),
        ({**megatron(tensor_model_parallel_size=2), "num_workers": 3}, r"num_workers \(3\) is not divisible by"),
        ({**megatron(pipeline_model_parallel_size=2, tensor_model_parallel_size=2), "num_workers": 6}, r"\(4\)"),
        (megatron(sequence_parallel=True), "sequence_parallel needs tensor_model_parallel_size > 1"),
        (
            {**megatron(sequence_parallel=True, tensor_model_parallel_size=2), "num_workers": 2},
            "needs policy.device=cuda",
        ),
        (megatron(context_parallel_size=2), "context_parallel_size=2 is not supported"),
        ({**megatron(), "scheduler": [{"name": "torch.optim.lr_scheduler.ConstantLR"}]}, "use megatron_cfg.scheduler"),
        (megatron(scheduler={"lr_decay_style": "cosine"}), "needs lr_decay_iters"),
        (megatron(optimizer={"optimizer": "adamw"}), "optimizer"),
        (megatron(distributed_data_parallel_config={"average_in_collective": True}), "average_in_collective"),
        # the shipped Qwen3-0.6B: 16 heads, 8 KV heads, 28 layers
        (
            {**megatron(tensor_model_parallel_size=16), "num_workers": 16, "model_name": QWEN3_0_6B},
            r"does not divide the model's num_key_value_heads \(8\)",
        ),  # fmt: skip
        (
            {**megatron(tensor_model_parallel_size=32), "num_workers": 32, "model_name": QWEN3_0_6B},
            r"does not divide the model's num_attention_heads \(16\)",
        ),  # fmt: skip
        (
            {**megatron(pipeline_model_parallel_size=3), "num_workers": 3, "model_name": QWEN3_0_6B},
            r"pipeline_model_parallel_size=3 does not divide the model's num_hidden_layers \(28\)",
        ),  # fmt: skip
    ],
)
def test_misconfigurations_are_refused_in_one_line(overrides, message):
    with pytest.raises(ValidationError, match=message) as raised:
        policy_config(**overrides)
    [error] = raised.value.errors()
    assert "\n" not in error["msg"]


def test_a_valid_megatron_split_of_a_shipped_model_is_accepted():
    cfg = policy_config(model_name=QWEN3_0_6B, num_workers=8, **megatron(tensor_model_parallel_size=8))
    assert cfg.megatron_cfg.tensor_model_parallel_size == 8


def test_sequence_packing_is_accepted_with_megatron():
    cfg = policy_config(**megatron(pipeline_model_parallel_size=2), num_workers=2, sequence_packing={"enabled": True})
    assert cfg.sequence_packing.enabled and cfg.megatron_cfg.enabled


@pytest.mark.parametrize(("tp", "divisible_by", "padded"), [(1, 128, 640), (2, 128, 768), (2, 1, 592), (4, 64, 768)])
def test_the_vocabulary_pads_to_a_multiple_of_make_vocab_size_divisible_by_times_tp(tp, divisible_by, padded):
    from nemo_tau2.models.policy.megatron_config import MegatronConfig

    cfg = MegatronConfig(tensor_model_parallel_size=tp, make_vocab_size_divisible_by=divisible_by)
    assert cfg.padded_vocab_size(591) == padded


def test_a_vocabulary_tp_does_not_divide_is_accepted_since_it_is_padded():
    from transformers import LlamaConfig

    from nemo_tau2.models.policy.megatron_config import MegatronConfig, check_megatron_architecture

    tiny = LlamaConfig(vocab_size=591, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    check_megatron_architecture(MegatronConfig(tensor_model_parallel_size=2), tiny)  # 591 is odd: padded to 768
