"""Scenario bodies run inside a spawned gloo process (see :mod:`scenarios`); each returns what its test asserts."""

from pathlib import Path

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

from nemo_tau2.models.megatron import conversion
from nemo_tau2.models.megatron.hf_weights import full_hf_state, load_hf_state, read_hf_state, save_hf_folder
from nemo_tau2.models.megatron.model import build_gpt_model, transformer_config
from nemo_tau2.models.megatron.parallel import destroy_megatron, initialize_megatron
from tests.unit.models.megatron.scenarios import tiny_hf_model


def _tokens(batch: int = 2, length: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, 96, (batch, length), generator=torch.Generator().manual_seed(1))
    return ids, torch.arange(length).expand(batch, length)


@torch.no_grad()
def _megatron_logits(model, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    return model(ids, positions, None)


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def _build(hf_config, tp: int = 1):
    return build_gpt_model(hf_config, transformer_config(hf_config, tensor_model_parallel_size=tp)).eval()


def conversion_single(tmp: Path) -> dict:
    initialize_megatron(1, 1, seed=0)
    results = {}
    ids, positions = _tokens()
    for model_type in ("qwen3", "llama"):
        hf_model, hf_config = tiny_hf_model(model_type)
        hf_model.save_pretrained(tmp / model_type)
        hf_state = read_hf_state(tmp / model_type)
        with torch.no_grad():
            expected = hf_model(ids).logits
        model = _build(hf_config)
        load_hf_state(model, hf_state, hf_config)
        back = full_hf_state(model, hf_config)
        results[model_type] = {
            "round_trip_names_equal": sorted(back) == sorted(hf_state),
            "round_trip_max_abs_diff": max(_max_diff(back[name], hf_state[name]) for name in hf_state),
            "logits_max_abs_diff": _max_diff(_megatron_logits(model, ids, positions), expected),
            "logits_scale": expected.abs().mean().item(),
        }
        exported = save_hf_folder(model, hf_config, tmp / f"{model_type}_export")
        reloaded = AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32, attn_implementation="eager")
        with torch.no_grad():
            results[model_type]["export_reload_max_abs_diff"] = _max_diff(reloaded(ids).logits, expected)
        results[model_type]["export_files"] = sorted(path.name for path in exported.iterdir())
        if model_type == "qwen3":  # the plausible bug: q, k, v stacked as three blocks, not per query group
            right = conversion.fuse_qkv
            conversion.fuse_qkv = lambda q, k, v, config: torch.cat([q, k, v], dim=0)
            try:
                load_hf_state(model, hf_state, hf_config)
            finally:
                conversion.fuse_qkv = right
            wrong = _megatron_logits(model, ids, positions)
            results[model_type]["wrong_qkv_logits_max_abs_diff"] = _max_diff(wrong, expected)
    destroy_megatron()
    return results


def conversion_tp2(tmp: Path) -> dict:
    initialize_megatron(2, 1, seed=0)
    hf_model, hf_config = tiny_hf_model("qwen3")
    if dist.get_rank() == 0:
        hf_model.save_pretrained(tmp / "hf")
    dist.barrier()
    hf_state = read_hf_state(tmp / "hf")
    model = _build(hf_config, tp=2)
    load_hf_state(model, hf_state, hf_config)
    ids, positions = _tokens()
    with torch.no_grad():
        expected = hf_model(ids).logits
    logits = _megatron_logits(model, ids, positions)
    back = full_hf_state(model, hf_config)
    destroy_megatron()
    if back is None:
        return {}
    return {
        "logits_max_abs_diff": _max_diff(logits, expected),
        "export_max_abs_diff": max(_max_diff(back[name], hf_state[name]) for name in hf_state),
    }
