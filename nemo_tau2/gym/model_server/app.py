"""``fast_vllm_model``: a NeMo-Gym model server with ``vllm_model``'s config, routes and answers, at a fraction of
its CPU cost per call.

NeMo-Gym's ``vllm_model`` validates every request and response with pydantic and asks the endpoint's ``/tokenize``
for the prompt's token ids after each generation. In a training episode each policy request carries the previous
turn's token ids, so that server spent most of a rollout's CPU (profile in ``BENCHMARKS.md``). This one takes the
same ``VLLMModelConfig``, applies the same mapping on plain dicts (:mod:`.conversion`), and reads the prompt ids
from the completion itself (vLLM >= 0.10.2 returns them with ``return_token_ids``), calling ``/tokenize`` only for
endpoints that do not. With several endpoints (vLLM replicas), every call of a session goes to one of them (its
prefix cache holds the episode's history), new sessions go to the least busy live one, and a replica that cannot
be reached is routed around (:mod:`.routing`).

What it does not do, refused at start-up or per request with a message naming the setting: Responses-native
endpoints, reasoning parsers, ``sequential_reasoning_allowed: false``, audio metadata, and every ``vllm_model`` key
of NeMo-Gym 0.7.0 it does not implement (``sampling_overrides``, ``use_completions_api``, ``reasoning_field``...)
set to anything but its default, and 0.7.0's run-wide ``token_id_capture`` (its token ids ride on the output
items instead). For those, use NeMo-Gym's ``vllm_model``; the tau2 agent works with either
(NeMo-RL points ``policy_model`` at its own ``vllm_model``). 0.7.0's ``supply_prefix_token_ids`` and
``request_prompt_and_generation_token_ids`` are what this server always does with ``return_token_id_information``
(the previous turn's token ids ride on the history for the endpoint's splice; prompt ids come with the completion).
"""

from typing import Any

import orjson
from fastapi import Body, Request, Response
from nemo_gym import base_responses_api_model
from nemo_gym.base_responses_api_model import SimpleResponsesAPIModel
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.server_utils import SESSION_ID_KEY
from pydantic import ConfigDict, Field, PrivateAttr, model_validator
from responses_api_models.vllm_model.app import VLLMModelConfig

from nemo_tau2.gym.config_keys import GymInstanceConfigMixin, RequestLimitsMixin
from nemo_tau2.gym.fast_middleware import FastMiddlewareMixin
from nemo_tau2.gym.http_client import GymHttpClient, InfrastructureError, RetryConfig
from nemo_tau2.gym.model_server.conversion import BadRequest
from nemo_tau2.gym.model_server.endpoint import ChatEndpoint, EndpointError, read_request
from nemo_tau2.gym.model_server.routing import ReplicaRouter, ReplicaRouting
from nemo_tau2.gym.nemo_gym_compat import OwnModelRoutes
from nemo_tau2.gym.serving import disable_ray_uv_runtime_env

_ANTHROPIC = base_responses_api_model._ANTHROPIC_CONVERTER  # the converter NeMo-Gym's /v1/messages uses
_ONLY_VALUE = {"is_responses_native": False, "uses_reasoning_parser": False, "sequential_reasoning_allowed": True}
"""vllm_model keys this server implements for one value only."""
_IMPLEMENTED = frozenset(
    {
        *("host", "port", "entrypoint", "name", "domain", "num_workers", "base_url", "api_key", "model"),
        *("return_token_id_information", "uses_interleaved_reasoning", "replace_developer_role_with_system"),
        *("chat_template_kwargs", "extra_body", "default_headers", "audio_root"),
        # NeMo-Gym 0.7.0: what this server does either way (see the module docstring)
        *("supply_prefix_token_ids", "request_prompt_and_generation_token_ids"),
    }
)
"""vllm_model keys this server implements; any other key (of whichever NeMo-Gym release is installed) must keep
its default."""


def _shown(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else repr(value)


class FastVLLMModelConfig(GymInstanceConfigMixin, RequestLimitsMixin, VLLMModelConfig):
    model_config = ConfigDict(extra="allow")

    request_timeout_s: float = Field(
        default=600.0, gt=0, description="Per endpoint call; one attempt (the agent retries)."
    )
    replica_routing: ReplicaRouting = Field(
        default="sticky",
        description="With several base_url: sticky keeps every call of an episode on one replica (its prefix "
        "cache), new episodes on the least busy; round_robin spreads calls one by one (NeMo-RL's native path).",
    )
    replica_retry_after_s: float = Field(
        default=30.0, gt=0, description="How long a replica that could not be reached gets no calls."
    )

    @model_validator(mode="after")
    def _supported_settings(self) -> "FastVLLMModelConfig":
        refused = []
        for key, field in VLLMModelConfig.model_fields.items():
            if key in _IMPLEMENTED:
                continue
            allowed = _ONLY_VALUE[key] if key in _ONLY_VALUE else field.get_default(call_default_factory=True)
            if getattr(self, key) != allowed:
                refused.append(f"{key}: {_shown(getattr(self, key))}")
        if refused:
            raise ValueError(
                f"fast_vllm_model does not implement {', '.join(refused)}; use NeMo-Gym's vllm_model for that endpoint"
            )
        return self


def _refuse_token_id_capture(global_config: Any) -> None:
    """NeMo-Gym 0.7.0's run-wide ``token_id_capture`` records token ids by wrapping ``vllm_model``'s
    ``_invoke_responses``, which this server's own routes never call: with capture on, its records would silently
    miss every call made here. Token ids reach the trainer on this server's output items instead."""
    capture = (global_config or {}).get("token_id_capture") or {}
    if capture.get("enabled"):
        raise ValueError(
            "fast_vllm_model does not take part in NeMo-Gym's token_id_capture (its items carry the token ids: "
            "return_token_id_information: true); set token_id_capture.enabled: false, or use vllm_model"
        )


class FastVLLMModel(OwnModelRoutes, FastMiddlewareMixin, SimpleResponsesAPIModel):
    config: FastVLLMModelConfig
    _http: GymHttpClient = PrivateAttr()
    _endpoint: ChatEndpoint = PrivateAttr()
    _router: ReplicaRouter = PrivateAttr()

    def model_post_init(self, context: Any) -> None:
        _refuse_token_id_capture(self.server_client.global_config_dict)
        self._http = GymHttpClient()
        urls = self.config.base_url
        self._router = ReplicaRouter(
            [urls] if isinstance(urls, str) else list(urls),
            self.config.replica_routing,
            self.config.replica_retry_after_s,
        )
        retry = RetryConfig(timeout_s=self.config.request_timeout_s, max_attempts=1)
        self._endpoint = ChatEndpoint(self.config, self._http, retry)
        return super().model_post_init(context)

    def setup_webserver(self):
        app = super().setup_webserver()
        app.router.on_shutdown.append(self._http.close)
        return app

    def cancel_on_disconnect(self, path: str) -> bool:
        """A model call whose caller has gone is cancelled, and with it the request to the endpoint."""
        return path in ("/v1/responses", "/v1/chat/completions")

    # ------------------------------------------------------------------ routes (one error boundary)
    async def responses(self, request: Request) -> Response:
        return await self._answer(request, self._endpoint.responses)

    async def chat_completions(self, request: Request) -> Response:
        return await self._answer(request, self._endpoint.chat_completion)

    async def _answer(self, request: Request, handler) -> Response:
        try:
            body = orjson.loads(await request.body())
            if not isinstance(body, dict):
                raise BadRequest("the request body must be a JSON object")
            payload, status = await self._routed(request, handler, body), 200
        except (orjson.JSONDecodeError, BadRequest) as e:
            payload, status = {"detail": f"{type(e).__name__}: {e}"}, 400
        except (EndpointError, InfrastructureError) as e:
            payload, status = self._failed(e), 502
        return Response(content=orjson.dumps(payload), media_type="application/json", status_code=status)

    async def messages(self, request: Request, body: dict = Body()) -> Any:
        """NeMo-Gym's Anthropic Messages route, with this server's error boundary: a request NeMo-Gym's converter
        cannot read is a 400 naming what it tripped on (the converter takes the raw dict), an endpoint failure a
        502."""
        try:
            read_request("Anthropic Messages", lambda: _ANTHROPIC.anthropic_request_to_responses(body))
            return await super().messages(request, body)
        except BadRequest as e:
            status, detail = 400, f"{type(e).__name__}: {e}"
        except (EndpointError, InfrastructureError) as e:
            return Response(content=orjson.dumps(self._failed(e)), media_type="application/json", status_code=502)
        return Response(content=orjson.dumps({"detail": detail}), media_type="application/json", status_code=status)

    def _failed(self, e: EndpointError | InfrastructureError) -> dict[str, str]:
        """A 502's body: ``detail`` with where the endpoint failed, ``cause`` without (what the agent records)."""
        return {"detail": f"{self.config.name}: {e}", "cause": f"{self.config.name}: {getattr(e, 'cause', e)}"}

    async def _invoke_responses(
        self, request: Request, params: NeMoGymResponseCreateParamsNonStreaming
    ) -> NeMoGymResponse:
        """The Gym base's /v1/messages (Anthropic) route goes through here."""
        body = params.model_dump(exclude_unset=True)
        return NeMoGymResponse.model_validate(await self._routed(request, self._endpoint.responses, body))

    async def _routed(self, request: Request, handler, body: dict) -> Any:
        """Call ``handler`` on this session's replica; one that does not answer at all is set aside (the agent's
        retry of the turn then goes to a live replica)."""
        with self._router.call(request.session[SESSION_ID_KEY]) as base_url:
            try:
                return await handler(body, base_url)
            except InfrastructureError as e:
                if e.unreachable:
                    self._router.unreachable(base_url)
                raise


if __name__ == "__main__":
    disable_ray_uv_runtime_env()
    FastVLLMModel.run_webserver()
