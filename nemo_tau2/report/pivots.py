"""The pivots section of a turn-level run (PivotRL, ``run_pivot_rl.py``): accuracy on the validation pivots at the
first and the last validated step, per domain and per demonstrated tool, held-out pivots (tau2's test split) apart,
and the pivots that flipped (right by majority at one end, wrong at the other).

A validation record is one sampled turn at one pivot (``pivot_id``, ``pivot_tool``): its reward is the functional
verdict, so a pivot's accuracy is the share of its samples that scored 1.
"""

from collections import defaultdict
from typing import Any

from nemo_tau2.report.page import esc
from nemo_tau2.report.sources import EvalRun


def has_pivots(run: EvalRun) -> bool:
    return any(record.get("pivot_id") for record in run.records)


def _per_pivot(run: EvalRun) -> dict[str, dict[str, Any]]:
    pivots: dict[str, dict[str, Any]] = {}
    for record in run.records:
        if record.get("status") != "ok" or not record.get("pivot_id"):
            continue
        entry = pivots.setdefault(record["pivot_id"], {
            "domain": record.get("domain"), "task_id": record.get("task_id"), "tool": record.get("pivot_tool") or "?",
            "held_out": record.get("split") == "test", "rewards": [],
        })  # fmt: skip
        entry["rewards"].append(float(record.get("reward") or 0.0))
    return pivots


def _accuracy(entries: list[dict[str, Any]]) -> float | None:
    rewards = [reward for entry in entries for reward in entry["rewards"]]
    return sum(rewards) / len(rewards) if rewards else None


def pivot_summary(first: EvalRun, last: EvalRun, first_step: int, last_step: int) -> dict[str, Any]:
    """Accuracy at both ends by (domain, tool), train and held out apart, and the flipped pivots."""
    before, after = _per_pivot(first), _per_pivot(last)
    groups: dict[tuple[str, str, bool], list[str]] = defaultdict(list)
    for pivot_id, entry in after.items():
        groups[entry["domain"], entry["tool"], entry["held_out"]].append(pivot_id)
    rows = []
    for (domain, tool, held_out), ids in sorted(groups.items()):
        rows.append({
            "domain": domain, "tool": tool, "held_out": held_out, "pivots": len(ids),
            "accuracy_first": _accuracy([before[i] for i in ids if i in before]),
            "accuracy_last": _accuracy([after[i] for i in ids]),
        })  # fmt: skip
    flipped = []
    for pivot_id, entry in after.items():
        if pivot_id in before:
            was, now = _accuracy([before[pivot_id]]) or 0.0, _accuracy([entry]) or 0.0
            if (was > 0.5) != (now > 0.5):
                flipped.append({"pivot_id": pivot_id, "domain": entry["domain"], "task_id": entry["task_id"],
                                "tool": entry["tool"], "accuracy_first": was, "accuracy_last": now})  # fmt: skip
    flipped.sort(key=lambda f: (f["accuracy_last"] < f["accuracy_first"], f["pivot_id"]))  # gains first
    return {
        "first_step": first_step,
        "last_step": last_step,
        "rows": rows,
        "flipped": flipped,
        "overall_first": _accuracy(list(before.values())),
        "overall_last": _accuracy(list(after.values())),
    }


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def pivot_table_html(summary: dict[str, Any]) -> str:
    head = (f"<tr><th>domain</th><th>demonstrated</th><th>split</th><th>pivots</th>"
            f"<th>step {summary['first_step']}</th><th>step {summary['last_step']}</th></tr>")  # fmt: skip
    body = "".join(
        f"<tr><td>{esc(r['domain'])}</td><td>{esc(r['tool'])}</td><td>{'held out' if r['held_out'] else 'train'}</td>"
        f"<td>{r['pivots']}</td><td>{_share(r['accuracy_first'])}</td><td>{_share(r['accuracy_last'])}</td></tr>"
        for r in summary["rows"]
    )
    flips = "".join(
        f"<li>{esc(f['domain'])}/{esc(str(f['task_id']))} {esc(f['tool'])} (pivot {esc(f['pivot_id'])}): "
        f"{_share(f['accuracy_first'])} &rarr; {_share(f['accuracy_last'])}</li>"
        for f in summary["flipped"]
    )
    flipped = (
        f"<p>Flipped pivots ({len(summary['flipped'])}):</p><ul>{flips}</ul>" if flips else "<p>No pivot flipped.</p>"
    )
    return f"<table class='table'>{head}{body}</table>{flipped}"


def pivot_table_text(summary: dict[str, Any]) -> str:
    first, last = f"step {summary['first_step']}", f"step {summary['last_step']}"
    lines = [f"{'domain':<18} {'demonstrated':<28} {'split':<9} {'pivots':>6} {first:>9} {last:>9}"]
    for r in summary["rows"]:
        split = "held out" if r["held_out"] else "train"
        lines.append(f"{r['domain']:<18} {r['tool']:<28} {split:<9} {r['pivots']:>6} "
                     f"{_share(r['accuracy_first']):>9} {_share(r['accuracy_last']):>9}")  # fmt: skip
    lines.append(f"flipped pivots: {len(summary['flipped'])}")
    return "\n".join(lines)
