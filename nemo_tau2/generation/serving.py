"""Running servers: free ports, a uvicorn app on a background thread, subprocesses that die with us, health waits.

Every server binds 127.0.0.1 unless configured otherwise. A configured port that is taken is reported before
anything starts; a server that exits or never becomes healthy is reported with the end of its log.
"""

import atexit
import contextlib
import logging
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import uvicorn
from fastapi import FastAPI

from nemo_tau2.generation.errors import GenerationStartupError
from nemo_tau2.ports import bind_free_port
from nemo_tau2.processes import child_environment, die_with_parent

logger = logging.getLogger(__name__)

SHUTDOWN_GRACE_S = 1.0
"""How long a stopping endpoint server lets requests in flight finish before cancelling them (uvicorn's default is
to wait for them all: a long generation kept a stopping llama.cpp server alive for a minute)."""


def bind_socket(host: str, port: int | None, *, key: str, wait_s: float = 0.0) -> socket.socket:
    """A listening-ready socket on ``host:port`` (``port`` None: a free one), or a clear error if it is taken.

    A free port is drawn outside the kernel's ephemeral range (:mod:`nemo_tau2.ports`). ``wait_s``: how long a port
    that is taken may take to be freed (a restart while the old server's process is still going away)."""
    if not port:
        try:
            return bind_free_port(host, reuse_address=True)
        except OSError as e:
            raise GenerationStartupError(f"{key}: {e}; free some ports or configure one") from e
    deadline = time.monotonic() + wait_s
    while True:
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
            return sock
        except OSError as e:
            sock.close()
            if time.monotonic() >= deadline:
                raise GenerationStartupError(
                    f"{key}: port {port} on {host} is already in use ({e.strerror}); choose another port or set "
                    "it to null to pick a free one"
                ) from e
        time.sleep(0.2)


def reserve_port(host: str, port: int | None, *, key: str) -> int:
    """Check ``port`` is free (or find a free one) for a server that binds it itself."""
    with bind_socket(host, port, key=key) as sock:
        return sock.getsockname()[1]


def url_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "") else (f"[{host}]" if ":" in host else host)


def wait_until_healthy(
    url: str, *, timeout_s: float, what: str, alive: Callable[[], str | None] = lambda: None
) -> None:
    """Poll ``url`` until it answers 200; ``alive`` returns a reason when the server has died."""
    deadline = time.monotonic() + timeout_s
    delay = 0.05
    while True:
        reason = alive()
        if reason is not None:
            raise GenerationStartupError(f"{what} stopped before becoming healthy: {reason}")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        if time.monotonic() > deadline:
            raise GenerationStartupError(f"{what} did not become healthy at {url} within {timeout_s:.0f} s")
        time.sleep(delay)
        delay = min(delay * 1.5, 1.0)


class BackgroundServer:
    """A FastAPI app served by uvicorn on a daemon thread of this process (its own event loop)."""

    def __init__(self, app: FastAPI, host: str, port: int | None, *, key: str) -> None:
        self._socket = bind_socket(host, port, key=key)
        self.host = host
        self.port: int = self._socket.getsockname()[1]
        config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=5)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, name=f"uvicorn-{self.port}", daemon=True
        )

    @property
    def base_url(self) -> str:
        return f"http://{url_host(self.host)}:{self.port}"

    def start(self, timeout_s: float) -> None:
        self._thread.start()
        alive = lambda: None if self._thread.is_alive() else "the server thread exited (see the log above)"  # noqa: E731
        wait_until_healthy(f"{self.base_url}/health", timeout_s=timeout_s, what="the in-process server", alive=alive)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)
        self._socket.close()
        if self._thread.is_alive():
            logger.warning("uvicorn thread on port %d did not stop within 30 s", self.port)


_LIVE_PROCESSES: set["ManagedProcess"] = set()


@atexit.register
def _kill_leftovers() -> None:
    for process in list(_LIVE_PROCESSES):
        process.stop(grace_s=2)


def kill_managed_processes() -> None:
    """SIGKILL every live server this process started, with its children (a lease ran out: no grace)."""
    for process in list(_LIVE_PROCESSES):
        process._signal_group(signal.SIGKILL)


class ManagedProcess:
    """A server subprocess in its own process group, logged to a file, killed with its children on stop or exit.

    The log is a temporary file, deleted after a clean stop (kept when the process failed), unless ``log_dir`` is
    given: then it is ``<log_dir>/<name>.log``, appended to and always kept (a run's results keep its servers'
    logs beside their own, ``server_logs/``)."""

    def __init__(
        self, command: list[str], *, name: str, env: dict[str, str] | None = None, log_dir: Path | None = None
    ) -> None:
        self.name = name
        if log_dir is None:
            fd, self.log_path = tempfile.mkstemp(prefix=f"nemo_tau2_{name}_", suffix=".log")
            self._log = os.fdopen(fd, "wb")
        else:
            Path(log_dir).mkdir(parents=True, exist_ok=True)
            self.log_path = str(Path(log_dir) / f"{name}.log")
            self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop(), as the temporary one
        self._keep_log = log_dir is not None
        self._failed = False
        logger.info("starting %s: %s (log: %s)", name, " ".join(command), self.log_path)
        self._process = subprocess.Popen(
            command,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env if env is not None else child_environment(),
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        _LIVE_PROCESSES.add(self)

    @property
    def pid(self) -> int:
        return self._process.pid

    def exit_reason(self) -> str | None:
        """None while running, else the exit code and the end of the log."""
        code = self._process.poll()
        if code is None:
            return None
        self._failed = True  # keep the log for the user
        return f"exit code {code}; last lines of {self.log_path}:\n{self.log_tail()}"

    def log_tail(self, lines: int = 25) -> str:
        with open(self.log_path, "rb") as f:
            return b"\n".join(f.read().splitlines()[-lines:]).decode(errors="replace")

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM the process group, SIGKILL it after ``grace_s``, reap the process; the log is kept on failure."""
        if self not in _LIVE_PROCESSES:
            return
        if self._process.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                self._process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                self._process.wait()
        self._signal_group(signal.SIGKILL)  # children that outlived their parent
        self._log.close()
        if not self._failed and not self._keep_log:
            os.unlink(self.log_path)
        _LIVE_PROCESSES.discard(self)

    def _signal_group(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is already gone
            os.killpg(self._process.pid, sig)
