"""Training sequences, their collation into padded tensors, and the one place where logits become token logprobs.

**Frame convention.** Every per-token quantity is aligned with the tokens: for a sequence ``x_0 .. x_{L-1}``,
``logprobs[t] = log p(x_t | x_<t)`` for ``t >= 1``, and ``logprobs[0] = 0.0`` because the first token has no
context. The logits of position ``t - 1`` score token ``t``; :func:`token_logprobs` does this shift, once, for
the trainer and for ``get_logprobs``. The first token can therefore never carry loss (``token_mask[0] == 0``),
which holds for every episode since a conversation starts with a prompt.

**Two layouts of a micro-batch.** Padded: one right-padded row per sequence (real tokens at ``0 .. L-1``,
padding masked out of attention and loss). Packed (``policy.sequence_packing``): the sequences concatenated into
one row without padding, position ids restarting at 0 for each sequence, from which transformers builds the
per-sequence causal attention. Either way the loss sees the same ``[B, T]`` tensors: :class:`PackedRow` scatters
the packed row's per-token values back into that frame, so loss and gradient do not depend on the layout.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils.checkpoint


@dataclass
class TrainingSequence:
    """One episode as the trainer sees it; every per-token list has ``len(token_ids)`` entries.

    Attributes:
        token_ids: The whole episode: every turn's new prompt tokens followed by what the policy generated.
        token_mask: 1 on policy-generated tokens (the only ones with loss), 0 on system/user/tool tokens.
        generation_logprobs: What the generator reported for each generated token; 0.0 elsewhere.
        advantage: One per episode (GRPO), or one per token.
        loss_multiplier: 0 removes the episode from the loss (NeMo-RL's ``loss_multiplier`` / ``sample_mask``).
        prev_logprobs: The trainer's logprobs before the update (``Policy.get_logprobs``); needed by ``train``.
        reference_logprobs: The reference policy's logprobs; needed when the KL penalty is on.
        generation_weight_versions: The weight version that sampled each policy turn, in order (empty when the
            generator did not say); async GRPO's episodes can span weight updates.
    """

    token_ids: list[int]
    token_mask: list[int]
    generation_logprobs: list[float]
    advantage: float | list[float]
    loss_multiplier: float = 1.0
    prev_logprobs: list[float] | None = None
    reference_logprobs: list[float] | None = None
    generation_weight_versions: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        if n < 2:
            raise ValueError(f"a training sequence needs at least 2 tokens, got {n}")
        per_token: dict[str, Any] = {
            "token_mask": self.token_mask,
            "generation_logprobs": self.generation_logprobs,
            "prev_logprobs": self.prev_logprobs,
            "reference_logprobs": self.reference_logprobs,
        }
        if isinstance(self.advantage, list):
            per_token["advantage"] = self.advantage
        for name, values in per_token.items():
            if values is not None and len(values) != n:
                raise ValueError(f"{name} has {len(values)} entries for {n} tokens")
        if any(m not in (0, 1) for m in self.token_mask):
            raise ValueError(f"token_mask must hold only 0 and 1, got {sorted(set(self.token_mask))}")
        if self.token_mask[0]:
            raise ValueError("token_mask[0] must be 0: the first token has no context, hence no logprob")

    def __len__(self) -> int:
        return len(self.token_ids)


def sequence_from_message_log(
    message_log: Sequence[dict[str, Any]],
    advantage: float,
    *,
    loss_multiplier: float = 1.0,
    max_total_sequence_length: int | None = None,
    truncate: bool = False,
    with_generation_logprobs: bool = True,
) -> TrainingSequence:
    """The training sequence of one episode's NeMo-RL ``message_log`` (see ``experience.rollouts``).

    Messages are concatenated; ``assistant`` messages are policy-generated (mask 1, their ``generation_logprobs``
    kept), every other role is prompt (mask 0, logprob 0.0).

    Args:
        message_log: ``[{"role", "token_ids", "generation_logprobs" (assistant only)}, ...]``.
        advantage: The episode's advantage, put on every token (masked-out tokens ignore it).
        loss_multiplier: 0 keeps the episode out of the loss.
        max_total_sequence_length: With ``truncate=False`` a longer episode is a ValueError; with
            ``truncate=True`` only its first ``max_total_sequence_length`` tokens are kept (the rest of the
            episode, including its final turns, gets no loss; the advantage still reflects the whole episode).
        truncate: See ``max_total_sequence_length``.
        with_generation_logprobs: False for supervised data (no sampling happened): assistant messages need no
            ``generation_logprobs`` and get 0.0.
    """
    token_ids: list[int] = []
    token_mask: list[int] = []
    logprobs: list[float] = []
    for index, message in enumerate(message_log):
        ids = message.get("token_ids")
        if not isinstance(ids, list):
            raise ValueError(f"message_log[{index}] has no token_ids list (role {message.get('role')!r})")
        if message.get("role") == "assistant":
            generated = message.get("generation_logprobs") if with_generation_logprobs else [0.0] * len(ids)
            if not isinstance(generated, list) or len(generated) != len(ids):
                got = len(generated) if isinstance(generated, list) else generated
                raise ValueError(
                    f"message_log[{index}] (assistant) needs one generation_logprob per token: "
                    f"{len(ids)} token_ids, generation_logprobs {got}"
                )
            token_mask += [1] * len(ids)
            logprobs += [float(x) for x in generated]
        else:
            token_mask += [0] * len(ids)
            logprobs += [0.0] * len(ids)
        token_ids += ids
    if max_total_sequence_length is not None and len(token_ids) > max_total_sequence_length:
        if not truncate:
            raise ValueError(
                f"the episode has {len(token_ids)} tokens, more than max_total_sequence_length "
                f"{max_total_sequence_length}; raise the limit, stop rollouts earlier, or pass truncate=True"
            )
        cut = max_total_sequence_length
        token_ids, token_mask, logprobs = token_ids[:cut], token_mask[:cut], logprobs[:cut]
    return TrainingSequence(
        token_ids=token_ids,
        token_mask=token_mask,
        generation_logprobs=logprobs,
        advantage=float(advantage),
        loss_multiplier=loss_multiplier,
        generation_weight_versions=[m["weight_version"] for m in message_log if m.get("weight_version") is not None],
    )


@dataclass
class PackedRow:
    """The sequences of a micro-batch concatenated into one row (``N`` tokens), and the way back to ``[B, T]``."""

    input_ids: torch.Tensor  # [1, N] long; trailing padding (if rounded up) is a segment of its own
    position_ids: torch.Tensor  # [1, N] long, 0 .. L_b - 1 for each sequence b
    flat_index: torch.Tensor  # [B, T] long: the row position of token t of sequence b (0 where t >= L_b)
    in_frame: torch.Tensor  # [B, T] bool: 0 < t < L_b (entry 0 of each sequence is no prediction)
    segment_lengths: list[int] = field(default_factory=list)  # the sequences', then the padding's (host ints)

    def unpack(self, values: torch.Tensor) -> torch.Tensor:
        """``[1, N]`` per-token values of the row (token frame) -> ``[B, T]``, 0.0 outside ``in_frame``."""
        return torch.where(self.in_frame, values[0][self.flat_index], 0.0)

    def to(self, device: torch.device | str) -> "PackedRow":
        tensors = {name: value.to(device) for name, value in vars(self).items() if isinstance(value, torch.Tensor)}
        return PackedRow(**tensors, segment_lengths=self.segment_lengths)

    def widened(self, width: int, pad_token_id: int) -> "PackedRow":
        """The row right-padded to ``width`` tokens: the padding is a segment of its own (position ids from 0), which
        the ``[B, T]`` frame never reads."""
        extra = width - self.input_ids.shape[1]
        if extra <= 0:
            return self
        padding = torch.full((1, extra), pad_token_id, dtype=self.input_ids.dtype, device=self.input_ids.device)
        positions = torch.arange(extra, dtype=self.position_ids.dtype, device=self.position_ids.device)[None]
        return PackedRow(
            input_ids=torch.cat([self.input_ids, padding], 1),
            position_ids=torch.cat([self.position_ids, positions], 1),
            flat_index=self.flat_index,
            in_frame=self.in_frame,
            segment_lengths=[*self.segment_lengths, extra],
        )


@dataclass
class TrainingBatch:
    """Right-padded tensors of a list of sequences; ``B`` sequences, ``T`` = longest (rounded up), same frame.

    ``packed`` (with sequence packing) is what the model runs on; the ``[B, T]`` tensors are what the loss reads.
    """

    input_ids: torch.Tensor  # [B, T] long, padding = pad_token_id
    attention_mask: torch.Tensor  # [B, T] long, 1 on real tokens
    token_mask: torch.Tensor  # [B, T] float, 1 on policy-generated tokens
    generation_logprobs: torch.Tensor  # [B, T] float
    advantages: torch.Tensor  # [B], or [B, T] when any sequence has per-token advantages
    sample_mask: torch.Tensor  # [B] float, the loss multipliers
    prev_logprobs: torch.Tensor | None = None  # [B, T]
    reference_logprobs: torch.Tensor | None = None  # [B, T]
    lengths: list[int] = field(default_factory=list)
    packed: PackedRow | None = None

    def loss_inputs(self) -> dict[str, torch.Tensor | None]:
        """What a :class:`~.interfaces.LossFunction` reads of this batch, besides ``curr_logprobs`` and the global
        normalisers (one place, for every backend that calls a loss)."""
        return {
            "prev_logprobs": self.prev_logprobs,
            "generation_logprobs": self.generation_logprobs,
            "advantages": self.advantages,
            "token_mask": self.token_mask,
            "sample_mask": self.sample_mask,
            "reference_logprobs": self.reference_logprobs,
        }

    @property
    def model_input_ids(self) -> torch.Tensor:
        """What the model runs on: the packed row's ids (``[1, N]``), else the ``[B, T]`` rows."""
        return self.packed.input_ids if self.packed is not None else self.input_ids

    def to_frame(self, values: torch.Tensor) -> torch.Tensor:
        """Per-token ``values`` of :attr:`model_input_ids` in the ``[B, T]`` frame the loss reads (every backend)."""
        return self.packed.unpack(values) if self.packed is not None else values

    def mean_over_loss_tokens(self, values: torch.Tensor) -> float:
        """The mean of ``[B, T]`` ``values`` over the tokens that carry loss (policy tokens of kept episodes)."""
        mask = self.token_mask * self.sample_mask[:, None]
        return ((values * mask).sum() / mask.sum().clamp(min=1)).item()

    def to(self, device: torch.device | str) -> "TrainingBatch":
        moved = {
            name: value.to(device) if isinstance(value, torch.Tensor | PackedRow) else value
            for name, value in vars(self).items()
        }
        return TrainingBatch(**moved)


def _padded(rows: list[list[float]] | list[list[int]], width: int, fill: float, dtype: torch.dtype) -> torch.Tensor:
    out = torch.full((len(rows), width), fill, dtype=dtype)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=dtype)
    return out


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def pack_row(
    lengths: Sequence[int], token_ids: Sequence[Sequence[int]], pad_token_id: int, multiple: int
) -> PackedRow:
    """Concatenate sequences into one row (rounded up to ``multiple`` tokens) with per-sequence position ids."""
    width = max(lengths)
    ids = [token for row in token_ids for token in row]
    positions = [t for n in lengths for t in range(n)]
    starts = torch.tensor([0, *lengths[:-1]]).cumsum(0)
    offsets = torch.arange(width)
    lengths_t = torch.tensor(list(lengths))
    inside = offsets[None, :] < lengths_t[:, None]
    row = PackedRow(
        input_ids=torch.tensor([ids], dtype=torch.long),
        position_ids=torch.tensor([positions], dtype=torch.long),
        flat_index=torch.where(inside, starts[:, None] + offsets[None, :], 0),
        in_frame=inside & (offsets[None, :] > 0),
        segment_lengths=list(lengths),
    )
    return row.widened(_round_up(len(ids), multiple), pad_token_id)


def collate(
    sequences: Sequence[TrainingSequence], pad_token_id: int, pad_to_multiple_of: int = 1, *, packed: bool = False
) -> TrainingBatch:
    """Right-pad ``sequences`` into a :class:`TrainingBatch` (optional logprobs only if every sequence has them).

    With ``packed`` the batch also carries the sequences as one :class:`PackedRow` (its length rounded up to
    ``pad_to_multiple_of``) for the forward pass, and the ``[B, T]`` tensors are not rounded up.
    """
    if not sequences:
        raise ValueError("cannot collate an empty list of sequences")
    lengths = [len(s) for s in sequences]
    width = max(lengths) if packed else _round_up(max(lengths), pad_to_multiple_of)

    def optional(name: str) -> torch.Tensor | None:
        rows = [getattr(s, name) for s in sequences]
        return None if any(r is None for r in rows) else _padded(rows, width, 0.0, torch.float32)

    if any(isinstance(s.advantage, list) for s in sequences):
        rows = [s.advantage if isinstance(s.advantage, list) else [s.advantage] * len(s) for s in sequences]
        advantages = _padded(rows, width, 0.0, torch.float32)
    else:
        advantages = torch.tensor([s.advantage for s in sequences], dtype=torch.float32)
    return TrainingBatch(
        input_ids=_padded([s.token_ids for s in sequences], width, pad_token_id, torch.long),
        attention_mask=_padded([[1] * n for n in lengths], width, 0, torch.long),
        token_mask=_padded([s.token_mask for s in sequences], width, 0.0, torch.float32),
        generation_logprobs=_padded([s.generation_logprobs for s in sequences], width, 0.0, torch.float32),
        advantages=advantages,
        sample_mask=torch.tensor([s.loss_multiplier for s in sequences], dtype=torch.float32),
        prev_logprobs=optional("prev_logprobs"),
        reference_logprobs=optional("reference_logprobs"),
        lengths=lengths,
        packed=pack_row(lengths, [s.token_ids for s in sequences], pad_token_id, pad_to_multiple_of)
        if packed
        else None,
    )


def _next_token_logprobs(logits: torch.Tensor, next_ids: torch.Tensor) -> torch.Tensor:
    logits = logits.float()
    return logits.gather(-1, next_ids[..., None]).squeeze(-1) - logits.logsumexp(-1)


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, chunk_size: int | None = None) -> torch.Tensor:
    """Per-token logprobs ``[B, T]`` in the token frame: ``out[:, t] = log softmax(logits[:, t-1])[input_ids[:, t]]``.

    The fp32 log-softmax is what costs memory (``B x T x V x 4`` bytes, again for its gradient). With
    ``chunk_size`` it runs over that many positions at a time, each chunk recomputed in the backward pass
    (activation checkpointing) instead of kept, so at most one chunk's fp32 logits exist at once.

    Args:
        logits: ``[B, T, V]`` from a forward pass over ``input_ids`` (any float dtype; computed in fp32).
        input_ids: ``[B, T]``.
        chunk_size: Positions per chunk; None computes all at once.

    Returns:
        ``[B, T]`` float32 with ``out[:, 0] = 0`` (the first token has no context).
    """
    # Position t scores token t + 1; the last position scores nothing (a dummy target, dropped below). Splitting
    # the whole logits tensor (not a [:, :-1] view of it) keeps its gradient to one allocation.
    next_ids = torch.nn.functional.pad(input_ids[:, 1:], (0, 1), value=0)
    if chunk_size is None or logits.shape[1] <= chunk_size:
        picked = _next_token_logprobs(logits, next_ids)
    else:
        parts = [
            torch.utils.checkpoint.checkpoint(_next_token_logprobs, chunk, ids, use_reentrant=False)
            for chunk, ids in zip(logits.split(chunk_size, 1), next_ids.split(chunk_size, 1), strict=True)
        ]
        picked = torch.cat(parts, 1)
    return torch.nn.functional.pad(picked[:, :-1], (1, 0), value=0.0)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Exact per-token entropy ``[B, T]`` of the categorical distributions given by ``logits [B, T, V]``."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


@torch.no_grad()
def next_token_entropy(logits: torch.Tensor, chunk_size: int | None = None) -> torch.Tensor:
    """Entropy ``[B, T]`` in the token frame (entry t: the distribution token t was drawn from; entry 0 is 0)."""
    chunks_ = [logits] if chunk_size is None else logits.split(chunk_size, 1)
    entropy = torch.cat([entropy_from_logits(chunk) for chunk in chunks_], 1)
    return torch.nn.functional.pad(entropy[:, :-1], (1, 0), value=0.0)


def chunks(items: Sequence[Any], size: int) -> list[Sequence[Any]]:
    """Consecutive slices of at most ``size`` items (micro-batches)."""
    return [items[i : i + size] for i in range(0, len(items), size)]


def even_split(items: Sequence[Any], parts: int) -> list[Sequence[Any]]:
    """``parts`` consecutive slices whose sizes differ by at most one (possibly empty when items are few)."""
    base, extra = divmod(len(items), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + base + (1 if i < extra else 0)
        out.append(items[start:end])
        start = end
    return out
