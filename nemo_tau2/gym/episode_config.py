"""The Gym episode settings, defined once: each key has one schema and one default, wherever it is read from.

- :class:`EpisodeLimits`: tau2's limits and the retries of every call an episode makes. ``env.nemo_gym`` of the eval
  and GRPO configs (:class:`NemoGymEnvConfig`), ``Tau2EnvConfig`` and the agent server's config all *are* this model
  (they inherit it), so ``max_steps`` means the same and defaults to the same everywhere.
- :class:`UserSimulatorConfig`: the ``user`` block of the eval and GRPO configs (the simulated user's own endpoint,
  its sampling, seed and strategy).
- :class:`EpisodeSettings`: what the agent server plays every episode with: the limits plus the user-side settings,
  built from the two above by :meth:`UserSimulatorConfig.episode_settings` and handed to the agent as the object
  (it is the agent config's own schema), never as a hand-built dict.
"""

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from nemo_tau2.generation.validation import GymGenerationConfig
from nemo_tau2.gym.agent.user_strategies import UserStrategyConfig
from nemo_tau2.gym.http_client import RetryConfig
from nemo_tau2.gym.model_server.routing import ReplicaRouting
from nemo_tau2.gym.stack import ModelServerKind

USER_RESPONSES_CREATE_PARAMS_DEFAULTS: dict[str, Any] = {"temperature": 0.0, "max_output_tokens": 1024}
"""The simulated user's sampling unless configured: tau2's temperature 0, and a cap on each message's tokens (tau2's
user messages take tens of tokens; a weak user model left uncapped can write thousands per turn and stall the run)."""

CLUSTER_FOR_REPLICAS = (
    "env.nemo_gym.agent_replicas / resources_replicas above 1 place servers on a Ray cluster: set "
    "cluster.gym_placement=ray (or the replicas to 1)"
)


class EpisodeLimits(BaseModel):
    """tau2's episode limits, the retries of the episode's calls (policy, user simulator, resources server) and how a
    pivot row's text turn is scored."""

    model_config = ConfigDict(extra="forbid")

    max_steps: int = Field(default=200, gt=0, description="tau2's max_steps (every message hop counts).")
    max_errors: int = Field(default=10, gt=0, description="tau2's max_errors: tool errors before termination.")
    max_turns: int | None = Field(default=None, gt=0, description="Policy turns before termination (ours).")
    user_empty_retries: int = Field(default=2, ge=0, description="Retries of an empty user message before user_error.")
    policy_retry: RetryConfig = Field(default_factory=RetryConfig, description="Calls to the policy's model server.")
    user_retry: RetryConfig = Field(default_factory=RetryConfig, description="Calls to the user simulator.")
    resources_retry: RetryConfig = Field(
        default_factory=lambda: RetryConfig(timeout_s=120.0), description="Calls to the tau2 resources server."
    )
    pivot_text_reward: Literal["message", "continue"] = Field(
        default="message",
        description="A pivot row (docs/pivot-rl.md) whose demonstrated turn is text: 'message' scores any text 1 "
        "(NeMo-Gym's verifier); 'continue' plays on from a fork of the pivot's state, the sampled turn first, with "
        "the policy and the simulated user, and scores tau2's reward.",
    )

    def limits(self) -> dict[str, Any]:
        """These fields as they are (typed values, not dumped), to build another model that has them."""
        return {name: getattr(self, name) for name in EpisodeLimits.model_fields}


class EpisodeSettings(EpisodeLimits):
    """Everything the agent server plays an episode with: the limits and the user simulator's settings."""

    user_responses_create_params: dict[str, Any] = Field(
        default_factory=lambda: dict(USER_RESPONSES_CREATE_PARAMS_DEFAULTS),
        description="Sampling params of user simulator calls (NeMo-Gym's responses_create_params keys); keys left "
        "out keep their default: temperature 0 (tau2's) and max_output_tokens 1024 (null: uncapped).",
    )
    user_seed: int | None = Field(
        default=300, description="tau2's run seed: sample k of a task gets tau2's trial-k seed. null: send none."
    )
    user_strategy: UserStrategyConfig = Field(
        default_factory=UserStrategyConfig, description="How the simulated user writes each message (default: tau2's)."
    )

    @field_validator("user_responses_create_params")
    @classmethod
    def _no_top_k_or_stop(cls, value: dict[str, Any]) -> dict[str, Any]:
        banned = sorted(set(value) & {"top_k", "stop", "stop_strings", "input", "tools"})
        if banned:
            raise ValueError(
                f"user_responses_create_params may not set {banned} (not OpenAI-compatible or set by the agent)"
            )
        # the configured keys in their order (the request is tau2's user call, key for key), defaults for the rest
        return value | {k: v for k, v in USER_RESPONSES_CREATE_PARAMS_DEFAULTS.items() if k not in value}


class UserSimulatorConfig(UserStrategyConfig):
    """The simulated user's own endpoint (never the policy's), how it samples (tau2: temperature 0) and its
    strategy (``strategy``, ``max_checks``: :mod:`nemo_tau2.gym.agent.user_strategies`). Its ``generation`` block
    obeys the gym rules, as the policy's does."""

    generation: GymGenerationConfig
    seed: int | None = Field(
        default=EpisodeSettings.model_fields["user_seed"].default,  # one default: the agent's user_seed
        description="tau2's run seed; sample k gets tau2's trial-k seed (the agent's user_seed).",
    )

    def responses_params(self) -> dict[str, Any]:
        """The sampling parameters of every user-model request (the agent's ``user_responses_create_params``)."""
        generation = self.generation
        return {
            "temperature": generation.temperature,
            "top_p": generation.top_p,
            "max_output_tokens": generation.max_new_tokens,
        }

    def strategy_config(self) -> UserStrategyConfig:
        """The strategy part, as the agent server's ``user_strategy`` takes it."""
        fields = self.model_dump(include=set(UserStrategyConfig.model_fields), exclude_unset=True)
        return UserStrategyConfig.model_validate(fields)

    def episode_settings(self, limits: EpisodeLimits) -> EpisodeSettings:
        """The agent's settings: ``limits`` (e.g. ``env.nemo_gym``) played with this user simulator."""
        return EpisodeSettings(
            **limits.limits(),
            user_responses_create_params=self.responses_params(),
            user_seed=self.seed,
            user_strategy=self.strategy_config(),
        )


class NemoGymEnvConfig(EpisodeLimits):
    """``env.nemo_gym``: the tau2 Gym servers (the episode limits, and how the servers are run)."""

    policy_model_server: ModelServerKind = Field(
        default="fast_vllm_model",
        description="Gym model server in front of the policy endpoint: fast_vllm_model (ours: vllm_model's "
        "answers at a fraction of its CPU), NeMo-Gym's vllm_model, or openai_model (no token ids).",
    )
    user_model_server: ModelServerKind = Field(
        default="fast_vllm_model", description="Gym model server in front of the user simulator's endpoint."
    )
    return_token_ids: bool = Field(default=False, description="Per-turn token ids and logprobs (training needs them).")
    policy_chat_template_kwargs: dict[str, Any] | None = Field(
        default=None,
        description="chat_template_kwargs the policy's model server adds to every request (vllm_model's "
        "chat_template_kwargs, e.g. {enable_thinking: false}); NeMo-RL's tokenizer.chat_template_kwargs.",
    )
    replica_routing: ReplicaRouting = Field(
        default="sticky",
        description="With several policy replicas (vLLM data_parallel_size > 1): sticky keeps every turn of an "
        "episode on one replica (its prefix cache), new episodes on the least busy; round_robin spreads turns one "
        "by one. fast_vllm_model only (NeMo-Gym's vllm_model keeps sessions on one replica by itself).",
    )
    session_idle_timeout_s: float = Field(default=1800.0, gt=0, description="The resources server ends idle sessions.")
    turn_timeout_s: float = Field(
        default=30.0,
        gt=0,
        allow_inf_nan=False,
        description="Wall-clock budget of one policy turn and what follows it (user message, tool calls): an "
        "episode's limit is its policy turns (max_turns, else max_steps) times this, unless episode_timeout_s is set.",
    )
    episode_timeout_s: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="Wall-clock limit of one episode, seen from the head; past it the episode is an infrastructure "
        "error that says so. null: (max_turns, else max_steps) x turn_timeout_s.",
    )
    server_startup_timeout_s: float = Field(default=300.0, gt=0, description="Each Gym server must be up by then.")
    agent_replicas: int = Field(
        default=1,
        ge=1,
        description="Agent servers (each with its own policy and user model servers); rows are spread over them, "
        "an episode on one. More than 1 needs cluster.gym_placement=ray.",
    )
    resources_replicas: int = Field(
        default=1,
        ge=1,
        description="tau2 resources servers; each episode's session lives on one. More than 1 needs "
        "cluster.gym_placement=ray.",
    )

    def episode_limit_s(self) -> float:
        """An episode's wall-clock limit (see ``episode_timeout_s``)."""
        if self.episode_timeout_s is not None:
            return self.episode_timeout_s
        return (self.max_turns or self.max_steps) * self.turn_timeout_s

    @model_validator(mode="after")
    def _template_kwargs_need_a_vllm_server(self) -> "NemoGymEnvConfig":
        if self.policy_chat_template_kwargs and self.policy_model_server == "openai_model":
            raise ValueError(
                "policy_chat_template_kwargs: openai_model sends no chat_template_kwargs; set "
                "policy_model_server=fast_vllm_model (or drop the kwargs)"
            )
        if self.replica_routing != "sticky" and self.policy_model_server != "fast_vllm_model":
            raise ValueError(
                f"replica_routing: {self.replica_routing} needs policy_model_server=fast_vllm_model "
                f"({self.policy_model_server} routes by itself); set it, or replica_routing=sticky"
            )
        return self
