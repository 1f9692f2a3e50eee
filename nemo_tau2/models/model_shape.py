"""The size of a model from its Hugging Face ``config.json`` alone, for the memory plan.

The architecture is built on the meta device (no memory, no weights) and its parameters counted, per transformer
block and outside them. The config is found, in order, in ``policy.model_name`` as a directory, the local Hugging Face
cache, or the copies shipped in ``hf_configs/`` (so the plan of the shipped recipes works on a laptop).
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

SHIPPED_CONFIGS = Path(__file__).parent / "hf_configs"


@dataclass
class ModelShape:
    """What the plan needs to know about the architecture."""

    name: str
    source: str
    parameters: int
    block_parameters: int  # the largest transformer block
    root_parameters: int  # outside the blocks: embeddings, LM head, final norm
    num_blocks: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    attention_width: int  # num_attention_heads x head_dim
    kv_width: int  # num_key_value_heads x head_dim
    max_position_embeddings: int


def find_model_config(model_name: str) -> tuple[Any, str]:
    """``(transformers config, where it came from)`` of ``model_name`` without weights or network."""
    from transformers import AutoConfig

    candidates = [Path(model_name), SHIPPED_CONFIGS / model_name]
    if (candidates[0] / "config.json").is_file():
        return AutoConfig.from_pretrained(candidates[0], local_files_only=True), str(candidates[0] / "config.json")
    try:
        return AutoConfig.from_pretrained(model_name, local_files_only=True), "the local Hugging Face cache"
    except (OSError, ValueError):
        pass
    if (candidates[1] / "config.json").is_file():
        return AutoConfig.from_pretrained(candidates[1]), f"nemo_tau2/models/hf_configs/{model_name}/config.json"
    raise ValueError(
        f"policy.model_name: no config.json for {model_name!r} (not a directory, not in the local Hugging Face cache, "
        f"not shipped in nemo_tau2/models/hf_configs/): put its config.json in a directory and point "
        "policy.model_name at it"
    )


def transformer_blocks(model: Any) -> list[Any]:
    """The model's repeated blocks: modules whose class is in ``model._no_split_modules`` (what accelerate uses).

    A fact of the architecture, used to count a block here and, by the trainer, to shard, checkpoint and compile it
    block by block (so it lives here, below the trainer, which imports it)."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    blocks = [module for module in model.modules() if type(module).__name__ in names]
    if not blocks:
        raise ValueError(
            f"{type(model).__name__} names no transformer block class (_no_split_modules={sorted(names)}): "
            "cannot treat it block by block (FSDP2 sharding, checkpointing, compiling)"
        )
    return blocks


def model_shape(config: Any, name: str, source: str) -> ModelShape:
    """Count the parameters of ``config``'s architecture on the meta device."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    blocks = transformer_blocks(model)
    block_sizes = [sum(p.numel() for p in block.parameters()) for block in blocks]
    total = sum(p.numel() for p in model.parameters())  # a tied parameter counts once
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return ModelShape(
        name=name,
        source=source,
        parameters=total,
        block_parameters=max(block_sizes),
        root_parameters=total - sum(block_sizes),
        num_blocks=len(blocks),
        hidden_size=text.hidden_size,
        intermediate_size=getattr(text, "intermediate_size", 4 * text.hidden_size),
        vocab_size=text.vocab_size,
        attention_width=heads * head_dim,
        kv_width=getattr(text, "num_key_value_heads", heads) * head_dim,
        max_position_embeddings=getattr(text, "max_position_embeddings", 0),
    )
