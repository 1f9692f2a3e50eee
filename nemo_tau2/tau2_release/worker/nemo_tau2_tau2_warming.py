"""Warm a task's gold side while its episode is played, so the episode's verify finds the gold DB hash memoised.

tau2 v1.0.1's ``evaluate_simulation`` replays the task's gold actions and hashes the gold DB on every verify; the
worker memoises tau2's hash on the DB's content (``nemo_tau2_tau2_snapshots.ContentHashes``), so only a task's
first verify pays for it (airline ~70 ms, retail ~35 ms). An episode lasts many LLM turns, in which the scoring
worker is mostly idle: when the episode is seeded, the scoring worker forks a child that runs tau2's own
``EnvironmentEvaluator.calculate_reward`` on the task with the trajectory of an agent that did nothing (so the
gold DB and the task's initial DB are hashed, by tau2), and sends back the hashes it computed with their content
keys. The parent adopts them into its memo. Nothing a child does reaches the parent except those (key, hash)
pairs, and a key is the DB's content, so a warm-up can only turn a later hash into a memo hit, never change an
answer. The parent keeps answering while children work, and forks one only when no request waits (a fork holds
the parent ~16 ms at ~250 MB resident).

A fork leaves every page of the parent write-protected: its next writes to each (reference counts included) take
a page fault, so its next verify costs ~2.5 ms more (airline, retail, telecom alike). Once a child's hashes are
adopted, no child runs and no request waits, the parent replays the same warm-up itself (every hash now a memo hit:
~2-4 ms, off any request), which takes those faults before the task's verify would; a verify that comes first
drops it.

A verify of a task whose warm-up is running waits for it (it would compute the same hashes), at most
``verify_wait_s``; one whose warm-up is still queued drops it and computes them itself. A child that fails, outlives
``timeout_s`` or the verify's wait is dropped (killed); its task is then scored exactly as without the warm-up.
"""

import os
import pickle
import select
import signal
import time
import traceback
from collections import OrderedDict
from dataclasses import dataclass, field


@dataclass
class _Child:
    pid: int
    key: tuple
    started: float = field(default_factory=time.monotonic)
    chunks: list = field(default_factory=list)


class GoldWarming:
    """Warm-ups queued by task, one forked child at a time (each is a CPU-bound tau2 replay and hash)."""

    def __init__(self, hashes, warm_one, timeout_s: float = 60.0, max_children: int = 1, verify_wait_s: float = 5.0):
        self._hashes = hashes
        self._warm_one = warm_one  # (domain, task_id) -> None, run in the child: tau2's evaluator on the task
        self._timeout_s = timeout_s
        self._verify_wait_s = verify_wait_s  # longer than a healthy child takes (a fraction of a second); then cold
        self._max_children = max_children
        self._queued: OrderedDict = OrderedDict()
        self._children: dict[int, _Child] = {}  # by the read end of its pipe
        self._done: set = set()
        self._to_settle: OrderedDict = OrderedDict()  # warmed tasks the parent replays once no child runs
        self.failed = 0
        self.settled = 0

    def request(self, domain: str, task_id: str) -> dict:
        """Queue the task's warm-up (once per task); its child starts when no request waits (:meth:`start_next`)."""
        key = (domain, str(task_id))
        if key not in self._done and key not in self._queued and not self._running(key):
            self._queued[key] = None
        return {"queued": key in self._queued}

    def stats(self) -> dict:
        return {
            "warmed": len(self._done),
            "queued": len(self._queued),
            "running": [[*child.key, child.pid] for child in self._children.values()],
            "failed": self.failed,
            "settled": self.settled,
            "hashed": self._hashes.computed,
            "adopted": self._hashes.adopted,
        }

    def fds(self) -> list[int]:
        """The pipes to watch beside stdin."""
        return list(self._children)

    def poll_timeout(self) -> float | None:
        """How long the worker may wait for a request: not at all when a child could start, else until a running
        child is due to be checked."""
        if self._queued and len(self._children) < self._max_children or self._to_settle and not self._children:
            return 0.0
        return 1.0 if self._children else None

    def on_readable(self, fd: int) -> None:
        child = self._children[fd]
        data = os.read(fd, 1 << 16)
        if data:
            child.chunks.append(data)
            return
        del self._children[fd]
        os.close(fd)
        _, status = os.waitpid(child.pid, 0)
        if status == 0:
            try:
                self._hashes.adopt(pickle.loads(b"".join(child.chunks)))
                self._done.add(child.key)
                self._to_settle[child.key] = None
            except Exception:  # noqa: BLE001  (a cut-off answer: the task is scored as without the warm-up)
                traceback.print_exc()
                self.failed += 1
        else:
            self.failed += 1

    def drop_overdue(self) -> None:
        for fd, child in list(self._children.items()):
            if time.monotonic() - child.started > self._timeout_s:
                self._kill(fd)
                self.failed += 1

    def before_scoring(self, domain: str, task_id: str) -> None:
        """A verify of the task is next: take its warm-up's hashes if it is running, else drop it from the queue."""
        key = (domain, str(task_id))
        self._queued.pop(key, None)
        for fd, child in list(self._children.items()):
            if child.key != key:
                continue
            until = min(child.started + self._timeout_s, time.monotonic() + self._verify_wait_s)
            while fd in self._children:
                remaining = until - time.monotonic()
                if remaining <= 0:  # a child stuck (e.g. on a lock a thread held at the fork): scored as without it
                    self._kill(fd)
                    self.failed += 1
                    break
                readable, _, _ = select.select([fd], [], [], remaining)
                if readable:
                    self.on_readable(fd)
        self._to_settle.pop(key, None)  # the verify takes the faults itself

    def close(self) -> None:
        for fd in list(self._children):
            self._kill(fd)

    def _running(self, key: tuple) -> bool:
        return any(child.key == key for child in self._children.values())

    def _kill(self, fd: int) -> None:
        child = self._children.pop(fd)
        os.close(fd)
        os.kill(child.pid, signal.SIGKILL)
        os.waitpid(child.pid, 0)

    def start_next(self) -> None:
        """Fork the next queued warm-ups' children (the worker calls this when no request waits: a fork blocks
        the worker for ~16 ms)."""
        if not self._queued and not self._children and self._to_settle:
            self._settle(*self._to_settle.popitem(last=False)[0])
        while self._queued and len(self._children) < self._max_children:
            key, _ = self._queued.popitem(last=False)
            read_end, write_end = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: never returns
                os.close(read_end)
                self._child(key, write_end)
            os.close(write_end)
            self._children[read_end] = _Child(pid, key)

    def _settle(self, domain: str, task_id: str) -> None:
        """The warm-up replayed in the parent after the forks (its hashes memo hits): a page fault taken here is one
        the task's verify does not take. The verdict is discarded, as the child's is."""
        try:
            self._warm_one(domain, task_id)
            self.settled += 1
        except Exception:  # noqa: BLE001  (reported on stderr; the verify is scored as it would be anyway)
            traceback.print_exc()

    def _child(self, key: tuple, write_end: int) -> None:
        code = 1
        try:
            self._hashes.fresh = []
            self._warm_one(*key)
            data = memoryview(pickle.dumps(self._hashes.fresh))
            while data:
                data = data[os.write(write_end, data) :]
            code = 0
        except BaseException:  # noqa: BLE001  (reported on stderr; the parent scores as without the warm-up)
            traceback.print_exc()
        finally:
            os._exit(code)
