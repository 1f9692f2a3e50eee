"""One entry point for every backend: ``start_generation(cfg)`` -> a handle with OpenAI-compatible base URLs.

>>> with start_generation(GenerationConfig(backend="llamacpp", temperature=1.0, top_p=1.0)) as gen:
...     gen.base_urls  # ['http://127.0.0.1:41235/v1']

Every local backend waits for ``/health`` before returning, picks free ports on 127.0.0.1 unless configured, and
on ``shutdown()`` (or leaving the ``with`` block) stops its threads and kills and reaps its processes.
"""

import importlib.util
import json
import logging
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from typing import Any

from nemo_tau2.generation.config import GenerationConfig, HfConfig, LlamacppConfig, OpenAIConfig
from nemo_tau2.generation.errors import GenerationStartupError
from nemo_tau2.generation.prefix_cache import PrefixCacheCounters, read_prefix_cache_counters
from nemo_tau2.generation.serving import ManagedProcess, reserve_port, url_host, wait_until_healthy
from nemo_tau2.generation.weight_stream import WeightStream
from nemo_tau2.processes import register_secret

logger = logging.getLogger(__name__)

LOCAL_API_KEY = "EMPTY"
"""What clients send to our local servers, which check no key (as vLLM without --api-key)."""


class GenerationHandle:
    """A running policy endpoint (or several, one per replica) and how to update its weights and stop it."""

    def __init__(
        self,
        *,
        backend: str,
        base_urls: list[str],
        model_name: str,
        api_key: str = LOCAL_API_KEY,
        stop: Callable[[], None] = lambda: None,
        load_state_dict: Callable[[Mapping[str, Any] | WeightStream], int] | None = None,
        load_checkpoint: Callable[[str], int] | None = None,
        engine: Any = None,
    ) -> None:
        self.backend = backend
        self.base_urls = base_urls
        self.model_name = model_name
        self.api_key = api_key
        self.engine = engine
        """The in-process engine (hf with ``in_process``), else None."""
        self._stop = stop
        self._load_state_dict = load_state_dict
        self._load_checkpoint = load_checkpoint
        self._stopped = False

    def __repr__(self) -> str:  # no api_key: it may be a real secret
        return (
            f"GenerationHandle(backend={self.backend!r}, model_name={self.model_name!r}, base_urls={self.base_urls})"
        )

    def update_weights(
        self, state_dict: Mapping[str, Any] | WeightStream | None = None, *, checkpoint_dir: str | None = None
    ) -> int:
        """Serve new weights without restarting; returns the new weight version (1 after the first update).

        Args:
            state_dict: Tensors keyed like the served model's ``state_dict()``, as a mapping or a
                :class:`~nemo_tau2.generation.weight_stream.WeightStream` (hf in-process only).
            checkpoint_dir: A ``save_pretrained`` directory (hf, both modes; vllm).
        """
        if (state_dict is None) == (checkpoint_dir is None):
            raise ValueError("update_weights: give exactly one of state_dict or checkpoint_dir")
        if state_dict is not None:
            if self._load_state_dict is None:
                raise NotImplementedError(
                    f"backend {self.backend!r} cannot load a state dict in place (only hf with in_process: true); "
                    "save a checkpoint and pass checkpoint_dir"
                )
            return self._load_state_dict(state_dict)
        if self._load_checkpoint is None:
            raise NotImplementedError(f"backend {self.backend!r} serves fixed weights and cannot update them")
        assert checkpoint_dir is not None
        return self._load_checkpoint(checkpoint_dir)

    def prefix_cache_counters(self) -> PrefixCacheCounters | None:
        """vLLM's prefix-cache counters summed over the replicas (None for other backends or when unreadable)."""
        return read_prefix_cache_counters(self.base_urls) if self.backend == "vllm" else None

    def shutdown(self) -> None:
        """Stop servers and processes; safe to call twice."""
        if not self._stopped:
            self._stopped = True
            self._stop()

    def __enter__(self) -> "GenerationHandle":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()


def _require(module: str, backend: str, extra: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise GenerationStartupError(
            f"backend {backend!r} needs the {module} package, which is not installed: install it with "
            f"`uv sync --extra {extra}`"
        )


def _spawn(command: list[str], *, name: str, host: str, port: int, timeout_s: float) -> ManagedProcess:
    process = ManagedProcess(command, name=name)
    try:
        wait_until_healthy(
            f"http://{url_host(host)}:{port}/health", timeout_s=timeout_s, what=name, alive=process.exit_reason
        )
    except BaseException:
        process.stop(grace_s=5)
        raise
    return process


def _post_update(root: str, checkpoint_dir: str) -> int:
    body = json.dumps({"checkpoint_dir": os.path.abspath(checkpoint_dir)}).encode()
    request = urllib.request.Request(f"{root}/update_weights", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            return int(json.loads(response.read())["weight_version"])
    except urllib.error.HTTPError as e:
        raise ValueError(f"update_weights failed: {json.loads(e.read()).get('message')}") from e


def _start_hf(cfg: GenerationConfig, model: Any, tokenizer: Any) -> GenerationHandle:
    _require("transformers", "hf", "training")
    hf_cfg = cfg.backend_block
    assert isinstance(hf_cfg, HfConfig) and cfg.model_name is not None
    if not hf_cfg.in_process:
        from nemo_tau2.generation.hf_server import check_model_source

        check_model_source(cfg.model_name)
        if model is not None:
            raise ValueError("start_generation: a model object can only be served with hf_cfg.in_process: true")
        return _start_hf_subprocess(cfg, hf_cfg)
    from nemo_tau2.generation.hf_engine import HFEngine
    from nemo_tau2.generation.hf_server import InProcessHfServer, load_pretrained, read_chat_template

    if (model is None) != (tokenizer is None):
        raise ValueError("start_generation: give both model and tokenizer, or neither")
    if model is None:
        model, tokenizer = load_pretrained(cfg.model_name, hf_cfg.dtype, hf_cfg.device)
    engine = HFEngine(
        model,
        tokenizer,
        model_name=cfg.model_name,
        max_model_len=hf_cfg.max_model_len,
        max_batch_size=hf_cfg.max_batch_size,
        batch_wait_s=hf_cfg.batch_wait_ms / 1000,
        chat_template=read_chat_template(hf_cfg.chat_template),
    )
    server = InProcessHfServer(engine, hf_cfg)
    return GenerationHandle(
        backend="hf",
        base_urls=[server.base_url],
        model_name=cfg.model_name,
        stop=server.shutdown,
        load_state_dict=engine.update_weights,
        load_checkpoint=engine.update_weights_from_checkpoint,
        engine=engine,
    )


def _start_hf_subprocess(cfg: GenerationConfig, hf_cfg: HfConfig) -> GenerationHandle:
    assert cfg.model_name is not None
    port = reserve_port(hf_cfg.host, hf_cfg.port, key="policy.generation.hf_cfg.port")
    command = [
        sys.executable, "-m", "nemo_tau2.generation.hf_server",
        "--model", cfg.model_name,
        "--host", hf_cfg.host, "--port", str(port),
        "--device", hf_cfg.device, "--dtype", hf_cfg.dtype,
        "--max-batch-size", str(hf_cfg.max_batch_size), "--batch-wait-ms", str(hf_cfg.batch_wait_ms),
        "--parent-pid", str(os.getpid()),
    ]  # fmt: skip
    if hf_cfg.max_model_len is not None:
        command += ["--max-model-len", str(hf_cfg.max_model_len)]
    if hf_cfg.chat_template is not None:
        command += ["--chat-template", hf_cfg.chat_template]
    process = _spawn(command, name="hf_server", host=hf_cfg.host, port=port, timeout_s=hf_cfg.startup_timeout_s)
    root = f"http://{url_host(hf_cfg.host)}:{port}"
    return GenerationHandle(
        backend="hf",
        base_urls=[f"{root}/v1"],
        model_name=cfg.model_name,
        stop=process.stop,
        load_checkpoint=lambda checkpoint_dir: _post_update(root, checkpoint_dir),
    )


def _start_llamacpp(cfg: GenerationConfig) -> GenerationHandle:
    _require("xllamacpp", "llamacpp", "llamacpp")
    from nemo_tau2.generation.llamacpp_server import resolve_gguf

    llama_cfg = cfg.backend_block
    assert isinstance(llama_cfg, LlamacppConfig)
    model_path = resolve_gguf(llama_cfg.model_path)
    if llama_cfg.chat_template is not None and not os.path.isfile(llama_cfg.chat_template):
        raise GenerationStartupError(
            f"policy.generation.llamacpp_cfg.chat_template: no file at {llama_cfg.chat_template!r}"
        )
    model_name = cfg.model_name or model_path.stem
    port = reserve_port(llama_cfg.host, llama_cfg.port, key="policy.generation.llamacpp_cfg.port")
    command = [
        sys.executable, "-m", "nemo_tau2.generation.llamacpp_server",
        "--model-path", str(model_path), "--served-model-name", model_name,
        "--host", llama_cfg.host, "--port", str(port),
        "--n-ctx", str(llama_cfg.n_ctx), "--n-parallel", str(llama_cfg.n_parallel),
        "--n-threads", str(llama_cfg.n_threads or os.cpu_count() or 1),
        "--parent-pid", str(os.getpid()),
    ]  # fmt: skip
    if llama_cfg.chat_template is not None:
        command += ["--chat-template", llama_cfg.chat_template]
    if not llama_cfg.constrain_tool_calls:
        command.append("--no-constrain-tool-calls")
    process = _spawn(
        command, name="llamacpp_server", host=llama_cfg.host, port=port, timeout_s=llama_cfg.startup_timeout_s
    )
    root = f"http://{url_host(llama_cfg.host)}:{port}"
    return GenerationHandle(backend="llamacpp", base_urls=[f"{root}/v1"], model_name=model_name, stop=process.stop)


def _start_vllm(cfg: GenerationConfig) -> GenerationHandle:
    from nemo_tau2.generation.vllm_launcher import VllmReplicas

    replicas = VllmReplicas(cfg)
    assert cfg.model_name is not None
    return GenerationHandle(
        backend="vllm",
        base_urls=replicas.base_urls,
        model_name=cfg.model_name,
        stop=replicas.shutdown,
        load_checkpoint=replicas.update_weights_from_checkpoint,
    )


def register_api_key(cfg: GenerationConfig) -> str | None:
    """The API key an ``openai`` backend's config names (None for other backends), registered as a secret so that
    no child process inherits it: call it before starting any process (the Gym servers' fork server does)."""
    if cfg.backend != "openai" or cfg.openai_cfg is None:
        return None
    return _openai_api_key(cfg.openai_cfg)


def _openai_api_key(cfg: OpenAIConfig) -> str:
    api_key = LOCAL_API_KEY
    if cfg.api_key_env is not None:
        api_key = os.environ.get(cfg.api_key_env, "")
        if not api_key:
            raise GenerationStartupError(
                f"policy.generation.openai_cfg.api_key_env names {cfg.api_key_env!r}, but that environment variable "
                "is not set or empty; export it with the endpoint's API key"
            )
        register_secret(api_key)  # child processes (local servers, Gym servers) do not inherit it
    return api_key


def _start_openai(cfg: OpenAIConfig) -> GenerationHandle:
    api_key = _openai_api_key(cfg)
    base_url = cfg.base_url.rstrip("/")
    if cfg.health_check:
        request = urllib.request.Request(f"{base_url}/models", headers={"Authorization": f"Bearer {api_key}"})
        try:
            with urllib.request.urlopen(request, timeout=cfg.timeout_s) as response:
                response.read()
        except urllib.error.HTTPError as e:
            raise GenerationStartupError(
                f"policy.generation.openai_cfg.base_url: GET {base_url}/models answered HTTP {e.code}; check the URL "
                "and the API key"
            ) from e
        except (urllib.error.URLError, OSError) as e:
            raise GenerationStartupError(
                f"policy.generation.openai_cfg.base_url: cannot reach {base_url}/models ({e}); is it running?"
            ) from e
    return GenerationHandle(backend="openai", base_urls=[base_url], model_name=cfg.model, api_key=api_key)


BACKEND_ENTRY_POINTS = "nemo_tau2.generation_backends"
"""Entry-point group of backends other packages provide: ``name = "module:start"``, ``start(cfg) -> handle``.
The scripted fake (``backend: fake``) is one, provided by ``nemo_tau2.testing`` (see pyproject.toml)."""


def _start_plugin(cfg: GenerationConfig) -> GenerationHandle:
    found = [point for point in entry_points(group=BACKEND_ENTRY_POINTS) if point.name == cfg.backend]
    if not found:
        raise GenerationStartupError(
            f"policy.generation.backend {cfg.backend!r}: no installed package provides it (entry-point group "
            f"{BACKEND_ENTRY_POINTS!r}); reinstall the project (uv sync)"
        )
    return found[0].load()(cfg)


def start_generation(cfg: GenerationConfig, *, model: Any = None, tokenizer: Any = None) -> GenerationHandle:
    """Start (or connect to) the backend named by ``cfg.backend`` and wait until it serves.

    Args:
        cfg: The `policy.generation` block.
        model: hf in-process only: serve this ``PreTrainedModel`` object (e.g. a copy of the model being trained)
            instead of loading ``cfg.model_name``; ``cfg.model_name`` is then only the served name.
        tokenizer: The tokenizer (with a chat template) that goes with ``model``.

    Raises:
        GenerationStartupError: A dependency or file is missing, a configured port is busy, or a server died or
            never became healthy; the message says what to do.
    """
    if model is not None and cfg.backend != "hf":
        raise ValueError(f"start_generation: a model object can only be served by backend 'hf', not {cfg.backend!r}")
    match cfg.backend:
        case "hf":
            return _start_hf(cfg, model, tokenizer)
        case "llamacpp":
            return _start_llamacpp(cfg)
        case "vllm":
            return _start_vllm(cfg)
        case "openai":
            assert cfg.openai_cfg is not None
            return _start_openai(cfg.openai_cfg)
        case _:
            return _start_plugin(cfg)
