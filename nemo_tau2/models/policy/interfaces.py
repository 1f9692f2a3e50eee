"""What the trainer needs from a loss function: it is passed in (``Policy.train(sequences, loss_fn)``), so this
package never imports the algorithms that define one (NeMo-RL's ``LossFunction``)."""

from typing import Protocol

import torch


class LossFunction(Protocol):
    """A per-micro-batch loss over ``[B, T]`` tensors in the token frame (see :mod:`.data`).

    Called with keyword arguments ``curr_logprobs`` (carries the gradient), ``prev_logprobs``,
    ``generation_logprobs``, ``advantages``, ``token_mask``, ``sample_mask``, ``reference_logprobs`` (or None),
    ``global_valid_tokens`` and ``global_valid_seqs`` (the normalisers of the whole global batch, so that the
    micro-batch losses add up to the global batch's loss). Returns the scalar loss and float metrics, which must
    include ``num_valid_tokens`` (the weight when metrics of micro-batches are combined).
    Must be picklable: Ray workers receive it. ``prev_logprobs`` is None for a loss that does not read it
    (``needs_prev_logprobs`` False, e.g. supervised fine-tuning's NLL).
    """

    needs_reference_logprobs: bool
    needs_prev_logprobs: bool

    def __call__(self, **tensors: torch.Tensor | float | None) -> tuple[torch.Tensor, dict[str, float]]: ...
