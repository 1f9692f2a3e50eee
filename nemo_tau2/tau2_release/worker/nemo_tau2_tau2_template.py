"""A worker template: one process of a tau2 release's environment that has imported tau2 once, and forks workers.

A worker's start is tau2's import: 5-6 s of CPU on an idle 2-core box (litellm, pandas, openai's types), more on a
busy one, paid by every ``Tau2Worker`` (a resources server starts two). A test session starts dozens. The template
imports what the worker imports from tau2 once; each worker is then a ``fork()`` of it that runs the worker file as
``python -u nemo_tau2_tau2_worker.py`` would, on the requester's pipes, environment and folder.

What a forked worker gets, so that it is the worker a fresh interpreter would have been:
- the requester's stdin, stdout and stderr (pipes and a file, passed over the Unix socket), environment and folder,
  the worker file run as ``__main__``; numpy's global generator reseeded (``random`` reseeds itself at a fork);
- tau2's import-time reads of the environment made with the same values: the template records every variable its
  imports read (tau2's data folder, litellm's and loguru's settings, the proxies httpx looks up) and refuses a
  requester whose environment differs in any of them (the requester then starts its worker as before); an import
  that read the whole environment would make it refuse any environment but its own.
The requester's connection stays open while its worker lives; the template sends the worker's exit status on it
(``{"event": "exited", "status": N}``, negative: the signal), as ``Popen.wait`` would give it. The template ends when
its starter closes its stdin (or ends), or on SIGTERM; workers it forked keep running until their stdin closes.

Protocol (SOCK_SEQPACKET, one JSON object a message): request ``{"python", "env", "cwd", "worker_file"}`` with three
file descriptors (the worker's stdin, stdout, stderr); answer ``{"event": "forked", "pid"}`` or
``{"event": "refused", "reason"}``, later ``{"event": "exited", "status"}``.
"""

import contextlib
import json
import os
import select
import signal
import socket
import sys
import traceback

_WORKER_IMPORTS = (  # what nemo_tau2_tau2_worker and its siblings import from the release: its start's cost
    "loguru",
    "tau2.agent.llm_agent",
    "tau2.data_model.message",
    "tau2.data_model.simulation",
    "tau2.data_model.tasks",
    "tau2.evaluator.evaluator",
    "tau2.evaluator.evaluator_env",
    "tau2.orchestrator.orchestrator",
    "tau2.registry",
    "tau2.runner",
)
_WHOLE_ENVIRONMENT = "*"  # recorded when an import iterated the whole environment for a reason not known here
_PROXIES = "*_proxy"  # recorded when urllib's proxy lookup iterated it (httpx's clients, made at import)


def _import_recording_environment() -> dict:
    """Import the release's modules; the environment variables they read, with the values they saw (None: unset).
    urllib's proxy lookup iterates the environment for ``*_proxy`` names: recorded as those names."""
    environ_type, read = type(os.environ), {}
    original_getitem, original_iter = environ_type.__getitem__, environ_type.__iter__

    def recording_getitem(environ, key):
        try:
            value = original_getitem(environ, key)
        except KeyError:
            read.setdefault(key, None)
            raise
        read.setdefault(key, value)
        return value

    def recording_iter(environ):
        caller = sys._getframe(1)
        while caller is not None and caller.f_globals.get("__name__") in ("os", "_collections_abc", "collections.abc"):
            caller = caller.f_back
        proxies = caller is not None and caller.f_code.co_name == "getproxies_environment"
        read[_PROXIES if proxies else _WHOLE_ENVIRONMENT] = True
        return original_iter(environ)

    environ_type.__getitem__, environ_type.__iter__ = recording_getitem, recording_iter
    try:
        for module in _WORKER_IMPORTS:
            __import__(module)
    finally:
        environ_type.__getitem__, environ_type.__iter__ = original_getitem, original_iter
    return read


def environment_difference(recorded: dict, imported_under: dict, env: dict) -> str | None:
    """The first variable the imports read (under ``imported_under``) whose value ``env`` changes (None: the
    template's imports hold for ``env``)."""
    if _WHOLE_ENVIRONMENT in recorded:
        return None if imported_under == env else "the release's import read the whole environment, which differs"
    if _PROXIES in recorded:
        proxies = [{k: v for k, v in each.items() if k.lower().endswith("_proxy")} for each in (imported_under, env)]
        if proxies[0] != proxies[1]:
            return "the *_proxy variables differ"
    for name, value in recorded.items():
        if name not in (_WHOLE_ENVIRONMENT, _PROXIES) and env.get(name) != value:
            return f"${name} differs"
    return None


def _become_worker(request: dict, fds: list[int], inherited: list) -> None:
    """In the forked child: the requester's pipes, environment and folder, then the worker file as ``__main__``."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        for each in inherited:  # the template's listener, wake-up pipe and other requesters' connections
            each.close() if isinstance(each, socket.socket) else os.close(each)
        for signum in (signal.SIGCHLD, signal.SIGTERM):
            signal.signal(signum, signal.SIG_DFL)
        sys.stdout.flush()
        sys.stderr.flush()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        _show_command_line([sys.executable, "-u", request["worker_file"]])
        sys.argv = [request["worker_file"]]
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()
        import runpy

        runpy.run_path(request["worker_file"], run_name="__main__")
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001  (a fresh interpreter prints it and exits 1)
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def _show_command_line(argv: list[str]) -> None:
    """Have ``/proc/<pid>/cmdline`` (``ps``, psutil) show ``argv``, a fresh worker's command line, rather than the
    template's: written over this process's own argument area (``/proc/self/stat``'s ``arg_start``/``arg_end``),
    which the template's longer command line (its socket's path) leaves room for. Python's ``sys.argv`` is a copy."""
    import ctypes

    with open("/proc/self/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    start, end = int(fields[45]), int(fields[46])  # stat's 48th and 49th fields; these begin at its 3rd
    shown = b"\0".join(os.fsencode(part) for part in argv) + b"\0"
    if len(shown) <= end - start:
        ctypes.memmove(start, shown.ljust(end - start, b"\0"), end - start)


def _send(connection: socket.socket, message: dict) -> None:
    with contextlib.suppress(OSError):  # its requester is gone
        connection.send(json.dumps(message).encode())


def _listening_socket(socket_path: str) -> socket.socket:
    """The listener, at ``socket_path`` only once it accepts and its owner's alone (``nemo_tau2.processes.
    listening_socket``'s way, which this interpreter cannot import): bound at a name of its own with mode 0600,
    listening, then renamed into place, so a requester that sees the path is queued, never refused."""
    staging = os.path.join(os.path.dirname(socket_path), f".{os.getpid()}.sock")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(staging)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    umask = os.umask(0o177)
    try:
        listener.bind(staging)
    finally:
        os.umask(umask)
    listener.listen(64)
    os.replace(staging, socket_path)
    return listener


def main(socket_path: str) -> None:
    wake_read, wake_write = os.pipe()
    for fd in (wake_read, wake_write):
        os.set_blocking(fd, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    listener = _listening_socket(socket_path)  # before the imports: a requester that comes early waits, queued
    imported_under = dict(os.environ)
    recorded = _import_recording_environment()
    workers: dict[int, socket.socket] = {}  # pid -> its requester's connection
    stdin = sys.stdin.fileno()
    while True:
        readable, _, _ = select.select([listener, wake_read, stdin], [], [])
        if stdin in readable and not os.read(stdin, 4096):
            return  # the starter is gone
        if wake_read in readable:
            while True:
                try:
                    if not os.read(wake_read, 4096):
                        break
                except BlockingIOError:
                    break
            _reap(workers)
        if listener in readable:
            _answer(listener, (recorded, imported_under), workers, [listener, wake_read, wake_write])


def _reap(workers: dict) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        connection = workers.pop(pid, None)
        if connection is not None:
            _send(connection, {"event": "exited", "status": os.waitstatus_to_exitcode(status)})
            connection.close()


def _answer(listener: socket.socket, imports: tuple[dict, dict], workers: dict, own: list) -> None:
    """One requester: fork its worker, or refuse (it then starts one of its own)."""
    connection, _ = listener.accept()
    connection.settimeout(5.0)  # a requester sends its request at once; one that does not holds up no other
    try:
        message, fds, _, _ = socket.recv_fds(connection, 1 << 20, 3)
    except OSError:
        connection.close()
        return
    connection.settimeout(None)
    try:
        request = json.loads(message) if message else None
    except ValueError:
        request = None
    if not isinstance(request, dict) or len(fds) != 3:
        reason = "a request is a JSON object with three file descriptors"
    elif os.path.abspath(request.get("python", "")) != os.path.abspath(sys.executable):
        reason = f"another interpreter: {request.get('python')}"
    else:
        reason = environment_difference(*imports, request["env"])
    if reason is not None:
        _send(connection, {"event": "refused", "reason": reason})
        connection.close()
    elif (pid := os.fork()) == 0:
        _become_worker(request, fds, [*own, *workers.values(), connection])
    else:
        workers[pid] = connection
        _send(connection, {"event": "forked", "pid": pid})
    for fd in fds:
        os.close(fd)


if __name__ == "__main__":
    main(sys.argv[1])
