"""Pivot candidates out of stored trajectories, written as one JSONL file (``examples/prepare_pivots.py``).

Each trajectory's task gives the prompt's start and the policy's tools: its Gym row, as ``prepare_data.py`` writes
it for that release (v0.2.1 in process, a later release through its worker). Every row is marked with the tau2
split its task is in (``split``: ``test`` or ``train``), so held-out pivots (the test split's) are reported apart
and never trained on by accident. A trajectory of another release than the one named, or of a task that release
does not have, is counted by reason and skipped.
"""

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from nemo_tau2.algorithms.sft_data import release_test_split_ids
from nemo_tau2.pivots.candidates import StoredTrajectory, pivot_rows
from nemo_tau2.tau2_env import domains
from nemo_tau2.tau2_env.gym_rows import compact_rows, task_row
from nemo_tau2.tau2_release.config import Tau2ReleaseConfig
from nemo_tau2.utils.jsonl_log import replace_lines

TEST, TRAIN = "test", "train"


@dataclass
class PivotReport:
    trajectories: int = 0
    skipped: Counter = field(default_factory=Counter)  # trajectories and turns left out, by reason
    pivots: Counter = field(default_factory=Counter)  # (domain, action type, split) -> pivots written

    def summary(self) -> dict[str, Any]:
        by_domain: dict[str, dict[str, int]] = {}
        for (domain, kind, split), count in sorted(self.pivots.items()):
            entry = by_domain.setdefault(domain, {"pivots": 0, "held_out": 0})
            entry["pivots"] += count
            entry["held_out"] += count if split == TEST else 0
            entry[kind] = entry.get(kind, 0) + count
        return {"trajectories": self.trajectories, "pivots": sum(self.pivots.values()), "by_domain": by_domain,
                "skipped": dict(self.skipped)}  # fmt: skip


def task_rows(tau2: Tau2ReleaseConfig, keys: set[tuple[str, str]], compact: bool) -> dict[tuple[str, str], dict]:
    """The Gym row of each ``(domain, task_id)`` the release has (those it lacks are left out); ``compact``: the
    short system prompt and the gold actions' tools only, as a run with ``data.compact_rows`` plays them."""
    if tau2.version == "v0.2.1":
        rows = {}
        for domain, task_id in keys:
            try:
                rows[domain, task_id] = (compact_rows(domain, [task_id]) if compact else [task_row(domain, task_id)])[
                    0
                ]
            except (domains.UnknownDomainError, domains.UnknownTaskError, ValueError):
                continue
        return rows
    from nemo_tau2.tau2_release.rows import release_rows

    found = release_rows(tau2, sorted({domain for domain, _ in keys}), split=None, what="pivots", compact=compact)
    return {(row["domain"], str(row["task_id"])): row for row in found if (row["domain"], str(row["task_id"])) in keys}


def prepare_pivots(
    trajectories: list[StoredTrajectory], tau2: Tau2ReleaseConfig, output: Path, compact: bool = False,
    agent_name: str | None = None,
) -> PivotReport:  # fmt: skip
    """Write every candidate of ``trajectories`` to ``output`` (whole or absent); what was written, and skipped.
    ``agent_name``: the ``agent_ref`` every row names (default: the task rows' own, ``tau2_agent``)."""
    report = PivotReport(trajectories=len(trajectories))
    mine = []
    for trajectory in trajectories:
        if trajectory.tau2_version != tau2.version:
            report.skipped[
                f"another release's trajectory (tau2 {trajectory.tau2_version}; named: {tau2.version})"
            ] += 1
        else:
            mine.append(trajectory)
    rows = task_rows(tau2, {(t.domain, t.task_id) for t in mine}, compact)
    held_out = release_test_split_ids(tau2, sorted({domain for domain, _ in rows}))
    lines = []
    for trajectory in mine:
        row = rows.get((trajectory.domain, trajectory.task_id))
        if row is None:
            report.skipped[f"a task tau2 {tau2.version} does not have"] += 1
            continue
        found, skipped = pivot_rows(trajectory, row)
        report.skipped.update(skipped)
        split = TEST if trajectory.task_id in held_out.get(trajectory.domain, ()) else TRAIN
        for pivot in found:
            pivot["split"] = split
            if agent_name is not None:
                pivot["agent_ref"] = {"type": "responses_api_agents", "name": agent_name}
            report.pivots[trajectory.domain, pivot["expected_action"]["type"], split] += 1
            lines.append(orjson.dumps(pivot) + b"\n")
    output.parent.mkdir(parents=True, exist_ok=True)
    replace_lines(output, lines)
    return report
