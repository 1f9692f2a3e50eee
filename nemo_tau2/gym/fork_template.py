"""A fork template: one warm process from which fork servers (and calls) are forked, their imports already done.

A fork server (:mod:`nemo_tau2.gym.fork_server`) imports the server classes once per Gym stack: 6-9 s of CPU on an
idle 2-core box, more on a busy one. A run starts one stack and pays it once. A test session starts a stack in most
modules, about seventy in all, and paid it about seventy times over (~400 CPU-s of the suite's ~2,600 measured by
process accounting). The template imports the server classes once per test worker; each stack's fork server is then
a ``fork()`` of it, ready at once.

The launcher's side is unchanged but for one argument: ``ForkServer(..., template=fork_template_path())``. The
template is found through :data:`TEMPLATE_ENV` (a Unix socket's path), which only the test session sets
(``tests/conftest.py``); a launcher without it, or one whose interpreter is not the template's, starts its fork server
as an interpreter of its own. Ray-placed servers never use it (their fork server is their node actor's child).

What a forked fork server gets, so that it is the fork server a fresh interpreter would have been:
- the launcher's environment (``child_environment``'s, sent, never inherited from the template), working directory,
  log file and its own session (process group);
- a pidfd of the launcher: it ends when the launcher ends, as ``PR_SET_PDEATHSIG`` makes a fresh one end (its parent
  is the template, with which it also ends);
- the launcher's control socket (the connection itself): the protocol after ``forked`` is the fork server's own.
Secrets never pass through the template: they go from the launcher to each server through a pipe, as before.

A launcher may also ask for a *call* (:func:`nemo_tau2.gym.fork_protocol.call_in_template`): a fork that takes the
launcher's environment, folder and session as above, its stdout pipe and stderr, and calls one ``module:function``
with an argv, as ``python -m module argv`` would have run it; the scripted fake server's subprocess starts so
(~0.07 CPU-s instead of ~1). Only what the launcher's own user could run: the socket is that user's alone (0600).
"""

import contextlib
import importlib
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

from nemo_tau2.gym.fork_protocol import receive_message, send_message
from nemo_tau2.gym.fork_server import _STARTING_SIGTERM, _reap, flush_and_exit, import_server_classes, serve
from nemo_tau2.processes import child_environment, die_with_parent, listening_socket, wait_for_listener

TEMPLATE_ENV = "NEMO_TAU2_FORK_TEMPLATE"
_WAKE: tuple[int, int] = (-1, -1)  # the template's self-pipe for SIGCHLD (main)
_FORKS: dict[int, str] = {}  # the template's forks not yet reaped


def fork_template_path() -> str | None:
    """The fork template this process's stacks fork their fork servers from (``None``: none, the default)."""
    return os.environ.get(TEMPLATE_ENV) or None


class ForkTemplate:
    """Start a fork template listening on ``socket_path``, importing ``preload`` (``module:Class`` paths) at once;
    it ends with this process or at :meth:`stop` (its forked fork servers with it)."""

    def __init__(self, socket_path: Path, preload: list[str], log_path: Path):
        self.socket_path = Path(socket_path)
        with open(log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "nemo_tau2.gym.fork_template", str(self.socket_path), *preload],
                env=child_environment({"PYTHONUNBUFFERED": "1", "OPENBLAS_NUM_THREADS": "1"}, drop_secret_names=True),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        wait_for_listener(self.socket_path, self.process)

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def _take_the_launchers_place(request: dict, log_fds: tuple[int, int]) -> None:
    """In the forked child: leave the template's wake-up pipe, take a session of its own (ended with the template's
    end too), the launcher's environment and folder, and ``log_fds`` as stdout and stderr."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for fd in _WAKE:
        os.close(fd)
    os.setsid()
    die_with_parent()  # the template's end ends it too
    for target, fd in zip((1, 2), log_fds, strict=True):
        os.dup2(fd, target)
    for fd in set(log_fds):
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.path[0] = request["cwd"]  # where ``python -m`` in that folder would have looked first
    extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
    sys.path[1:1] = extra


def _become_fork_server(control: socket.socket, request: dict, log_fd: int, launcher_pidfd: int) -> None:
    """In the forked child: take the launcher's environment, folder and log, then serve as its fork server."""
    code = 1
    try:
        _take_the_launchers_place(request, (log_fd, log_fd))
        send_message(control, {"event": "forked", "pid": os.getpid()})
        serve(control, request["preload"], launcher_pidfd)
        code = 0
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        flush_and_exit(code)


def _become_call(control: socket.socket, request: dict, fds: list[int], launcher_pidfd: int) -> None:
    """In the forked child: take the launcher's environment and folder, its stdout pipe and stderr, then call
    ``request["call"]`` (``module:function``) with ``request["argv"]``, as ``python -m module argv`` would have run,
    and say its exit code on ``control``. The launcher's end ends it (SIGTERM, as ``PR_SET_PDEATHSIG`` would)."""
    code = 1
    try:
        _take_the_launchers_place(request, (fds[0], fds[1]))
        signal.signal(signal.SIGTERM, _STARTING_SIGTERM)
        send_message(control, {"event": "forked", "pid": os.getpid()})
        threading.Thread(target=_end_with_launcher, args=(launcher_pidfd,), daemon=True).start()
        module, function = request["call"].split(":")
        sys.argv = [module, *request["argv"]]
        getattr(importlib.import_module(module), function)(request["argv"])
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(OSError):  # the launcher's exit code: the template reaps this process, not it
            send_message(control, {"event": "exited", "code": code})
        flush_and_exit(code)


def _end_with_launcher(launcher_pidfd: int) -> None:
    select.select([launcher_pidfd], [], [])
    os.kill(os.getpid(), signal.SIGTERM)


def _answer(listener: socket.socket) -> None:
    """One launcher's request: fork a fork server or a call for it, or refuse (it then starts its own process)."""
    connection, _ = listener.accept()
    with connection:
        message, fds = receive_message(connection, max_fds=3)
        wanted = 3 if message is not None and "call" in message else 2
        if message is None or len(fds) != wanted:
            for fd in fds:
                os.close(fd)
            return
        *given, launcher_pidfd = fds
        if (message["python"], message["prefix"]) != (sys.executable, sys.prefix):
            send_message(connection, {"event": "refused", "reason": f"another interpreter: {message['python']}"})
        elif (pid := os.fork()) == 0:
            listener.close()
            if "call" in message:
                _become_call(connection, message, given, launcher_pidfd)
            _become_fork_server(connection, message, given[0], launcher_pidfd)
        else:
            _FORKS[pid] = message.get("call", "fork server")
        for fd in fds:
            os.close(fd)


def main(argv: list[str]) -> None:
    global _WAKE
    socket_path, preload = argv[0], argv[1:]
    _WAKE = os.pipe()
    for fd in _WAKE:
        os.set_blocking(fd, False)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    listener = listening_socket(socket_path)  # before the imports: a launcher that comes early waits, queued
    import warnings

    import_server_classes(preload)
    warnings.filterwarnings("ignore", "This process .* is multi-threaded", DeprecationWarning)  # native threads
    # an ended fork is reaped at once (no zombie for long): its SIGCHLD wakes the loop through this pipe
    signal.set_wakeup_fd(_WAKE[1])
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    try:
        while True:
            readable = select.select([listener, _WAKE[0]], [], [], 0.5)[0]
            if _WAKE[0] in readable:
                with contextlib.suppress(BlockingIOError):
                    os.read(_WAKE[0], 4096)
            if listener in readable:
                _answer(listener)
            _reap(_FORKS, None)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(socket_path)


if __name__ == "__main__":
    main(sys.argv[1:])
