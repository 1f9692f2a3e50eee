"""The vLLM surface as a FastAPI app over any :class:`~nemo_tau2.generation.engine.Engine`.

Routes: ``POST /v1/chat/completions`` (non-streaming, one choice, token ids + logprobs, Hermes tool calls),
``POST /tokenize`` and ``POST /detokenize`` (no /v1 prefix, as vLLM), ``GET /v1/models``, ``GET /health``.
The full contract is /work/helper_briefs/vllm_surface.md, mirrored in this package's README. Both the prompt of a
chat completion and the ``tokens`` of ``/tokenize`` come from :func:`prompt_ids_for`, so they always agree,
prefix-correction splice included.
"""

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.requests import Request

from nemo_tau2.generation.engine import Engine, GenerationRequest
from nemo_tau2.generation.errors import BadRequestError, EngineError
from nemo_tau2.generation.prefix import REQUIRED_PREFIX_FIELD, find_token_prefix, splice_prompt
from nemo_tau2.generation.protocol import (
    ChatCompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
    chat_completion_response,
    error_body,
    logprobs_content,
    normalize_messages,
    normalize_tools,
)
from nemo_tau2.generation.tool_calls import ParsedOutput, parse_hermes_tool_calls
from nemo_tau2.request_guard import RequestBodyGuard

logger = logging.getLogger(__name__)

DEFAULT_TEMPERATURE = 1.0
DEFAULT_TOP_P = 1.0


async def prompt_ids_for(
    engine: Engine,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    chat_template_kwargs: dict[str, Any] | None,
    add_generation_prompt: bool = True,
    required_prefix_token_ids: list[int] | None = None,
) -> list[int]:
    """The prompt token ids for a chat: the template's rendering, spliced onto recorded ids when the request has
    them (NeMo-RL's ``required_prefix_token_ids``, else an assistant message's ``prompt_token_ids``)."""
    prefix = find_token_prefix(messages, required_prefix_token_ids)
    rendered = await engine.render(
        normalize_messages(messages), normalize_tools(tools), chat_template_kwargs or {}, add_generation_prompt
    )
    if prefix is None:
        return rendered
    source = REQUIRED_PREFIX_FIELD if required_prefix_token_ids is not None else "messages"
    return splice_prompt(prefix, rendered, engine.end_of_turn_ids, source)


def _check_model(engine: Engine, model: str | None) -> None:
    if model is not None and model != engine.model_name:
        raise BadRequestError(f"The model `{model}` does not exist; this server serves `{engine.model_name}`.", 404)


def _context_error(engine: Engine, prompt_len: int) -> BadRequestError:
    return BadRequestError(
        f"This model's maximum context length is {engine.max_model_len} tokens. However, your request has "
        f"{prompt_len} prompt tokens, which leaves no room to generate. Please reduce the length of the messages."
    )


async def chat_completion(engine: Engine, body: ChatCompletionRequest) -> dict[str, Any]:
    """Serve one chat completion (see module docstring)."""
    body.check_supported()
    _check_model(engine, body.model)
    mode, allowed_tools = body.tool_choice_mode()
    if mode == "required" and not engine.supports_forced_tool_choice:
        raise BadRequestError(
            f"tool_choice: {body.tool_choice!r} needs constrained decoding, which this backend does not have; "
            "send tool_choice='auto'"
        )
    prompt_ids = await prompt_ids_for(
        engine, body.messages, body.tools, body.chat_template_kwargs, True, body.required_prefix_token_ids
    )
    room = engine.max_model_len - len(prompt_ids)
    if room <= 0:
        raise _context_error(engine, len(prompt_ids))
    asked = body.max_tokens or body.max_completion_tokens or room
    top_logprobs = body.top_logprobs or 0
    result = await engine.generate(
        GenerationRequest(
            prompt_ids=prompt_ids,
            max_tokens=min(asked, room),
            temperature=DEFAULT_TEMPERATURE if body.temperature is None else body.temperature,
            top_p=DEFAULT_TOP_P if body.top_p is None else body.top_p,
            seed=body.seed,
            top_logprobs=top_logprobs,
            tools=normalize_tools(allowed_tools) if mode != "none" else None,
            tool_choice=mode,
        )
    )
    if body.tools and mode != "none":
        parsed = parse_hermes_tool_calls(result.text)
    else:
        parsed = ParsedOutput(content=result.text or None, tool_calls=[])
    logprobs = None
    if body.logprobs:
        logprobs = logprobs_content(result.tokens, top_logprobs, as_ids=bool(body.return_tokens_as_token_ids))
    return chat_completion_response(
        model=engine.model_name, prompt_ids=prompt_ids, result=result, parsed=parsed, logprobs=logprobs
    )


async def tokenize(engine: Engine, body: TokenizeRequest) -> dict[str, Any]:
    """Serve /tokenize: ``tokens`` equal the prompt a chat completion of the same messages would use."""
    _check_model(engine, body.model)
    if (body.messages is None) == (body.prompt is None):
        raise BadRequestError("tokenize: send exactly one of `messages` or `prompt`")
    if body.messages is not None:
        tokens = await prompt_ids_for(
            engine,
            body.messages,
            body.tools,
            body.chat_template_kwargs,
            body.add_generation_prompt,
            body.required_prefix_token_ids,
        )
    else:
        add_special = True if body.add_special_tokens is None else body.add_special_tokens
        tokens = await engine.tokenize(body.prompt or "", add_special)
    return {"count": len(tokens), "max_model_len": engine.max_model_len, "tokens": tokens, "token_strs": None}


def build_app(engine: Engine, *, extra_routes: Callable[[FastAPI], None] | None = None) -> FastAPI:
    """A FastAPI app serving the vLLM surface from ``engine``; ``extra_routes`` adds backend-specific routes."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await engine.aclose()

    app = FastAPI(title="nemo-tau2 policy endpoint", lifespan=lifespan)
    # Size, JSON depth, Unicode: 4xx before any route; a generation whose client has gone is cancelled.
    app.add_middleware(
        RequestBodyGuard, error_body=error_body, cancel_on_disconnect=lambda path: path == "/v1/chat/completions"
    )

    @app.exception_handler(BadRequestError)
    async def _bad_request(_: Request, exc: BadRequestError) -> JSONResponse:
        return JSONResponse(error_body(str(exc), exc.status), status_code=exc.status)

    @app.exception_handler(EngineError)
    async def _engine_failed(_: Request, exc: EngineError) -> JSONResponse:
        logger.error("engine failure: %s", exc)
        return JSONResponse(error_body(f"the model backend failed: {exc}", 500), status_code=500)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'][1:])}: {e['msg']}" for e in exc.errors())
        return JSONResponse(error_body(f"invalid request: {problems}", 400), status_code=400)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": engine.model_name,
                    "object": "model",
                    "owned_by": "nemo-tau2",
                    "max_model_len": engine.max_model_len,
                }
            ],
        }

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest) -> dict[str, Any]:
        return await chat_completion(engine, body)

    @app.post("/tokenize")
    async def tokenize_route(body: TokenizeRequest) -> dict[str, Any]:
        return await tokenize(engine, body)

    @app.post("/detokenize")
    async def detokenize_route(body: DetokenizeRequest) -> dict[str, Any]:
        _check_model(engine, body.model)
        return {"prompt": await engine.detokenize(body.tokens)}

    if extra_routes is not None:
        extra_routes(app)
    return app
