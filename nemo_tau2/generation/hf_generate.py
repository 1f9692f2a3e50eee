"""Continuous batched sampling from a transformers causal LM, with per-request temperature / top_p / seed.

``model.generate`` applies one set of sampling parameters to a whole batch, reports processed scores and cannot
take new sequences while it runs. :class:`DecodeBatch` keeps the rows being decoded together (their KV cache,
attention mask and next positions); new rows are prefilled and merged in between decode steps, finished rows are
dropped, so a request never waits for another one's generation to end.

Every reported logprob is that of the *raw* model distribution (``log_softmax`` of the logits, before temperature
and top_p), which is what vLLM and NeMo-RL report and what a trainer's forward pass recomputes. Rows are
left-padded (keys of padding positions are zero and masked out, and position ids are explicit), so a row computes
the same logits batched as alone, up to float rounding.
"""

from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel

from nemo_tau2.generation.row_cache import RowCache


@dataclass
class RowRequest:
    """One sequence to complete."""

    prompt_ids: list[int]
    max_tokens: int
    temperature: float
    top_p: float
    top_logprobs: int
    generator: torch.Generator


@dataclass
class RowOutput:
    """Sampled ids, their raw logprobs, the top alternatives per step, and why the row stopped."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    finish_reason: str = "length"


@dataclass
class _Live:
    request: RowRequest
    tag: Any
    position: int
    output: RowOutput = field(default_factory=RowOutput)


def _sample(logits: torch.Tensor, row: RowRequest) -> int:
    """Sample from softmax(logits / temperature) restricted to the top_p nucleus; temperature 0 is argmax."""
    if row.temperature == 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / row.temperature, dim=-1)
    if row.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        outside = torch.cumsum(sorted_probs, dim=-1) - sorted_probs >= row.top_p
        sorted_probs[outside] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return int(torch.multinomial(probs, 1, generator=row.generator))


def _left_pad(mask: torch.Tensor, width: int) -> torch.Tensor:
    return torch.cat([mask.new_zeros((mask.shape[0], width - mask.shape[1])), mask], 1)


class DecodeBatch:
    """Rows decoded together; :meth:`add` merges new rows in, :meth:`step` samples one token for every row."""

    def __init__(self, model: PreTrainedModel, stop_ids: frozenset[int], pad_id: int) -> None:
        self.model = model
        self.stop_ids = stop_ids
        self.pad_id = pad_id
        self.device = next(model.parameters()).device
        self.rows: list[_Live] = []
        self._cache = RowCache()
        self._mask = torch.zeros((0, 0), dtype=torch.long, device=self.device)
        self._logits = torch.zeros((0, 0))

    def __len__(self) -> int:
        return len(self.rows)

    @torch.inference_mode()
    def add(self, requests: list[RowRequest], tags: list[Any]) -> None:
        """Prefill ``requests`` (left-padded among themselves) and merge them into the batch."""
        width = max(len(r.prompt_ids) for r in requests)
        input_ids = torch.full((len(requests), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(requests), width), dtype=torch.long)
        for i, request in enumerate(requests):
            input_ids[i, width - len(request.prompt_ids) :] = torch.tensor(request.prompt_ids)
            mask[i, width - len(request.prompt_ids) :] = 1
        input_ids, mask = input_ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = RowCache()
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            logits_to_keep=1,
        )
        logits = out.logits[:, -1, :].float().cpu()
        new_rows = [_Live(r, tag, position=len(r.prompt_ids)) for r, tag in zip(requests, tags, strict=True)]
        if not self.rows:
            self._cache, self._mask, self._logits, self.rows = cache, mask, logits, new_rows
            return
        self._cache.merge(cache)
        self._mask = torch.cat([_left_pad(self._mask, self._cache.width), _left_pad(mask, self._cache.width)])
        self._logits = torch.cat([self._logits, logits])
        self.rows += new_rows

    @torch.inference_mode()
    def step(self) -> list[tuple[Any, RowOutput]]:
        """Sample the next token of every row, drop and return the rows that finished, advance the others."""
        logprobs = torch.log_softmax(self._logits, dim=-1)
        tokens, keep, finished = [], [], []
        for i, live in enumerate(self.rows):
            token = _sample(self._logits[i], live.request)
            output = live.output
            output.token_ids.append(token)
            output.logprobs.append(float(logprobs[i, token]))
            if live.request.top_logprobs:
                values, ids = torch.topk(logprobs[i], live.request.top_logprobs)
                output.top.append(list(zip(ids.tolist(), values.tolist(), strict=True)))
            if token in self.stop_ids:
                output.finish_reason = "stop"
            if token in self.stop_ids or len(output.token_ids) >= live.request.max_tokens:
                finished.append((live.tag, output))
            else:
                keep.append(i)
                tokens.append(token)
        if len(keep) < len(self.rows):
            self._select(keep)
        if self.rows:
            self._advance(tokens)
        return finished

    def drop(self, tags: set[Any]) -> None:
        """Stop decoding the rows with these tags (their callers have gone): they free their place at once."""
        keep = [i for i, live in enumerate(self.rows) if live.tag not in tags]
        if len(keep) < len(self.rows):
            self._select(keep)

    def _select(self, keep: list[int]) -> None:
        index = torch.tensor(keep, dtype=torch.long, device=self.device)
        self.rows = [self.rows[i] for i in keep]
        self._mask = self._mask.index_select(0, index)
        start = int((self._mask.sum(0) > 0).nonzero()[0]) if self.rows else self._mask.shape[1]
        self._mask = self._mask[:, start:]  # drop padding columns no remaining row needs
        self._cache.keep(index, start)
        self._logits = self._logits[keep]

    def _advance(self, tokens: list[int]) -> None:
        count = len(self.rows)
        self._mask = torch.cat([self._mask, self._mask.new_ones((count, 1))], 1)
        positions = torch.tensor([[live.position] for live in self.rows], device=self.device)
        out = self.model(
            input_ids=torch.tensor(tokens, device=self.device)[:, None],
            attention_mask=self._mask,
            position_ids=positions,
            past_key_values=self._cache,  # grows in place (see row_cache)
            logits_to_keep=1,
        )
        self._logits = out.logits[:, -1, :].float().cpu()
        for live in self.rows:
            live.position += 1


def generate_batch(
    model: PreTrainedModel, rows: list[RowRequest], stop_ids: frozenset[int], pad_id: int
) -> list[RowOutput]:
    """Complete every row together; a row stops after a token in ``stop_ids`` (kept) or ``max_tokens``."""
    batch = DecodeBatch(model, stop_ids, pad_id)
    batch.add(rows, list(range(len(rows))))
    outputs: dict[int, RowOutput] = {}
    while len(batch):
        outputs.update(batch.step())
    return [outputs[i] for i in range(len(rows))]
