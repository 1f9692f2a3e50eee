"""A tiny random Llama with a real chat tokenizer, built in-process in about a second, for CPU tests.

No network and no downloads: a byte-level BPE tokenizer is trained on an in-memory corpus and wrapped as a
``PreTrainedTokenizerFast`` carrying our ChatML + tools template; the model is a ``LlamaForCausalLM`` with hidden
size 64 and 2 layers. :func:`teach_reply` trains it for a few seconds to answer one prompt with a fixed reply (e.g.
a ``<tool_call>``), which gives tests "a prompt built for it" with a known answer. GRPO tests reuse all of this.
"""

import json
from dataclasses import dataclass
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from nemo_tau2.generation.chat_templates import CHATML_TOOLS_TEMPLATE

# SmolLM2-135M-Instruct's Llama shape: benchmarks build random models of it (the cost of the real weights).
SMOLLM2_135M_SHAPE = {
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "vocab_size": 49152,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
}

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]
# Like Qwen's: single tokens that decoding keeps (not "special"), so tool calls survive skip_special_tokens.
TOOL_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name"}},
            "required": ["city"],
        },
    },
}
"""The tool used by tests and benchmarks that need a tool-call prompt."""

_CORPUS = [
    "You are a helpful customer service agent. Be brief and polite.",
    "What is the weather in Paris? It is sunny in Paris today, with a light breeze.",
    "Hello! How can I help you today? I would like to change my flight reservation, please.",
    "Thank you for waiting. Your order has been cancelled and the refund is on its way.",
    "The quick brown fox jumps over the lazy dog. 0123456789 {}[]:,\"'.!?-_/\\n",
    json.dumps(WEATHER_TOOL),
    '{"name": "get_weather", "arguments": {"city": "Paris"}}',
    "# Tools\n\nYou can call the functions described below. Their signatures are JSON objects inside <tools></tools>:",
    "To call a function, reply with a JSON object holding its name and its arguments between <tool_call></tool_call>",
    'tags:\n<tool_call>\n{"name": <function name>, "arguments": <JSON object>}\n</tool_call>',
]


@dataclass
class TinyModel:
    """A model and its tokenizer, ready to serve (``model`` in eval mode, float32, on CPU)."""

    model: LlamaForCausalLM
    tokenizer: PreTrainedTokenizerFast


def build_tiny_tokenizer(vocab_size: int = 600) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on the in-memory corpus (deterministic) and attach the ChatML + tools template."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_CORPUS * 4, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        chat_template=CHATML_TOOLS_TEMPLATE,
        model_max_length=1 << 30,  # the model (max_position_embeddings) sets the limit, not the tokenizer
    )
    tokenizer.add_tokens(TOOL_TOKENS, special_tokens=False)
    return tokenizer


def build_tiny_model(seed: int = 0, *, hidden_size: int = 64, num_layers: int = 2) -> TinyModel:
    """A randomly initialised Llama (same ``seed`` -> same weights) with the tiny tokenizer."""
    tokenizer = build_tiny_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return TinyModel(model=model, tokenizer=tokenizer)


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    """The assistant text of one Hermes-style tool call, as the chat template renders it."""
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments)}}}\n</tool_call>'


def teach_reply(
    tiny: TinyModel,
    messages: list[dict[str, Any]],
    reply: str,
    *,
    tools: list[dict[str, Any]] | None = None,
    steps: int = 150,
    lr: float = 1e-2,
) -> float:
    """Train ``tiny.model`` in place so that greedy decoding answers ``messages`` with ``reply`` + end of turn.

    Returns:
        The final mean cross-entropy on the reply tokens (near zero once learned).
    """
    tokenizer = tiny.tokenizer
    prompt = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    prompt_ids = tokenizer(prompt, add_special_tokens=False).input_ids
    reply_ids = tokenizer(reply, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
    input_ids = torch.tensor([prompt_ids + reply_ids])
    labels = torch.tensor([[-100] * len(prompt_ids) + reply_ids])
    model = tiny.model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    loss = torch.tensor(float("nan"))
    for _ in range(steps):
        optimizer.zero_grad()
        loss = model(input_ids=input_ids, labels=labels).loss
        loss.backward()
        optimizer.step()
    model.eval()
    return float(loss.detach())
