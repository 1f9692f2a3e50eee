"""One training replica: a transformers causal LM, its optimizer, logprobs, and one optimizer step per global batch.

Used directly in-process (``num_workers == 1``) or as a Ray actor (data parallelism, see ``ray_group``); in the
second case ``init_distributed`` joins a torch.distributed group and gradients are summed across replicas before
clipping, so every replica takes the same step.

Precision: weights, gradients and optimizer state are always fp32 (the master copy). With ``precision:
bfloat16`` the forward and backward run under ``torch.autocast(bfloat16)`` (as NeMo-RL's FSDP2 mixed precision:
bf16 compute, fp32 parameters and reduction), and logits are cast to fp32 before the log-softmax.
"""

import contextlib
import copy
import logging
import math
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from nemo_tau2.algorithms.loss import ClippedPGLossConfig, clipped_pg_loss, entropy_from_logits
from nemo_tau2.models.policy.checkpoint import HF_MODEL_DIR, OPTIMIZER_FILE, get_rng_state, set_rng_state
from nemo_tau2.models.policy.config import PolicyConfig
from nemo_tau2.models.policy.data import TrainingBatch, TrainingSequence, chunks, collate, token_logprobs

logger = logging.getLogger(__name__)

REDUCE_BUCKET_NUMEL = 64 * 1024 * 1024
"""Gradients are all-reduced in flat fp32 buckets of at most this many elements (256 MB)."""


def load_pretrained(cfg: PolicyConfig) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """``policy.model_name`` (fp32) and its tokenizer from a directory or the local HF cache (never the network)."""

    def load(key: str, name: str, loader: Any, **kwargs: Any) -> Any:
        try:
            return loader.from_pretrained(name, local_files_only=True, **kwargs)
        except (OSError, ValueError) as e:
            first_line = (str(e).splitlines() or [type(e).__name__])[0][:300]
            raise ValueError(
                f"{key}: cannot load {name!r} from a local directory or the local Hugging Face cache "
                f"(nothing is downloaded at run time): {first_line}"
            ) from e

    model = load("policy.model_name", cfg.model_name, AutoModelForCausalLM, dtype=torch.float32)
    tokenizer = load("policy.tokenizer.name", cfg.tokenizer_name, AutoTokenizer)
    return model, tokenizer


def _build_optimizer(cfg: PolicyConfig, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    return cfg.optimizer.optimizer_class()(params, **cfg.optimizer.kwargs)


def _build_scheduler(cfg: PolicyConfig, optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
    schedulers, milestones = cfg.scheduler_parts()
    built = [item.scheduler_class()(optimizer, **item.kwargs) for item in schedulers]
    if not built:
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)  # constant lr, still checkpointable
    if len(built) == 1:
        return built[0]
    return torch.optim.lr_scheduler.SequentialLR(optimizer, built, milestones=milestones)


def _warn_on_dropout(model: PreTrainedModel) -> None:
    # Modules (nn.Dropout) and functional dropout configured on the model config (e.g. Llama's attention_dropout).
    active = {f"module p={m.p}" for m in model.modules() if isinstance(m, torch.nn.Dropout) and m.p > 0}
    for key, value in model.config.to_dict().items():
        if key.endswith(("dropout", "pdrop")) and isinstance(value, float) and value > 0:
            active.add(f"{key}={value}")
    if active:
        logger.warning(
            "the model has active dropout (%s): training forward passes differ from get_logprobs, so on-policy "
            "ratios are not 1; RL recipes usually set the model's dropout to 0",
            ", ".join(sorted(active)),
        )


class PolicyWorker:
    """A model replica with its optimizer. Every method works on whole :class:`TrainingSequence` lists.

    Args:
        cfg: The policy config.
        model: A model object to train (moved to the device in fp32); None loads ``cfg.model_name``.
        tokenizer: Its tokenizer (required with ``model``).
        init_reference_model: Keep a frozen copy of the initial weights for ``get_reference_logprobs``.
        rank / world_size: This replica's place in the data-parallel group (``init_distributed`` joins it).
    """

    def __init__(
        self,
        cfg: PolicyConfig,
        *,
        model: PreTrainedModel | None = None,
        tokenizer: PreTrainedTokenizerBase | None = None,
        init_reference_model: bool = False,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if (model is None) != (tokenizer is None):
            raise ValueError("PolicyWorker: give both model and tokenizer, or neither")
        if model is None:
            model, tokenizer = load_pretrained(cfg)
        assert tokenizer is not None
        if cfg.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("policy.device: 'cuda' was asked for but torch sees no CUDA GPU")
        self.cfg = cfg
        self.rank = rank
        self.world_size = world_size
        self._in_group = False
        on_gpu = cfg.device == "cuda"
        self.device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
        self.model = model.to(device=self.device, dtype=torch.float32)
        self.tokenizer = tokenizer
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if self.pad_token_id is None:
            raise ValueError(f"the tokenizer of {cfg.tokenizer_name!r} has neither a pad nor an eos token")
        if cfg.activation_checkpointing:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        _warn_on_dropout(self.model)
        self.reference_model: PreTrainedModel | None = None
        if init_reference_model:
            self.reference_model = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = _build_optimizer(cfg, self.params)
        self.scheduler = _build_scheduler(cfg, self.optimizer)

    # ---- data parallelism ------------------------------------------------------------------------------------

    def rendezvous_address(self) -> str:
        """``tcp://host:port`` of a free port on this node, for the other replicas to join (rank 0 only)."""
        import ray.util

        host = ray.util.get_node_ip_address()
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        return f"tcp://{host}:{port}"

    def init_distributed(self, init_method: str) -> None:
        """Join the data-parallel process group (gloo on CPU, NCCL on GPU) and take rank 0's weights."""
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # NCCL binds the communicator to the current device
        dist.init_process_group(backend, init_method=init_method, rank=self.rank, world_size=self.world_size)
        self._in_group = True
        with torch.no_grad():
            for tensor in [*self.model.parameters(), *self.model.buffers()]:
                dist.broadcast(tensor.data, src=0)

    def close(self) -> None:
        """Leave the process group this worker joined (never one the caller's process set up)."""
        if self._in_group:
            dist.destroy_process_group()
            self._in_group = False

    def _all_reduce_gradients(self) -> None:
        """Sum gradients over replicas (each holds its share of the global loss), in flat buckets."""
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

    # ---- forward passes --------------------------------------------------------------------------------------

    def _autocast(self) -> contextlib.AbstractContextManager:
        enabled = self.cfg.precision == "bfloat16"
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16, enabled=enabled)

    def _logits(self, model: PreTrainedModel, batch: TrainingBatch) -> torch.Tensor:
        with self._autocast():
            return model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False).logits

    def _collate(self, sequences: Sequence[TrainingSequence]) -> TrainingBatch:
        return collate(sequences, self.pad_token_id, self.cfg.make_sequence_length_divisible_by).to(self.device)

    @torch.no_grad()
    def _logprobs_of(self, model: PreTrainedModel, sequences: Sequence[TrainingSequence]) -> list[list[float]]:
        model.eval()
        out: list[list[float]] = []
        for micro in chunks(sequences, self.cfg.logprob_micro_batch_size):
            batch = self._collate(micro)
            logprobs = token_logprobs(self._logits(model, batch), batch.input_ids).cpu()
            out += [row[:n].tolist() for row, n in zip(logprobs, batch.lengths, strict=True)]
        return out

    def get_logprobs(self, sequences: Sequence[TrainingSequence]) -> list[list[float]]:
        """Per-token logprobs of the current weights (token frame: entry 0 is 0.0), no gradient."""
        return self._logprobs_of(self.model, sequences)

    def get_reference_logprobs(self, sequences: Sequence[TrainingSequence]) -> list[list[float]]:
        """Like :meth:`get_logprobs` under the frozen initial weights."""
        if self.reference_model is None:
            raise ValueError("no reference model: build the Policy with init_reference_model=True")
        return self._logprobs_of(self.reference_model, sequences)

    # ---- training --------------------------------------------------------------------------------------------

    def _micro_batch_loss(
        self, micro: Sequence[TrainingSequence], loss_cfg: ClippedPGLossConfig, valid_toks: float, valid_seqs: float
    ) -> dict[str, float]:
        batch = self._collate(micro)
        assert batch.prev_logprobs is not None  # checked by the Policy
        logits = self._logits(self.model, batch)
        curr = token_logprobs(logits, batch.input_ids)
        loss, metrics = clipped_pg_loss(
            loss_cfg,
            curr_logprobs=curr,
            prev_logprobs=batch.prev_logprobs,
            generation_logprobs=batch.generation_logprobs,
            advantages=batch.advantages,
            token_mask=batch.token_mask,
            sample_mask=batch.sample_mask,
            reference_logprobs=batch.reference_logprobs,
            global_valid_tokens=valid_toks,
            global_valid_seqs=valid_seqs,
        )
        with torch.no_grad():  # entropy in the token frame: the logits of position t-1 predict token t
            mask = (batch.token_mask * batch.sample_mask[:, None])[:, 1:]
            entropy = entropy_from_logits(logits[:, :-1].detach())
            metrics["entropy"] = ((entropy * mask).sum() / mask.sum().clamp(min=1)).item()
        del logits
        loss.backward()
        return metrics

    def train_global_batch(
        self,
        sequences: Sequence[TrainingSequence],
        loss_cfg: ClippedPGLossConfig,
        global_valid_toks: float,
        global_valid_seqs: float,
    ) -> dict[str, Any]:
        """Accumulate this replica's share of one global batch, sum gradients over replicas, clip, step.

        Returns:
            ``{"microbatches": [loss metrics per micro-batch], "grad_norm", "lr", "stepped"}``; the step is
            skipped (``stepped`` False) when the gradient norm is not finite.
        """
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        parts = [
            self._micro_batch_loss(micro, loss_cfg, global_valid_toks, global_valid_seqs)
            for micro in chunks(sequences, self.cfg.train_micro_batch_size)
        ]
        for p in self.params:  # a replica without data, or a parameter the loss never reached: zero gradient
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if self.world_size > 1:
            self._all_reduce_gradients()
        max_norm = self.cfg.max_grad_norm if self.cfg.max_grad_norm is not None else math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm).item()
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

    # ---- weights and checkpoints -----------------------------------------------------------------------------

    def state_dict_for_generation(self) -> dict[str, torch.Tensor]:
        """The model's state dict on CPU, keyed as the model class names it (what ``HFEngine`` expects).

        On CPU these are the live tensors (no copy): hand them to ``GenerationHandle.update_weights`` (which
        copies) before the next ``train``. On GPU they are CPU copies.
        """
        return {name: tensor.detach().to("cpu") for name, tensor in self.model.state_dict().items()}

    def save_hf_model(self, directory: str) -> None:
        """``save_pretrained`` of the model (fp32 safetensors) and of the tokenizer into ``directory``."""
        self.model.save_pretrained(directory, safe_serialization=True)
        self.tokenizer.save_pretrained(directory)

    def save(self, directory: str) -> None:
        """Write ``hf_model/`` and ``optimizer.pt`` (optimizer + scheduler state) into a checkpoint directory."""
        path = Path(directory)
        self.save_hf_model(str(path / HF_MODEL_DIR))
        state = {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}
        torch.save(state, path / OPTIMIZER_FILE)

    def load(self, directory: str) -> None:
        """Copy the weights, optimizer and scheduler state of a checkpoint into this replica."""
        path = Path(directory)
        loaded = AutoModelForCausalLM.from_pretrained(path / HF_MODEL_DIR, local_files_only=True, dtype=torch.float32)
        target, source = self.model.state_dict(), loaded.state_dict()
        if set(target) != set(source):
            diff = sorted(set(target) ^ set(source))[:5]
            raise ValueError(f"checkpoint {directory!r} holds a different model: parameter names differ ({diff})")
        with torch.no_grad():
            for name, tensor in target.items():
                if tensor.shape != source[name].shape:
                    raise ValueError(f"checkpoint {directory!r}: {name} has shape {tuple(source[name].shape)}")
                tensor.copy_(source[name])
        state = torch.load(path / OPTIMIZER_FILE, map_location=self.device, weights_only=True)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])

    def get_rng_state(self) -> dict[str, Any]:
        return get_rng_state()

    def set_rng_state(self, state: dict[str, Any]) -> None:
        set_rng_state(state)

    def seed(self, seed: int) -> None:
        """Seed this replica's python, numpy and torch RNGs (Ray workers: seed + rank)."""
        import random

        import numpy as np

        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
