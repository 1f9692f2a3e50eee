"""The tau2 agent as a NeMo-Gym agent server: ``/run`` plays one whole tau2 episode with a simulated user.

``/run`` takes one dataset row (``responses_create_params`` with the policy's system prompt, tools and greeting;
``domain``; ``task_id``) and answers with the resources server's ``/verify`` response (tau2's reward, its
components, the whole transcript in ``response.output`` with per-turn token ids) plus episode data (turns, steps,
termination, token contiguity, timings). An episode that fails for infrastructure reasons (a model or the
resources server unreachable, timing out or erroring after retries) answers HTTP 502 with
``status: infrastructure_error`` and the cause: it is never a zero reward. ``GET /progress`` counts episodes,
model calls and generated tokens as they happen, for callers to show progress inside long episodes.

The policy is NeMo-Gym's ``model_server`` (``policy_model``: ``vllm_model`` for endpoints that return token ids,
``openai_model`` otherwise), so NeMo-RL, which points ``policy_model`` at its own vLLM servers, runs it unchanged.
The user simulator is a separate model server (``user_model_server``).
"""

import dataclasses
import logging
from typing import Any

import orjson
from fastapi import Body, FastAPI, HTTPException, Request, Response
from nemo_gym.base_resources_server import BaseRunRequest
from nemo_gym.base_responses_api_agent import BaseResponsesAPIAgentConfig, SimpleResponsesAPIAgent
from nemo_gym.config_types import ModelServerRef, ResourcesServerRef
from nemo_gym.openai_utils import NeMoGymResponseCreateParamsNonStreaming
from pydantic import ConfigDict, Field, PrivateAttr, field_validator, model_validator

from nemo_tau2.gym.agent.orchestrator import Endpoints, EpisodeOrchestrator
from nemo_tau2.gym.config_keys import GymInstanceConfigMixin, RequestLimitsMixin
from nemo_tau2.gym.episode_config import EpisodeSettings
from nemo_tau2.gym.fast_middleware import FastMiddlewareMixin
from nemo_tau2.gym.http_client import GymHttpClient
from nemo_tau2.gym.task_fields import Tau2TaskFields
from nemo_tau2.tau2_env import ALL_DOMAINS

logger = logging.getLogger(__name__)


class Tau2AgentConfig(EpisodeSettings, GymInstanceConfigMixin, RequestLimitsMixin, BaseResponsesAPIAgentConfig):
    """The agent server's config: its servers and domains, and the episode settings (one schema: EpisodeSettings)."""

    model_config = ConfigDict(extra="allow")

    resources_server: ResourcesServerRef
    resources_server_replicas: list[ResourcesServerRef] = Field(
        default_factory=list,
        description="More instances of the resources server: each new episode goes to the least busy of all of "
        "them and stays there (its session lives there); one that cannot be reached gets no new episodes.",
    )
    model_server: ModelServerRef = Field(description="The policy's model server (NeMo-RL points it at its vLLM).")
    user_model_server: ModelServerRef | None = Field(
        default=None, description="The user simulator's model server: required, and better not the policy's."
    )
    domains: list[str] = Field(default=["airline", "retail", "telecom"], description="Domains this agent plays.")

    @model_validator(mode="before")
    @classmethod
    def _user_model_required(cls, data: Any) -> Any:
        if isinstance(data, dict) and not data.get("user_model_server"):
            raise ValueError(
                "tau2_agent needs a user simulator: set user_model_server to a responses_api_models instance "
                "(e.g. {type: responses_api_models, name: user_model}) pointing at its own endpoint"
            )
        return data

    @field_validator("domains")
    @classmethod
    def _known_domains(cls, value: list[str]) -> list[str]:
        unknown = [domain for domain in value if domain not in ALL_DOMAINS]  # the resources server knows the release
        if unknown:
            raise ValueError(f"unknown domain(s) {unknown}; tau2 domains are: {', '.join(ALL_DOMAINS)}")
        return value


MAX_SAMPLE_INDEX = 1_000_000  # tau2 draws k + 1 numbers to seed trial k


class Tau2AgentRunRequest(Tau2TaskFields, BaseRunRequest):
    model_config = ConfigDict(extra="allow")  # NeMo-Gym agents post the whole dataset row

    sample_index: int | None = Field(
        default=None, ge=0, le=MAX_SAMPLE_INDEX, description="Which sample of the task (tau2's trial: its user seed)."
    )

    @model_validator(mode="after")
    def _rollout_index_is_a_sample_index(self) -> "Tau2AgentRunRequest":
        value = (self.model_extra or {}).get("_ng_rollout_index")  # NeMo-Gym's name for it
        if value is not None and not (type(value) is int and 0 <= value <= MAX_SAMPLE_INDEX):
            raise ValueError(f"_ng_rollout_index must be an integer in 0..{MAX_SAMPLE_INDEX}, got {value!r}")
        return self


_WHOLE_EPISODES_ONLY = "tau2_agent plays whole episodes with a simulated user: POST the dataset row to /run"


class Tau2Agent(FastMiddlewareMixin, SimpleResponsesAPIAgent):
    config: Tau2AgentConfig
    _orchestrator: EpisodeOrchestrator = PrivateAttr()
    _http: GymHttpClient = PrivateAttr()

    def model_post_init(self, context: Any) -> None:
        global_config = self.server_client.global_config_dict
        urls: dict[str, list[str]] = {"resources": [], "policy": [], "user": []}
        for role, ref in (
            ("resources", self.config.resources_server),
            *(("resources", replica) for replica in self.config.resources_server_replicas),
            ("policy", self.config.model_server),
            ("user", self.config.user_model_server),
        ):
            if ref.name not in global_config:
                raise ValueError(
                    f"{self.config.name}: its {role} server {ref.name!r} is not in the config "
                    f"(top-level keys: {sorted(global_config)})"
                )
            urls[role].append(_instance_url(global_config, ref.name))
        if self.config.user_model_server.name == self.config.model_server.name:
            logger.warning(
                "the user simulator is the policy's own model server (self-play): scores are not "
                "comparable with tau2's, which uses a separate user model"
            )
        self._http = GymHttpClient()
        # The config is an EpisodeSettings (one schema): the orchestrator reads its episode fields from it.
        self._orchestrator = EpisodeOrchestrator(
            self._http, Endpoints(urls["resources"], *urls["policy"], *urls["user"]), self.config
        )
        return super().model_post_init(context)

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.get("/progress")(self.progress)
        app.router.on_shutdown.append(self._http.close)
        return app

    def cancel_on_disconnect(self, path: str) -> bool:
        """An episode whose caller has gone (timed out, stopped) is cancelled, which ends its session."""
        return path == "/run"

    async def progress(self) -> dict[str, int]:
        """Episodes running and finished, model calls and generated tokens so far (counters since start-up)."""
        return dataclasses.asdict(self._orchestrator.progress)

    async def responses(self, body: NeMoGymResponseCreateParamsNonStreaming = Body()) -> Any:
        raise HTTPException(status_code=400, detail=_WHOLE_EPISODES_ONLY)

    async def seed_agent_session(self, request: Request) -> Any:
        """NeMo-Gym 0.7.0's ``POST /v1/agent_sessions`` (an outside harness drives an episode turn by turn): a tau2
        episode needs its simulated user between the policy's turns, which only this agent plays."""
        raise HTTPException(status_code=400, detail=_WHOLE_EPISODES_ONLY)

    async def close_agent_session(self, request: Request) -> Any:
        raise HTTPException(status_code=400, detail=_WHOLE_EPISODES_ONLY)

    async def run(self, request: Request, body: Tau2AgentRunRequest) -> Response:
        if body.domain not in self.config.domains:
            raise HTTPException(
                status_code=400,
                detail=f"domain {body.domain!r} is not served by this agent (domains: {self.config.domains})",
            )
        row = body.model_dump(exclude_unset=True)
        try:  # what Python's json reads but no JSON encoder writes again (integers beyond 64 bits)
            orjson.dumps(row)
        except orjson.JSONEncodeError as e:
            raise HTTPException(status_code=400, detail=f"the row cannot be passed on as JSON: {e}") from e
        status, payload = await self._orchestrator.run(row)
        # orjson: a transcript with per-turn token ids is megabytes, and the stdlib encoder was the agent's hot spot.
        return Response(content=orjson.dumps(payload), media_type="application/json", status_code=status)


def _instance_url(global_config: Any, name: str) -> str:
    (block,) = global_config[name].values()
    (instance,) = block.values()
    return f"http://{instance['host']}:{instance['port']}"
