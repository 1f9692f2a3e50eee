"""The GPU kit's generation figure (``bench/gpu_check.py``): the hf engine's generated tokens/s on the device, a floor
for the rollout side (vLLM cannot reach the kit's machine)."""

import asyncio
import sys
import time

import torch
from transformers import AutoModelForCausalLM

from nemo_tau2.generation.engine import GenerationRequest
from nemo_tau2.generation.hf_engine import HFEngine

CONCURRENCY = (1, 8, 32)


def generation_speed(config, tokenizer, device: torch.device, sizes: tuple[int, int]) -> dict[str, float]:
    """Generated tokens/s of the hf engine (full depth, bf16 on a GPU) at each of ``CONCURRENCY`` requests."""
    prompt_tokens, new_tokens = sizes
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16 if device.type == "cuda" else None)
    engine = HFEngine(model, tokenizer, model_name="gpu_check", max_batch_size=max(CONCURRENCY))
    generator = torch.Generator().manual_seed(0)

    async def run(concurrency: int, max_tokens: int) -> float:
        requests = [GenerationRequest(torch.randint(10, config.vocab_size, (prompt_tokens,), generator=generator)
                                      .tolist(), max_tokens, 1.0, 1.0, seed=i, top_logprobs=0)
                    for i in range(concurrency)]  # fmt: skip
        started = time.perf_counter()
        results = await asyncio.gather(*(engine.generate(r) for r in requests))
        return sum(len(r.tokens) for r in results) / (time.perf_counter() - started)

    try:
        asyncio.run(run(2, 2))  # warm-up
        speeds = {str(c): round(asyncio.run(run(c, new_tokens)), 1) for c in CONCURRENCY}
    finally:
        engine.close()
    print(
        f"generation: {speeds} tokens/s at {'/'.join(map(str, CONCURRENCY))} concurrent requests",
        file=sys.stderr,
        flush=True,
    )
    return speeds
