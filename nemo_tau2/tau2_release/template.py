"""Start tau2 release workers as forks of a warm template (``worker/nemo_tau2_tau2_template.py``) where one runs.

A worker's start is tau2's import (5-6 s of CPU); the template has done it once, so a forked worker answers its
first request within a second. The template is found through :data:`TEMPLATE_ENV` (its Unix socket's path), which
only the test session sets (``tests/conftest.py``, one template per test process): a run starts its few workers as
interpreters of their own. A template that is not there, runs another interpreter or was imported under another
environment refuses, and the worker is then started as before: the template is a start-up cost saved, never a
different worker. The parity tests' reference scripts (tau2's own code playing and scoring episodes) start the same
way: any file run in the release's interpreter can be forked, since the template changes nothing tau2 imports.
"""

import contextlib
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from nemo_tau2.processes import wait_for_listener

logger = logging.getLogger(__name__)

TEMPLATE_ENV = "NEMO_TAU2_TAU2_TEMPLATE"
TEMPLATE_FILE = Path(__file__).parent / "worker" / "nemo_tau2_tau2_template.py"


class ForkedWorkerProcess:
    """A worker forked by the template, seen as the parts of a ``subprocess.Popen`` the client uses: ``stdin``
    (text, line-buffered), ``stdout``, ``poll``, ``wait`` and ``kill``. Its exit status comes over the connection
    the template keeps with this process (it is the template's child, not ours); its signals go through a pidfd, so
    a recycled pid is never signalled."""

    def __init__(self, pid: int, stdin: TextIO, stdout: BinaryIO, connection: socket.socket):
        self.pid, self.stdin, self.stdout = pid, stdin, stdout
        self._connection = connection
        self._pidfd = os.pidfd_open(pid)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self._status(0.0)

    def wait(self, timeout: float | None = None) -> int:
        status = self._status(timeout)
        if status is None:
            raise subprocess.TimeoutExpired(f"tau2 worker {self.pid}", timeout)
        return status

    def kill(self) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    def _status(self, timeout: float | None) -> int | None:
        if self.returncode is None and select.select([self._connection], [], [], timeout)[0]:
            message = _decode(self._connection.recv(4096))
            # the template gone without a word: its child was reaped by init, its status lost
            self.returncode = message["status"] if message and message.get("event") == "exited" else -signal.SIGKILL
            self._connection.close()
            os.close(self._pidfd)
        return self.returncode


def _decode(raw: bytes) -> dict | None:
    with contextlib.suppress(ValueError):
        message = json.loads(raw) if raw else None
        return message if isinstance(message, dict) else None
    return None


def forked_worker(
    python: str, worker_file: Path, env: dict[str, str], stderr: Any, wait_s: float, cwd: str | Path | None = None
) -> ForkedWorkerProcess | None:
    """The worker forked by this process's template, on new pipes, in ``cwd`` (default: this process's folder);
    ``None`` where there is no template, it refuses, it gives no answer within ``wait_s`` or ``stderr`` is not a
    file (``Popen``'s ``PIPE``): start one as before."""
    path = os.environ.get(TEMPLATE_ENV)
    if not path or (stderr_fd := _file_descriptor(sys.stderr if stderr is None else stderr)) is None:
        return None
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    (stdin_read, stdin_write), (stdout_read, stdout_write) = os.pipe(), os.pipe()
    request = {"python": python, "env": env, "cwd": str(cwd or os.getcwd()), "worker_file": str(worker_file)}
    answer = None
    try:
        connection.connect(path)
        socket.send_fds(connection, [json.dumps(request).encode()], [stdin_read, stdout_write, stderr_fd])
        if select.select([connection], [], [], wait_s)[0]:
            answer = _decode(connection.recv(4096))
    except OSError:
        answer = None
    finally:
        os.close(stdin_read)
        os.close(stdout_write)
    if not answer or answer.get("event") != "forked":
        logger.info("the tau2 worker template at %s did not fork a worker (%s): starting one", path, answer)
        connection.close()
        os.close(stdin_write)
        os.close(stdout_read)
        return None
    stdin = open(stdin_write, "w", buffering=1, encoding="utf-8")  # noqa: SIM115  (closed as Popen's is)
    return ForkedWorkerProcess(answer["pid"], stdin, open(stdout_read, "rb", buffering=0), connection)  # noqa: SIM115


def _file_descriptor(stream: Any) -> int | None:
    if isinstance(stream, int):
        return stream if stream >= 0 else None  # subprocess.PIPE, DEVNULL, STDOUT: Popen's own
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):
        return None


class Tau2WorkerTemplate:
    """Start a template of ``python``'s release listening on ``socket_path`` (it imports tau2 at once, in the
    background); it ends at :meth:`stop` or when this process ends (its stdin, our pipe, closes)."""

    def __init__(self, python: str, socket_path: Path, env: dict[str, str], log_path: Path):
        self.socket_path = Path(socket_path)
        self.socket_path.unlink(missing_ok=True)  # a stale one would be taken for this template's
        with open(log_path, "ab") as log:
            self.process = subprocess.Popen(
                [python, "-u", str(TEMPLATE_FILE), str(self.socket_path)],
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        wait_for_listener(self.socket_path, self.process)

    def stop(self) -> None:
        self.process.stdin.close()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
