"""Batched sampling from a transformers causal LM, with per-request temperature / top_p / seed.

``model.generate`` applies one set of sampling parameters to a whole batch and reports processed scores; we need
each request's own parameters and the log-probability of every sampled token under the *raw* model distribution
(``log_softmax`` of the logits, before temperature and top_p), which is what vLLM and NeMo-RL report and what a
trainer's forward pass recomputes. Prompts are left-padded with explicit position ids, so a padded row computes
the same logits as the row alone; finished rows keep stepping (cheap at these sizes) but record nothing.
"""

from dataclasses import dataclass, field

import torch
from transformers import DynamicCache, PreTrainedModel


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


def _sample_row(logits: torch.Tensor, row: RowRequest) -> int:
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


def _left_pad(rows: list[RowRequest], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(row.prompt_ids) for row in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        input_ids[i, width - len(row.prompt_ids) :] = torch.tensor(row.prompt_ids)
        mask[i, width - len(row.prompt_ids) :] = 1
    return input_ids.to(device), mask.to(device)


@torch.inference_mode()
def generate_batch(
    model: PreTrainedModel, rows: list[RowRequest], stop_ids: frozenset[int], pad_id: int
) -> list[RowOutput]:
    """Complete every row; a row stops after a token in ``stop_ids`` (kept in its output) or ``max_tokens``."""
    device = next(model.parameters()).device
    input_ids, mask = _left_pad(rows, pad_id, device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache()
    out = model(
        input_ids=input_ids, attention_mask=mask, position_ids=positions, past_key_values=cache, logits_to_keep=1
    )
    next_position = positions[:, -1:] + 1
    outputs = [RowOutput() for _ in rows]
    active = [True] * len(rows)
    for _ in range(max(row.max_tokens for row in rows)):
        logits = out.logits[:, -1, :].float().cpu()
        logprobs = torch.log_softmax(logits, dim=-1)
        next_tokens = torch.full((len(rows), 1), pad_id, dtype=torch.long)
        for i, row in enumerate(rows):
            if not active[i]:
                continue
            token = _sample_row(logits[i], row)
            next_tokens[i, 0] = token
            record = outputs[i]
            record.token_ids.append(token)
            record.logprobs.append(float(logprobs[i, token]))
            if row.top_logprobs:
                values, ids = torch.topk(logprobs[i], row.top_logprobs)
                record.top.append(list(zip(ids.tolist(), values.tolist(), strict=True)))
            if token in stop_ids:
                record.finish_reason = "stop"
                active[i] = False
            elif len(record.token_ids) >= row.max_tokens:
                active[i] = False
        if not any(active):
            break
        mask = torch.cat([mask, torch.ones((len(rows), 1), dtype=mask.dtype, device=device)], dim=-1)
        out = model(
            input_ids=next_tokens.to(device),
            attention_mask=mask,
            position_ids=next_position,
            past_key_values=out.past_key_values,
            logits_to_keep=1,
        )
        next_position = next_position + 1
    return outputs
