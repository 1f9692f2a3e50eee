"""A warm parent for Gym servers: import the heavy libraries once, then fork one process per server.

Every Gym server imports tau2, litellm, NeMo-Gym (with Ray, pandas, wandb, openai, anthropic), FastAPI and uvicorn:
about 8 s of CPU each. Started as separate interpreters, four or five servers paid that four or five times over on
two cores before the first episode. Here one process (the fork server) imports the server classes once, and each
server is a ``fork()`` of it: its own process, pid, process group and log, sharing the imported code copy-on-write.

The fork server forks from its main thread before any event loop exists (each server starts its own uvicorn loop
after the fork); it checks that no other Python thread runs. Native threads started by imports (pyarrow's jemalloc
background thread) are fork-aware.

Isolation, as with separate interpreters:
- **Secrets** go from the launcher straight to the one server that needs them, through a pipe whose read end only
  that server holds: not the fork server, not an environment variable, not a command line.
- **Logs**: the launcher opens each server's log file and hands the descriptor over; the server's stdout and stderr
  are that file.
- **Lifetimes**: each server is its own session (``stop`` takes down anything it spawns); it dies with the fork
  server, which dies with the launcher (``PR_SET_PDEATHSIG``), so a killed launcher leaves no orphan. The fork
  server reaps its servers and tells the launcher which one exited and how. Once they are stopped, its objects are
  frozen (``gc.freeze``) before the interpreter's teardown: the collector walking the ~570,000 objects of the server
  classes' imports took 4.7 s on an idle 2-core box, and 12 s at load 8, in every stop of a Gym stack (the launcher
  waits for it); frozen, it is a fraction of a second (atexit handlers, coverage's among them, still run).

Protocol: JSON messages over a ``SOCK_SEQPACKET`` Unix socket pair (:mod:`nemo_tau2.gym.fork_protocol`).
"""

import contextlib
import gc
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path

from nemo_tau2.gym.fork_protocol import fork_from_template, receive_message, send_message
from nemo_tau2.lease import LEASE_FILE_ENV, lease_expired, watch_lease_from_env
from nemo_tau2.processes import child_environment, die_with_parent

_STOP_GRACE_S = 5.0

# SIGTERM's handler as the interpreter started: a start-up hook's where it is callable (coverage's `sigterm` one saves
# the process's data), else the default. Taken before the fork server or its template install their own, and given
# back to each server, which then ends on SIGTERM as an interpreter of its own would (uvicorn raises it again)
_STARTING_SIGTERM = signal.getsignal(signal.SIGTERM)
if not callable(_STARTING_SIGTERM):
    _STARTING_SIGTERM = signal.SIG_DFL


class ForkServerError(RuntimeError):
    """The fork server could not import the server classes or stopped answering."""


@dataclass
class ServerExit:
    name: str
    pid: int
    returncode: int  # as subprocess's: negative for a signal


# ====================================================================== launcher side


class ForkServer:
    """Handle on a running fork server; :meth:`spawn` starts a server process from it."""

    def __init__(
        self, preload: list[str], log_path: Path, env: dict[str, str] | None = None, template: str | None = None
    ):
        """Start the fork server, which imports ``preload`` (``module:Class`` paths) in the background.

        ``template``: the socket of a fork template (:mod:`nemo_tau2.gym.fork_template`) to fork the fork server from,
        its imports done, instead of starting an interpreter. Where the template cannot (it is gone, or it runs
        another interpreter than this process), the fork server starts as without one."""
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._names: dict[int, str] = {}
        self._exits: list[ServerExit] = []
        self._ready = False
        self._stopped = False
        self.preload_s: float | None = None
        environment = child_environment(
            (env or {}) | {"PYTHONUNBUFFERED": "1", "OPENBLAS_NUM_THREADS": "1"}, drop_secret_names=True
        )
        forked = None
        if template:
            with open(self.log_path, "ab") as log:
                forked = fork_from_template(template, {"preload": preload, "env": environment}, [log.fileno()])
        if forked is not None:
            self.process, self._socket = forked, forked.control
            return
        self._socket, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with theirs, open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "nemo_tau2.gym.fork_server", str(theirs.fileno()), *preload],
                env=environment,
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=[theirs.fileno()],
                start_new_session=True,  # Ctrl-C in the terminal reaches the launcher, which stops everything
                preexec_fn=die_with_parent,
            )

    def wait_ready(self, timeout_s: float) -> None:
        """Block until the fork server has imported everything (:class:`ForkServerError` if it could not)."""
        if not self._ready:
            message = self._next_message(timeout_s, "import the server classes")
            if message.get("event") != "ready":
                raise ForkServerError(f"the fork server could not start: {message.get('error', message)}")
            self._ready, self.preload_s = True, message["preload_s"]

    def spawn(
        self, name: str, argv: list[str], env: dict[str, str], secrets: dict, log_path: Path, timeout_s: float = 60.0
    ) -> int:
        """Fork a server; it runs ``nemo_tau2.gym.serving.main(argv)`` with ``env`` added to its environment,
        ``secrets`` (sent through a pipe only it reads) and ``log_path`` as its stdout and stderr; returns its pid."""
        self.wait_ready(timeout_s)
        read_end, write_end = os.pipe()
        try:
            with open(log_path, "ab") as log:
                request = {"op": "spawn", "name": name, "argv": argv, "env": env}
                send_message(self._socket, request, [log.fileno(), read_end])
        finally:
            os.close(read_end)
        with os.fdopen(write_end, "wb") as pipe:  # a pipe buffer holds far more than a few keys
            pipe.write(json.dumps(secrets).encode())
        message = self._next_message(timeout_s, f"fork server {name!r}")
        if message.get("event") != "spawned":
            raise ForkServerError(f"the fork server could not start server {name!r}: {message}")
        self._names[message["pid"]] = name
        return message["pid"]

    def server_pids(self) -> list[int]:
        """Every server spawned (some may have exited)."""
        return list(self._names)

    def exits(self) -> list[ServerExit]:
        """Every server that has exited so far (reads what the fork server has reported; does not block)."""
        while self._socket.fileno() >= 0 and select.select([self._socket], [], [], 0)[0]:
            message, _ = receive_message(self._socket)
            if message is None:
                break
            self._take(message)
        return list(self._exits)

    def _take(self, message: dict) -> bool:
        """Record an exit report; False for any other message (the caller's answer)."""
        if message.get("event") != "exited":
            return False
        self._exits.append(ServerExit(self._names.get(message["pid"], "?"), message["pid"], message["returncode"]))
        return True

    def _next_message(self, timeout_s: float, doing: str) -> dict:
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ForkServerError(f"the fork server did not {doing} within {timeout_s:g} s")
            if select.select([self._socket], [], [], min(left, 0.5))[0]:
                message, _ = receive_message(self._socket)
                if message is None:
                    raise ForkServerError(
                        f"the fork server exited (code {self.process.poll()}) before it could {doing}"
                    )
                if not self._take(message):
                    return message
            elif self.process.poll() is not None:
                raise ForkServerError(f"the fork server exited with code {self.process.returncode}")

    def stop(self) -> None:
        """Stop every server (SIGTERM to its process group, SIGKILL after a grace period), then the fork server.
        Idempotent: only the first call signals anything (a pid may be reused later)."""
        if self._stopped:
            return
        self._stopped = True
        with contextlib.suppress(OSError):
            self._socket.close()  # end of input: the fork server stops its servers and exits
        try:
            self.process.wait(timeout=_STOP_GRACE_S + 3)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        for pid in self._names:  # normally gone already: the fork server waited for them
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


# ====================================================================== fork-server side


class _Stop(Exception):
    pass


def _raise_stop(signum, frame) -> None:
    raise _Stop


def _serve_in_child(control: socket.socket, message: dict, log_fd: int, secrets_fd: int) -> None:
    """In the forked child: become the server (never returns)."""
    code = 1
    try:
        control.close()
        signal.signal(signal.SIGTERM, _STARTING_SIGTERM)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()
        die_with_parent()
        if os.getppid() == 1:  # the fork server died between fork() and prctl()
            os._exit(1)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
        with os.fdopen(secrets_fd, "rb") as pipe:
            secrets = json.loads(pipe.read() or b"{}")
        os.environ.update(message["env"])
        watch_lease_from_env()  # started under a lease: end with it
        from nemo_tau2.gym.serving import main

        main(message["argv"], secrets=secrets)
        code = 0
    except SystemExit as e:
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        flush_and_exit(code)


def flush_and_exit(code: int) -> None:
    """End a forked child: what it printed reaches its log, and nothing of the parent's (atexit, buffers) runs."""
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def _stop_children(children: dict[int, str], control: socket.socket | None) -> None:
    for pid in children:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + _STOP_GRACE_S
    while children and time.monotonic() < deadline:
        _reap(children, control)
        time.sleep(0.05)
    for pid in list(children):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        children.pop(pid)


def _reap(children: dict[int, str], control: socket.socket | None) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        name = children.pop(pid, "?")
        code = os.waitstatus_to_exitcode(status)
        print(f"server {name!r} (pid {pid}) exited with code {code}", flush=True)
        if control is not None:
            with contextlib.suppress(OSError):
                send_message(control, {"event": "exited", "pid": pid, "returncode": code})


def main(argv: list[str]) -> None:
    serve(socket.socket(fileno=int(argv[0])), argv[1:])


def import_server_classes(preload: list[str]) -> float:
    """Import what serving needs and the ``preload`` classes (``module:Class``); the seconds it took, also printed.
    Once per fork server, or once per fork template for all the fork servers forked from it."""
    began = time.perf_counter()
    import nemo_tau2  # noqa: F401  (offline settings before tau2 loads litellm)
    from nemo_tau2.gym.serving import preload_class, preload_serving

    preload_serving()
    for path in preload:
        preload_class(path)
    seconds = time.perf_counter() - began
    print(f"imported {len(preload)} server classes in {seconds:.1f} s", flush=True)
    return seconds


def serve(control: socket.socket, preload: list[str], launcher_pidfd: int | None = None) -> None:
    """The fork server: import ``preload``, answer ``ready``, then fork a server per request on ``control`` until the
    launcher closes it, its lease ends, or (forked from a template) ``launcher_pidfd`` says the launcher has ended."""
    signal.signal(signal.SIGTERM, _raise_stop)  # the launcher died (PDEATHSIG) or someone stops us
    children: dict[int, str] = {}
    try:
        try:
            preload_s = import_server_classes(preload)
        except Exception as e:
            traceback.print_exc()
            send_message(control, {"event": "error", "error": f"{type(e).__name__}: {e}"})
            return
        if threading.active_count() != 1:  # a Python thread would not survive fork() in the children
            names = [thread.name for thread in threading.enumerate()]
            send_message(control, {"event": "error", "error": f"threads running after the imports: {names}"})
            return
        send_message(control, {"event": "ready", "preload_s": round(preload_s, 3)})
        lease = os.environ.get(LEASE_FILE_ENV)
        watched = [control] if launcher_pidfd is None else [control, launcher_pidfd]
        while not (lease and lease_expired(lease)):  # the head stopped renewing: stop the servers, end
            readable = select.select(watched, [], [], 0.2)[0]
            if launcher_pidfd in readable:
                break  # the launcher has ended (a template's fork has no PDEATHSIG tied to it)
            if control in readable:
                message, fds = receive_message(control, max_fds=2)
                if message is None:
                    break  # the launcher is done (or gone)
                log_fd, secrets_fd = fds
                sys.stdout.flush()
                with warnings.catch_warnings():  # it counts native threads; see the module's docstring
                    warnings.filterwarnings("ignore", "This process .* is multi-threaded", DeprecationWarning)
                    pid = os.fork()
                if pid == 0:
                    _serve_in_child(control, message, log_fd, secrets_fd)
                os.close(log_fd)
                os.close(secrets_fd)
                children[pid] = message["name"]
                print(f"forked server {message['name']!r} as pid {pid}", flush=True)
                send_message(control, {"event": "spawned", "name": message["name"], "pid": pid})
            _reap(children, control)
    except _Stop:
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # finish stopping the servers
        _stop_children(children, None)
        gc.freeze()  # the teardown that follows leaves the imports' objects to the process's end (module docstring)


if __name__ == "__main__":
    main(sys.argv[1:])
