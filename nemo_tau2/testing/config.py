"""The fake server's configuration and the bodies of its control route (pydantic: YAML, JSON and HTTP input)."""

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from nemo_tau2.testing.faults import FaultSpec
from nemo_tau2.testing.scripts import DEFAULT_CLOSING_TEXT, ToolCallSpec, Turn, TurnListScript, WhenExhausted
from nemo_tau2.testing.tau2_scripts import Tau2ScriptsConfig


class ToolCallModel(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class TurnSpec(BaseModel):
    """One scripted turn: text, tool calls, or both."""

    model_config = ConfigDict(extra="forbid")

    text: str | None = None
    tool_calls: list[ToolCallModel] = Field(default_factory=list)

    @model_validator(mode="after")
    def _not_empty(self) -> "TurnSpec":
        if not self.text and not self.tool_calls:
            raise ValueError("a turn needs non-empty text or at least one tool call")
        return self

    def to_turn(self) -> Turn:
        calls = tuple(ToolCallSpec(call.name, call.arguments) for call in self.tool_calls)
        return Turn(text=self.text, tool_calls=calls)


class ScriptSpec(BaseModel):
    """A fixed list of turns (:class:`TurnListScript`) in serialisable form."""

    model_config = ConfigDict(extra="forbid")

    turns: list[TurnSpec]
    when_exhausted: WhenExhausted = "repeat_closing"
    closing_text: str = DEFAULT_CLOSING_TEXT
    token_consistent: bool = True

    def to_script(self) -> TurnListScript:
        return TurnListScript(
            turns=[turn.to_turn() for turn in self.turns],
            when_exhausted=self.when_exhausted,
            closing_text=self.closing_text,
            token_consistent=self.token_consistent,
        )


class FakeServerConfig(BaseModel):
    """Everything that configures a fake server (``--config`` of ``python -m nemo_tau2.testing.fake_server``)."""

    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(0, ge=0, le=65535, description="0 picks a free port")
    model: str = Field("fake-model", description="the name /v1/models lists")
    max_model_len: int = Field(131072, ge=1, description="longer prompts (+ max_tokens) get vLLM's 400")
    latency_ms: float = Field(0.0, ge=0.0, description="added to every chat completion (asyncio sleep)")
    token_ids_in_completions: Literal["always", "when_requested", "never"] = Field(
        "always",
        description="when completions carry prompt_token_ids and choices[0].token_ids: always, (as vLLM >= 0.10.2) "
        "only for requests with return_token_ids=true, or (as older vLLM) never; the prompt ids are most of a "
        "response's bytes",
    )
    prefix_correction: bool = Field(
        True,
        description="honour prompt_token_ids + generation_token_ids carried on assistant messages (NeMo-RL's vLLM "
        "server does; stock vLLM does not): false re-renders history, so token-inconsistent scripts break contiguity",
    )
    key_field: str = Field(
        "user", description="request field with the conversation key: a top-level field, or 'metadata.<name>'"
    )
    missing_key: Literal["error", "default", "tau2"] = Field(
        "error",
        description="a request without a key: 400 (error), answered by default_script (default), or keyed by the "
        "tau2 task and side recognised in it among inferred_key_domains' tasks (tau2: for harnesses that send no "
        "key, such as tau2's own runner; nemo_tau2.testing.tau2_inferred_keys)",
    )
    inferred_key_domains: list[str] = Field(
        default_factory=list,
        description="missing_key tau2: the domains whose tasks (tau2.release_tasks' where given) keyless requests are "
        "matched to",
    )
    inferred_key_seeds: dict[int, str] = Field(
        default_factory=dict,
        description="missing_key tau2: a request's seed -> '<domain>|<task_id>' (tau2 sends its run's seed on every "
        "request): names the task where its opening is another task's too",
    )
    default_script: ScriptSpec | None = None
    scripts: dict[str, ScriptSpec] = Field(default_factory=dict, description="scripts for exact keys")
    tau2: Tau2ScriptsConfig | None = Field(
        default_factory=Tau2ScriptsConfig, description="how tau2 keys are played; null: tau2 keys are unknown"
    )
    preload_domains: list[str] = Field(
        default_factory=list, description="tau2 domains loaded at start-up instead of on their first request"
    )
    backlog: int = Field(2048, ge=1, description="listen backlog: hundreds of clients may connect at once")
    faults: list[FaultSpec] = Field(
        default_factory=list, description="fault rules active from the start (as POST /fake/control adds them)"
    )

    @field_validator("inferred_key_seeds")
    @classmethod
    def _seed_tasks_named(cls, value: dict[int, str]) -> dict[int, str]:
        return _checked_seed_tasks(value)

    @model_validator(mode="after")
    def _default_script_if_used(self) -> "FakeServerConfig":
        if self.missing_key == "default" and self.default_script is None:
            raise ValueError("missing_key='default' needs a default_script")
        if self.key_field.startswith("metadata.") and not self.key_field.removeprefix("metadata."):
            raise ValueError(f"key_field {self.key_field!r} names no metadata entry")
        if self.missing_key == "tau2" and (not self.inferred_key_domains or self.tau2 is None):
            raise ValueError(
                "missing_key='tau2' needs inferred_key_domains (the domains whose tasks requests are matched to) "
                "and tau2 scripts enabled"
            )
        if self.preload_domains and self.tau2 is None:
            raise ValueError("preload_domains needs tau2 scripts enabled (tau2 is null)")
        return self


class ControlRequest(BaseModel):
    """Body of ``POST /fake/control``; every field is optional. Applied in field order (clears first)."""

    model_config = ConfigDict(extra="forbid")

    clear_faults: bool = False
    faults: list[FaultSpec] = Field(default_factory=list, description="fault rules to add")
    latency_ms: float | None = Field(None, ge=0.0)
    prefix_correction: bool | None = Field(None, description="switch the splice on or off (see FakeServerConfig)")
    clear_scripts: bool = False
    scripts: dict[str, ScriptSpec] = Field(default_factory=dict, description="scripts to register by exact key")
    tau2: Tau2ScriptsConfig | None = Field(None, description="replace how tau2 keys are played")
    inferred_key_seeds: dict[int, str] = Field(
        default_factory=dict, description="seeds to add to FakeServerConfig.inferred_key_seeds (missing_key tau2)"
    )

    @field_validator("inferred_key_seeds")
    @classmethod
    def _seed_tasks_named(cls, value: dict[int, str]) -> dict[int, str]:
        return _checked_seed_tasks(value)

    reset_stats: bool = False
    reset_conversations: bool = Field(False, description="forget every key's first request (turn bases)")
    weight_version: int | None = Field(
        None, ge=0, description="the label completions report from now on, as if new weights had loaded"
    )


def seed_task(seed: int, task: str) -> tuple[str, str]:
    """``(domain, task_id)`` of an ``inferred_key_seeds`` entry ``'<domain>|<task_id>'``; ValueError naming it."""
    domain, sep, task_id = task.partition("|")
    if not (sep and domain and task_id):
        raise ValueError(f"inferred_key_seeds[{seed}] is {task!r}; expected '<domain>|<task_id>'")
    return domain, task_id


def _checked_seed_tasks(seeds: dict[int, str]) -> dict[int, str]:
    for seed, task in seeds.items():
        seed_task(seed, task)
    return seeds
