"""What the Megatron tests run in spawned gloo processes (megatron-core's parallel state is per process), and the
tiny HF models they compare against. Rank 0 of a scenario returns a dict; :func:`run_spawned` hands it back.
"""

import os
import socket
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config


def tiny_hf_model(model_type: str, seed: int = 0, vocab_size: int = 96):
    """A 2-layer model with 4 query heads in 2 groups; Qwen3 tied with head_dim 24 (not hidden / heads), Llama untied.

    Norm weights are drawn away from 1 so that a norm mapped to the wrong place changes the logits.
    """
    common = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
    )
    if model_type == "qwen3":
        config = Qwen3Config(**common, head_dim=24, tie_word_embeddings=True)
    else:
        config = LlamaConfig(**common, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
            else:
                param.normal_(0.0, 0.2)
    return model.eval(), config


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _entry(rank: int, name: str, world_size: int, tmp: str, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        from tests.unit.models.megatron import scenario_bodies

        result = getattr(scenario_bodies, name)(Path(tmp))
        if rank == 0:
            torch.save(result, Path(tmp) / "result.pt")
    finally:
        dist.destroy_process_group()


def run_spawned(name: str, *, world_size: int, tmp: Path) -> dict:
    """Run scenario ``name`` on ``world_size`` fresh gloo processes; rank 0's result."""
    mp.start_processes(_entry, args=(name, world_size, str(tmp), _free_port()), nprocs=world_size,
                       start_method="spawn")  # fmt: skip
    return torch.load(Path(tmp) / "result.pt", weights_only=False)
