"""One rank of the Megatron backend: the model stage, Megatron DDP, its optimizer and LR schedule, logprobs and one
optimizer step per global batch through megatron-core's pipeline schedule.

The loss is the one :class:`~nemo_tau2.models.policy.interfaces.LossFunction` the torch backends are given, on the same
``[B, T]`` token frame (:func:`~nemo_tau2.models.policy.data.token_logprobs` is the only shift) with the global
batch's normalisers. So gradients must be **summed** over micro-batches and data-parallel ranks, never averaged:
``calculate_per_token_loss`` makes Megatron DDP sum, the loss function reports one "token" per micro-batch and the
schedule's ``finalize_model_grads_func`` is given no token count, so nothing rescales them. Two traps of the schedule
are handled here: without ``config.finalize_model_grads_func`` / ``no_sync_func`` data-parallel gradients are never
reduced, and Megatron DDP writes ``param.main_grad`` (its optimizer reads that, a plain torch one would not).

The model's vocabulary may be padded for tensor parallelism (``make_vocab_size_divisible_by``): every logprob, loss
and entropy reads the HF vocabulary's logits only (:func:`~nemo_tau2.models.megatron.model.hf_vocab_logits`).

**bf16** (``policy.precision``) is megatron-core's mixed precision: the stage, loaded in fp32, is wrapped in
``Float16Module`` (bf16 weights; fp32 logits out of the last stage), gradients are reduced in fp32 and the optimizer
(``bf16=True``) steps fp32 master copies, then copies them into the bf16 weights. :attr:`MegatronStack.gpt_model`
is the stage under both wrappers: conversion, exports, checkpoints and the reference model read its (bf16) weights.

Every micro-batch of a step is padded to the same ``[B, T]`` (pipeline stages exchange fixed-shape activations):
padding rows carry no loss (``sample_mask`` 0).

**Sequence packing** (``policy.sequence_packing``): the model runs on the batch's :class:`PackedRow` (``[1, N]``)
with its sequences' boundaries, found on the host once per micro-batch (where the position ids restart), as
megatron-core's ``packed_seq_params`` (:mod:`~nemo_tau2.models.megatron.packed_attention`: each sequence attends
causally within itself, no ``N x N`` mask or scores); logprobs and entropy go back to the ``[B, T]`` frame with
``PackedRow.unpack`` before the same loss call, as in the torch backend. Every packed row of a step is padded to one
``N`` (a trailing padding segment of its own), for the pipeline's fixed shapes.

**Logits** stay in the compute dtype (bf16: ``Float16Module(fp32_output=False)``; the upcast would copy ``N x V``
for nothing: the values are the same); the fp32 log-softmax and entropy run ``policy.logprob_chunk_size``
positions at a time, as the torch backend's do.
"""

import functools
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from nemo_tau2.models.megatron.model import hf_vocab_logits
from nemo_tau2.models.policy.config import PolicyConfig
from nemo_tau2.models.policy.data import TrainingBatch, next_token_entropy, token_logprobs
from nemo_tau2.models.policy.interfaces import LossFunction


@dataclass
class MegatronStack:
    """What one rank trains: its pipeline stage wrapped in Megatron DDP, the optimizer and the LR schedule."""

    hf_config: Any
    config: Any  # megatron-core TransformerConfig
    model: Any  # DistributedDataParallel(GPTModel stage)
    optimizer: Any
    scheduler: Any
    make_vocab_size_divisible_by: int  # with TP, what the embedding's rows were padded to (its checkpoints' shape)
    checkpoint_format: str  # how checkpoints hold the optimizer state (MegatronOptimizerConfig.checkpoint_format)
    attention_backend: str = "sdpa"  # packed_attention.attention_backend: what packed rows' sequences are given as
    logprob_chunk_size: int | None = None  # policy.logprob_chunk_size: positions per fp32 log-softmax

    @property
    def gpt_model(self) -> Any:
        """The ``GPTModel`` stage itself, under Megatron DDP and (bf16) ``Float16Module``: its parameters have the
        names the conversion, checkpoints and exports use, in the dtype the forward computes in."""
        inner = self.model.module
        return inner.module if self.config.bf16 else inner


def _finalize_without_token_scaling(model_chunks: list, num_tokens: Any = None, **kwargs: Any) -> None:
    from megatron.core.distributed import finalize_model_grads

    finalize_model_grads(model_chunks, None, **kwargs)  # the loss is already normalised globally: sum only


def build_stack(cfg: PolicyConfig, hf_folder: str) -> MegatronStack:
    """Build this rank's stage from an HF folder (weights converted on load), after ``initialize_megatron``."""
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
    from transformers import AutoConfig

    from nemo_tau2.models.megatron.hf_weights import load_hf_state, read_hf_state
    from nemo_tau2.models.megatron.model import build_gpt_model, transformer_config
    from nemo_tau2.models.megatron.packed_attention import attention_backend
    from nemo_tau2.models.policy.megatron_config import check_megatron_architecture

    mcfg = cfg.megatron_cfg
    hf_config = AutoConfig.from_pretrained(hf_folder, local_files_only=True)
    check_megatron_architecture(mcfg, hf_config)
    backend = attention_backend(cfg.device)
    config = transformer_config(
        hf_config,
        params_dtype=torch.float32,
        tensor_model_parallel_size=mcfg.tensor_model_parallel_size,
        pipeline_model_parallel_size=mcfg.pipeline_model_parallel_size,
        sequence_parallel=mcfg.sequence_parallel,
        activation_checkpointing=mcfg.activation_checkpointing,
        attention_backend=backend,
    )
    config.calculate_per_token_loss = True
    config.bf16 = cfg.precision == "bfloat16"
    model = build_gpt_model(
        hf_config,
        config,
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
        padded_vocab_size=mcfg.padded_vocab_size(hf_config.vocab_size),
        attention_backend=backend,
    )
    load_hf_state(model, read_hf_state(hf_folder), hf_config)
    if config.bf16:  # megatron-core's mixed precision: bf16 weights compute, the optimizer keeps fp32 masters
        from megatron.core.transformer.module import Float16Module

        config.pipeline_dtype = torch.bfloat16  # the activations pipeline stages exchange
        model = Float16Module(config, model)
    if cfg.device == "cuda":  # built on the CPU (use_cpu_initialization); DDP's buffers are on the device
        model.cuda(torch.cuda.current_device())
    ddp = mcfg.distributed_data_parallel_config
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=ddp.grad_reduce_in_fp32,
        overlap_grad_reduce=ddp.overlap_grad_reduce,
        overlap_param_gather=ddp.overlap_param_gather,
        use_distributed_optimizer=mcfg.optimizer.use_distributed_optimizer,
    )
    wrapped = DistributedDataParallel(config=config, ddp_config=ddp_config, module=model)
    config.no_sync_func = wrapped.no_sync
    config.finalize_model_grads_func = _finalize_without_token_scaling
    opt = mcfg.optimizer
    optimizer = get_megatron_optimizer(
        OptimizerConfig(
            optimizer=opt.optimizer,
            lr=opt.lr,
            min_lr=opt.min_lr,
            weight_decay=opt.weight_decay,
            adam_beta1=opt.adam_beta1,
            adam_beta2=opt.adam_beta2,
            adam_eps=opt.adam_eps,
            sgd_momentum=opt.sgd_momentum,
            clip_grad=cfg.max_grad_norm or 0.0,
            bf16=config.bf16,
            params_dtype=torch.float32,
            use_distributed_optimizer=opt.use_distributed_optimizer,
        ),
        [wrapped],
    )
    sched = mcfg.scheduler
    scheduler = OptimizerParamScheduler(
        optimizer,
        init_lr=sched.lr_warmup_init,
        max_lr=opt.lr,
        min_lr=opt.min_lr,
        lr_warmup_steps=sched.lr_warmup_iters,
        lr_decay_steps=sched.lr_decay_iters or sched.lr_warmup_iters + 1,
        lr_decay_style=sched.lr_decay_style,
        start_wd=opt.weight_decay,
        end_wd=opt.weight_decay,
        wd_incr_steps=1,
        wd_incr_style="constant",
    )
    return MegatronStack(
        hf_config=hf_config,
        config=config,
        model=wrapped,
        optimizer=optimizer,
        scheduler=scheduler,
        make_vocab_size_divisible_by=mcfg.make_vocab_size_divisible_by,
        checkpoint_format=mcfg.optimizer.checkpoint_format,
        attention_backend=backend,
        logprob_chunk_size=cfg.logprob_chunk_size,
    )


def _pad_rows(batch: TrainingBatch, rows: int, pad_token_id: int) -> TrainingBatch:
    """``batch`` with ``rows`` more rows that carry no loss (every mask 0), so micro-batches share one shape."""
    if rows == 0:
        return batch

    def extend(tensor: torch.Tensor | None, fill: float) -> torch.Tensor | None:
        if tensor is None:
            return None
        return torch.cat([tensor, torch.full((rows, *tensor.shape[1:]), fill, dtype=tensor.dtype)])

    fields = {name: extend(value, 0.0) for name, value in vars(batch).items() if isinstance(value, torch.Tensor)}
    fields["input_ids"] = extend(batch.input_ids, pad_token_id)
    return TrainingBatch(**{**vars(batch), **fields})


def _frame_logprobs(stack: MegatronStack, logits: torch.Tensor, batch: TrainingBatch) -> torch.Tensor:
    """Per-token logprobs in the batch's ``[B, T]`` frame, from padded rows' or the packed row's logits."""
    return batch.to_frame(token_logprobs(logits, batch.model_input_ids, stack.logprob_chunk_size))


def _prepared(stack: MegatronStack, batches: list[TrainingBatch], pad_token_id: int) -> list[tuple]:
    """``(batch, packed_seq_params or None)`` per micro-batch, all of one shape, on the stage's device: a packed
    row's sequence lengths are read here, on the host, once per micro-batch (never by a layer)."""
    from nemo_tau2.models.megatron.packed_attention import packed_seq_params, sequence_lengths

    shaped = same_shape(batches, pad_token_id)
    lengths = [sequence_lengths(b.packed.position_ids) if b.packed is not None else None for b in shaped]
    device = next(stack.model.parameters()).device
    on_device = shaped if device.type == "cpu" else [batch.to(device) for batch in shaped]
    return [(batch, None if n is None else packed_seq_params(n, device, stack.attention_backend))
            for batch, n in zip(on_device, lengths, strict=True)]  # fmt: skip


def _run_schedule(stack: MegatronStack, prepared: list[tuple], loss_of: Any, forward_only: bool) -> list:
    from megatron.core.pipeline_parallel import get_forward_backward_func

    first = prepared[0][0].packed if prepared[0][0].packed is not None else prepared[0][0]
    rows, width = first.input_ids.shape  # packed: one row of N tokens
    positions = torch.arange(width, device=first.input_ids.device).expand(rows, width)
    half = {"fp32_output": False} if stack.config.bf16 else {}  # bf16 logits: no fp32 copy of N x V

    def forward_step(data_iterator: Any, model: Any) -> tuple[torch.Tensor, Any]:
        batch, sequences = next(data_iterator)
        if sequences is None:
            return model(batch.input_ids, positions, None, **half), functools.partial(loss_of, batch)
        row = batch.packed
        logits = model(row.input_ids, row.position_ids, None, packed_seq_params=sequences, **half)
        return logits, functools.partial(loss_of, batch)

    return get_forward_backward_func()(
        forward_step_func=forward_step,
        data_iterator=iter(prepared),
        model=[stack.model],
        num_microbatches=len(prepared),
        seq_length=width,
        micro_batch_size=rows,
        forward_only=forward_only,
    )


def _same_packed_width(batches: list[TrainingBatch], pad_token_id: int) -> list[TrainingBatch]:
    """Every packed row right-padded to the longest ``N`` of the list: the padding is a sequence of its own
    (position ids from 0) that the ``[B, T]`` frame never reads. The ``[B, T]`` tensors stay as they are."""
    width = max(batch.packed.input_ids.shape[1] for batch in batches)
    return [TrainingBatch(**{**vars(batch), "packed": batch.packed.widened(width, pad_token_id)}) for batch in batches]


def same_shape(batches: list[TrainingBatch], pad_token_id: int) -> list[TrainingBatch]:
    """Right-pad every micro-batch to the widest ``T`` and the largest ``B`` of the list (packed: every row to
    the longest ``N``)."""
    if batches[0].packed is not None:
        return _same_packed_width(batches, pad_token_id)
    width = max(batch.input_ids.shape[1] for batch in batches)
    rows = max(batch.input_ids.shape[0] for batch in batches)
    out = []
    for batch in batches:
        extra = width - batch.input_ids.shape[1]
        if extra:
            pads = {"input_ids": pad_token_id, "attention_mask": 0}
            widened = {
                name: torch.nn.functional.pad(value, (0, extra), value=pads.get(name, 0.0))
                for name, value in vars(batch).items()
                if isinstance(value, torch.Tensor) and value.dim() == 2
            }
            batch = TrainingBatch(**{**vars(batch), **widened})
        out.append(_pad_rows(batch, rows - batch.input_ids.shape[0], pad_token_id))
    return out


def _from_last_stage(value: Any) -> Any:
    """The last pipeline stage's ``value`` on every stage of this pipeline."""
    from megatron.core import parallel_state

    if parallel_state.get_pipeline_model_parallel_world_size() == 1:
        return value
    values: list[Any] = [None] * parallel_state.get_pipeline_model_parallel_world_size()
    dist.all_gather_object(values, value, group=parallel_state.get_pipeline_model_parallel_group())
    return values[-1]


@torch.no_grad()
def get_logprobs(stack: MegatronStack, batches: list[TrainingBatch], pad_token_id: int) -> list[list[float]]:
    """Per-token logprobs (token frame) of every sequence of ``batches``, in order, on every rank."""
    stack.model.eval()
    prepared = _prepared(stack, batches, pad_token_id)

    def loss_of(batch: TrainingBatch, logits: torch.Tensor) -> tuple:
        logprobs = _frame_logprobs(stack, hf_vocab_logits(logits, stack.hf_config), batch)
        return logprobs.sum() * 0.0, torch.tensor(1), {"logprobs": logprobs}

    outputs = _from_last_stage(_run_schedule(stack, prepared, loss_of, forward_only=True))
    result = []
    for batch, out in zip(batches, outputs, strict=True):
        result += [row[:n].tolist() for row, n in zip(out["logprobs"], batch.lengths, strict=False)]
    return result


def train_global_batch(
    stack: MegatronStack,
    batches: list[TrainingBatch],
    loss_fn: LossFunction,
    global_valid_toks: float,
    global_valid_seqs: float,
    pad_token_id: int,
) -> dict[str, Any]:
    """This rank's micro-batches of one global batch: forward/backward (pipelined), gradients summed over DP, one
    optimizer step (clipped to ``policy.max_grad_norm``). ``loss`` is the whole global batch's loss on every rank;
    ``microbatches`` the loss function's metrics of each micro-batch (plus ``entropy``) on the last pipeline stage,
    an empty list on the others."""
    from megatron.core import parallel_state

    stack.model.train()
    stack.model.zero_grad_buffer()
    stack.optimizer.zero_grad()
    prepared = _prepared(stack, batches, pad_token_id)

    def loss_of(batch: TrainingBatch, logits: torch.Tensor) -> tuple:
        logits = hf_vocab_logits(logits, stack.hf_config)
        loss, metrics = loss_fn(
            curr_logprobs=_frame_logprobs(stack, logits, batch),
            **batch.loss_inputs(),
            global_valid_tokens=global_valid_toks,
            global_valid_seqs=global_valid_seqs,
        )
        entropy = next_token_entropy(logits.detach(), stack.logprob_chunk_size)
        metrics["entropy"] = batch.mean_over_loss_tokens(batch.to_frame(entropy))
        return loss, torch.tensor(1), {"loss": loss.detach(), "metrics": metrics}

    outputs = _run_schedule(stack, prepared, loss_of, forward_only=False)
    stepped, grad_norm, _ = stack.optimizer.step()
    lr = stack.optimizer.param_groups[0]["lr"]
    if stepped:
        stack.scheduler.step(increment=1)
    # every TP rank of the last stage holds the same loss; DP ranks hold parts; other stages add 0
    last_stage = parallel_state.is_pipeline_last_stage()
    local = sum(float(out["loss"]) for out in outputs) if last_stage else 0.0
    total = torch.tensor([local], dtype=torch.float64, device=next(stack.model.parameters()).device)  # NCCL: on it
    dist.all_reduce(total)
    loss = total.item() / parallel_state.get_tensor_model_parallel_world_size()
    stack.model.eval()
    parts = [out["metrics"] for out in outputs] if last_stage else []
    return {
        "loss": loss,
        "grad_norm": float(grad_norm or 0.0),
        "lr": lr,
        "stepped": bool(stepped),
        "microbatches": parts,
    }
