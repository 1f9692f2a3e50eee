"""Our vLLM OpenAI server: vLLM's own server, same flags and every route, plus what RL training needs.

Run as ``python -m nemo_tau2_vllm_server <vllm serve flags>`` in place of ``vllm.entrypoints.openai.api_server``
(the vllm backend does; this folder is on the process's ``PYTHONPATH``). Everything is vLLM's: its CLI, engine,
routes (``/v1/chat/completions``, ``/tokenize``, ``/collective_rpc``, ``/pause``, ``/resume``, ``/metrics``, ...),
tool parsers, logprobs and ``return_token_ids``. One class is ours: the renderer that turns a chat into the engine's
prompt, which chat completions and ``/tokenize`` share (so both always give the same ids). It adds:

- **The prefix splice** (``nemo_tau2_token_splice``, the rule every backend of ours uses): when an assistant
  message carries ``prompt_token_ids`` + ``generation_token_ids``, or the request carries NeMo-RL's
  ``required_prefix_token_ids``, the engine's prompt is those ids followed by the re-rendered tail. Stock vLLM
  re-renders history from text, and a template that rewrites history (Qwen3 drops ``<think>`` blocks; tool-call
  JSON re-serialised) then breaks token contiguity, which silently shortens what a multi-turn episode trains on.
- **A ``max_tokens`` clamp** (NeMo-RL's): a request asking for more than the context has left gets what is left,
  instead of vLLM's 400; a prompt that fills the context is a 400 that says "maximum context length", which our
  model servers turn into a truncated episode (never an infrastructure error).
- **400s naming the field** for ids that are not a list of ints, ids past the vocabulary (which would otherwise
  reach the embedding), and a splice that cannot apply.
- **``weight_version``** on each chat completion: the label (``/update_weight_version``) of the weights that
  generated it, from the engine's own per-token record (``CompletionOutput.weight_versions``). Async GRPO trains each
  turn knowing which weights sampled it; a completion that straddled an update (which ``/pause?mode=wait`` rules
  out) reports the first, and logs it.

vLLM builds its renderer and its chat serving inside ``init_app_state``; we give those modules our subclasses
before the server starts, and check that they still have the names we replace, so a vLLM whose layout moved fails
at start with a clear message rather than serving without the splice. This file runs in vLLM's environment
(Python 3.11 for vLLM's CPU build): it imports vLLM, the standard library and ``nemo_tau2_token_splice``, never
``nemo_tau2``.
"""

from __future__ import annotations

import sys
from typing import Any

import nemo_tau2_token_splice as splice
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
from vllm.exceptions import VLLMValidationError
from vllm.logger import init_logger
from vllm.renderers.online_renderer import OnlineRenderer

logger = init_logger("nemo_tau2_vllm_server")

SUPPORTED_VLLM = "0.32."
"""The vLLM release line whose server layout this module was written against (the tests run 0.32.0)."""


def end_of_turn_ids(tokenizer: Any, hf_config: Any, generation_config: dict[str, Any]) -> frozenset[int]:
    """The ids that end a turn: the tokenizer's EOS and the model's EOS ids (as our other backends count them)."""
    ids: set[int] = set()
    for value in (
        tokenizer.eos_token_id,
        getattr(hf_config, "eos_token_id", None),
        generation_config.get("eos_token_id"),
    ):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list | tuple):
            ids.update(v for v in value if isinstance(v, int))
    if not ids:
        raise RuntimeError("the model has no eos_token_id (tokenizer, config or generation_config): cannot splice")
    return frozenset(ids)


class TokenFaithfulRenderer(OnlineRenderer):
    """vLLM's chat renderer with the prefix splice and the ``max_tokens`` clamp (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        tokenizer = self.renderer.get_tokenizer()
        self.end_of_turn_ids = end_of_turn_ids(
            tokenizer, self.model_config.hf_config, self.model_config.try_get_generation_config()
        )
        self.vocab_size = self.model_config.get_vocab_size()
        logger.info(
            "nemo_tau2 token splice on: end-of-turn ids %s, vocabulary %d",
            sorted(self.end_of_turn_ids),
            self.vocab_size,
        )

    async def preprocess_chat(self, request: Any, messages: list[Any], *args: Any, **kwargs: Any) -> Any:
        extra = getattr(request, "model_extra", None) or {}
        required = extra.get(splice.REQUIRED_PREFIX_FIELD)
        try:
            prefix = splice.recorded_prefix(messages, required, self.vocab_size)
        except splice.SpliceError as e:
            raise VLLMValidationError(str(e), parameter=e.field) from e
        is_chat = isinstance(request, ChatCompletionRequest)
        asked = _take_max_tokens(request) if is_chat else None  # rendered first, clamped after the splice
        conversation, engine_inputs = await super().preprocess_chat(request, messages, *args, **kwargs)
        if prefix is not None:
            if len(engine_inputs) != 1 or engine_inputs[0].get("type") != "token":
                raise VLLMValidationError(
                    "recorded token ids can only be spliced into a text prompt; send this request without them",
                    parameter=splice.REQUIRED_PREFIX_FIELD if required is not None else "messages",
                )
            (engine_input,) = engine_inputs
            source = splice.REQUIRED_PREFIX_FIELD if required is not None else "messages"
            try:
                spliced = splice.splice_token_ids(
                    prefix, engine_input["prompt_token_ids"], self.end_of_turn_ids, source
                )
            except splice.SpliceError as e:
                raise VLLMValidationError(str(e), parameter=e.field) from e
            engine_input["prompt_token_ids"] = spliced
            engine_input.pop("prompt", None)  # the text no longer spells these ids
            engine_input.pop("prompt_token_offsets", None)
        if is_chat:
            self._clamp(request, asked, engine_inputs)
        return conversation, engine_inputs

    def _clamp(self, request: ChatCompletionRequest, asked: tuple[str, int] | None, engine_inputs: list[Any]) -> None:
        """Give back the caller's ``max_tokens`` (or ``max_completion_tokens``), cut to what the context has left."""
        prompt_len = max((len(e.get("prompt_token_ids") or ()) for e in engine_inputs), default=0)
        max_model_len = self.model_config.max_model_len
        room = max_model_len - prompt_len
        if room <= 0:
            raise VLLMValidationError(
                f"This model's maximum context length is {max_model_len} tokens. However, your request has "
                f"{prompt_len} prompt tokens, which leaves no room to generate. Please reduce the length of the "
                "messages.",
                parameter="messages",
                value=prompt_len,
            )
        if asked is not None:
            field, value = asked
            setattr(request, field, min(value, room))


class VersionReportingChat(OpenAIServingChat):
    """vLLM's chat completions with ``weight_version`` added to each full (non-streamed) response."""

    async def chat_completion_full_generator(self, request: Any, result_generator: Any, *args: Any, **kwargs: Any):
        final: list[Any] = []

        async def remembered() -> Any:
            async for output in result_generator:
                final[:] = [output]
                yield output

        response = await super().chat_completion_full_generator(request, remembered(), *args, **kwargs)
        version = _weight_version(final[0]) if final and hasattr(response, "choices") else None
        if version is not None:
            response.weight_version = version  # the response model allows extra fields
        return response


def _weight_version(output: Any) -> int | None:
    """The integer label of the weights that sampled the first choice's tokens (None: unlabelled)."""
    spans = getattr(output.outputs[0], "weight_versions", None) if output.outputs else None
    if not spans:
        return None
    if len({span.version for span in spans}) > 1:
        logger.warning("a completion was sampled by several weight versions: %s", spans)
    try:
        return int(spans[0].version)
    except ValueError:
        return None


def _take_max_tokens(request: ChatCompletionRequest) -> tuple[str, int] | None:
    """Remove the requested output length from ``request`` for rendering (vLLM refuses prompt + it > context)."""
    for field in ("max_completion_tokens", "max_tokens"):
        value = getattr(request, field, None)
        if value is not None:
            setattr(request, field, None)
            return field, value
    return None


def install() -> None:
    """Make vLLM's server build :class:`TokenFaithfulRenderer`; fail clearly on a vLLM whose layout differs."""
    import vllm
    from vllm.entrypoints.launchers.api_server import app_state

    if getattr(app_state, "OnlineRenderer", None) is not OnlineRenderer:
        raise SystemExit(
            f"nemo_tau2_vllm_server: vLLM {vllm.__version__} builds its chat renderer elsewhere than vLLM "
            f"{SUPPORTED_VLLM}x did; install the release scripts/build_vllm_env.sh pins"
        )
    if not vllm.__version__.startswith(SUPPORTED_VLLM):
        logger.warning("nemo_tau2_vllm_server was written for vLLM %sx; this is %s", SUPPORTED_VLLM, vllm.__version__)
    app_state.OnlineRenderer = TokenFaithfulRenderer
    from vllm.entrypoints.openai.chat_completion import serving as chat_serving

    if getattr(chat_serving, "OpenAIServingChat", None) is not OpenAIServingChat:
        raise SystemExit(f"nemo_tau2_vllm_server: vLLM {vllm.__version__} moved its chat serving class")
    chat_serving.OpenAIServingChat = VersionReportingChat


def main() -> None:
    install()
    from vllm.entrypoints.launchers.api_server.entry import main as vllm_main

    sys.argv[0] = "nemo_tau2_vllm_server"
    vllm_main()


if __name__ == "__main__":
    main()
