"""NeMo-Gym 0.7.0's own tau2 agent (``responses_api_agents/tau2``), installed and served offline for
``bench/peer_nemo_gym_tau2.py``, as its README has a user run it: ``ng_run`` with its ``configs/tau2.yaml`` and
NeMo-Gym's ``vllm_model`` for the policy and the user, from the 0.7.0 environment ``scripts/setup.sh gym07`` builds.

What differs from their README, and why (each is what a user without GitHub must do):

- **tau2.** Their ``requirements.txt`` installs tau2 from a fork's branch on GitHub, and their agent clones tau2's
  ``data/`` from git at start-up (``NEMO_GYM_TAU2_BENCH_REPO_URL`` / ``_REF``). Here both come from a local git
  repository made from the vendored tau2 v1.0.1 (``../shared/vendor/tau2-bench-1.0.1``, or
  ``$NEMO_TAU2_TAU2_V1_SOURCE``), on a branch with :mod:`peer_tau2_shim` (what their agent needs of the fork).
- **Their venv** is built once (cached under ``~/.cache/nemo-tau2/peer-nemo-gym-tau2``) as their requirements say,
  tau2 from that repository, versions held to the 0.7.0 environment's and tau2 v1.0.1's (litellm: v1.0.1 needs
  >= 1.80.15). ``ng_run`` uses it as is (``uv_venv_dir`` + ``skip_venv_if_present``), for NeMo-Gym's ``vllm_model``
  and ``legacy_agent`` servers too (they need only nemo-gym).
- **Their folder** is overlaid by links in a run folder (NeMo-Gym finds server folders from the working directory
  first), so the ``tau2_data/`` their agent writes beside its ``app.py`` lands there, not in the 0.7.0 environment.
"""

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import yaml
from peer_measure import kill_side
from peer_tau2_shim import SHIM_REVISION, apply_shim

ROOT = Path(__file__).resolve().parents[1]
AGENT_FOLDER = "responses_api_agents/tau2"
SHIM_BRANCH = "nemo_gym_shim"
READY = re.compile(r"All \d+ / \d+ servers ready")


def site_packages(python: Path) -> Path:
    return Path(subprocess.check_output([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                        text=True).strip())  # fmt: skip


def base_python(python: Path) -> Path:
    return Path(
        subprocess.check_output([str(python), "-c", "import sys; print(sys._base_executable)"], text=True).strip()
    )


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=bench", "-c", "user.email=bench@localhost", *args],
                   check=True, capture_output=True)  # fmt: skip


@dataclass
class TheirInstall:
    repo: Path  # the local tau2 repository their agent installs and clones data from
    venvs: Path  # NeMo-Gym's uv_venv_dir: <type>/<name>/.venv
    python: Path  # their agent's interpreter
    gym07_python: Path
    uv: Path

    @property
    def ref(self) -> str:
        return SHIM_BRANCH


def install(cache: Path, tau2_source: Path, gym07_python: Path, tau2_v1_python: Path, uv: Path) -> TheirInstall:
    """Their agent's tau2 repository and venv, built on first use (~15 s; PyPI for the packages uv has not cached)."""
    key = hashlib.sha256(f"{SHIM_REVISION}|{tau2_source.resolve()}|{gym07_python}".encode()).hexdigest()[:12]
    home = cache / key
    repo, venvs = home / "tau2-bench", home / "venvs"
    agent_venv = venvs / AGENT_FOLDER / ".venv"
    done = home / "installed"
    if not done.exists():
        shutil.rmtree(home, ignore_errors=True)
        shutil.copytree(tau2_source, repo, ignore=shutil.ignore_patterns(".git", "results", "__pycache__", ".venv"))
        _git(repo, "init", "-q", "-b", "v1.0.1")
        _git(repo, "add", "-A")
        _git(repo, "commit", "-qm", "tau2-bench v1.0.1 (vendored)")
        _git(repo, "checkout", "-q", "-b", SHIM_BRANCH)
        apply_shim(repo)
        _git(repo, "commit", "-qam", "what NeMo-Gym 0.7.0's tau2 agent needs of its fork (bench/peer_tau2_shim.py)")
        constraints = home / "constraints.txt"
        constraints.write_text(_constraints(uv, gym07_python, tau2_v1_python))
        env = os.environ | {"UV_CONFIG_FILE": str(ROOT / "scripts/uv_python_3.13.14.toml")}
        env.pop("VIRTUAL_ENV", None)
        subprocess.run([str(uv), "venv", "-q", "--seed", "--python", str(base_python(gym07_python)), str(agent_venv)],
                       check=True, env=env)  # fmt: skip
        requirements = home / "requirements.txt"  # theirs, with tau2 from the local repository
        requirements.write_text(
            f"nemo-gym==0.7.0\ntau2[knowledge] @ git+file://{repo}@{SHIM_BRANCH}\nrank-bm25>=0.2.2\nopenai>=1.0.0\n"
            "audioop-lts>=0.2.2\n"
        )
        subprocess.run([str(uv), "pip", "install", "-q", "--python", str(agent_venv / "bin/python"), "-c",
                        str(constraints), "-r", str(requirements)], check=True, env=env)  # fmt: skip
        for folder in ("responses_api_models/vllm_model", "environment_servers/legacy_agent"):
            (venvs / folder).mkdir(parents=True, exist_ok=True)
            (venvs / folder / ".venv").symlink_to(agent_venv)
        done.write_text("ok\n")
    return TheirInstall(repo, venvs, agent_venv / "bin/python", gym07_python, uv)


def _constraints(uv: Path, gym07_python: Path, tau2_v1_python: Path) -> str:
    def frozen(python: Path) -> dict[str, str]:
        text = subprocess.check_output([str(uv), "pip", "freeze", "--python", str(python)], text=True)
        pins = {}
        for line in text.splitlines():
            name = line.split("==")[0].lower().replace("_", "-")
            if "==" in line and not name.startswith(("tau2", "nemo-tau2", "-e")):
                pins[name] = line.strip()
        return pins

    tau2_pins = frozen(tau2_v1_python)
    pins = tau2_pins | frozen(gym07_python) | {"litellm": tau2_pins["litellm"]}  # v1.0.1 needs litellm >= 1.80.15
    return "\n".join(sorted(pins.values())) + "\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TheirServers:
    """``ng_run`` of their agent (``num_workers`` uvicorn processes), its policy and user on ``base_url`` through
    NeMo-Gym's ``vllm_model`` (their training config), in a session of its own: ``session`` names its processes."""

    def __init__(
        self,
        their: TheirInstall,
        base_url: str,
        num_workers: int,
        run_dir: Path,
        model: str,
        max_steps: int | None,
        max_tokens: int,
    ) -> None:
        self.their, self.base_url, self.num_workers, self.run_dir = their, base_url, num_workers, run_dir
        self.model, self.max_steps = model, max_steps or 200  # 200: their agent config's
        self.max_tokens = max_tokens  # the user's, through their user_llm_args (the policy's: the row's)
        self.process: subprocess.Popen | None = None
        self.agent_url = ""
        self.startup_s = 0.0

    @property
    def session(self) -> int:
        return self.process.pid

    def __enter__(self) -> "TheirServers":
        run = self.run_dir
        overlay = run / AGENT_FOLDER
        overlay.mkdir(parents=True, exist_ok=True)
        source = site_packages(self.their.gym07_python) / AGENT_FOLDER
        for item in [*source.iterdir()]:
            if item.name not in ("tau2_data", "__pycache__") and not (overlay / item.name).exists():
                (overlay / item.name).symlink_to(item)
        config = {
            "config_paths": [f"{AGENT_FOLDER}/configs/tau2.yaml",
                             "responses_api_models/vllm_model/configs/vllm_model_for_training.yaml"],
            "user_model": {"responses_api_models": {"vllm_model": {
                "entrypoint": "app.py", "base_url": "${user_base_url}", "api_key": "${user_api_key}",
                "model": "${user_model_name}", "return_token_id_information": False, "uses_reasoning_parser": False}}},
            "tau2_agent": {"responses_api_agents": {"tau2": {
                "user_model_server": {"type": "responses_api_models", "name": "user_model"},
                "num_workers": self.num_workers, "max_steps": self.max_steps,
                "user_llm_args": {"max_tokens": self.max_tokens}}}},
        }  # fmt: skip
        (run / "their_tau2.yaml").write_text(yaml.safe_dump(config))
        uv_cache = subprocess.check_output([str(self.their.uv), "cache", "dir"], text=True).strip()
        (run / "env.yaml").write_text(yaml.safe_dump({
            "policy_base_url": self.base_url, "policy_api_key": "EMPTY", "policy_model_name": self.model,
            "user_base_url": self.base_url, "user_api_key": "EMPTY", "user_model_name": self.model,
            "uv_cache_dir": uv_cache, "uv_venv_dir": str(self.their.venvs), "skip_venv_if_present": True,
            "head_server": {"host": "127.0.0.1", "port": free_port()},
        }))  # fmt: skip
        bins = [self.their.gym07_python.parent, self.their.uv.parent, base_python(self.their.gym07_python).parent]
        env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")} | {
            "PATH": os.pathsep.join([*map(str, bins), os.environ["PATH"]]),
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "RAY_ADDRESS": "local",
            "UV_CONFIG_FILE": str(ROOT / "scripts/uv_python_3.13.14.toml"),
            "NEMO_GYM_TAU2_BENCH_REPO_URL": f"file://{self.their.repo}",
            "NEMO_GYM_TAU2_BENCH_REF": self.their.ref,
        }
        log = run / "ng_run.log"
        began = time.perf_counter()
        with log.open("w") as out:
            self.process = subprocess.Popen([str(self.their.gym07_python.parent / "ng_run"), "--config",
                                             "their_tau2.yaml"], cwd=run, env=env, stdout=out,
                                            stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        try:
            while (url := _agent_url(text := log.read_text(errors="replace"))) is None:
                if self.process.poll() is not None:
                    raise RuntimeError(f"their ng_run exited {self.process.returncode}: {text[-2000:]}")
                if time.perf_counter() - began > 600:
                    raise RuntimeError(f"their ng_run was not ready in 600 s (log: {log})")
                time.sleep(0.5)
            self.startup_s, self.agent_url = time.perf_counter() - began, url
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        """SIGTERM to ng_run (it stops its servers), then whatever of its session is left (Ray's agents linger)."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(30)
        kill_side(self.session)
        self.process.wait()


def _agent_url(log: str) -> str | None:
    """Their agent's URL from ng_run's listing of its server instances, printed once every server is ready."""
    ready = READY.search(log)
    if ready is None or (at := log.find("tau2_agent (responses_api_agents/tau2)", ready.end())) < 0:
        return None
    found = re.search(r"'url': '([^']+)'", log[at:])
    return found.group(1) if found else None


def their_rows(their: TheirInstall, tau2_data: Path, episodes: list[tuple[str, str, int]], **settings) -> list[dict]:
    """One row per ``(domain, task_id, seed)`` (:mod:`peer_their_rows`, in their agent's environment)."""
    request = json.dumps({"episodes": episodes, **settings})
    env = os.environ | {"TAU2_DATA_DIR": str(tau2_data), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    out = subprocess.run([str(their.python), str(Path(__file__).with_name("peer_their_rows.py"))], input=request,
                         capture_output=True, text=True, env=env)  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"their rows: {out.stderr[-2000:]}")
    return [json.loads(line) for line in out.stdout.splitlines()]
