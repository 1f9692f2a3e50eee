"""Chat Completions endpoints spoken to as NeMo-Gym's ``vllm_model`` speaks to them, without a server around it.

:class:`ChatEndpoint` is ``fast_vllm_model``'s whole request path (Responses request -> Chat Completions request
with the server's settings -> the endpoint -> Responses object, token ids when configured): the model server wraps
it in routes, and ``Tau2Env`` calls a user-simulator endpoint with it in process.
"""

import json
import time
from collections.abc import Callable
from typing import Any

from responses_api_models.vllm_model.app import VLLMModelConfig

from nemo_tau2.gym.http_client import GymHttpClient, JsonResponse, RetryConfig
from nemo_tau2.gym.model_server import conversion
from nemo_tau2.gym.model_server.conversion import BadRequest


class EndpointError(RuntimeError):
    """The endpoint answered with an error or something that is not a vLLM chat completion."""


class ChatEndpoint:
    """Calls the endpoints of one ``vllm_model`` config (``base_url`` is chosen per call by the caller)."""

    def __init__(
        self,
        config: VLLMModelConfig,
        http: GymHttpClient,
        retry: RetryConfig,
        retry_statuses: frozenset[int] = frozenset(),
    ):
        """``retry_statuses``: endpoint statuses retried here (none in the model server, whose caller retries)."""
        self.config = config
        self.http = http
        self.retry = retry
        self.retry_statuses = retry_statuses
        self.headers = {"Authorization": f"Bearer {config.api_key}", **config.default_headers}

    # ------------------------------------------------------------------ Responses API
    async def responses(self, body: dict, base_url: str) -> dict:
        request = read_request(
            "Responses API",
            lambda: server_settings_applied(
                self.config, conversion.chat_request(body, with_token_ids=self.config.return_token_id_information)
            ),
        )
        completion, token_fields = await self.complete(request, base_url)
        choice = completion["choices"][0]
        output = conversion.output_items(choice["message"], token_fields)
        return conversion.response_object(
            body,
            self.config.model,
            output,
            choice.get("finish_reason"),
            completion.get("usage"),
            float(int(time.time())),
        )

    # ------------------------------------------------------------------ Chat Completions
    async def chat_completion(self, body: dict, base_url: str) -> dict:
        if not isinstance(body.get("messages"), list):
            raise BadRequest("messages must be a list")
        conversion.refuse_streaming(body)
        request = read_request("Chat Completions", lambda: server_settings_applied(self.config, body))
        completion, token_fields = await self.complete(request, base_url)
        completion["choices"][0]["message"].update(token_fields or {})
        return completion

    async def complete(self, request: dict, base_url: str) -> tuple[dict, dict | None]:
        """Call the endpoint: the completion, and its token ids and logprobs when the config asks for them.

        A context-length 400 becomes an empty completion with finish_reason ``length``, as in vllm_model."""
        response = await self._post(f"{base_url}/chat/completions", request, "chat completion")
        if response.status == 400 and ("context length" in response.text or "max_tokens" in response.text):
            return {"choices": [{"index": 0, "finish_reason": "length", "message": {"role": "assistant"}}]}, None
        if response.status != 200:
            raise EndpointError(f"the endpoint answered HTTP {response.status}: {response.text[:500]}")
        completion = response.body
        try:
            choice = completion["choices"][0]
            message = choice["message"]
        except (KeyError, IndexError, TypeError):
            raise EndpointError(f"not a chat completion: {response.text[:300]}") from None
        if message.get("reasoning_content") or message.get("reasoning"):
            raise EndpointError(
                "the endpoint returned reasoning content but uses_reasoning_parser is false: "
                "serve it without a reasoning parser, or use NeMo-Gym's vllm_model with uses_reasoning_parser: true"
            )
        if not self.config.return_token_id_information:
            return completion, None
        token_fields = await self._token_fields(completion, request, base_url)
        choice.pop("logprobs", None)
        return completion, token_fields

    async def _token_fields(self, completion: dict, request: dict, base_url: str) -> dict:
        choice = completion["choices"][0]
        logprobs = (choice.get("logprobs") or {}).get("content")
        if logprobs is None:
            raise EndpointError(
                "per-token logprobs were requested (logprobs, top_logprobs 0, return_tokens_as_token_ids) "
                f"but the answer has none (choice.logprobs={choice.get('logprobs')!r})"
            )
        try:
            generated = [int(entry["token"].removeprefix("token_id:")) for entry in logprobs]
        except (KeyError, ValueError):
            raise EndpointError(
                "logprob tokens are not 'token_id:<id>': the endpoint ignores return_tokens_as_token_ids"
            ) from None
        prompt_ids = completion.get("prompt_token_ids")
        if prompt_ids is None:
            prompt_ids = await self._tokenize(request, base_url)
        fields = {
            "prompt_token_ids": prompt_ids,
            "generation_token_ids": generated,
            "generation_log_probs": [entry["logprob"] for entry in logprobs],
        }
        if isinstance(completion.get("weight_version"), int):  # which weights sampled them (our servers say)
            fields["weight_version"] = completion["weight_version"]
        return fields

    async def _tokenize(self, request: dict, base_url: str) -> list[int]:
        """The prompt ids from ``/tokenize`` (endpoints older than vLLM 0.10.2)."""
        body = {key: request[key] for key in ("model", "messages", "tools", "chat_template_kwargs") if key in request}
        root = base_url.removesuffix("/").removesuffix("/v1")
        response = await self._post(f"{root}/tokenize", body, "tokenize")
        if response.status != 200 or not isinstance(response.body, dict) or "tokens" not in response.body:
            raise EndpointError(f"/tokenize answered HTTP {response.status}: {response.text[:300]}")
        return response.body["tokens"]

    async def _post(self, url: str, body: dict, what: str) -> JsonResponse:
        """One call to the endpoint, with this endpoint's credentials, retry policy and retried statuses."""
        return await self.http.post(
            url, body, self.retry, headers=self.headers, what=what, retry_statuses=self.retry_statuses
        )


def read_request(api: str, convert: Callable[[], Any]) -> Any:
    """Run the request-side conversion of a client's body. It only reshapes that body, so anything it trips on
    (a list where an object belongs, a part without its text) is the request's fault: a 400 that says what."""
    try:
        return convert()
    except BadRequest:
        raise
    except (TypeError, KeyError, AttributeError, IndexError, ValueError, NotImplementedError) as e:  # pydantic too
        raise BadRequest(f"not a {api} request this server can read: {type(e).__name__}: {e}"[:1000]) from e


def server_settings_applied(config: VLLMModelConfig, request: dict) -> dict:
    """The server's settings applied to a chat request (``request`` is changed): vllm_model's preprocessing."""
    if config.replace_developer_role_with_system:
        for message in request["messages"]:
            if message.get("role") == "developer":
                message["role"] = "system"
    request["model"] = config.model
    metadata = request.get("metadata") or {}
    audio = conversion.audio_keys(metadata)
    if audio:
        raise BadRequest(f"metadata {audio}: audio is not supported by fast_vllm_model")
    template_kwargs = dict(config.chat_template_kwargs or {}) | _json_metadata(metadata, "chat_template_kwargs")
    if template_kwargs:
        request["chat_template_kwargs"] = template_kwargs
    extra_body = dict(config.extra_body or {}) | _json_metadata(metadata, "extra_body")
    if config.return_token_id_information:
        request |= {"logprobs": True, "top_logprobs": 0, "return_tokens_as_token_ids": True}
        request["return_token_ids"] = True  # vLLM >= 0.10.2: prompt ids in the answer, no /tokenize call
    if request.get("top_logprobs", 0) is None:
        del request["top_logprobs"]
    return extra_body | request


def _json_metadata(metadata: dict, key: str) -> dict:
    """A JSON-object string in the request's metadata (how per-request extra_body/chat_template_kwargs travel)."""
    raw = metadata.get(key)
    if raw is None:
        return {}
    try:
        value = json.loads(raw)
    except (TypeError, json.JSONDecodeError):
        value = None
    if not isinstance(value, dict):
        raise BadRequest(f"metadata.{key} must be a JSON object encoded as a string, got {raw!r}")
    return value
