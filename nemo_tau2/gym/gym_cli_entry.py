"""How our servers run under NeMo-Gym's own CLI (``ng_run`` / ``gym env start``): NeMo-Gym's ``run_webserver``, and
an end for the whole run when the process that started it is gone.

``ng_run`` starts each server as ``bash -c "cd <server dir> && <venv setup> && python app.py"`` in its own process
group and, when one server fails to start, raises and exits without stopping the others (its ``shutdown`` runs
only after a successful start). Those servers, ours and NeMo-Gym's own model servers alike, then keep their ports
and Ray connections with nobody to stop them. So each of our servers watches the run:

- the run's head server (a thread of the ``ng_run`` process) refusing connections means ``ng_run`` is gone;
- if the process group we share was led by an ancestor of ours that no longer exists (``ng_run`` as a terminal,
  ``nohup`` or a test starts it), every process left in the group belongs to that dead run: the group gets SIGTERM, and
  SIGKILL 5 s later for whatever ignores it (Ray's agents do), which takes the other servers of the run with us;
- otherwise (the group is alive, as under NeMo-RL's Ray actor) only this server exits.

A head server that is merely slow or busy still accepts connections, so nothing here fires while the run lives.

A SIGTERM to ``ng_run`` ends it at once, without its Ray's shutdown: our servers are gone about 3 s later (the
above), but the raylet's ``RuntimeEnvAgent`` and ``DashboardAgent`` (not in ``ng_run``'s process group) linger for
about 65 s until they notice their raylet is gone. So each server, as it starts, notes the processes below
``ng_run`` that run Ray's code (``.../ray/...`` in their command line, or Ray's ``ray::`` titles), and as it stops
leaves a small reaper (its own session) that waits for ``ng_run`` to end, then sends those same processes (same pid
and start time) SIGTERM, and SIGKILL 5 s later. Nothing else is touched.
"""

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from nemo_tau2.gym.serving import disable_ray_uv_runtime_env

logger = logging.getLogger(__name__)

HEAD_POLL_S = 1.0
HEAD_GONE_AFTER = 3
"""Consecutive refused connections (one per second) that mean the head server, and so the run, is gone."""
KILL_AFTER_S = 5.0
_REAPER = f"""
import os, signal, sys, time
group = int(sys.argv[1])
os.killpg(group, signal.SIGTERM)
time.sleep({KILL_AFTER_S})
try:
    os.killpg(group, signal.SIGKILL)
except ProcessLookupError:
    pass
"""


RAY_REAPER_WAIT_S = 600.0
"""How long the reaper waits for ``ng_run`` to end after our server stopped (it gives up then: the run lives on)."""
# argv: ng_run's pid, then "pid:start_time" of each Ray process it started
_RAY_REAPER = """
import os, signal, sys, time
leader, deadline = int(sys.argv[1]), time.monotonic() + WAIT_S
started = dict(item.split(":") for item in sys.argv[2:])
while time.monotonic() < deadline:  # ng_run ends first
    try:
        os.kill(leader, 0)
    except ProcessLookupError:
        break
    time.sleep(0.5)
else:
    sys.exit(0)

def alive():
    found = []
    for pid, start in started.items():
        try:
            stat = open("/proc/%s/stat" % pid).read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if stat[19] == start and stat[0] != "Z":  # the same process, not a new one under a reused pid
            found.append(int(pid))
    return found

for sig in (signal.SIGTERM, signal.SIGKILL):
    for pid in alive():
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    if sig == signal.SIGTERM and alive():
        time.sleep(KILL_AFTER_S)
""".replace("WAIT_S", repr(RAY_REAPER_WAIT_S)).replace("KILL_AFTER_S", repr(KILL_AFTER_S))


def ancestors(pid: int, depth: int = 8) -> list[int]:
    """The process ids above ``pid`` (parent first), read from /proc; empty where /proc has no such file."""
    chain: list[int] = []
    for _ in range(depth):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # the field after the state; the name may hold spaces
        if pid <= 1:
            break
        chain.append(pid)
    return chain


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def head_server_refuses(host: str, port: int) -> bool:
    """Whether nothing listens at the head server's address any more (a timeout or any other error is not proof)."""
    try:
        with socket.create_connection((host, port), timeout=2):
            return False
    except ConnectionRefusedError:
        return True
    except OSError:
        return False


def end_run(group_led_by_ancestor: bool) -> None:
    """Stop what the gone run left: the whole process group when its dead leader was our ancestor, else us."""
    group = os.getpgrp()
    if group_led_by_ancestor and not _exists(group):
        logger.warning("the ng_run process is gone: stopping the servers it started (process group %d)", group)
        # From outside the group (its own session), so that it outlives the SIGTERM and can send the SIGKILL.
        subprocess.Popen([sys.executable, "-I", "-S", "-c", _REAPER, str(group)], start_new_session=True)
    else:
        logger.warning("the NeMo-Gym head server is gone: this server stops")
        threading.Timer(KILL_AFTER_S, os._exit, (1,)).start()
        os.kill(os.getpid(), signal.SIGTERM)


def watch_run(host: str, port: int) -> threading.Thread:
    """Start a daemon thread that ends the run's processes once its head server is gone (see the module doc)."""
    group_led_by_ancestor = os.getpgrp() in ancestors(os.getpid())

    def watch() -> None:
        refused = 0
        while refused < HEAD_GONE_AFTER:
            time.sleep(HEAD_POLL_S)
            refused = refused + 1 if head_server_refuses(host, port) else 0
        end_run(group_led_by_ancestor)

    thread = threading.Thread(target=watch, name="gym-run-watch", daemon=True)
    thread.start()
    return thread


def _process_table() -> dict[int, tuple[int, str, bytes]]:
    """pid -> (parent pid, start time, command line) of every process /proc shows."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            command = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        table[int(entry)] = (int(fields[1]), fields[19], command)
    return table


def ray_processes_of(leader: int) -> list[str]:
    """``"pid:start_time"`` of each process below ``leader`` that runs Ray's code (its path, or the ``ray::`` title
    Ray's agents and workers take): the processes of the Ray cluster ``ng_run`` started."""
    table = _process_table()
    children: dict[int, list[int]] = {}
    for pid, (parent, _, _) in table.items():
        children.setdefault(parent, []).append(pid)
    found, stack = [], list(children.get(leader, []))
    while stack:
        pid = stack.pop()
        stack += children.get(pid, [])
        _, start, command = table[pid]
        if b"/ray/" in command or command.startswith(b"ray::"):
            found.append(f"{pid}:{start}")
    return found


def reap_ray_after_the_run(leader: int, ray_processes: list[str]) -> None:
    """Leave a reaper (its own session) that stops ``ray_processes`` once ``leader`` (``ng_run``) is gone."""
    if ray_processes:
        command = [sys.executable, "-I", "-S", "-c", _RAY_REAPER, str(leader), *ray_processes]
        subprocess.Popen(command, start_new_session=True)


def run_webserver(server_class: type) -> None:
    """Serve ``server_class`` as ``gym env start`` expects of an ``app.py``, ending with the run that started it."""
    from nemo_gym.server_utils import ServerClient

    disable_ray_uv_runtime_env()
    head = ServerClient.load_head_server_config()
    watch_run(head.host, head.port)
    group = os.getpgrp()  # ng_run leads it when run from a terminal or a test (module docstring)
    ray_processes = ray_processes_of(group) if group in ancestors(os.getpid()) else []  # its Ray started first
    try:
        server_class.run_webserver()
    finally:
        reap_ray_after_the_run(group, ray_processes)
