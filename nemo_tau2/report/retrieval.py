"""The retrieval section of a knowledge domain's evaluation (banking_knowledge): did the agent find the documents the
task needs, did it unlock the tools the gold actions use, and does success follow retrieval?

Each record's ``retrieval`` comes with tau2's verdict (the worker's ``_search_log``): the searches and the documents
their answers showed, the task's ``required_documents`` found among them, and the discoverable tools unlocked against
the gold unlocks. Runs of different retrieval variants are drawn side by side, each labelled with its variant.
"""

from typing import Any

from nemo_tau2.report.charts import dodged_bars, run_color
from nemo_tau2.report.episodes import outcome
from nemo_tau2.report.page import esc, swatch
from nemo_tau2.report.sources import EvalRun

RECALL_BINS = ["0", "under 1/2", "1/2 to under 1", "all", "none required"]


def retrieved(record: dict[str, Any]) -> dict[str, Any] | None:
    """The episode's retrieval summary, or None (another domain, an infrastructure error, or an older record)."""
    value = record.get("retrieval")
    return value if record.get("status") == "ok" and isinstance(value, dict) else None


def has_retrieval(runs: list[EvalRun]) -> bool:
    return any(retrieved(r) for run in runs for r in run.records)


def recall_bin(recall: float | None) -> str:
    if recall is None:
        return RECALL_BINS[4]
    if recall <= 0:
        return RECALL_BINS[0]
    if recall < 0.5:
        return RECALL_BINS[1]
    return RECALL_BINS[2] if recall < 1 else RECALL_BINS[3]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def retrieval_figures(runs: list[EvalRun]) -> list:
    """Success rate per document-recall bin, and mean document / unlock recall, one colour per run."""
    bins = [b for b in RECALL_BINS if any(_binned(run, b) for run in runs)]
    success_series, recall_series = [], []
    for i, run in enumerate(runs):
        success_series.append(
            (run.name, run_color(i), [_mean([float(r["success"]) for r in _binned(run, b)]) for b in bins])
        )
        summaries = [s for r in run.records if (s := retrieved(r))]
        recall_series.append(
            (
                run.name,
                run_color(i),
                [
                    _mean([s["document_recall"] for s in summaries if s["document_recall"] is not None]),
                    _mean([s["unlock_recall"] for s in summaries if s["unlock_recall"] is not None]),
                ],
            )
        )
    return [
        dodged_bars("Success rate by required documents found", bins, success_series, y_label="success rate"),
        dodged_bars(
            "Retrieval: mean recall",
            ["required documents found", "gold tools unlocked"],
            recall_series,
            y_label="mean recall",
        ),  # fmt: skip
    ]


def _binned(run: EvalRun, name: str) -> list[dict[str, Any]]:
    return [r for r in run.records if (s := retrieved(r)) and recall_bin(s["document_recall"]) == name]


def _fraction(found: list, wanted: list) -> str:
    return "-" if not wanted else f"{len(set(found) & set(wanted))}/{len(set(wanted))}"


def retrieval_table(runs: list[EvalRun], keys_of) -> str:
    """One row per episode: its outcome, searches, required documents found, gold tools unlocked, and the unlocks
    missed and made beyond the gold; each episode links to its transcript."""
    head = (
        "<tr><th>episode</th><th>outcome</th><th>searches</th><th>documents shown</th><th>required found</th>"
        '<th>gold unlocked</th><th style="text-align:left">unlocks missed</th>'
        '<th style="text-align:left">unlocks beyond gold</th></tr>'
    )
    rows = []
    for i, run in enumerate(runs):
        for record in run.records:
            s = retrieved(record)
            if s is None:
                continue
            missed = [tool for tool in s["gold_unlocks"] if tool not in s["tools_unlocked"]]
            rows.append(
                f'<tr class="retrieval-row"><td>{swatch(i) if len(runs) > 1 else ""}'
                f'<a href="#" data-episode="{esc(keys_of(i, record))}">{esc(record["domain"])}/'
                f"{esc(record['task_id'])} #{esc(record['sample_index'])}</a></td><td>{esc(outcome(record))}</td>"
                f"<td>{len(s['searches'])}</td><td>{len(s['documents_found'])}</td>"
                f"<td>{_fraction(s['documents_found'], s['required_documents'])}</td>"
                f"<td>{_fraction(s['tools_unlocked'], s['gold_unlocks'])}</td>"
                f'<td style="text-align:left">{esc(", ".join(missed))}</td>'
                f'<td style="text-align:left">{esc(", ".join(s["extra_unlocks"]))}</td></tr>'
            )
    return f'<div class="scroll"><table class="data" id="retrieval-table">{head}{"".join(rows)}</table></div>'
