"""The vllm backend end to end: start-up, surface check, in-place weight reload, tokens/s; the last line is JSON.

CPU (default): SmolLM2-135M-Instruct on vLLM's CPU build. GPU (``--device cuda``): ``--model``, an HF id in the local
cache or a folder, else a randomly initialised model of Qwen3-0.6B's shape. Both need vLLM's environment
(``scripts/build_vllm_env.sh --device cpu|cuda``, then ``NEMO_TAU2_VLLM_PYTHON``).

Reload: a perturbed copy of the served weights is loaded ``--reloads`` times through our path (the worker extension:
vLLM's ``reload_weights``, then the tied-weight fix-up) and through vLLM's bare ``reload_weights`` RPC, alternating;
the reference is a restart (the start-up time). The logprobs of a fixed greedy completion must move to the new
weights and come back exactly when the original folder is reloaded.

    NEMO_TAU2_VLLM_PYTHON=... uv run python bench/vllm_smoke.py [--device cuda --model Qwen/Qwen3-4B-Instruct-2507]
"""

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import nemo_tau2  # noqa: F401  (offline settings first)
from nemo_tau2.generation import GenerationConfig, start_generation
from nemo_tau2.generation.surface_check import ToolCallProbe, call_json, check_surface
from nemo_tau2.generation.tiny_model import WEATHER_TOOL, build_tiny_tokenizer

sys.path.insert(0, str(Path(__file__).parent))
from generation_speed import _level, vllm_cpu_config  # noqa: E402

QWEN3_06B_SHAPE = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
}
PROMPT = [
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "What is the weather in Paris?"},
]


def _random_checkpoint(config_source: str, path: Path, seed: int) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(config_source), dtype=torch.bfloat16)
    model.save_pretrained(path)


def _gpu_config(model: str | None, root: Path) -> GenerationConfig:
    if model is None:
        model = str(root / "qwen3-0.6b-shape")
        Path(model).mkdir()
        tokenizer = build_tiny_tokenizer()
        vocab = -(-len(tokenizer) // 64) * 64  # vLLM's detokenizer cannot handle ids the tokenizer lacks
        shape = QWEN3_06B_SHAPE | {"vocab_size": vocab, "eos_token_id": tokenizer.eos_token_id}
        (Path(model) / "config.json").write_text(json.dumps(shape))
        tokenizer.save_pretrained(model)
        _random_checkpoint(model, Path(model), seed=0)
    vllm_cfg = {"device": "cuda", "gpu_memory_utilization": 0.5, "max_model_len": 4096}
    return GenerationConfig(backend="vllm", model_name=model, temperature=1.0, top_p=1.0, vllm_cfg=vllm_cfg)


def _perturbed(served: Path, target: Path) -> str:
    """A copy of the served folder with every tensor scaled by 1.01 (same layout, different weights)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(served, target, ignore=shutil.ignore_patterns("*.safetensors"))
    for file in served.glob("*.safetensors"):
        save_file({k: v * 1.01 for k, v in load_file(file).items()}, target / file.name, metadata={"format": "pt"})
    return str(target)


def _greedy_logprobs(base_url: str, model: str) -> list[float]:
    body = {"model": model, "messages": PROMPT, "max_tokens": 16, "temperature": 0.0, "top_p": 1.0}
    status, response = call_json(
        "POST", f"{base_url}/chat/completions", body | {"logprobs": True, "top_logprobs": 0}, timeout_s=300
    )
    assert status == 200, response
    return [entry["logprob"] for entry in response["choices"][0]["logprobs"]["content"]]


def _engine_reload(root: str, folder: str) -> None:
    """vLLM's bare in-place reload, as a client would call it (no layout check, no tied-weight fix-up)."""
    for path, body in (
        ("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": folder}}),
        ("/reset_prefix_cache", {}),
    ):
        status, answer = call_json("POST", f"{root}{path}", body, timeout_s=300)
        assert status == 200, answer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--model", default=None, help="cuda: HF id or folder (default: Qwen3-0.6B's shape, random)")
    parser.add_argument("--reloads", type=int, default=3)
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    report: dict = {"benchmark": "vllm_smoke", "device": args.device}
    with tempfile.TemporaryDirectory() as tmp:
        cfg = vllm_cpu_config() if args.device == "cpu" else _gpu_config(args.model, Path(tmp))
        assert cfg.model_name is not None
        served = Path(cfg.model_name)
        started = time.perf_counter()
        with start_generation(cfg) as handle:
            report["startup_s"] = time.perf_counter() - started
            url = handle.base_urls[0]
            root = url.removesuffix("/v1")
            probe = ToolCallProbe(
                messages=PROMPT, tools=[WEATHER_TOOL], tool_choice="required", expect_tool_calls_finish=False
            )
            # stock vLLM neither splices prompt_token_ids nor rejects stream/top_k/stop (see vllm_launcher.py)
            check_surface(url, tool_probe=probe, check_splice=False, check_rejections=False)
            report["surface_check"] = "passed"
            before = _greedy_logprobs(url, handle.model_name)
            perturbed = _perturbed(served, Path(tmp) / "perturbed")
            ours, engine = [], []
            for _ in range(args.reloads):
                start = time.perf_counter()
                handle.update_weights(checkpoint_dir=perturbed)
                ours.append(time.perf_counter() - start)
                start = time.perf_counter()
                _engine_reload(root, perturbed)
                engine.append(time.perf_counter() - start)
            report["logprobs_changed"] = _greedy_logprobs(url, handle.model_name) != before
            handle.update_weights(checkpoint_dir=str(served))
            report["logprobs_restored_exactly"] = _greedy_logprobs(url, handle.model_name) == before
            report |= {"reload_ours_s": statistics.median(ours), "reload_engine_s": statistics.median(engine)}
            report["restart_over_reload"] = report["startup_s"] / report["reload_ours_s"]
            report["throughput"] = [
                asyncio.run(_level(handle, int(c), 2, args.max_tokens, nonce=1000 * i))
                for i, c in enumerate(args.concurrency.split(","))
            ]
    for row in report["throughput"]:
        print(f"c={row['concurrency']:<3d} gen {row['gen_tok_s']:7.1f} tok/s  prompt {row['prompt_tok_s']:7.1f} tok/s")
    print(
        f"start-up {report['startup_s']:.0f} s; reload ours {report['reload_ours_s']:.2f} s, vLLM's bare "
        f"{report['reload_engine_s']:.2f} s ({report['restart_over_reload']:.0f}x faster than a restart)"
    )
    print(json.dumps(report))


if __name__ == "__main__":
    main()
