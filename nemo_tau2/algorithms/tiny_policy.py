"""The tiny policy's settings and architecture: what a GRPO config's ``tiny_policy`` block says and what the memory
plan sizes before the model exists. Building and warm-starting it against the scripted fake user is test
scaffolding: :mod:`nemo_tau2.testing.warm_start`.
"""

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:  # transformers is imported where an architecture is built, not where a config is read
    from transformers import LlamaConfig, PreTrainedTokenizerFast


class TinyPolicyConfig(BaseModel):
    """``tiny_policy``: build this model into ``policy.model_name`` when that directory does not exist yet."""

    model_config = ConfigDict(extra="forbid")

    seed: int = 0
    hidden_size: int = Field(default=64, ge=8)
    num_layers: int = Field(default=2, ge=1)
    num_attention_heads: int = Field(
        default=4, ge=1, description="hidden_size / heads is the head size; vLLM's CPU attention needs >= 32."
    )
    num_key_value_heads: int = Field(default=2, ge=1)
    max_position_embeddings: int = Field(default=2048, ge=128)
    correct_fraction: float = Field(default=0.3, ge=0.0, le=1.0, description="Share of correct first calls in SFT.")
    warm_start_steps: int = Field(default=300, ge=0)
    learning_rate: float = Field(default=3e-3, gt=0)


def tiny_policy_architecture(
    cfg: TinyPolicyConfig, tokenizer: "PreTrainedTokenizerFast | None" = None
) -> "LlamaConfig":
    """The tiny policy's Llama config (what the memory plan sizes before the model is built)."""
    from transformers import LlamaConfig

    from nemo_tau2.generation.tiny_model import build_tiny_tokenizer

    tokenizer = tokenizer or build_tiny_tokenizer()
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=2 * cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
