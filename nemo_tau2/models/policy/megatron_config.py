"""``policy.megatron_cfg``: the megatron-core backend (tensor and pipeline parallelism), NeMo-RL's key names.

Kept with NeMo-RL's meaning: ``enabled``, ``tensor_model_parallel_size``, ``pipeline_model_parallel_size``,
``context_parallel_size`` (only 1), ``sequence_parallel``, ``activation_checkpointing``,
``make_vocab_size_divisible_by``, ``optimizer`` {``optimizer``, ``lr``, ``min_lr``, ``weight_decay``, ``adam_beta1``,
``adam_beta2``, ``adam_eps``, ``sgd_momentum``, ``use_distributed_optimizer``}, ``scheduler`` {``lr_decay_style``,
``lr_decay_iters``, ``lr_warmup_iters``, ``lr_warmup_init``} and ``distributed_data_parallel_config``
{``grad_reduce_in_fp32``, ``overlap_grad_reduce``, ``overlap_param_gather``}. What NeMo-RL sets twice is read from
the policy once: ``clip_grad`` is ``policy.max_grad_norm``, ``bf16`` / ``params_dtype`` / ``pipeline_dtype`` follow
``policy.precision``. Data parallelism is what the ranks leave: ``policy.num_workers / (TP x PP)``.
"""

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MegatronOptimizerConfig(_Strict):
    """``megatron_cfg.optimizer``: megatron-core's optimizer (NeMo-RL's defaults), fp32 master weights."""

    optimizer: Literal["adam", "sgd"] = "adam"
    lr: float = Field(default=5e-6, gt=0)
    min_lr: float = Field(default=5e-7, ge=0, description="The floor of a decaying schedule.")
    weight_decay: float = Field(default=0.01, ge=0)
    adam_beta1: float = Field(default=0.9, ge=0, lt=1)
    adam_beta2: float = Field(default=0.999, ge=0, lt=1)
    adam_eps: float = Field(default=1e-8, gt=0)
    sgd_momentum: float = Field(default=0.9, ge=0)
    use_distributed_optimizer: bool = Field(
        default=True, description="Shard the optimizer state over the data-parallel ranks (ZeRO-1)."
    )
    dist_ckpt_optim_fully_reshardable: bool = Field(
        default=True,
        description="Save the distributed optimizer's state in model space (megatron-core's 'fully_reshardable': "
        "each TP/PP shard's state gathered over DP to its DP rank 0's host memory, 12 bytes per parameter of the "
        "shard), so a checkpoint resumes with any TP/PP/DP sizes and vocabulary padding. false: each rank writes its "
        "own buffer shard ('dp_reshardable': no gather), and the checkpoint resumes only in the layout that wrote it.",
    )

    @property
    def checkpoint_format(self) -> str:
        """How a checkpoint holds this optimizer's state: ``fully_reshardable`` / ``dp_reshardable`` (distributed,
        megatron-core's names), or ``model_space`` (a replicated optimizer's state is mapped onto the model's
        sharded tensors by megatron-core itself)."""
        if not self.use_distributed_optimizer:
            return "model_space"
        return "fully_reshardable" if self.dist_ckpt_optim_fully_reshardable else "dp_reshardable"


class MegatronSchedulerConfig(_Strict):
    """``megatron_cfg.scheduler``: the learning rate per optimizer step (linear warm-up, then the decay style)."""

    lr_decay_style: Literal["constant", "linear", "cosine"] = "constant"
    lr_decay_iters: int | None = Field(default=None, ge=1, description="Steps to decay over; null: constant.")
    lr_warmup_iters: int = Field(default=0, ge=0)
    lr_warmup_init: float = Field(default=0.0, ge=0)

    @model_validator(mode="after")
    def _check(self) -> "MegatronSchedulerConfig":
        if self.lr_decay_style != "constant" and self.lr_decay_iters is None:
            raise ValueError(
                f"policy.megatron_cfg.scheduler.lr_decay_style={self.lr_decay_style} needs lr_decay_iters "
                "(the steps to decay over)"
            )
        return self


class MegatronDDPConfig(_Strict):
    """``megatron_cfg.distributed_data_parallel_config``: how gradients travel over the data-parallel ranks.

    Gradients are always summed (each micro-batch's loss already uses its global batch's normalisers), never
    averaged, so NeMo-RL's ``average_in_collective`` has no meaning here and is not a key.
    """

    grad_reduce_in_fp32: bool = Field(
        default=True, description="Reduce gradients in fp32 (with bf16 compute; the trainer's precision contract)."
    )
    overlap_grad_reduce: bool = Field(default=False, description="Reduce bucket by bucket during the backward.")
    overlap_param_gather: bool = Field(
        default=False, description="Gather the distributed optimizer's updated parameters during the next forward."
    )


class MegatronConfig(_Strict):
    """``policy.megatron_cfg``: megatron-core's GPTModel with TP/PP/DP (see nemo_tau2/models/megatron)."""

    enabled: bool = Field(default=False, description="Train with megatron-core instead of torch/FSDP2.")
    tensor_model_parallel_size: int = Field(default=1, ge=1, description="Ranks each layer's matrices split over.")
    pipeline_model_parallel_size: int = Field(default=1, ge=1, description="Stages the layers split into (evenly).")
    context_parallel_size: int = Field(default=1, ge=1, description="Only 1 (no context parallelism).")
    sequence_parallel: bool = Field(
        default=False, description="Split activations along the sequence between TP ranks (needs TP > 1 and cuda)."
    )
    activation_checkpointing: bool = Field(
        default=False, description="Recompute each transformer layer's activations in the backward pass."
    )
    make_vocab_size_divisible_by: int = Field(
        default=128,
        ge=1,
        description="The embedding and output layer get zero rows up to a multiple of this x TP (as Megatron pads, "
        "so any vocabulary splits over the TP ranks); the HF export drops them and the logprobs never see them.",
    )
    optimizer: MegatronOptimizerConfig = Field(default_factory=MegatronOptimizerConfig)
    scheduler: MegatronSchedulerConfig = Field(default_factory=MegatronSchedulerConfig)
    distributed_data_parallel_config: MegatronDDPConfig = Field(default_factory=MegatronDDPConfig)

    @model_validator(mode="after")
    def _check(self) -> "MegatronConfig":
        if self.context_parallel_size != 1:
            raise ValueError(
                f"policy.megatron_cfg.context_parallel_size={self.context_parallel_size} is not supported; set it "
                "to 1 (tensor and pipeline parallelism are)"
            )
        if self.sequence_parallel and self.tensor_model_parallel_size == 1:
            raise ValueError(
                "policy.megatron_cfg.sequence_parallel needs tensor_model_parallel_size > 1 (it splits activations "
                "between the TP ranks); set it to false"
            )
        return self

    @property
    def model_parallel_size(self) -> int:
        return self.tensor_model_parallel_size * self.pipeline_model_parallel_size

    def padded_vocab_size(self, vocab_size: int) -> int:
        """``vocab_size`` rounded up to a multiple of ``make_vocab_size_divisible_by x TP`` (Megatron's rule)."""
        multiple = self.make_vocab_size_divisible_by * self.tensor_model_parallel_size
        return -(-vocab_size // multiple) * multiple


def check_megatron_policy(megatron: MegatronConfig, *, dtensor_enabled: bool, device: str, num_workers: int,
                          scheduler: Any) -> None:  # fmt: skip
    """The policy-level rules of an enabled ``megatron_cfg`` (called by ``PolicyConfig``'s validator)."""
    if not megatron.enabled:
        return
    if dtensor_enabled:
        raise ValueError(
            "policy.megatron_cfg.enabled and policy.dtensor_cfg.enabled are both true: pick one training backend"
        )
    if num_workers % megatron.model_parallel_size:
        raise ValueError(
            f"policy.num_workers ({num_workers}) is not divisible by tensor_model_parallel_size x "
            f"pipeline_model_parallel_size ({megatron.model_parallel_size}); data parallelism needs whole copies"
        )
    if megatron.sequence_parallel and device != "cuda":
        raise ValueError(
            "policy.megatron_cfg.sequence_parallel needs policy.device=cuda (its norms come from Transformer Engine, "
            "which has no CPU build); set it to false"
        )
    if scheduler is not None:
        raise ValueError(
            "policy.scheduler is the torch backends' schedule; with megatron_cfg use megatron_cfg.scheduler"
        )


def check_megatron_architecture(megatron: MegatronConfig, hf_config: Any) -> None:
    """TP must split the attention heads, the query groups and the MLP (the vocabulary is padded); PP the layers."""
    tp, pp = megatron.tensor_model_parallel_size, megatron.pipeline_model_parallel_size
    sizes = {
        "num_attention_heads": hf_config.num_attention_heads,
        "num_key_value_heads": hf_config.num_key_value_heads,
        "intermediate_size": hf_config.intermediate_size,
    }
    for key, value in sizes.items():
        if value % tp:
            raise ValueError(
                f"policy.megatron_cfg.tensor_model_parallel_size={tp} does not divide the model's {key} ({value}); "
                "pick a TP size that does"
            )
    if hf_config.num_hidden_layers % pp:
        raise ValueError(
            f"policy.megatron_cfg.pipeline_model_parallel_size={pp} does not divide the model's "
            f"num_hidden_layers ({hf_config.num_hidden_layers}); pick a PP size that does"
        )


LAYOUT_SIZES = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "data_parallel_size",
                "make_vocab_size_divisible_by")  # fmt: skip


def megatron_layout(megatron: MegatronConfig, num_workers: int) -> dict[str, Any] | None:
    """What a Megatron checkpoint records of the run that wrote it (``layout.json``) and a resume is checked against
    (:func:`layout_refusal`): the TP/PP/DP sizes, the vocabulary padding (the embedding's shape), whether the
    optimizer is distributed and the format of its state. None: the torch backend."""
    if not megatron.enabled:
        return None
    return {
        "tensor_model_parallel_size": megatron.tensor_model_parallel_size,
        "pipeline_model_parallel_size": megatron.pipeline_model_parallel_size,
        "data_parallel_size": num_workers // megatron.model_parallel_size,
        "make_vocab_size_divisible_by": megatron.make_vocab_size_divisible_by,
        "use_distributed_optimizer": megatron.optimizer.use_distributed_optimizer,
        "optimizer_format": megatron.optimizer.checkpoint_format,
    }


def _describe(layout: dict[str, Any], keys: tuple[str, ...]) -> str:
    return " ".join(f"{key}={layout.get(key)}" for key in keys)


def layout_refusal(written: dict[str, Any], mine: dict[str, Any]) -> str | None:
    """Why a Megatron checkpoint that recorded ``written`` cannot resume in the layout ``mine`` (one line naming the
    fix), or None when it can.

    The model's shards and a ``fully_reshardable`` or ``model_space`` optimizer state are addressed by each tensor's
    global shape and offsets, so megatron-core loads them into any TP/PP/DP sizes; the embedding and output rows
    are loaded with ``allow_shape_mismatch`` (padding rows zero), so another vocabulary padding loads too. A
    ``dp_reshardable`` state (or a checkpoint from before the format was recorded) is the ranks' own buffer
    shards: only the sizes that wrote it read them. Switching between a distributed and a replicated optimizer is
    not something megatron-core's loaders do."""
    written_format = written.get("optimizer_format", "dp_reshardable")
    if (
        "use_distributed_optimizer" in written
        and written["use_distributed_optimizer"] != mine["use_distributed_optimizer"]
    ):
        return (
            f"was written with policy.megatron_cfg.optimizer.use_distributed_optimizer="
            f"{str(written['use_distributed_optimizer']).lower()}, this run has "
            f"{str(mine['use_distributed_optimizer']).lower()}: resume with the setting that wrote it"
        )
    if written_format == "dp_reshardable" and any(written.get(key) != mine[key] for key in LAYOUT_SIZES):
        return (
            f"holds the optimizer state of Megatron ranks {_describe(written, LAYOUT_SIZES)} as their own shards "
            f"(dp_reshardable), this run has {_describe(mine, LAYOUT_SIZES)}: resume with the policy.megatron_cfg "
            "parallel sizes, make_vocab_size_divisible_by and policy.num_workers that wrote it (checkpoints saved "
            "with megatron_cfg.optimizer.dist_ckpt_optim_fully_reshardable=true load into any layout)"
        )
    return None
