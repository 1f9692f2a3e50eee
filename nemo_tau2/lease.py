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
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from nemo_tau2.request_guard import RUN_ID_ENV, RUN_ID_HEADER

LEASE_FILE_ENV = "NEMO_TAU2_LEASE_FILE"
CHECK_INTERVAL_S = 0.5
RENEWALS_PER_LEASE = 6  # five may be lost before a healthy node's lease runs out


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


def end_process() -> None:
    """End this process now."""
    print("the run's lease expired (its head stopped renewing it): ending", flush=True)
    os._exit(1)


def end_process_group() -> None:
    """End this process and everything in its process group: for a process that leads its own group (a server is
    its own session), never for one that shares another's (a Ray worker shares its raylet's)."""
    if os.getpgid(0) == os.getpid():
        print("the run's lease expired (its head stopped renewing it): ending with its children", flush=True)
        with contextlib.suppress(OSError):
            os.killpg(os.getpid(), signal.SIGKILL)
    end_process()


def watch_lease_from_env() -> None:
    """In a server started under a lease (``NEMO_TAU2_LEASE_FILE``): end it and its children once the lease
    expires. Nothing without one."""
    path = os.environ.get(LEASE_FILE_ENV)
    if path:
        watch_lease(path, end_process_group)


def hold_lease(name: str, timeout_s: float, on_expiry: Callable[[], None]) -> NodeLease:
    """In an actor, once it is up (Ray runs no method, so no renewal, before ``__init__`` returns): the lease
    ``name`` in its node's temporary folder, watched from now on."""
    lease = NodeLease(Path(tempfile.gettempdir()) / f"nemo_tau2_lease_{name}", timeout_s)
    watch_lease(lease.path, on_expiry)
    return lease


class LeaseRenewer:
    """The head's side: every ``timeout_s / RENEWALS_PER_LEASE``, ``renew(time.time())`` on each actor ``actors()``
    lists, in the actor's ``lease`` concurrency group (no long call holds it up), not waited for: a stopped or
    cut-off node's lease runs out, as it should."""

    def __init__(self, timeout_s: float, actors: Callable[[], Iterable[Any]]) -> None:
        self.timeout_s, self._actors = timeout_s, actors
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nemo-tau2-leases", daemon=True)

    def start(self) -> "LeaseRenewer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()

    def _run(self) -> None:
        while not self._stopping.wait(self.timeout_s / RENEWALS_PER_LEASE):
            for actor in list(self._actors()):
                with contextlib.suppress(Exception):
                    actor.renew.options(concurrency_group="lease").remote(time.time())
