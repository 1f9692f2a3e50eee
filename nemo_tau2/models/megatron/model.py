"""A megatron-core ``GPTModel`` shaped like an HF Llama / Qwen3 checkpoint (local spec: no Transformer Engine).

The architecture is read from the HF ``config.json`` (what :mod:`nemo_tau2.models.model_shape` reads too): RMSNorm,
SwiGLU MLP without biases, grouped-query attention with RoPE (rotate-half, HF's layout), Qwen3's per-head q/k
RMSNorm, tied or separate output embeddings. Anything else (biases, scaled RoPE, sliding windows, MoE) is refused
with a one-line error rather than silently built wrong. megatron-core is imported inside the functions: the package
imports without the ``megatron`` extra.
"""

from typing import Any

import torch

SUPPORTED_MODEL_TYPES = ("llama", "qwen3")


class UnsupportedArchitecture(ValueError):
    """The HF config describes something the Megatron conversion does not build exactly."""


def check_supported(hf_config: Any) -> None:
    """Raise :class:`UnsupportedArchitecture` naming the first feature we would build wrong."""
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedArchitecture(
            f"megatron backend: model_type {model_type!r} is not supported (supported: {SUPPORTED_MODEL_TYPES}); "
            "use policy.dtensor_cfg for it"
        )
    refused = {
        "attention_bias": bool(getattr(hf_config, "attention_bias", False)),
        "mlp_bias": bool(getattr(hf_config, "mlp_bias", False)),
        "use_sliding_window": bool(getattr(hf_config, "use_sliding_window", False)),
    }
    for key, present in refused.items():
        if present:
            raise UnsupportedArchitecture(
                f"megatron backend: {model_type} with {key} set is not supported; use policy.dtensor_cfg for it"
            )
    if getattr(hf_config, "hidden_act", "silu") != "silu":
        raise UnsupportedArchitecture(f"megatron backend: hidden_act {hf_config.hidden_act!r} (only silu) is refused")
    rope_theta(hf_config)


def rope_theta(hf_config: Any) -> float:
    """RoPE's base of an unscaled RoPE, from transformers 5's ``rope_parameters`` (``rope_type`` "default" is plain
    RoPE) or 4.x's ``rope_theta`` with ``rope_scaling`` unset; any scaled RoPE (linear, dynamic, yarn, llama3...)
    is refused: the local spec's RoPE has no scaling."""
    parameters = getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {}
    rope_type = parameters.get("rope_type", parameters.get("type", "default"))
    if rope_type != "default":
        raise UnsupportedArchitecture(
            f"megatron backend: rope_type {rope_type!r} (scaled RoPE) is not supported, only 'default'; "
            "use policy.dtensor_cfg for it"
        )
    theta = parameters.get("rope_theta", getattr(hf_config, "rope_theta", None))
    if theta is None:
        raise UnsupportedArchitecture(
            "megatron backend: the config names no rope_theta; use policy.dtensor_cfg for it"
        )
    return float(theta)


def head_dim(hf_config: Any) -> int:
    return getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads


def transformer_config(
    hf_config: Any,
    *,
    params_dtype: torch.dtype = torch.float32,
    tensor_model_parallel_size: int = 1,
    pipeline_model_parallel_size: int = 1,
    sequence_parallel: bool = False,
    activation_checkpointing: bool = False,
    attention_backend: str = "sdpa",
) -> Any:
    """megatron-core's ``TransformerConfig`` for this HF config (fp32 or bf16 compute); ``attention_backend``
    (:func:`~nemo_tau2.models.megatron.packed_attention.attention_backend`): ``"thd"`` also takes Transformer
    Engine's fused RoPE (packed rows: per-sequence positions)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    check_supported(hf_config)
    recompute = {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}
    return TransformerConfig(
        num_layers=hf_config.num_hidden_layers,
        hidden_size=hf_config.hidden_size,
        ffn_hidden_size=hf_config.intermediate_size,
        num_attention_heads=hf_config.num_attention_heads,
        num_query_groups=hf_config.num_key_value_heads,
        kv_channels=head_dim(hf_config),
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        normalization="RMSNorm",
        layernorm_epsilon=hf_config.rms_norm_eps,
        qk_layernorm=hf_config.model_type == "qwen3",
        add_bias_linear=False,
        add_qkv_bias=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        params_dtype=params_dtype,
        bf16=params_dtype == torch.bfloat16,
        pipeline_dtype=params_dtype,
        tensor_model_parallel_size=tensor_model_parallel_size,
        pipeline_model_parallel_size=pipeline_model_parallel_size,
        sequence_parallel=sequence_parallel,
        use_cpu_initialization=True,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,  # no softmax of megatron-core's runs: the core attention is SDPA or TE's
        persist_layer_norm=False,
        apply_rope_fusion=attention_backend == "thd",
        gradient_accumulation_fusion=False,
        **(recompute if activation_checkpointing else {}),
    )


def build_gpt_model(
    hf_config: Any,
    config: Any,
    *,
    pre_process: bool = True,
    post_process: bool = True,
    parallel_output: bool = False,
    padded_vocab_size: int | None = None,
    attention_backend: str = "sdpa",
) -> Any:
    """The ``GPTModel`` of one pipeline stage (``pre_process``: holds the embedding; ``post_process``: the head).

    ``padded_vocab_size`` (``MegatronConfig.padded_vocab_size``): the embedding and output rows, the HF vocabulary's
    plus zero rows that let tensor parallelism split them; the logits of those rows are not the model's to use
    (:func:`hf_vocab_logits`). None: exactly the HF vocabulary.

    ``parallel_output=False`` gathers the vocabulary slices of the logits over the tensor-parallel ranks, so every
    rank sees whole-vocabulary logits (what the token log-softmax needs).

    The layer spec is megatron-core's local one (the conversion's parameter names) with the core attention of
    ``attention_backend`` (:mod:`~nemo_tau2.models.megatron.packed_attention`): never the unfused
    ``DotProductAttention``, whose packed rows need a dense ``N x N`` mask.
    """
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    from nemo_tau2.models.megatron.packed_attention import core_attention_module

    spec = get_gpt_layer_local_spec(normalization="RMSNorm", qk_layernorm=config.qk_layernorm)
    attention = spec.submodules.self_attention.submodules
    attention.core_attention = core_attention_module(attention_backend)
    return GPTModel(
        config,
        spec,
        vocab_size=padded_vocab_size or hf_config.vocab_size,
        max_sequence_length=hf_config.max_position_embeddings,
        pre_process=pre_process,
        post_process=post_process,
        share_embeddings_and_output_weights=bool(getattr(hf_config, "tie_word_embeddings", False)),
        position_embedding_type="rope",
        rotary_base=rope_theta(hf_config),
        parallel_output=parallel_output,
    )


def layer_offset(model: Any) -> int:
    """The global index of this stage's first transformer layer (``layer_number`` is 1-based and global)."""
    layers = model.decoder.layers
    return layers[0].layer_number - 1 if len(layers) else 0


def hf_vocab_logits(logits: torch.Tensor, hf_config: Any) -> torch.Tensor:
    """The logits of the HF vocabulary only: the padding rows' entries (logit 0 from zero rows, or whatever training
    would make of them) must not take part in a softmax, so every logprob, loss and entropy reads this view."""
    return logits[..., : hf_config.vocab_size]
