"""``policy``: the model being trained and how (NeMo-RL's ``PolicyConfig`` keys where they exist).

NeMo-RL keys kept with their meaning: ``model_name``, ``tokenizer.name``, ``train_global_batch_size``,
``train_micro_batch_size``, ``logprob_batch_size``, ``max_total_sequence_length``,
``make_sequence_length_divisible_by``, ``precision``, ``max_grad_norm``, ``optimizer`` {``name``, ``kwargs``},
``scheduler`` (a list of {``name``, ``kwargs``} with a final {``milestones``}) and ``generation`` (the rollout
backend, see :mod:`nemo_tau2.generation.config`), ``dtensor_cfg`` (FSDP2 sharding, :class:`DTensorConfig`),
``megatron_cfg`` (megatron-core with TP/PP, :mod:`.megatron_config`), ``sequence_packing``
(:class:`SequencePackingConfig`) and ``logprob_chunk_size``. Our own keys, for what NeMo-RL
derives from ``cluster``: ``device`` and ``num_workers`` (trainer ranks).
"""

import importlib
import inspect
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from nemo_tau2.generation.config import GenerationConfig
from nemo_tau2.models.policy.megatron_config import MegatronConfig, check_megatron_architecture, check_megatron_policy


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _resolve_class(name: str, key: str, module_prefix: str, base_name: str) -> type:
    """The class a dotted path names (``torch.optim.AdamW``), checked to live under ``module_prefix``."""
    module_name, _, class_name = name.rpartition(".")
    if not name.startswith(module_prefix) or not class_name:
        raise ValueError(f"{key}: {name!r} must be a class path under {module_prefix} (e.g. {module_prefix}...)")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"{key}: cannot import {name!r} ({e})") from e
    base_module, _, base_class = base_name.rpartition(".")
    if not (isinstance(cls, type) and issubclass(cls, getattr(importlib.import_module(base_module), base_class))):
        raise ValueError(f"{key}: {name!r} is not a {base_name}")
    return cls


def _check_kwargs(cls: type, kwargs: dict[str, Any], key: str, positional: int) -> None:
    """Every kwarg must be a parameter of ``cls.__init__`` (after its first ``positional`` ones)."""
    params = list(inspect.signature(cls.__init__).parameters.values())[1 + positional :]
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return
    allowed = {p.name for p in params}
    unknown = sorted(set(kwargs) - allowed)
    if unknown:
        raise ValueError(f"{key}: {cls.__name__} takes no argument(s) {unknown}; it takes {sorted(allowed)}")


class TokenizerConfig(_Strict):
    name: str | None = Field(default=None, description="HF tokenizer id or directory; null uses policy.model_name.")


class OptimizerConfig(_Strict):
    """A ``torch.optim`` optimizer built as ``name(params, **kwargs)`` (NeMo-RL's ``policy.optimizer``)."""

    name: str = Field(default="torch.optim.AdamW", description="Class path under torch.optim.")
    kwargs: dict[str, Any] = Field(
        default_factory=lambda: {"lr": 5e-6, "weight_decay": 0.01, "betas": [0.9, 0.999], "eps": 1e-8},
        description="Keyword arguments of the optimizer (lr, weight_decay, betas, eps, ...).",
    )

    @model_validator(mode="after")
    def _check(self) -> "OptimizerConfig":
        _check_kwargs(self.optimizer_class(), self.kwargs, "policy.optimizer.kwargs", positional=1)
        return self

    def optimizer_class(self) -> type:
        return _resolve_class(self.name, "policy.optimizer.name", "torch.optim.", "torch.optim.Optimizer")


class SchedulerConfig(_Strict):
    """One ``torch.optim.lr_scheduler`` class built as ``name(optimizer, **kwargs)``, stepped once per update."""

    name: str = Field(description="Class path under torch.optim.lr_scheduler, e.g. torch.optim.lr_scheduler.LinearLR.")
    kwargs: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> "SchedulerConfig":
        _check_kwargs(self.scheduler_class(), self.kwargs, f"policy.scheduler ({self.name}) kwargs", positional=1)
        return self

    def scheduler_class(self) -> type:
        return _resolve_class(
            self.name, "policy.scheduler.name", "torch.optim.lr_scheduler.", "torch.optim.lr_scheduler.LRScheduler"
        )


class SchedulerMilestones(_Strict):
    milestones: list[int] = Field(description="Optimizer steps at which the next scheduler of the list takes over.")


class DTensorConfig(_Strict):
    """``policy.dtensor_cfg``: torch FSDP2 (``fully_shard`` over a 1-D device mesh of the trainer ranks).

    Disabled, every rank holds a full replica (fp32 weights, gradients and AdamW state: 16 bytes per parameter) and
    gradients are all-reduced. Enabled, parameters, gradients and optimizer state are sharded over the ranks (16/N
    bytes per parameter), each transformer block is gathered only while it computes, and the reference model is
    sharded the same way. Tensor, context and sequence parallelism are NeMo-RL keys we do not implement: any value
    other than the default is refused (see docs/trainer.md).
    """

    enabled: bool = Field(default=False, description="Shard with FSDP2 (per transformer block, then the root).")
    cpu_offload: bool = Field(
        default=False,
        description="Keep the sharded parameters, gradients and optimizer state (and the reference model) in host "
        "memory and move them to the GPU only while they compute (FSDP2 CPUOffloadPolicy; needs device cuda).",
    )
    activation_checkpointing: Literal["auto", "none", "selective", "full"] = Field(
        default="auto",
        description="What each transformer block keeps for its backward pass (sharded or not; models.policy.blocks). "
        "none: everything (fastest, most memory); selective: the outputs of its matrix multiplies and attention, the "
        "cheap elementwise rest (norms, rotary, activation) recomputed; full: only its input, the whole block "
        "recomputed (a third more compute); auto: the first of none, selective, full that the memory plan says fits "
        "the rank's memory. NeMo-RL's booleans keep their meaning: true is full, false is none.",
    )
    torch_compile: bool | None = Field(
        default=None,
        description="torch.compile each transformer block (inductor: fused elementwise kernels). null: on with "
        "policy.device cuda, off on cpu (a CPU compile costs minutes per model shape and CI would pay them).",
    )
    reshard_after_forward: bool | None = Field(
        default=None,
        description="FSDP2: free each block's gathered (compute-dtype) weights after its forward and gather them "
        "again for its backward. null: true with several ranks, false on one rank, where the gather is only a copy "
        "of the rank's own weights and keeping it costs a compute-dtype copy of the blocks (2 bytes per parameter "
        "in bf16) instead of a second copy per micro-batch.",
    )
    tensor_parallel_size: int = Field(default=1, ge=1, description="Only 1 (no tensor parallelism).")
    context_parallel_size: int = Field(default=1, ge=1, description="Only 1 (no context parallelism).")
    sequence_parallel: bool = Field(default=False, description="Only false (it needs tensor parallelism).")

    @field_validator("activation_checkpointing", mode="before")
    @classmethod
    def _nemo_rl_boolean(cls, value: Any) -> Any:
        return {True: "full", False: "none"}.get(value, value) if isinstance(value, bool) else value

    def compiles(self, device: str) -> bool:
        """Whether the blocks are compiled on ``device`` (``torch_compile`` or its default)."""
        return self.torch_compile if self.torch_compile is not None else device == "cuda"

    def reshards(self, world_size: int) -> bool:
        """Whether FSDP2 frees the gathered block weights after each forward (``reshard_after_forward`` or its
        default)."""
        return self.reshard_after_forward if self.reshard_after_forward is not None else world_size > 1

    @model_validator(mode="after")
    def _check(self) -> "DTensorConfig":
        refused = {
            "tensor_parallel_size": (self.tensor_parallel_size, 1),
            "context_parallel_size": (self.context_parallel_size, 1),
            "sequence_parallel": (self.sequence_parallel, False),
        }
        for key, (value, supported) in refused.items():
            if value != supported:
                raise ValueError(
                    f"policy.dtensor_cfg.{key}={value} is not supported: the trainer shards with FSDP2 only "
                    f"(data-parallel sharding over policy.num_workers); set it to {supported} and use more ranks, "
                    "dtensor_cfg.cpu_offload or sequence packing for memory (see docs/trainer.md)"
                )
        return self


class SequencePackingConfig(_Strict):
    """``policy.sequence_packing``: pack whole sequences into micro-batches of a token budget, without padding.

    A packed micro-batch is one row of concatenated sequences whose position ids restart at 0 for each sequence;
    transformers builds the per-sequence (block-causal) attention from them (flash-attention: variable-length
    kernels); the Megatron backend passes the block-causal mask itself (``megatron.training``). Loss and gradient
    are those of the padded path. ``train_micro_batch_size`` and
    ``logprob_batch_size`` are then unused: the budgets below decide how many sequences a micro-batch holds.
    """

    enabled: bool = False
    train_mb_tokens: int | None = Field(
        default=None,
        ge=2,
        description="Token budget of a training micro-batch; null: max_total_sequence_length x "
        "train_micro_batch_size. Must hold the longest sequence (max_total_sequence_length).",
    )
    logprob_mb_tokens: int | None = Field(
        default=None, ge=2, description="Token budget of a no-grad logprob micro-batch; null: train_mb_tokens."
    )
    attention: Literal["varlen", "per_sequence"] = Field(
        default="varlen",
        description="Where a packed row's sequences start (models.policy.packed_attention). varlen: planned once per "
        "micro-batch and given to every layer (one variable-length flash-attention call on CUDA in bf16, exact "
        "per-sequence SDPA elsewhere); per_sequence: every layer finds them from the position ids (a device sync "
        "per layer on a GPU), the path before the plan, kept to measure against.",
    )
    algorithm: Literal["first_fit_decreasing"] = Field(
        default="first_fit_decreasing",
        description="Bin packing: sequences longest first, each into the first micro-batch with room.",
    )


class PolicyConfig(_Strict):
    """The ``policy`` block: model, batch sizes, precision, optimizer and data parallelism of the trainer."""

    model_name: str = Field(description="HF model id (from the local cache) or a save_pretrained directory.")
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig)
    train_global_batch_size: int = Field(
        ge=1, description="Sequences per optimizer step; a train() batch larger than this makes several steps."
    )
    train_micro_batch_size: int = Field(ge=1, description="Sequences per forward/backward on one worker.")
    logprob_batch_size: int | None = Field(
        default=None, ge=1, description="Sequences per no-grad forward in get_logprobs; null: train_micro_batch_size."
    )
    max_total_sequence_length: int = Field(ge=2, description="Longest sequence (all turns) the trainer accepts.")
    make_sequence_length_divisible_by: int = Field(
        default=1, ge=1, description="Pad each micro-batch's length to a multiple of this (GPU kernel efficiency)."
    )
    precision: Literal["float32", "bfloat16"] = Field(
        default="float32",
        description="The compute dtype (NeMo-RL's mixed precision). float32: everything in fp32 (what the CPU "
        "tests use: comparisons to float tolerance). bfloat16: fp32 master weights, gradients, optimizer state and "
        "gradient reduction, bf16 forward/backward (FSDP2: parameters gathered in bf16; unsharded: bf16 autocast; "
        "Megatron: bf16 weights in Float16Module, the fp32 masters in its optimizer); logprobs and the loss in fp32.",
    )
    logprob_chunk_size: int | None = Field(
        default=None,
        ge=1,
        description="Compute the fp32 log-softmax over this many positions at a time (recomputed in the backward "
        "pass) instead of materialising fp32 logits for the whole micro-batch; null: all at once.",
    )
    max_grad_norm: float | None = Field(default=1.0, gt=0, description="Clip the global gradient norm; null: no clip.")
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    scheduler: list[SchedulerConfig | SchedulerMilestones] | None = Field(
        default=None,
        description="LR schedulers; several are chained by a final {milestones: [...]} entry (torch SequentialLR).",
    )
    device: Literal["cpu", "cuda"] = Field(default="cpu", description="cuda: one GPU per worker.")
    num_workers: int = Field(
        default=1,
        ge=1,
        description="Trainer ranks. 1 trains in this process; more run as Ray actors in one torch.distributed group "
        "(gloo on cpu, NCCL on cuda), replicas or FSDP2 shards (dtensor_cfg.enabled).",
    )
    dtensor_cfg: DTensorConfig = Field(default_factory=DTensorConfig)
    megatron_cfg: MegatronConfig = Field(default_factory=MegatronConfig)
    sequence_packing: SequencePackingConfig = Field(default_factory=SequencePackingConfig)
    generation: GenerationConfig | None = Field(
        default=None, description="policy.generation: the rollout backend (not used by the trainer itself)."
    )

    @model_validator(mode="before")
    @classmethod
    def _moved_keys(cls, data: Any) -> Any:
        if isinstance(data, dict) and "activation_checkpointing" in data:
            raise ValueError(
                "policy.activation_checkpointing moved to policy.dtensor_cfg.activation_checkpointing (NeMo-RL's key)"
            )
        return data

    @model_validator(mode="after")
    def _check(self) -> "PolicyConfig":
        if self.dtensor_cfg.cpu_offload and not (self.dtensor_cfg.enabled and self.device == "cuda"):
            raise ValueError(
                "policy.dtensor_cfg.cpu_offload needs policy.dtensor_cfg.enabled=true and policy.device=cuda "
                "(it offloads FSDP2 shards from the GPU to host memory)"
            )
        packing = self.sequence_packing
        if packing.enabled and self.train_mb_tokens < self.max_total_sequence_length:
            raise ValueError(
                f"policy.sequence_packing.train_mb_tokens ({self.train_mb_tokens}) must hold the longest sequence: "
                f"at least policy.max_total_sequence_length ({self.max_total_sequence_length})"
            )
        if packing.enabled and self.logprob_mb_tokens < self.max_total_sequence_length:
            raise ValueError(
                f"policy.sequence_packing.logprob_mb_tokens ({self.logprob_mb_tokens}) must be at least "
                f"policy.max_total_sequence_length ({self.max_total_sequence_length})"
            )
        if self.train_micro_batch_size > self.train_global_batch_size:
            raise ValueError(
                f"policy.train_micro_batch_size ({self.train_micro_batch_size}) must not exceed "
                f"policy.train_global_batch_size ({self.train_global_batch_size})"
            )
        self.scheduler_parts()  # raises on a malformed list
        check_megatron_policy(
            self.megatron_cfg,
            dtensor_enabled=self.dtensor_cfg.enabled,
            device=self.device,
            num_workers=self.num_workers,
            scheduler=self.scheduler,
        )
        if self.megatron_cfg.enabled:
            from nemo_tau2.models.model_shape import find_model_config

            try:
                hf_config, _ = find_model_config(self.model_name)
            except ValueError:
                hf_config = None  # not built yet (tiny_policy): the Megatron worker checks it when it loads it
            if hf_config is not None:
                check_megatron_architecture(self.megatron_cfg, hf_config)
        return self

    @property
    def tokenizer_name(self) -> str:
        return self.tokenizer.name or self.model_name

    @property
    def logprob_micro_batch_size(self) -> int:
        return self.logprob_batch_size or self.train_micro_batch_size

    @property
    def train_mb_tokens(self) -> int:
        """Token budget of a packed training micro-batch (``sequence_packing.train_mb_tokens`` or its default)."""
        explicit = self.sequence_packing.train_mb_tokens
        return explicit if explicit is not None else self.max_total_sequence_length * self.train_micro_batch_size

    @property
    def logprob_mb_tokens(self) -> int:
        explicit = self.sequence_packing.logprob_mb_tokens
        return explicit if explicit is not None else self.train_mb_tokens

    @property
    def activation_checkpointing(self) -> str:
        """``auto``, ``none``, ``selective`` or ``full`` (``dtensor_cfg.activation_checkpointing``)."""
        return self.dtensor_cfg.activation_checkpointing

    @property
    def compute_dtype(self) -> Any:
        """``torch.bfloat16`` or ``torch.float32`` (torch imported here: the config loads without it)."""
        import torch

        return torch.bfloat16 if self.precision == "bfloat16" else torch.float32

    def scheduler_parts(self) -> tuple[list[SchedulerConfig], list[int]]:
        """The schedulers in order and the milestones between them (empty for zero or one scheduler)."""
        items = self.scheduler or []
        schedulers = [item for item in items if isinstance(item, SchedulerConfig)]
        milestone_items = [item for item in items if isinstance(item, SchedulerMilestones)]
        if len(milestone_items) > 1 or (milestone_items and items[-1] is not milestone_items[0]):
            raise ValueError("policy.scheduler: give at most one {milestones: [...]} entry, last in the list")
        milestones = milestone_items[0].milestones if milestone_items else []
        if len(schedulers) > 1 and len(milestones) != len(schedulers) - 1:
            raise ValueError(
                f"policy.scheduler: {len(schedulers)} schedulers need {len(schedulers) - 1} milestones, "
                f"got {milestones}"
            )
        if len(schedulers) <= 1 and milestones:
            raise ValueError(f"policy.scheduler: milestones {milestones} need at least two schedulers")
        if milestones != sorted(milestones) or any(m <= 0 for m in milestones):
            raise ValueError(f"policy.scheduler: milestones must be positive and increasing, got {milestones}")
        return schedulers, milestones


class CheckpointingConfig(BaseModel):
    """``checkpointing`` (NeMo-RL keys); only the most recent ``keep_top_k`` are kept (no metric ranking)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    checkpoint_dir: str = Field(default="results/grpo", description="Holds one step_<N> directory per checkpoint.")
    save_period: int = Field(default=10, ge=1, description="Save every this many steps.")
    keep_top_k: int | None = Field(default=3, ge=1, description="Keep the last K checkpoints; null keeps all.")
