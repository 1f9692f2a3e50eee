"""Start a set of NeMo-Gym server instances on free local ports, wait until they answer, stop them cleanly.

Each instance is its own process, forked from a warm parent that has imported the server classes once
(:mod:`nemo_tau2.gym.fork_server`): CPU-bound servers do not share a GIL, and the stack is up in the time of one
set of imports instead of four or five competing for the cores. All run from the project's environment: no
per-server virtualenvs, no Ray. The global config handed to them is NeMo-Gym's own format, so the same server
classes run unchanged under ``gym env start`` and NeMo-RL.

Secrets stay with the process that needs them. Every process gets the global config (it finds the others there),
so any secret-looking key of an instance's config (``api_key``, ``openai_api_key``, an ``Authorization`` header;
:func:`nemo_tau2.processes.is_secret_key`) is taken out of it and handed to that instance's process alone, through a
pipe only it reads. No server inherits a variable of ours that holds such a value or whose name looks like a
credential. Secrets never appear in a command line or an environment.

Each server logs to ``<log_dir>/<name>.log`` (a line per request, errors with tracebacks); the fork server to
``<log_dir>/fork_server.log``. A line per server is logged (INFO) as it comes up.
"""

import atexit
import logging
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from nemo_tau2.gym.fork_server import ForkServer, ForkServerError, ServerExit
from nemo_tau2.gym.fork_template import fork_template_path
from nemo_tau2.gym.replica_health import ReplicaHealth
from nemo_tau2.gym.serving import CONFIG_DICT_ENV
from nemo_tau2.ports import free_port
from nemo_tau2.processes import is_secret_key, register_secret

logger = logging.getLogger(__name__)


class ServerStartError(RuntimeError):
    """A server process exited or did not answer in time; the message carries the end of its log."""


@dataclass
class ServerSpec:
    """One NeMo-Gym server instance: ``<name>: <server_type>: <impl>: {config}`` served by ``server_class``."""

    name: str
    server_type: str  # resources_servers | responses_api_agents | responses_api_models
    impl: str
    server_class: str  # "module:Class"
    config: dict[str, Any] = field(default_factory=dict)
    port: int | None = None
    host: str | None = None  # None: the launcher's host (a Ray-placed server binds its node's address)


def replica_name(name: str, index: int) -> str:
    """Replica ``index`` of an instance: the first keeps the instance's own name (what rows and configs name)."""
    return name if index == 0 else f"{name}_{index}"


def split_secrets(config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``config`` without its secret-looking keys (at any depth), and those keys alone, nested the same way."""
    public, secrets = {}, {}
    for key, value in config.items():
        if is_secret_key(str(key)) and value is not None:
            secrets[key] = value
        elif isinstance(value, dict):
            public[key], inner = split_secrets(value)
            if inner:
                secrets[key] = inner
        else:
            public[key] = value
    return public, secrets


def gym_global_config(specs: list[ServerSpec], host: str) -> DictConfig:
    """NeMo-Gym's global config dict for these instances, each with a host and a (free) port; without secrets."""
    config: dict[str, Any] = {"head_server": {"host": host, "port": 0}}
    for spec in specs:
        port = spec.port or free_port(spec.host or host)
        instance = {"entrypoint": "app.py", **split_secrets(spec.config)[0], "host": spec.host or host, "port": port}
        config[spec.name] = {spec.server_type: {spec.impl: instance}}
    return OmegaConf.create(config)


def _secret_values(secrets: Any) -> list[str]:
    if isinstance(secrets, dict):
        return [value for item in secrets.values() for value in _secret_values(item)]
    return [str(secrets)]


def _log_tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


FORK_SERVER_LOG = "fork_server.log"


class GymServers:
    """A running set of Gym servers; a context manager. ``url(name)`` gives ``http://host:port`` of an instance.

    ``fork_server``: one already started (and warming up) for these specs' classes; the servers then own it and
    stop it. By default they start their own.
    """

    def __init__(
        self,
        specs: list[ServerSpec],
        host: str = "127.0.0.1",
        log_dir: str | Path | None = None,
        startup_timeout_s: float = 180.0,
        env: dict[str, str] | None = None,
        fork_server: ForkServer | None = None,
    ):
        self.specs = specs
        self.host = host
        self.log_dir = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="nemo_tau2_servers_"))
        self.startup_timeout_s = startup_timeout_s
        self.extra_env = env or {}
        self.global_config = gym_global_config(specs, host)
        self._fork_server = fork_server
        self._pids: dict[str, int] = {}
        self.startup_s: float | None = None
        self.health = ReplicaHealth()  # servers declared lost (by the Ray-placed servers' watcher; none locally)
        self.run_id: str | None = None  # what the servers check requests against (Ray-placed ones; none locally)

    def url(self, name: str) -> str:
        (block,) = self.global_config[name].values()
        (instance,) = block.values()
        return f"http://{instance.host}:{instance.port}"

    def replica_urls(self, name: str) -> list[str]:
        """The URLs of every replica of an instance (:func:`replica_name`): one, unless the servers were replicated."""
        urls, index = [], 0
        while replica_name(name, index) in self.global_config:
            urls.append(self.url(replica_name(name, index)))
            index += 1
        return urls

    def pid(self, name: str) -> int:
        return self._pids[name]

    def process_ids(self) -> list[int]:
        """Every process started for these servers: the servers and their fork server."""
        return list(self._pids.values()) + ([self._fork_server.process.pid] if self._fork_server else [])

    def log_path(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def exited(self) -> list[ServerExit]:
        """The servers that have exited (crashed or were killed) since they started."""
        return self._fork_server.exits() if self._fork_server else []

    def start(self) -> "GymServers":
        began = time.perf_counter()
        secrets = self._prepare()
        if self._fork_server is None:
            classes = sorted({spec.server_class for spec in self.specs})
            self._fork_server = ForkServer(
                classes, self.log_dir / FORK_SERVER_LOG, self.extra_env, template=fork_template_path()
            )
        try:
            config_env = {CONFIG_DICT_ENV: OmegaConf.to_yaml(self.global_config)}
            for spec in self.specs:
                self._pids[spec.name] = self._fork_server.spawn(
                    spec.name,
                    [spec.name, spec.server_class],
                    config_env,
                    secrets[spec.name],
                    self.log_path(spec.name),
                    timeout_s=self.startup_timeout_s,
                )
            self._wait_healthy(began)
        except ForkServerError as e:
            log = self._fork_server.log_path
            self.stop()
            raise ServerStartError(f"{e}; its log ({log}) ends with:\n{_log_tail(log)}") from None
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.perf_counter() - began
        return self

    def _prepare(self) -> dict[str, dict]:
        """Make the log folder, keep the secrets out of every log, stop on exit; each server's secret keys."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        secrets = {spec.name: split_secrets(spec.config)[1] for spec in self.specs}
        for value in _secret_values(secrets):
            register_secret(value)
        atexit.register(self.stop)
        return secrets

    def _wait_healthy(self, began: float) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        pending = {spec.name for spec in self.specs}
        while pending:
            for exit in self.exited():
                raise ServerStartError(
                    f"server {exit.name!r} exited with code {exit.returncode} during start-up; its log "
                    f"({self.log_path(exit.name)}) ends with:\n{_log_tail(self.log_path(exit.name))}"
                )
            for name in sorted(pending):
                try:
                    with urllib.request.urlopen(self.url(name) + "/", timeout=2):
                        pending.discard(name)
                        logger.info(
                            "server %s up at %s after %.1f s (log: %s)",
                            name, self.url(name), time.perf_counter() - began, self.log_path(name),
                        )  # fmt: skip
                except (urllib.error.URLError, OSError):
                    pass
            if pending and time.monotonic() > deadline:
                name = sorted(pending)[0]
                raise ServerStartError(
                    f"server {name!r} did not answer within {self.startup_timeout_s:g} s; its log ends with:\n"
                    f"{_log_tail(self.log_path(name))}"
                )
            if pending:
                time.sleep(0.05)

    def stop(self) -> None:
        """Stop every server and the fork server (idempotent)."""
        if self._fork_server is not None:
            self._fork_server.stop()

    def __enter__(self) -> "GymServers":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
