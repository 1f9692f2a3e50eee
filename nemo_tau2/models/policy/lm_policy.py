"""``Policy``: what the GRPO loop calls to score, train, checkpoint and export the model being trained.

>>> policy = Policy(cfg, model=tiny.model, tokenizer=tiny.tokenizer)   # or Policy(cfg) to load cfg.model_name
>>> seqs = [sequence_from_message_log(r.message_log, adv) for r, adv in zip(results, advantages)]
>>> for seq, lp in zip(seqs, policy.get_logprobs(seqs)):
...     seq.prev_logprobs = lp
>>> metrics = policy.train(seqs, ClippedPGLossFn(loss_cfg))
>>> generation.update_weights(policy.stream_weights_for_generation())
>>> policy.save_checkpoint(step_dir(ckpt_root, step), {"step": step, "data_position": pos})

``num_workers == 1`` runs one rank in this process; more run as Ray actors (see ``workers``), replicas or FSDP2
shards (``dtensor_cfg.enabled``). The Policy plans which sequences each rank runs together (``batching``: by count,
or packed by tokens); every micro-batch's loss uses the normalisers of its whole global batch, so the gradients
summed over micro-batches and ranks are the gradient of the full-batch loss, whatever the layout.
"""

import logging
import math
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from nemo_tau2.generation.weight_stream import WeightStream
from nemo_tau2.models.policy import checkpoint as ckpt
from nemo_tau2.models.policy.batching import plan_micro_batches
from nemo_tau2.models.policy.config import PolicyConfig
from nemo_tau2.models.policy.data import TrainingSequence, even_split
from nemo_tau2.models.policy.interfaces import LossFunction
from nemo_tau2.models.policy.megatron_config import megatron_layout
from nemo_tau2.models.policy.metrics import combine_microbatch_metrics, combine_step_metrics
from nemo_tau2.models.policy.workers import LocalWorkerGroup, RayWorkerGroup

logger = logging.getLogger(__name__)


def global_normalisers(sequences: Sequence[TrainingSequence]) -> tuple[float, float]:
    """``(valid tokens, valid sequences)`` of a global batch, counted exactly as ``clipped_pg_loss`` counts them."""
    weights = [sum(s.token_mask) * float(s.loss_multiplier) for s in sequences]
    return math.fsum(weights), float(sum(w > 0 for w in weights))


class Policy:
    """The trained model behind one interface, whether it runs in this process or on Ray workers.

    Args:
        cfg: The ``policy`` config.
        model / tokenizer: A model object to train and its tokenizer (e.g. ``tiny_model.build_tiny_model()``);
            None loads ``cfg.model_name``. In-process the Policy trains this very object (moved to the device in
            fp32): give a copy if you need the original, e.g. to serve it for generation. To resume, build the
            Policy from the same *initial* model, then :meth:`load_checkpoint` (the reference model is the
            initial one).
        init_reference_model: Keep the initial weights for :meth:`get_reference_policy_logprobs` (KL penalty).
        seed: Ray workers seed their RNGs with ``seed + rank`` (in-process, the caller's RNGs are used as they are).
        ray_init_kwargs: Extra ``ray.init`` arguments if the Policy has to start Ray.
    """

    def __init__(
        self,
        cfg: PolicyConfig,
        *,
        model: PreTrainedModel | None = None,
        tokenizer: PreTrainedTokenizerBase | None = None,
        init_reference_model: bool = False,
        seed: int = 0,
        ray_init_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.cfg = cfg
        worker_kwargs = {"model": model, "tokenizer": tokenizer, "init_reference_model": init_reference_model}
        self.has_reference_model = init_reference_model
        if cfg.num_workers == 1 and not cfg.megatron_cfg.enabled:
            self._workers: LocalWorkerGroup | RayWorkerGroup = LocalWorkerGroup(cfg, **worker_kwargs)
        else:
            self._workers = RayWorkerGroup(cfg, seed=seed, ray_init_kwargs=ray_init_kwargs, **worker_kwargs)
        # the data-parallel rank of each worker: Megatron's TP/PP ranks of one data-parallel rank share its plan
        self._data_parallel_ranks = list(range(self._workers.world_size))
        if cfg.megatron_cfg.enabled:
            ranks = self._workers.run("data_parallel_rank", [()] * self._workers.world_size)
            self._data_parallel_ranks = [dp_rank for dp_rank, _ in ranks]

    # ---- scoring ---------------------------------------------------------------------------------------------

    def _check(self, sequences: Sequence[TrainingSequence]) -> None:
        if not sequences:
            raise ValueError("the batch of training sequences is empty")
        limit = self.cfg.max_total_sequence_length
        for index, seq in enumerate(sequences):
            if not isinstance(seq, TrainingSequence):
                raise ValueError(f"sequences[{index}] is a {type(seq).__name__}, not a TrainingSequence")
            if len(seq) > limit:
                raise ValueError(
                    f"sequences[{index}] has {len(seq)} tokens, more than policy.max_total_sequence_length {limit}"
                )

    def _plan(self, sequences: Sequence[TrainingSequence], *, training: bool) -> list[list[list[TrainingSequence]]]:
        """Per rank, its micro-batches of sequences (see ``batching``)."""
        cfg = self.cfg
        if cfg.sequence_packing.enabled:
            size = {"token_budget": cfg.train_mb_tokens if training else cfg.logprob_mb_tokens}
        else:
            size = {"micro_batch_size": cfg.train_micro_batch_size if training else cfg.logprob_micro_batch_size}
        equal_counts = cfg.dtensor_cfg.enabled or cfg.megatron_cfg.enabled
        num_plans = max(self._data_parallel_ranks) + 1
        plans = plan_micro_batches([len(s) for s in sequences], num_plans, equal_counts=equal_counts, **size)
        return [[[sequences[i] for i in micro] for micro in plans[dp_rank]] for dp_rank in self._data_parallel_ranks]

    def _scatter_logprobs(self, method: str, sequences: Sequence[TrainingSequence]) -> list[list[float]]:
        self._check(sequences)
        plans = self._plan(sequences, training=False)
        results = self._workers.run(method, [(plan,) for plan in plans])
        by_sequence = {}
        for plan, rows in zip(plans, results, strict=True):
            planned = [seq for micro in plan for seq in micro]
            by_sequence |= {id(seq): row for seq, row in zip(planned, rows, strict=True)}
        return [by_sequence[id(seq)] for seq in sequences]

    def get_logprobs(self, sequences: Sequence[TrainingSequence]) -> list[list[float]]:
        """Per-token logprobs under the current weights, one list per sequence of ``len(token_ids)`` floats.

        Token frame: entry t is ``log p(token_t | tokens_<t)``, entry 0 is 0.0. These are the trainer's
        ``prev_logprobs`` for the next :meth:`train`.
        """
        return self._scatter_logprobs("get_logprobs", sequences)

    def get_reference_policy_logprobs(self, sequences: Sequence[TrainingSequence]) -> list[list[float]]:
        """Like :meth:`get_logprobs` under the initial weights (needs ``init_reference_model=True``)."""
        if not self.has_reference_model:
            raise ValueError("no reference model: build the Policy with init_reference_model=True")
        return self._scatter_logprobs("get_reference_logprobs", sequences)

    # ---- training --------------------------------------------------------------------------------------------

    def _check_for_training(self, sequences: Sequence[TrainingSequence], loss_fn: LossFunction) -> None:
        self._check(sequences)
        for index, seq in enumerate(sequences):
            if loss_fn.needs_prev_logprobs and seq.prev_logprobs is None:
                raise ValueError(f"sequences[{index}].prev_logprobs is None: set it from Policy.get_logprobs first")
            if loss_fn.needs_reference_logprobs and seq.reference_logprobs is None:
                raise ValueError(
                    f"sequences[{index}].reference_logprobs is None but the loss has a KL penalty ({loss_fn!r}): "
                    "set it from Policy.get_reference_policy_logprobs"
                )

    def train(self, sequences: Sequence[TrainingSequence], loss_fn: LossFunction) -> dict[str, float]:
        """One optimizer step per global batch of at most ``train_global_batch_size`` sequences.

        A batch of ``n`` sequences makes ``ceil(n / train_global_batch_size)`` steps over consecutive global
        batches of near-equal size (one step when ``n <= train_global_batch_size``). Within a global batch each
        rank accumulates its micro-batches (``train_micro_batch_size`` sequences, or packed up to
        ``sequence_packing.train_mb_tokens``); the result equals one forward and backward over the whole global
        batch. ``loss_fn`` (e.g. ``ClippedPGLossFn``) computes each micro-batch's loss.

        Returns:
            ``clipped_pg_loss`` metrics over the whole batch (``loss``, ``pg_loss``, ``clip_fraction``,
            ``approx_kl``, ``kl_penalty``, ``probs_ratio_*``, ``importance_weight_*``, ``token_mult_prob_error``,
            ``entropy``, ...) plus ``grad_norm`` (before clipping), ``lr``, ``global_valid_toks``,
            ``global_valid_seqs``, ``num_sequences``, ``num_tokens`` (all tokens, prompts included) and
            ``num_optimizer_steps``. With several steps, counts add up, ``lr`` is the last step's, the rest is
            the mean over steps.

        Raises:
            ValueError: A sequence is too long or lacks ``prev_logprobs`` (or ``reference_logprobs`` with a KL
                penalty), or a global batch has no policy-generated token with a nonzero ``loss_multiplier``.
        """
        self._check_for_training(sequences, loss_fn)
        num_steps = math.ceil(len(sequences) / self.cfg.train_global_batch_size)
        step_metrics = []
        for index, global_batch in enumerate(even_split(list(sequences), num_steps)):
            valid_toks, valid_seqs = global_normalisers(global_batch)
            if valid_toks <= 0:
                raise ValueError(
                    f"global batch {index} ({len(global_batch)} sequences) has no policy-generated token with a "
                    "nonzero loss_multiplier: nothing to train on"
                )
            plans = self._plan(global_batch, training=True)
            results = self._workers.run(
                "train_global_batch", [(plan, loss_fn, valid_toks, valid_seqs) for plan in plans]
            )
            metrics = combine_microbatch_metrics([part for result in results for part in result["microbatches"]])
            metrics |= {
                "grad_norm": results[0]["grad_norm"],
                "lr": results[0]["lr"],
                "global_valid_toks": valid_toks,
                "global_valid_seqs": valid_seqs,
                "num_sequences": float(len(global_batch)),
                "num_tokens": float(sum(len(s) for s in global_batch)),
                "num_optimizer_steps": float(results[0]["stepped"]),
            }
            step_metrics.append(metrics)
        return combine_step_metrics(step_metrics)

    # ---- weights and checkpoints -----------------------------------------------------------------------------

    def stream_weights_for_generation(self) -> WeightStream:
        """The current full weights, gathered from the shards one tensor at a time and keyed like the model's own
        ``state_dict()``: what ``GenerationHandle.update_weights(...)`` takes (hf in-process engine). Consume it
        before the next :meth:`train`: in-process on CPU the tensors are the live weights (no copy)."""
        shapes = self._workers.run_rank0("weight_shapes")

        def tensors() -> Iterator[tuple[str, torch.Tensor]]:
            for bucket in self._workers.stream_rank0("stream_weights"):
                yield from bucket.items()

        return WeightStream(shapes, tensors())

    def state_dict_for_generation(self) -> dict[str, torch.Tensor]:
        """:meth:`stream_weights_for_generation` materialised as a dict (one full copy: small models, tests)."""
        return dict(self.stream_weights_for_generation())

    def save_hf_model(self, directory: str | Path) -> Path:
        """Write the current weights (gathered from the shards, streamed into safetensors files on rank 0), the model
        config and the tokenizer, as ``save_pretrained`` would, to ``directory``.

        What a generation backend that reloads from disk takes: ``GenerationHandle.update_weights(
        checkpoint_dir=...)`` (vLLM, hf subprocess); transformers loads it. Overwrites files already there.
        """
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        self._workers.run("save_hf_model", [(str(path),)] * self._workers.world_size)
        return path

    def save_checkpoint(self, checkpoint_dir: str | Path, trainer_state: dict[str, Any]) -> Path:
        """Write a complete checkpoint to ``checkpoint_dir`` (usually ``checkpoint.step_dir(root, step)``).

        Weights and optimizer state (every rank its shards: torch.distributed.checkpoint, or megatron-core's
        dist_checkpointing with ``megatron_cfg.enabled``, see ``checkpoint``), the scheduler state,
        the RNG states of this process and of every worker, the model config and tokenizer, and ``trainer_state``
        (JSON). Written to a temporary sibling directory and renamed when complete. Returns the directory.
        """
        final = Path(checkpoint_dir)
        tmp = ckpt.temporary_dir(final)
        try:
            ckpt.write_trainer_state(tmp, trainer_state)
            results = self._workers.run("save_checkpoint", [(str(tmp),)] * self._workers.world_size)
            torch.save(results[0], tmp / ckpt.SCHEDULER_FILE)
            rng = {"driver": ckpt.get_rng_state()}
            if isinstance(self._workers, RayWorkerGroup):
                rng["workers"] = self._workers.run("get_rng_state", [()] * self._workers.world_size)
            torch.save(rng, tmp / ckpt.RNG_FILE)
            tmp.rename(final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        logger.info("saved checkpoint %s", final)
        return final

    def load_checkpoint(self, checkpoint_dir: str | Path) -> dict[str, Any]:
        """Restore weights, optimizer, scheduler and RNG states from a checkpoint; returns its ``trainer_state``.

        On the number of ranks that wrote it, the next :meth:`train` gives the same result as in the run that
        saved it (bit for bit on CPU). On another number of ranks (or sharded <-> unsharded) the weights and
        optimizer state are resharded exactly; the workers' RNG states are then left as seeded. The Megatron
        backend reshards its checkpoints into other TP/PP/DP sizes too (unless saved ``dp_reshardable``); a
        checkpoint of the other backend, or one this Megatron layout cannot read, is a one-line
        :class:`~nemo_tau2.models.policy.checkpoint.CheckpointMismatchError`.
        """
        path = ckpt.check_checkpoint_dir(checkpoint_dir, megatron_layout(self.cfg.megatron_cfg, self.cfg.num_workers))
        scheduler_state = torch.load(path / ckpt.SCHEDULER_FILE, weights_only=False)  # our own file
        self._workers.run("load_checkpoint", [(str(path), scheduler_state)] * self._workers.world_size)
        # Our own file (python/numpy RNG states are not plain tensors): never load a checkpoint you did not write.
        rng = torch.load(path / ckpt.RNG_FILE, weights_only=False)
        ckpt.set_rng_state(rng["driver"])
        workers_rng = rng.get("workers")
        if isinstance(self._workers, RayWorkerGroup):
            if workers_rng is not None and len(workers_rng) == self._workers.world_size:
                self._workers.run("set_rng_state", [(state,) for state in workers_rng])
            else:
                logger.warning("checkpoint %s has no RNG states for %d workers; theirs stay as seeded", path,
                               self._workers.world_size)  # fmt: skip
        return ckpt.read_trainer_state(path)

    # ---- lifetime --------------------------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Stop the workers (and Ray, if the Policy started it); safe to call twice."""
        self._workers.shutdown()

    def __enter__(self) -> "Policy":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()
