"""One trainer rank: a transformers causal LM (a full replica, or its FSDP2 shards), its optimizer, logprobs, and one
optimizer step per global batch.

Used directly in-process (``num_workers == 1``) or as a Ray actor (see ``workers``). With several ranks, or with
``dtensor_cfg.enabled``, the rank joins a torch.distributed group (``init_distributed``) before its model is set up:

- **replicas** (``dtensor_cfg.enabled: false``): every rank holds the whole model, takes rank 0's weights, and
  gradients are summed over ranks in flat fp32 buckets before clipping, so every replica takes the same step;
- **FSDP2** (``dtensor_cfg.enabled: true``): see ``sharding``; gradients are reduce-scattered (summed) by FSDP
  after each micro-batch's backward, and every rank runs the same number of micro-batches (``batching``).

Precision (``policy.precision``): weights, gradients and optimizer state are fp32 (the master copy). With
``bfloat16`` the forward and backward compute in bf16 (FSDP2 gathers the parameters in bf16; replicas run under
``torch.autocast``) and logits become fp32 only inside the log-softmax (chunked with ``logprob_chunk_size``).
"""

import contextlib
import logging
import math
import sys
from collections.abc import Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from nemo_tau2.models.policy import sharding
from nemo_tau2.models.policy.blocks import prepare_blocks
from nemo_tau2.models.policy.building import (
    build_optimizer,
    build_scheduler,
    load_pretrained,
    load_tokenizer,
    warn_on_dropout,
)
from nemo_tau2.models.policy.checkpoint import (
    HF_CONFIG_DIR,
    get_rng_state,
    load_model_and_optimizer,
    save_model_and_optimizer,
    set_rng_state,
)
from nemo_tau2.models.policy.config import PolicyConfig
from nemo_tau2.models.policy.data import TrainingBatch, TrainingSequence, collate, next_token_entropy, token_logprobs
from nemo_tau2.models.policy.interfaces import LossFunction
from nemo_tau2.models.policy.packed_attention import attention_plan, use_packed_attention, uses_varlen_kernel
from nemo_tau2.models.policy.weights import iter_full_state_dict, shapes, write_safetensors
from nemo_tau2.ports import free_port

logger = logging.getLogger(__name__)

REDUCE_BUCKET_NUMEL = 64 * 1024 * 1024
"""Replicas all-reduce gradients in flat fp32 buckets of at most this many elements (256 MB)."""

WEIGHT_BUCKET_BYTES = 256 * 2**20
"""Gathered weights travel from a Ray worker to the driver in groups of about this many bytes."""

COLLECTIVE_TIMEOUT = timedelta(minutes=30)


class PolicyWorker:
    """One trainer rank. Every method works on whole :class:`TrainingSequence` lists or micro-batch plans.

    Args:
        cfg: The policy config.
        model: A model object to train (fp32, moved to the device); None loads ``cfg.model_name`` (with FSDP2,
            on rank 0 only: the other ranks build the architecture empty and receive their shards).
        tokenizer: Its tokenizer (required with ``model``).
        model_config: With FSDP2 on ranks > 0: the architecture (``model.config``) instead of a model.
        init_reference_model: Keep a frozen copy of the initial weights for ``get_reference_logprobs``.
        rank / world_size: This rank's place in the group (``init_distributed`` joins it).
    """

    def __init__(
        self,
        cfg: PolicyConfig,
        *,
        model: PreTrainedModel | None = None,
        tokenizer: PreTrainedTokenizerBase | None = None,
        model_config: Any = None,
        init_reference_model: bool = False,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if model is not None and tokenizer is None:
            raise ValueError("PolicyWorker: give the tokenizer with the model")
        if cfg.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("policy.device: 'cuda' was asked for but torch sees no CUDA GPU")
        self.cfg = cfg
        self.rank = rank
        self.world_size = world_size
        self.sharded = cfg.dtensor_cfg.enabled
        self._in_group = False
        self._init_reference_model = init_reference_model
        on_gpu = cfg.device == "cuda"
        self.device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
        if model is None and model_config is not None:
            model = sharding.empty_model(model_config)
        elif model is None:
            model, loaded_tokenizer = load_pretrained(cfg)
            tokenizer = tokenizer or loaded_tokenizer
        tokenizer = tokenizer or load_tokenizer(cfg)
        self.tokenizer = tokenizer
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if self.pad_token_id is None:
            raise ValueError(f"the tokenizer of {cfg.tokenizer_name!r} has neither a pad nor an eos token")
        self.model: PreTrainedModel = model
        self.reference_model: PreTrainedModel | None = None
        if not self.sharded and world_size == 1:
            self._setup_model()

    # ---- set-up ----------------------------------------------------------------------------------------------

    def rendezvous_address(self) -> str:
        """``tcp://host:port`` of a free port on this node, for the other ranks to join (rank 0 only)."""
        # A Ray actor has Ray loaded and needs its node's address; an in-process rank never imports Ray for this
        # (the GPU kit's machine has no Ray).
        host = "127.0.0.1"
        if "ray" in sys.modules and sys.modules["ray"].is_initialized():
            import ray.util

            host = ray.util.get_node_ip_address()
        return f"tcp://{host}:{free_port(host)}"

    def init_distributed(self, init_method: str) -> None:
        """Join the trainer group (gloo on CPU, NCCL on GPU), then shard or replicate the model across it."""
        if dist.is_initialized():
            raise ValueError(
                "a torch.distributed process group already exists in this process: a sharded policy with "
                "num_workers 1 runs its own one-rank group in-process; destroy yours first or use num_workers >= 2"
            )
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # NCCL binds the communicator to the current device
        dist.init_process_group(
            backend, init_method=init_method, rank=self.rank, world_size=self.world_size, timeout=COLLECTIVE_TIMEOUT
        )
        self._in_group = True
        self._setup_model()

    def _setup_model(self) -> None:
        cfg = self.cfg
        if cfg.sequence_packing.enabled:
            use_packed_attention(self.model)
        if not self.sharded:
            self.model = self.model.to(device=self.device, dtype=torch.float32)
            if self._in_group:
                with torch.no_grad():
                    for tensor in [*self.model.parameters(), *self.model.buffers()]:
                        dist.broadcast(tensor.data, src=0)
            if self._init_reference_model:  # a copy of the plain blocks, before they are checkpointed and compiled
                self.reference_model = sharding.unsharded_reference_model(self.model)
        self.activation_checkpointing = prepare_blocks(self.model, cfg, reference=self._init_reference_model)
        self._varlen_kernel = uses_varlen_kernel(self.model, self.device, cfg.compute_dtype)
        if self.sharded:
            mesh = sharding.device_mesh(self.device, self.world_size)
            self.model = sharding.shard_policy_model(self.model, cfg, mesh, self.device, self.rank)
            if self._init_reference_model:
                self.reference_model = sharding.sharded_reference_model(self.model, cfg, mesh, self.device)
        warn_on_dropout(self.model)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = build_optimizer(cfg, self.params)
        self.scheduler = build_scheduler(cfg, self.optimizer)

    def close(self) -> None:
        """Leave the process group this worker joined (never one the caller's process set up)."""
        if self._in_group:
            dist.destroy_process_group()
            self._in_group = False

    # ---- forward passes --------------------------------------------------------------------------------------

    def _autocast(self) -> contextlib.AbstractContextManager:
        # FSDP2 already computes in the compute dtype (its MixedPrecisionPolicy); replicas autocast.
        enabled = self.cfg.precision == "bfloat16" and not self.sharded
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16, enabled=enabled)

    def _collate(self, micro: Sequence[TrainingSequence]) -> TrainingBatch:
        packed = self.cfg.sequence_packing.enabled
        batch = collate(micro, self.pad_token_id, self.cfg.make_sequence_length_divisible_by, packed=packed)
        return batch.to(self.device)

    def _logits(self, model: PreTrainedModel, batch: TrainingBatch) -> torch.Tensor:
        with self._autocast():
            if batch.packed is not None:
                inputs = {"input_ids": batch.packed.input_ids, "position_ids": batch.packed.position_ids}
                if self.cfg.sequence_packing.attention == "varlen":
                    inputs |= attention_plan(batch.packed.segment_lengths, self.device, self._varlen_kernel)
            else:
                inputs = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask}
            return model(**inputs, use_cache=False).logits

    def _token_logprobs(self, logits: torch.Tensor, batch: TrainingBatch) -> torch.Tensor:
        return batch.to_frame(token_logprobs(logits, batch.model_input_ids, self.cfg.logprob_chunk_size))

    def _dummy_pass(self, model: PreTrainedModel, backward: bool) -> None:
        """A zero-loss forward (and backward) that takes part in FSDP's collectives for a rank without data."""
        ids = torch.full((1, 2), self.pad_token_id, dtype=torch.long, device=self.device)
        with self._autocast():
            logits = model(input_ids=ids, use_cache=False).logits
        if backward:
            (logits.float().sum() * 0.0).backward()

    @torch.no_grad()
    def _logprobs_of(self, model: PreTrainedModel, micro_batches: Sequence[Sequence[TrainingSequence]]) -> list:
        model.eval()
        out: list[list[float]] = []
        for micro in micro_batches:
            if not micro:
                self._dummy_pass(model, backward=False)
                continue
            batch = self._collate(micro)
            logprobs = self._token_logprobs(self._logits(model, batch), batch).cpu()
            out += [row[:n].tolist() for row, n in zip(logprobs, batch.lengths, strict=True)]
        return out

    def get_logprobs(self, micro_batches: Sequence[Sequence[TrainingSequence]]) -> list[list[float]]:
        """Per-token logprobs of the current weights (token frame: entry 0 is 0.0), no gradient, in the order of
        the micro-batches' sequences (an empty micro-batch is a dummy pass)."""
        return self._logprobs_of(self.model, micro_batches)

    def get_reference_logprobs(self, micro_batches: Sequence[Sequence[TrainingSequence]]) -> list[list[float]]:
        """Like :meth:`get_logprobs` under the frozen initial weights."""
        if self.reference_model is None:
            raise ValueError("no reference model: build the Policy with init_reference_model=True")
        return self._logprobs_of(self.reference_model, micro_batches)

    # ---- training --------------------------------------------------------------------------------------------

    def _micro_batch_loss(
        self, micro: Sequence[TrainingSequence], loss_fn: LossFunction, valid_toks: float, valid_seqs: float
    ) -> dict[str, float]:
        batch = self._collate(micro)
        logits = self._logits(self.model, batch)
        loss, metrics = loss_fn(
            curr_logprobs=self._token_logprobs(logits, batch),
            **batch.loss_inputs(),
            global_valid_tokens=valid_toks,
            global_valid_seqs=valid_seqs,
        )
        entropy = batch.to_frame(next_token_entropy(logits.detach(), self.cfg.logprob_chunk_size))
        metrics["entropy"] = batch.mean_over_loss_tokens(entropy)
        del logits
        loss.backward()
        return metrics

    def _all_reduce_gradients(self) -> None:
        """Sum replicas' gradients (each holds its share of the global loss), in flat buckets."""
        buckets: list[list[torch.Tensor]] = [[]]
        size = 0
        for p in self.params:
            if size >= REDUCE_BUCKET_NUMEL:
                buckets.append([])
                size = 0
            buckets[-1].append(p.grad)
            size += p.grad.numel()
        for bucket in buckets:
            flat = torch.cat([g.reshape(-1) for g in bucket])
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            offset = 0
            for g in bucket:
                g.copy_(flat[offset : offset + g.numel()].view_as(g))
                offset += g.numel()

    def train_global_batch(
        self,
        micro_batches: Sequence[Sequence[TrainingSequence]],
        loss_fn: LossFunction,
        global_valid_toks: float,
        global_valid_seqs: float,
    ) -> dict[str, Any]:
        """Accumulate this rank's micro-batches of one global batch, reduce gradients over ranks, clip, step.

        Returns:
            ``{"microbatches": [loss metrics per micro-batch], "grad_norm", "lr", "stepped"}``; the step is
            skipped (``stepped`` False) when the gradient norm is not finite.
        """
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        parts = []
        for micro in micro_batches:
            if micro:
                parts.append(self._micro_batch_loss(micro, loss_fn, global_valid_toks, global_valid_seqs))
            elif self.sharded:
                self._dummy_pass(self.model, backward=True)
        for p in self.params:  # a rank without data, or a parameter the loss never reached: zero gradient
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if self._in_group and not self.sharded:
            self._all_reduce_gradients()
        max_norm = self.cfg.max_grad_norm if self.cfg.max_grad_norm is not None else math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm)
        if isinstance(grad_norm, DTensor):
            grad_norm = grad_norm.full_tensor()
        grad_norm = grad_norm.item()
        lr = float(self.optimizer.param_groups[0]["lr"])
        stepped = math.isfinite(grad_norm)
        if stepped:
            self.optimizer.step()
            self.scheduler.step()
        else:
            logger.warning("gradient norm is %s: skipping this optimizer step", grad_norm)
        self.optimizer.zero_grad(set_to_none=True)
        self.model.eval()
        return {"microbatches": parts, "grad_norm": grad_norm, "lr": lr, "stepped": stepped}

    # ---- weights ---------------------------------------------------------------------------------------------

    def local_state_dict(self) -> dict[str, torch.Tensor]:
        """This rank's own tensors on CPU (a whole replica, or its FSDP2 shards): for checks across ranks."""
        local = {}
        for name, tensor in self.model.state_dict().items():
            own = tensor.to_local() if isinstance(tensor, DTensor) else tensor
            local[name] = own.detach().to("cpu", copy=True)
        return local

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        return shapes(self.model)

    def iter_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The full weights, one tensor at a time (see ``weights``); every rank must consume it, rank 0 yields."""
        return iter_full_state_dict(self.model, rank=self.rank, compute_device=self.device)

    def stream_weights(self, bucket_bytes: int = WEIGHT_BUCKET_BYTES) -> Iterator[dict[str, torch.Tensor]]:
        """:meth:`iter_weights` in groups of about ``bucket_bytes`` (a Ray streaming method: one object per group)."""
        bucket: dict[str, torch.Tensor] = {}
        size = 0
        for name, tensor in self.iter_weights():
            bucket[name] = tensor
            size += tensor.numel() * tensor.element_size()
            if size >= bucket_bytes:
                yield bucket
                bucket, size = {}, 0
        if bucket:
            yield bucket

    def save_hf_model(self, directory: str) -> None:
        """Rank 0 writes the gathered weights as HF safetensors, the model config and the tokenizer (all ranks
        must call it: the gathers are collectives)."""
        weights = self.iter_weights()
        if self.rank != 0:
            for _ in weights:
                pass
            return
        write_safetensors(weights, directory)
        self.model.config.save_pretrained(directory)
        if getattr(self.model, "generation_config", None) is not None:
            self.model.generation_config.save_pretrained(directory)
        self.tokenizer.save_pretrained(directory)

    # ---- checkpoints -----------------------------------------------------------------------------------------

    def save_checkpoint(self, directory: str) -> dict[str, Any] | None:
        """Write this rank's shards of weights and optimizer state (DCP); rank 0 returns the scheduler state and
        writes the model config and tokenizer."""
        path = Path(directory)
        save_model_and_optimizer(path, self.model, self.optimizer, distributed=self._in_group)
        if self.rank != 0:
            return None
        self.model.config.save_pretrained(path / HF_CONFIG_DIR)
        self.tokenizer.save_pretrained(path / HF_CONFIG_DIR)
        return self.scheduler.state_dict()

    def load_checkpoint(self, directory: str, scheduler_state: dict[str, Any]) -> None:
        """Read this rank's shards of a checkpoint written by any number of ranks, sharded or not."""
        load_model_and_optimizer(Path(directory), self.model, self.optimizer, distributed=self._in_group)
        self.scheduler.load_state_dict(scheduler_state)

    def get_rng_state(self) -> dict[str, Any]:
        return get_rng_state()

    def set_rng_state(self, state: dict[str, Any]) -> None:
        set_rng_state(state)

    def seed(self, seed: int) -> None:
        """Seed this rank's python, numpy and torch RNGs (Ray workers: seed + rank)."""
        import random

        import numpy as np

        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
