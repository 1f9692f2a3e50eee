"""``MegatronPolicyWorker``: one rank of the Megatron backend behind the same methods as the torch ``PolicyWorker``,
so :class:`~nemo_tau2.models.policy.lm_policy.Policy` drives either one.

megatron-core keeps its parallel state in globals of the process, so every rank is a process of its own: a Ray actor
(``RayWorkerGroup``), even with ``num_workers: 1``. ``init_distributed`` joins the trainer group (gloo on CPU, NCCL on
GPUs), applies the CPU mode where CUDA is absent (``initialize_megatron``) and builds the stack from an HF folder:
``policy.model_name``, or the model object the Policy was given, written to a temporary folder first.

The Policy plans micro-batches per data-parallel rank; the tensor- and pipeline-parallel ranks of one data-parallel
rank get the same plan. An empty micro-batch (``equal_counts``) runs as one row of padding without loss, so every
rank takes part in the same number of pipeline steps. Loss metrics come back from one rank per data-parallel rank
(TP rank 0 of the last stage), so nothing is counted twice.

The reference model (``init_reference_model``) is a CPU copy of this rank's initial parameters, swapped in for
:meth:`get_reference_logprobs` and swapped back out (on GPUs through page-locked host buffers kept between calls:
asynchronous copies at the link's speed, ordered on the stream, instead of a fresh pageable copy of every weight).
Weights for generation and ``save_hf_model`` go through
:func:`~nemo_tau2.models.megatron.hf_weights.full_hf_state` (TP slices gathered, PP stages collected on rank 0).
"""

import tempfile
from collections.abc import Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from nemo_tau2.models.policy.config import PolicyConfig
from nemo_tau2.models.policy.data import TrainingBatch, TrainingSequence, collate
from nemo_tau2.models.policy.interfaces import LossFunction

COLLECTIVE_TIMEOUT = timedelta(minutes=30)


def _host_copy(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` copied to host memory, page-locked when it lives on a GPU (so copies to and from it are fast and
    may run asynchronously)."""
    copy = tensor.detach().to("cpu", copy=True)
    return copy.pin_memory() if tensor.is_cuda else copy


WEIGHT_BUCKET_BYTES = 256 * 2**20


class MegatronPolicyWorker:
    """One Megatron rank (a Ray actor). Args as :class:`~nemo_tau2.models.policy.worker.PolicyWorker`'s."""

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
        from nemo_tau2.models.policy.building import load_tokenizer

        if model is not None and tokenizer is None:
            raise ValueError("MegatronPolicyWorker: give the tokenizer with the model")
        self.cfg = cfg
        self.rank = rank
        self.world_size = world_size
        self.tokenizer = tokenizer or load_tokenizer(cfg)
        self.pad_token_id = self.tokenizer.pad_token_id
        if self.pad_token_id is None:
            self.pad_token_id = self.tokenizer.eos_token_id
        self._folder = cfg.model_name
        self._tmp: tempfile.TemporaryDirectory | None = None
        if model is not None:  # megatron-core builds from an HF folder: this rank writes the given model to one
            self._tmp = tempfile.TemporaryDirectory(prefix="megatron_policy_")
            model.save_pretrained(self._tmp.name)
            self._folder = self._tmp.name
        self._init_reference_model = init_reference_model
        self._reference: dict[str, torch.Tensor] | None = None
        self._current: dict[str, torch.Tensor] | None = None  # host buffer of the current weights while swapped
        self.stack: Any = None
        self._in_group = False

    # ---- set-up ----------------------------------------------------------------------------------------------

    def rendezvous_address(self) -> str:
        from nemo_tau2.models.policy.worker import PolicyWorker

        return PolicyWorker.rendezvous_address(self)  # type: ignore[arg-type]

    def init_distributed(self, init_method: str) -> None:
        """Join the trainer group, set megatron-core's TP/PP/DP groups (CPU mode without CUDA), build the stack."""
        from nemo_tau2.models.megatron.parallel import initialize_megatron
        from nemo_tau2.models.megatron.training import build_stack

        on_gpu = self.cfg.device == "cuda"
        if on_gpu:
            torch.cuda.set_device(0)  # Ray shows each actor its own GPU as cuda:0
        dist.init_process_group("nccl" if on_gpu else "gloo", init_method=init_method, rank=self.rank,
                                world_size=self.world_size, timeout=COLLECTIVE_TIMEOUT)  # fmt: skip
        self._in_group = True
        mcfg = self.cfg.megatron_cfg
        initialize_megatron(mcfg.tensor_model_parallel_size, mcfg.pipeline_model_parallel_size, seed=0)
        self.stack = build_stack(self.cfg, self._folder)
        if self._init_reference_model:
            self._reference = {name: _host_copy(p) for name, p in self._parameters().items()}

    def data_parallel_rank(self) -> tuple[int, bool]:
        """``(data-parallel rank, reports loss metrics)``: the Policy plans per data-parallel rank."""
        from megatron.core import parallel_state

        reports = parallel_state.get_tensor_model_parallel_rank() == 0 and parallel_state.is_pipeline_last_stage()
        return parallel_state.get_data_parallel_rank(), reports

    def close(self) -> None:
        if self._in_group:
            from nemo_tau2.models.megatron.parallel import destroy_megatron

            destroy_megatron()
            dist.destroy_process_group()
            self._in_group = False
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def seed(self, seed: int) -> None:
        """Seed python, numpy, torch and megatron-core's model-parallel RNG streams (Ray workers: seed + rank)."""
        import random

        import numpy as np
        from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        model_parallel_cuda_manual_seed(seed)

    # ---- batches ---------------------------------------------------------------------------------------------

    def _batches(self, micro_batches: Sequence[Sequence[TrainingSequence]]) -> tuple[list[TrainingBatch], list]:
        """Collated micro-batches (an empty one becomes one padding row without loss) and which ones are real."""
        pad, zeros = [self.pad_token_id] * 2, [0.0, 0.0]
        dummy = TrainingSequence(pad, [0, 0], zeros, 0.0, loss_multiplier=0.0, prev_logprobs=zeros,
                                 reference_logprobs=zeros)  # fmt: skip
        batches, real = [], []
        for micro in micro_batches:
            real.append(bool(micro))
            micro = micro or [dummy]
            batches.append(collate(micro, self.pad_token_id, self.cfg.make_sequence_length_divisible_by,
                                   packed=self.cfg.sequence_packing.enabled))  # fmt: skip
        return batches, real

    def _parameters(self) -> dict[str, torch.nn.Parameter]:
        return dict(self.stack.gpt_model.named_parameters())

    # ---- logprobs and training -------------------------------------------------------------------------------

    def get_logprobs(self, micro_batches: Sequence[Sequence[TrainingSequence]]) -> list[list[float]]:
        from nemo_tau2.models.megatron.training import get_logprobs

        batches, real = self._batches(micro_batches)
        rows = get_logprobs(self.stack, batches, self.pad_token_id)
        out, index = [], 0
        for batch, is_real in zip(batches, real, strict=True):
            count = batch.input_ids.shape[0]
            if is_real:
                out += rows[index : index + count]
            index += count
        return out

    @torch.no_grad()
    def get_reference_logprobs(self, micro_batches: Sequence[Sequence[TrainingSequence]]) -> list[list[float]]:
        """:meth:`get_logprobs` with the initial parameters swapped in (and the current ones back afterwards)."""
        if self._reference is None:
            raise ValueError("no reference model: build the Policy with init_reference_model=True")
        params = self._parameters()
        if self._current is None:
            self._current = {name: _host_copy(p) for name, p in params.items()}
        on_gpu = next(iter(params.values())).is_cuda  # stream-ordered: each copy waits for the one before
        for name, p in params.items():
            self._current[name].copy_(p, non_blocking=on_gpu)
        try:
            for name, p in params.items():
                p.copy_(self._reference[name], non_blocking=on_gpu)
            return self.get_logprobs(micro_batches)
        finally:
            for name, p in params.items():
                p.copy_(self._current[name], non_blocking=on_gpu)

    def train_global_batch(
        self,
        micro_batches: Sequence[Sequence[TrainingSequence]],
        loss_fn: LossFunction,
        global_valid_toks: float,
        global_valid_seqs: float,
    ) -> dict[str, Any]:
        from nemo_tau2.models.megatron.training import train_global_batch

        batches, real = self._batches(micro_batches)
        result = train_global_batch(self.stack, batches, loss_fn, global_valid_toks, global_valid_seqs,
                                    self.pad_token_id)  # fmt: skip
        reports = self.data_parallel_rank()[1]
        parts = result["microbatches"]
        result["microbatches"] = (
            [part for part, is_real in zip(parts, real, strict=True) if is_real] if reports else []
        )
        return result

    # ---- weights ---------------------------------------------------------------------------------------------

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every name and shape of the HF model's ``state_dict()`` (built on the meta device: nothing allocated)."""
        from transformers import AutoModelForCausalLM

        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(self.stack.hf_config)
        return {name: tuple(t.shape) for name, t in model.state_dict().items()}

    def iter_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The full HF weights on rank 0 (a tied head under its own name too, as ``state_dict()`` has it); every
        rank must consume it (the gathers are collectives)."""
        from nemo_tau2.models.megatron.hf_weights import full_hf_state

        state = full_hf_state(self.stack.gpt_model, self.stack.hf_config)
        if state is None:
            return
        yield from state.items()
        if "lm_head.weight" not in state and getattr(self.stack.hf_config, "tie_word_embeddings", False):
            yield "lm_head.weight", state["model.embed_tokens.weight"]

    def stream_weights(self, bucket_bytes: int = WEIGHT_BUCKET_BYTES) -> Iterator[dict[str, torch.Tensor]]:
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
        """Rank 0 writes the gathered weights as HF safetensors, the config and the tokenizer (a collective)."""
        from nemo_tau2.models.megatron.hf_weights import save_hf_folder

        if save_hf_folder(self.stack.gpt_model, self.stack.hf_config, directory) is not None:
            self.tokenizer.save_pretrained(directory)

    # ---- checkpoints -----------------------------------------------------------------------------------------

    def save_checkpoint(self, directory: str) -> dict[str, Any] | None:
        """Every rank writes its shards to ``<directory>/megatron`` (a collective, see ``megatron.checkpoint``);
        rank 0 also the model config and tokenizer, and returns the LR schedule's state for the Policy to write."""
        from nemo_tau2.models.megatron.checkpoint import save_megatron_checkpoint
        from nemo_tau2.models.policy.checkpoint import HF_CONFIG_DIR, MEGATRON_DIR

        path = Path(directory)
        save_megatron_checkpoint(self.stack, path / MEGATRON_DIR)
        if self.rank != 0:
            return None
        self.stack.hf_config.save_pretrained(path / HF_CONFIG_DIR)
        self.tokenizer.save_pretrained(path / HF_CONFIG_DIR)
        return self.stack.scheduler.state_dict()

    def load_checkpoint(self, directory: str, scheduler_state: dict[str, Any]) -> None:
        """Read this rank's shards of a checkpoint written by the same TP/PP/DP layout (the Policy checks it)."""
        from nemo_tau2.models.megatron.checkpoint import load_megatron_checkpoint
        from nemo_tau2.models.policy.checkpoint import MEGATRON_DIR

        load_megatron_checkpoint(self.stack, Path(directory) / MEGATRON_DIR, scheduler_state)

    def get_rng_state(self) -> dict[str, Any]:
        """This process's RNG states and megatron-core's model-parallel streams (dropout in TP regions)."""
        from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

        from nemo_tau2.models.policy.checkpoint import get_rng_state

        return {**get_rng_state(), "megatron_tracker": get_cuda_rng_tracker().get_states()}

    def set_rng_state(self, state: dict[str, Any]) -> None:
        from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

        from nemo_tau2.models.policy.checkpoint import set_rng_state

        set_rng_state(state)
        get_cuda_rng_tracker().set_states(state["megatron_tracker"])
