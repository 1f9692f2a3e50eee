"""Leases: every process a run starts on a Ray node ends itself when the head stops renewing it.

A node that is stopped or partitioned and comes back, a head killed with -9, a run that ended while a node could not
be reached: in each case the head can no longer stop what it started there, and a process that outlives its run
holds ports and answers requests for a run that is over. So each process ends on its own, without the head:

- the node's launcher actor keeps the node's lease as a file, ``expires <wall-clock seconds>``, which the head
  renews every few seconds (:meth:`NodeLease.renew`, called with the time the head sent the renewal: one delivered
  late, as to a node woken from a stop, extends nothing);
- the launcher, its fork server and every server forked from it read that file (:func:`watch_lease` in a thread,
  :func:`lease_expired` in the fork server's loop) and end themselves, with their children, once it has expired or
  is gone (``cluster.lease_timeout_s`` after the last renewal).

Beside it, each server knows its run's id (``NEMO_TAU2_RUN_ID``); a request naming another run (the
``X-NeMo-Tau2-Run`` header, which the head, the agents and the watcher's probes send) is refused with 409 naming
both ids (:mod:`nemo_tau2.request_guard`): a woken server never answers a new run. A request without the header
(NeMo-Gym's own clients) is served as before; servers started without a lease (one box) are unchanged.
"""

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

from nemo_tau2.request_guard import RUN_ID_ENV, RUN_ID_HEADER

LEASE_FILE_ENV = "NEMO_TAU2_LEASE_FILE"
CHECK_INTERVAL_S = 0.5


def run_headers() -> dict[str, str]:
    """The header naming this process's run, for the requests it sends to the run's servers (none outside a run)."""
    run_id = os.environ.get(RUN_ID_ENV)
    return {RUN_ID_HEADER: run_id} if run_id else {}


class NodeLease:
    """The lease file of one node for one run (written by its launcher; read by every process started there)."""

    def __init__(self, path: Path, timeout_s: float) -> None:
        self.path, self.timeout_s = Path(path), timeout_s
        self.renew(time.time())

    def renew(self, sent_at: float) -> float:
        """Extend the lease to ``sent_at + timeout_s`` (wall clock; never shortened); the expiry it now has."""
        expires = max(sent_at + self.timeout_s, read_expiry(self.path) or 0.0)
        temporary = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        temporary.write_text(f"expires {expires:.3f}\n")
        os.replace(temporary, self.path)  # whole: a reader never sees half a line
        return expires

    def release(self) -> None:
        """End the lease now (a clean stop): the node's processes read it as expired."""
        with contextlib.suppress(OSError):
            self.path.unlink()


def read_expiry(path: str | Path) -> float | None:
    """The lease's expiry (wall clock), or None when the file is gone or unreadable."""
    try:
        word, value = Path(path).read_text().split()
        return float(value) if word == "expires" else None
    except (OSError, ValueError):
        return None


def lease_expired(path: str | Path) -> bool:
    expiry = read_expiry(path)
    return expiry is None or time.time() > expiry


def watch_lease(path: str | Path, on_expiry: Callable[[], None], interval_s: float = CHECK_INTERVAL_S) -> None:
    """Call ``on_expiry`` (which should not return) once the lease at ``path`` has expired: from a daemon thread."""

    def watch() -> None:
        while not lease_expired(path):
            time.sleep(interval_s)
        on_expiry()

    threading.Thread(target=watch, name="nemo-tau2-lease", daemon=True).start()


def end_process_group() -> None:
    """End this process and everything in its process group (a server is its own session: its children too)."""
    print("the run's lease expired (its head stopped renewing it): ending", flush=True)
    with contextlib.suppress(OSError):
        os.killpg(os.getpgid(0), signal.SIGKILL)
    os._exit(1)


def watch_lease_from_env() -> None:
    """In a server started under a lease (``NEMO_TAU2_LEASE_FILE``): end it and its children once the lease
    expires. Nothing without one."""
    path = os.environ.get(LEASE_FILE_ENV)
    if path:
        watch_lease(path, end_process_group)
