"""``policy``: the model being trained and how (NeMo-RL's ``PolicyConfig`` keys where they exist).

NeMo-RL keys kept with their meaning: ``model_name``, ``tokenizer.name``, ``train_global_batch_size``,
``train_micro_batch_size``, ``logprob_batch_size``, ``max_total_sequence_length``,
``make_sequence_length_divisible_by``, ``precision``, ``max_grad_norm``, ``optimizer`` {``name``, ``kwargs``},
``scheduler`` (a list of {``name``, ``kwargs``} with a final {``milestones``}) and ``generation`` (the rollout
backend, see :mod:`nemo_tau2.generation.config`). Our own keys, for what NeMo-RL spreads over ``dtensor_cfg`` and
``cluster``: ``activation_checkpointing`` (``dtensor_cfg.activation_checkpointing``), ``device`` and
``num_workers`` (data-parallel replicas; NeMo-RL derives it from ``cluster``).
"""

import importlib
import inspect
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from nemo_tau2.generation.config import GenerationConfig


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
        description="float32: everything in fp32. bfloat16: fp32 weights, gradients and optimizer state with the "
        "forward/backward under bf16 autocast (logprobs and the loss in fp32).",
    )
    activation_checkpointing: bool = Field(
        default=False, description="Recompute activations in the backward pass (NeMo-RL dtensor_cfg key)."
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
        description="Data-parallel replicas. 1 trains in this process; more run as Ray actors whose gradients are "
        "all-reduced (gloo on cpu, NCCL on cuda).",
    )
    generation: GenerationConfig | None = Field(
        default=None, description="policy.generation: the rollout backend (not used by the trainer itself)."
    )

    @model_validator(mode="after")
    def _check(self) -> "PolicyConfig":
        if self.train_micro_batch_size > self.train_global_batch_size:
            raise ValueError(
                f"policy.train_micro_batch_size ({self.train_micro_batch_size}) must not exceed "
                f"policy.train_global_batch_size ({self.train_global_batch_size})"
            )
        self.scheduler_parts()  # raises on a malformed list
        return self

    @property
    def tokenizer_name(self) -> str:
        return self.tokenizer.name or self.model_name

    @property
    def logprob_micro_batch_size(self) -> int:
        return self.logprob_batch_size or self.train_micro_batch_size

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
