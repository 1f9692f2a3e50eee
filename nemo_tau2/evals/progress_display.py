"""How an evaluation shows its progress: a live bar on a terminal, plain lines anywhere else.

A tqdm bar redraws itself with carriage returns several times a second; written to a file (a cluster job's log,
``nohup``), that is megabytes of one "line" that ``grep`` calls binary. Off a terminal the run therefore logs one
plain line every ``interval_s`` seconds (and one when it ends): episodes done/total, running, turns, infrastructure
errors, rate. Until the first model answer arrives the line says that is what the run waits for (a model loading,
a first token), instead of showing 0 turns.
"""

import logging
import sys
import time
from typing import TextIO

from tqdm import tqdm

from nemo_tau2.experience.progress import RolloutProgress

logger = logging.getLogger(__name__)

PLAIN_INTERVAL_S = 30.0
"""Seconds between two plain progress lines off a terminal."""
WAITING = "waiting for the first model answer (model loading, prompt processing)"


class EpisodeProgress:
    """Episodes done, pass rate, infrastructure errors and what runs inside the episodes; ``update`` per episode."""

    def __init__(self, total: int, done: int, *, stream: TextIO | None = None, interval_s: float = PLAIN_INTERVAL_S):
        stream = sys.stderr if stream is None else stream
        self.total, self.done, self.initial = total, done, done
        self.valid = self.successes = self.failures = 0
        self.snapshot: RolloutProgress | None = None
        self.interval_s = interval_s
        self.started = time.monotonic()
        self._last_line = self.started
        self._bar = None
        if stream.isatty():
            self._bar = tqdm(total=total, initial=done, desc="tau2 episodes", unit="ep", file=stream)

    def __enter__(self) -> "EpisodeProgress":
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.close()
        else:
            logger.info("%s", self.line())

    def _live(self) -> str:
        if self.snapshot is None or (self.snapshot.policy_turns == 0 and self.done == self.initial):
            return WAITING if self.done < self.total else ""
        return self.snapshot.describe()

    def line(self) -> str:
        """``episodes 12/200 (pass=75.0%), 8 running, 143 turns, 52 tok/s, infra_errors=0, 0.40 ep/s``."""
        elapsed = max(time.monotonic() - self.started, 1e-9)
        rate = f"{(self.done - self.initial) / elapsed:.2f} ep/s"
        parts = [f"episodes {self.done}/{self.total} ({self._pass()})", self._live()]
        return ", ".join(filter(None, [*parts, f"infra_errors={self.failures}", rate]))

    def _pass(self) -> str:
        return f"pass={self.successes / self.valid:.1%}" if self.valid else "pass=-"

    def _show(self) -> None:
        if self._bar is not None:
            infra = f"infra_errors={self.failures}" if self.failures else ""
            self._bar.set_postfix_str(", ".join(filter(None, [self._pass(), infra, self._live()])))
        elif time.monotonic() - self._last_line >= self.interval_s:
            self._last_line = time.monotonic()
            logger.info("%s", self.line())

    def on_progress(self, snapshot: RolloutProgress) -> None:
        """The rollout's callback (about once a second): turns and tokens inside the running episodes."""
        self.snapshot = snapshot
        self._show()

    def update(self, ok: bool, success: bool) -> None:
        """One episode ended: scored (``ok``), or an infrastructure error."""
        self.done += 1
        if ok:
            self.valid += 1
            self.successes += success
        else:
            self.failures += 1
        self._show()
        if self._bar is not None:
            self._bar.update(1)
