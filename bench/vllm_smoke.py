"""GPU smoke run of the vllm backend: start, surface check, in-place weight update; the last line printed is JSON.

Needs an NVIDIA GPU and the vllm extra (``uv sync --extra vllm``). ``--model`` is an HF id in the local cache or a
directory; without one, a randomly initialised model of Qwen3-0.6B's shape is written and served. The weight
update loads a freshly initialised checkpoint of the same shape and checks that the logprobs of a fixed greedy
completion change while the server keeps answering.

    uv run --extra vllm python bench/vllm_smoke.py [--model Qwen/Qwen3-4B-Instruct-2507]
"""

import argparse
import json
import tempfile
import time
from pathlib import Path

import nemo_tau2  # noqa: F401  (offline settings first)
from nemo_tau2.generation import GenerationConfig, start_generation
from nemo_tau2.generation.surface_check import ToolCallProbe, call_json, check_surface
from nemo_tau2.generation.tiny_model import WEATHER_TOOL, build_tiny_tokenizer

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
    """A randomly initialised model with ``config_source``'s config, saved as safetensors."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(config_source), dtype=torch.bfloat16)
    model.save_pretrained(path)


def _shape_dir(root: Path) -> str:
    path = root / "qwen3-0.6b-shape"
    path.mkdir()
    tokenizer = build_tiny_tokenizer()
    vocab = -(-len(tokenizer) // 64) * 64  # vLLM's detokenizer cannot handle ids the tokenizer lacks
    shape = QWEN3_06B_SHAPE | {"vocab_size": vocab, "eos_token_id": tokenizer.eos_token_id}
    (path / "config.json").write_text(json.dumps(shape))
    tokenizer.save_pretrained(path)
    _random_checkpoint(str(path), path, seed=0)
    return str(path)


def _greedy_logprobs(base_url: str, model: str) -> list[float]:
    body = {"model": model, "messages": PROMPT, "max_tokens": 16, "temperature": 0.0, "top_p": 1.0}
    status, response = call_json("POST", f"{base_url}/chat/completions", body | {"logprobs": True, "top_logprobs": 0})
    assert status == 200, response
    return [entry["logprob"] for entry in response["choices"][0]["logprobs"]["content"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    args = parser.parse_args()
    report: dict = {"benchmark": "vllm_smoke"}
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or _shape_dir(Path(tmp))
        vllm_cfg = {"gpu_memory_utilization": args.gpu_memory_utilization, "max_model_len": 4096}
        cfg = GenerationConfig(backend="vllm", model_name=model, temperature=1.0, top_p=1.0, vllm_cfg=vllm_cfg)
        started = time.perf_counter()
        with start_generation(cfg) as handle:
            report["startup_s"] = time.perf_counter() - started
            url = handle.base_urls[0]
            probe = ToolCallProbe(
                messages=PROMPT, tools=[WEATHER_TOOL], tool_choice="required", expect_tool_calls_finish=False
            )
            # stock vLLM neither splices prompt_token_ids nor rejects stream/top_k/stop (see vllm_launcher.py)
            relaxed = {"check_splice": False, "check_rejections": False, "check_context_limit": False}
            check_surface(url, tool_probe=probe, **relaxed)
            report["surface_check"] = "passed"
            before = _greedy_logprobs(url, handle.model_name)
            checkpoint = Path(tmp) / "update"
            _random_checkpoint(model, checkpoint, seed=1)
            started = time.perf_counter()
            report["weight_version"] = handle.update_weights(checkpoint_dir=str(checkpoint))
            report["update_s"] = time.perf_counter() - started
            after = _greedy_logprobs(url, handle.model_name)
            report["logprobs_changed"] = before != after
            check_surface(url, **relaxed)
            report["surface_check_after_update"] = "passed"
    print(json.dumps(report))


if __name__ == "__main__":
    main()
