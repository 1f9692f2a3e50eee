"""The reference the generation tests compare served logprobs with: one plain forward pass of a transformers model."""

import torch


def forward_logprobs(model, prompt_ids: list[int], generated_ids: list[int]) -> torch.Tensor:
    """Log-probability of each generated token under one plain forward pass over prompt + generation."""
    ids = torch.tensor([prompt_ids + generated_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    logprobs = torch.log_softmax(logits[len(prompt_ids) - 1 : -1], dim=-1)
    return logprobs.gather(1, torch.tensor(generated_ids)[:, None])[:, 0]
