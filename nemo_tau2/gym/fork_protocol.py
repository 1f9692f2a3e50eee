"""The messages between a launcher, a fork template and the fork servers, and the launcher's side of a template.

JSON messages over ``SOCK_SEQPACKET`` Unix sockets: one message per packet, descriptors alongside.

A launcher asks a fork template (:mod:`nemo_tau2.gym.fork_template`) for a fork of it, its imports done, in one of two
shapes: a fork server for a Gym stack (``preload``), or a call of one function (``call``: ``module:function``, given
``argv``) as ``python -m module argv`` would have run it in a process of its own. Either way the fork takes the
launcher's environment and folder, its own session, and ends when the launcher ends (a pidfd of the launcher goes with
the request, as ``PR_SET_PDEATHSIG`` ends a fresh child). Where the template cannot serve (it is gone, or runs another
interpreter), the launcher gets ``None`` and starts the process as it would without a template.
"""

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import IO

_MAX_MESSAGE = 1 << 20
_TEMPLATE_WAIT_S = 180.0  # a template still importing (the session's first stack) answers when it is done


def send_message(sock: socket.socket, message: dict, fds: list[int] = ()) -> None:
    socket.send_fds(sock, [json.dumps(message).encode()], list(fds))


def receive_message(sock: socket.socket, max_fds: int = 0) -> tuple[dict | None, list[int]]:
    data, fds, _, _ = socket.recv_fds(sock, _MAX_MESSAGE, max_fds)
    return (json.loads(data) if data else None), fds


class TemplateFork:
    """A process forked by a fork template: the template's child, not this process's, so its end is read from a
    pidfd and the template reaps it. ``returncode``, once it has ended: a call's (``call_in_template``) says its exit
    code on the control socket as it exits; one that ended without saying was ended by a signal (``-signum`` of the
    last one sent from here, else ``-SIGKILL``); a fork server's is 0. What a launcher uses of a ``subprocess.Popen``
    (``stdout``: the read end of its stdout, where the launcher asked for one).
    """

    def __init__(self, pid: int, control: socket.socket, reports_exit: bool):
        self.pid, self.control, self.returncode = pid, control, None
        self.stdout: IO[str] | None = None
        self.reports_exit = reports_exit  # a call's fork says its exit code before it ends
        self._pidfd = os.pidfd_open(pid)
        self._last_signal: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self._pidfd], [], [], 0)[0]:
            self.returncode = self._exit_code() if self.reports_exit else 0
            os.close(self._pidfd)
        return self.returncode

    def _exit_code(self) -> int:
        said = None
        with contextlib.suppress(OSError):
            if select.select([self.control], [], [], 0)[0]:
                said = receive_message(self.control)[0]
        self.control.close()
        if said and said.get("event") == "exited":
            return int(said["code"])
        return -(self._last_signal or signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None and not select.select([self._pidfd], [], [], timeout)[0]:
            raise subprocess.TimeoutExpired("a fork of the fork template", timeout)
        return self.poll()

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:  # a pidfd's signal never reaches a reused pid
            self._last_signal = signum
            signal.pidfd_send_signal(self._pidfd, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def fork_from_template(path: str, request: dict, fds: list[int]) -> TemplateFork | None:
    """Ask the fork template at ``path`` for a fork that ``request`` describes (``preload`` or ``call``, and ``env``),
    ``fds`` handed to it; None where the template cannot give one (then start the process anew)."""
    control = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        control.connect(path)
        full = request | {"cwd": os.getcwd(), "python": sys.executable, "prefix": sys.prefix}
        launcher = os.pidfd_open(os.getpid())  # the fork ends with this process, as PDEATHSIG would have it
        try:
            send_message(control, full, [*fds, launcher])
        finally:
            os.close(launcher)
        message = receive_message(control)[0] if select.select([control], [], [], _TEMPLATE_WAIT_S)[0] else None
        if message and message.get("event") == "forked":
            return TemplateFork(message["pid"], control, reports_exit="call" in request)
    except OSError:
        pass
    control.close()
    return None


def call_in_template(
    path: str, target: str, argv: list[str], env: dict[str, str], stderr_path: Path | None = None
) -> TemplateFork | None:
    """Run ``target`` (``module:function``, called with ``argv``) in a fork of the template at ``path``: its stdout a
    pipe read from the returned handle's ``stdout``, its stderr appended to ``stderr_path`` (None: ours). None where
    the template cannot (then start ``python -m module`` as without one)."""
    read_end, write_end = os.pipe()
    try:
        with open(stderr_path, "ab") if stderr_path is not None else open(os.dup(2), "wb") as stderr:
            forked = fork_from_template(path, {"call": target, "argv": argv, "env": env}, [write_end, stderr.fileno()])
    finally:
        os.close(write_end)
    if forked is None:
        os.close(read_end)
        return None
    forked.stdout = open(read_end, encoding="utf-8")  # noqa: SIM115  (the handle's, as a Popen's stdout is)
    return forked
