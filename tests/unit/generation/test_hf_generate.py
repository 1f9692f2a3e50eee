"""Continuous batching: rows that join or leave mid-generation keep exact logprobs and greedy outputs."""

import torch

from nemo_tau2.generation.hf_generate import DecodeBatch, RowRequest, generate_batch
from nemo_tau2.generation.tiny_model import build_tiny_model
from tests.forward_logprobs import forward_logprobs


def _row(prompt: list[int], max_tokens: int, temperature: float = 1.0, seed: int = 0) -> RowRequest:
    return RowRequest(prompt, max_tokens, temperature, 1.0, 0, torch.Generator().manual_seed(seed))


def test_rows_joining_and_leaving_mid_generation_keep_exact_logprobs():
    model = build_tiny_model(seed=2).model
    no_stop = frozenset({-1})
    prompts = [list(range(10, 40)), list(range(50, 55)), list(range(60, 100))]
    batch = DecodeBatch(model, no_stop, pad_id=0)
    outputs = {}
    batch.add([_row(prompts[0], 12, seed=1)], ["a"])
    for _ in range(3):
        outputs.update(batch.step())
    batch.add([_row(prompts[1], 4, seed=2), _row(prompts[2], 9, seed=3)], ["b", "c"])  # b leaves first
    while len(batch):
        outputs.update(batch.step())
    for tag, prompt, length in (("a", prompts[0], 12), ("b", prompts[1], 4), ("c", prompts[2], 9)):
        output = outputs[tag]
        assert len(output.token_ids) == length and output.finish_reason == "length"
        expected = forward_logprobs(model, prompt, output.token_ids)
        assert torch.allclose(torch.tensor(output.logprobs), expected, atol=1e-4)


def test_greedy_rows_generate_the_same_tokens_together_as_alone():
    model = build_tiny_model(seed=3).model
    prompts = [list(range(10, 40)), list(range(5, 12)), list(range(70, 90))]
    stop = frozenset({7})
    together = generate_batch(model, [_row(p, 10, temperature=0.0) for p in prompts], stop, pad_id=0)
    alone = [generate_batch(model, [_row(p, 10, temperature=0.0)], stop, pad_id=0)[0] for p in prompts]
    assert [o.token_ids for o in together] == [o.token_ids for o in alone]
    for output in together:
        assert output.finish_reason == ("stop" if output.token_ids[-1] in stop else "length")


def test_long_generations_grow_the_cache_in_place_with_exact_logprobs():
    """200 decode steps cross several buffer growths (a row leaves mid-way): logprobs stay those of a plain forward
    pass, and the key buffer is reallocated a handful of times, not copied every step like a concatenating cache."""
    model = build_tiny_model(seed=4).model
    prompts = [list(range(10, 20)), list(range(30, 33))]
    batch = DecodeBatch(model, frozenset({-1}), pad_id=0)
    batch.add([_row(prompts[0], 200, seed=5), _row(prompts[1], 90, seed=6)], ["long", "short"])
    outputs, buffer, reallocations = {}, None, 0
    while len(batch):
        outputs.update(batch.step())
        if len(batch) and batch._cache.layers[0].key_room is not buffer:  # held: its identity is not reused
            buffer, reallocations = batch._cache.layers[0].key_room, reallocations + 1
    assert 2 <= reallocations <= 8, f"the key buffer was reallocated {reallocations} times in 200 steps"
    for tag, prompt in (("long", prompts[0]), ("short", prompts[1])):
        expected = forward_logprobs(model, prompt, outputs[tag].token_ids)
        assert torch.allclose(torch.tensor(outputs[tag].logprobs), expected, atol=1e-4)
