"""What a run of the GPU kit (``bench/gpu_check.py``) keeps about itself: its peak-memory meter, its time budget, the
commit it ran, and the one GRPO step every measurement of the torch path times.

A loan is short (15 minutes of device time, start included), so the check runs under ``--budget-s``: before each
unit of work (a shape's torch path, its Megatron step, its generation) it compares the time left with what the unit
took on an H200 (``H200_S``, from the 2026-11-27 records, ``shared/measurements/``), scaled by how this run's finished
units compared with their own H200 times, and skips the unit when it would overrun; the shape's record then names
what was skipped and why. A unit already started is never cut short.
"""

import math
import subprocess
import time
from pathlib import Path

import torch

H200_S = {
    "torch": {"0.6b": 30.0, "1.7b": 30.0, "4b": 55.0, "8b": 50.0},
    "megatron": {"0.6b": 35.0, "1.7b": 35.0, "4b": 65.0, "8b": 60.0},
    "generation": {"0.6b": 15.0, "1.7b": 15.0, "4b": 20.0, "8b": 25.0},
}
"""Seconds a unit takes on one H200 at the kit's defaults (``--max-tokens 32768``, ``--steps 2``, the Megatron step at
the torch path's timed micro-batch after one untimed step). torch: the recorded ladder and timed steps (4k..32k; the
8B at 21 layers) plus the recorded time between them (building, FSDP, the reference model: 15-25 s a shape);
Megatron: its target, 1.2x the torch path's timed steps (per-sequence attention; the one recorded step, 0.6B at 16k
tokens, took 9.3 s with the dense mask it no longer builds), plus its worker's start; generation: never measured yet
(1024-token prompts, 128 new tokens at 1, 8 and 32 requests). In all about 445 s with the start."""


class Budget:
    """A deadline ``budget_s`` after ``started``; :meth:`allows` says whether a unit fits in what is left."""

    def __init__(self, budget_s: float | None, started: float | None = None) -> None:
        self.budget_s = budget_s
        self.started = time.monotonic() if started is None else started
        self.expected_s = 0.0  # H200 seconds of the units finished so far
        self.taken_s = 0.0  # and what they took here

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def pace(self) -> float:
        """This machine's seconds per H200 second, from the units finished so far (1.0 before any)."""
        return self.taken_s / self.expected_s if self.expected_s else 1.0

    def allows(self, unit: str, key: str) -> str | None:
        """None when ``unit`` of shape ``key`` fits in the time left, else why not (one line, for the record)."""
        if self.budget_s is None:
            return None
        need, left = H200_S[unit].get(key, 60.0) * self.pace(), self.budget_s - self.elapsed()
        if need <= left:
            return None
        return f"{unit}: {left:.0f} s of the {self.budget_s:.0f} s budget left, needs ~{need:.0f} s"

    def finished(self, unit: str, key: str, seconds: float) -> None:
        self.expected_s += H200_S[unit].get(key, 60.0)
        self.taken_s += seconds


def project_commit(root: Path) -> str:
    """The commit of the project at ``root``: git's, when ``root`` is the top of its own checkout; else the one
    ``scripts/gpu_kit.sh`` stamped beside the wheels (``gpu_kit_wheels/COMMIT``: a copy without ``.git``, carried
    alone or inside another checkout, whose commit would be the wrong one); else ``"unknown"``."""
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=root, text=True, capture_output=True,
                             check=True, timeout=30).stdout.strip()  # fmt: skip
        if Path(top).resolve() == root.resolve():
            return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, text=True, capture_output=True,
                                  check=True, timeout=30).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        pass
    return kit_commit(root) or "unknown"


def kit_commit(root: Path) -> str | None:
    """The commit ``scripts/gpu_kit.sh`` stamped beside the wheels, if any. The summary records it beside git's when
    they differ: a checkout carried with a ``.git`` of another state (the GPU loan's copy of a session's tree carried
    its last landed commit, 2026-12-04) names the wrong commit through git alone."""
    stamped = root / "gpu_kit_wheels" / "COMMIT"
    return (stamped.read_text().strip() or None) if stamped.is_file() else None


def one_line(error: BaseException) -> str:
    """An error as one bounded line for a record: its type and the first line of its message."""
    return f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:300]}"


class PeakMemory:
    """Peak bytes over a window. GPU: the caching allocator's peak reservation plus what the process holds outside
    it (context, NCCL, cuBLAS workspace). CPU (dry run): peak resident set (Linux VmHWM, reset through
    ``/proc/self/clear_refs``) above the resident set before any model was built; host figures, for the mechanism."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.baseline = 0 if device.type == "cuda" else self._status("VmRSS")

    @staticmethod
    def _status(key: str) -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
        raise RuntimeError(f"/proc/self/status has no {key}")

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        else:
            Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current resident set

    def peak(self) -> float:
        if self.device.type != "cuda":
            return float(self._status("VmHWM") - self.baseline)
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        outside = max(total - free - torch.cuda.memory_reserved(), 0)
        return float(torch.cuda.max_memory_reserved() + outside)


def grpo_step(policy, sequences: list, loss) -> tuple[float, float, dict]:
    """The trainer's part of one GRPO step on ``policy`` (a ``Policy``): logprobs (policy, reference), then ``train``
    with ``loss``; its two times and the training metrics. A non-finite gradient norm (a skipped step) is an error:
    its times would not be a step's."""
    started = time.perf_counter()
    for seq, lp, ref in zip(sequences, policy.get_logprobs(sequences),
                            policy.get_reference_policy_logprobs(sequences), strict=True):  # fmt: skip
        seq.prev_logprobs, seq.reference_logprobs = lp, ref
    scored = time.perf_counter()
    metrics = policy.train(sequences, loss)
    if not math.isfinite(metrics["grad_norm"]):
        raise RuntimeError(f"the training step gave a gradient norm of {metrics['grad_norm']} (step skipped)")
    return scored - started, time.perf_counter() - scored, metrics
