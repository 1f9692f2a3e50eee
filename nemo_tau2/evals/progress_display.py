"""How a long run (an evaluation, GRPO) shows its progress: a live bar on a terminal, plain lines anywhere else.

A tqdm bar redraws itself with carriage returns several times a second; written to a file (a cluster job's log,
``nohup``), that is megabytes of one "line" that ``grep`` calls binary. Off a terminal the run therefore logs one
plain line every ``interval_s`` seconds (and one when it ends): episodes done/total (GRPO: steps, and the rollouts of
the current one), running, turns, infrastructure errors, rate. Until the first model answer arrives the line says
that is what the run waits for (a model loading, a first token), instead of showing 0 turns.
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


def log_plainly(name: str = __name__) -> None:
    """Logger ``name``'s records at INFO and up go to stderr as the message alone (not the root handler's
    ``LEVEL name:`` prefix): the progress lines, and what else a front door wants read as plain output."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    plain = logging.getLogger(name)
    plain.setLevel(logging.INFO)
    plain.addHandler(handler)
    plain.propagate = False


class ProgressDisplay:
    """The mechanism: a live tqdm bar on a terminal (its postfix updated in place); off a terminal one plain line
    (logged) at most every ``interval_s`` seconds and one at the end. Subclasses say what the line and the postfix
    hold; :meth:`write` prints a whole line above the bar (or plainly)."""

    def __init__(
        self, total: int, done: int, *, desc: str, unit: str, stream: TextIO | None, interval_s: float
    ) -> None:
        stream = sys.stderr if stream is None else stream
        self.total, self.done, self.initial = total, done, done
        self.snapshot: RolloutProgress | None = None
        self.interval_s = interval_s
        self.started = time.monotonic()
        self._last_line = self.started
        self._bar = None
        if stream.isatty():
            self._bar = tqdm(total=total, initial=done, desc=desc, unit=unit, file=stream)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Close the bar, or log the last plain line."""
        if self._bar is not None:
            self._bar.close()
        else:
            logger.info("%s", self.line())

    def line(self) -> str:
        raise NotImplementedError

    def postfix(self) -> str:
        raise NotImplementedError

    def write(self, text: str) -> None:
        """A whole line of output (a table row) that the bar does not tear."""
        if self._bar is not None:
            self._bar.write(text)
        else:
            print(text, flush=True)

    def _show(self) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(self.postfix())
        elif time.monotonic() - self._last_line >= self.interval_s:
            self._last_line = time.monotonic()
            logger.info("%s", self.line())

    def _advance(self) -> None:
        self.done += 1
        self._show()
        if self._bar is not None:
            self._bar.update(1)

    def on_progress(self, snapshot: RolloutProgress) -> None:
        """The rollout's callback (about once a second): turns and tokens inside the running episodes."""
        self.snapshot = snapshot
        self._show()


class EpisodeProgress(ProgressDisplay):
    """Episodes done, pass rate, infrastructure errors and what runs inside the episodes; ``update`` per episode."""

    def __init__(self, total: int, done: int, *, stream: TextIO | None = None, interval_s: float = PLAIN_INTERVAL_S):
        super().__init__(total, done, desc="tau2 episodes", unit="ep", stream=stream, interval_s=interval_s)
        self.valid = self.successes = self.failures = 0

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

    def postfix(self) -> str:
        infra = f"infra_errors={self.failures}" if self.failures else ""
        return ", ".join(filter(None, [self._pass(), infra, self._live()]))

    def _pass(self) -> str:
        return f"pass={self.successes / self.valid:.1%}" if self.valid else "pass=-"

    def update(self, ok: bool, success: bool) -> None:
        """One episode ended: scored (``ok``), or an infrastructure error."""
        if ok:
            self.valid += 1
            self.successes += success
        else:
            self.failures += 1
        self._advance()


class StepProgress(ProgressDisplay):
    """A training run's steps, with the rollout in progress inside the current one; ``step_done`` per step."""

    def __init__(self, total: int, done: int, *, stream: TextIO | None = None, interval_s: float = PLAIN_INTERVAL_S):
        super().__init__(total, done, desc="GRPO steps", unit="step", stream=stream, interval_s=interval_s)
        self.infra_errors = 0
        self._answered = False  # a model has answered since the run started

    def _rollout(self) -> str:
        snapshot = self.snapshot
        if snapshot is None:
            return "" if self._answered or self.done >= self.total else WAITING
        self._answered = self._answered or bool(snapshot.policy_turns or snapshot.episodes_done)
        if not self._answered:
            return WAITING
        rate = snapshot.episodes_done / max(snapshot.elapsed_s, 1e-9)
        return (
            f"rollouts {snapshot.episodes_done}/{snapshot.episodes_total}, {snapshot.describe()}, "
            f"{rate:.2f} rollouts/s"
        )

    def line(self) -> str:
        """``steps 3/12, rollouts 9/16, 7 running, 41 turns, 52 tok/s, 0.40 rollouts/s, infra_errors=0, 95 s/step``."""
        elapsed = max(time.monotonic() - self.started, 1e-9)
        steps = self.done - self.initial
        per_step = f"{elapsed / steps:.0f} s/step" if steps else ""
        parts = [f"steps {self.done}/{self.total}", self._rollout(), f"infra_errors={self.infra_errors}", per_step]
        return ", ".join(filter(None, parts))

    def postfix(self) -> str:
        infra = f"infra_errors={self.infra_errors}" if self.infra_errors else ""
        return ", ".join(filter(None, [self._rollout(), infra]))

    def step_done(self, infra_errors: int) -> None:
        """A step ended, its rollouts having had ``infra_errors`` infrastructure errors."""
        self.infra_errors += infra_errors
        self.snapshot = None
        self._advance()
