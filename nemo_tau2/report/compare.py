"""What changed between two evaluations: the tasks that flipped.

A task *passes* in a run when more than half of its valid episodes succeeded (its pass rate, pass^1 of that task,
is above 0.5); it flipped when it passes on one side and not on the other. A task with no valid episode on a side
(every episode an infrastructure error) has no verdict there and is never listed as flipped.
"""

from dataclasses import dataclass

from nemo_tau2.report.eval_figures import pass_rates
from nemo_tau2.report.sources import EvalRun

PASS_THRESHOLD = 0.5


@dataclass
class FlippedTask:
    task: str  # "<domain>/<task_id>"
    before: float  # pass rate in the first run
    after: float  # pass rate in the second run

    @property
    def direction(self) -> str:
        return "failed -> passed" if self.after > PASS_THRESHOLD else "passed -> failed"


def passes(rate: float) -> bool:
    return rate > PASS_THRESHOLD


def flipped_tasks(before: EvalRun, after: EvalRun) -> list[FlippedTask]:
    """Tasks whose verdict differs between the runs: newly passed first, then newly failed, each by task."""
    rates_before, rates_after = pass_rates(before), pass_rates(after)
    flipped = [
        FlippedTask(task, rates_before[task], rates_after[task])
        for task in rates_before.keys() & rates_after.keys()
        if passes(rates_before[task]) != passes(rates_after[task])
    ]
    return sorted(flipped, key=lambda f: (f.direction != "failed -> passed", f.task))
