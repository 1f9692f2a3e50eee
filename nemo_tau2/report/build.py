"""``build_report(paths, out)``: one self-contained HTML file for an evaluation, a training run, or a comparison of
several of one kind (see ``examples/report.py``)."""

import datetime
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nemo_tau2.report import eval_figures as ef
from nemo_tau2.report import page
from nemo_tau2.report.compare import flipped_tasks
from nemo_tau2.report.episodes import OUTCOME_COLORS, Redactor, episode_payload
from nemo_tau2.report.pivots import has_pivots, pivot_summary, pivot_table_html
from nemo_tau2.report.retrieval import has_retrieval, retrieval_figures, retrieval_table
from nemo_tau2.report.sources import EvalRun, ReportInputError, TrainingRun, check_comparable, load_results
from nemo_tau2.report.training_figures import training_figures
from nemo_tau2.trained_tasks import describe as describe_trained_on

logger = logging.getLogger(__name__)

REPORT_FILE = "report.html"


class _Page:
    """What the sections add up: body HTML, Bokeh models by placeholder name, and the viewer's data."""

    def __init__(self, redactor: Redactor):
        self.redactor = redactor
        self.parts: list[str] = []
        self.nav: list[tuple[str, str]] = []
        self.models: dict[str, Any] = {}
        self.episodes: dict[str, str] = {}
        self.run_names: list[str] = []
        self.prompts: list[dict[str, int]] = []
        self.prompt_texts: list[str] = []
        self.orders: list[dict[str, list[str]]] = []

    def chart(self, name: str, model: Any) -> str:
        self.models[name] = model
        return page.card("{{" + name + "}}")

    def add(self, anchor: str, title: str, content: str, hint: str = "", nav: str | None = None) -> None:
        self.parts.append(page.section(anchor, title, content, hint))
        if nav:
            self.nav.append((anchor, nav))

    def register_run(self, run: EvalRun, label: str) -> int:
        """Give an evaluation (or a validation step) its viewer index; embed its episodes and system prompts."""
        index = len(self.run_names)
        self.run_names.append(label)
        prompt_index = {}
        for task, text in run.system_prompts.items():
            text = self.redactor.text(text)
            if text not in self.prompt_texts:
                self.prompt_texts.append(text)
            prompt_index[task] = self.prompt_texts.index(text)
        self.prompts.append(prompt_index)
        for record in run.records:
            self.episodes[ef.episode_key(index, record)] = page.packed(episode_payload(record, self.redactor))
        self.orders.append({})
        return index


def _eval_sections(p: _Page, runs: list[EvalRun], labels: list[str], prefix: str, title: str) -> None:
    indices = [p.register_run(run, label) for run, label in zip(runs, labels, strict=True)]
    scopes = ef.scopes(runs[0])
    # a model a training run exported: which of these tasks it trained on (not held out), said beside its scores
    trained = " ".join(
        f"{label}: {describe_trained_on(run.trained_on)}".replace("\n", "; ")
        for run, label in zip(runs, labels, strict=True)
        if run.trained_on
    )
    p.add(
        f"{prefix}summary",
        f"{title}: scores",
        page.card(page.metrics_table(runs, scopes)),
        "pass^k: all k episodes of a task succeed; pass@k: at least one does. Brackets: the evaluator's 95% "
        "bootstrap interval over tasks." + (f" {trained}" if trained else ""),
        nav="Scores",
    )
    charts = "".join(p.chart(f"{prefix}passk_{i}", fig) for i, fig in enumerate(ef.pass_k_figures(runs)))
    p.add(
        f"{prefix}passk",
        "pass^k and pass@k against k",
        f'<div class="grid4">{charts}</div>',
        "Solid: pass^k; dashed: pass@k; whiskers: 95% intervals.",
        nav="pass^k",
    )
    grids = []
    for run, index in zip(runs, indices, strict=True):
        fig, orders = ef.outcome_grid(run, index)
        p.orders[index] = orders
        grids.append(f"<div>{page.grid_toolbar(index)}{p.chart(f'{prefix}grid_{index}', fig)}</div>")
    p.add(
        f"{prefix}grid",
        "Every episode",
        f'<div class="grid2">{"".join(grids)}</div>',
        "Rows: tasks; columns: samples. Click a cell to read the episode.",
        nav="Episodes",
    )
    bars = [ef.outcome_figure(runs), ef.component_figure(runs), ef.termination_figure(runs)]
    p.add(
        f"{prefix}why",
        "Why episodes fail",
        f'<div class="grid2">{"".join(p.chart(f"{prefix}bars_{i}", fig) for i, fig in enumerate(bars))}</div>'
        + page.card(page.failure_kinds_table(runs, scopes)),
        "The table: how each episode ended (the first that applies: infrastructure, tool error cap, max steps, "
        "empty message, transfer, malformed tool call, hallucinated tool, ended normally), as a share of episodes.",
        nav="Failures",
    )
    if has_retrieval(runs):
        charts = "".join(p.chart(f"{prefix}retrieval_{i}", fig) for i, fig in enumerate(retrieval_figures(runs)))
        table = page.card(retrieval_table(runs, lambda i, r: ef.episode_key(indices[i], r)))
        p.add(
            f"{prefix}retrieval",
            "Retrieval",
            f'<div class="grid2">{charts}</div>{table}',
            "Found: the task's required documents among those its searches showed (KB_search and grep list them, "
            "shell shows a file's text); unlocked: the gold actions' discoverable tools the agent unlocked.",
            nav="Retrieval",
        )
    dists = "".join(p.chart(f"{prefix}dist_{i}", fig) for i, fig in enumerate(ef.distribution_figures(runs)))
    p.add(
        f"{prefix}cost",
        "Turns, tokens and time per episode",
        f'<div class="grid4">{dists}</div>',
        "Boxes: quartiles; whiskers: 5th to 95th percentile; bar: median.",
        nav="Cost",
    )
    p.add(
        f"{prefix}contiguity",
        "Token-contiguity breaks",
        page.card(page.contiguity_table(runs, lambda i, r: ef.episode_key(indices[i], r))),
    )
    if len(runs) > 1:
        tables = []
        for before, after, index in zip(runs, runs[1:], indices[1:], strict=False):
            keys = {}
            for record in after.records:
                keys.setdefault(ef.task_label(record), ef.episode_key(index, record))
            flipped = flipped_tasks(before, after)
            tables.append(
                f"<h3>{page.esc(before.name)} &rarr; {page.esc(after.name)}</h3>"
                + page.flipped_table(flipped, before.name, after.name, keys)
            )
        p.add(
            f"{prefix}flipped",
            "Tasks that flipped",
            page.card("".join(tables)),
            "A task passes when more than half of its valid episodes succeed.",
            nav="Flipped",
        )


def _training_sections(p: _Page, runs: list[TrainingRun]) -> None:
    figures, notes = training_figures(runs)
    charts = "".join(p.chart(f"train_{i}", fig) for i, fig in enumerate(figures))
    notes_html = "".join(f"<li>{page.esc(n)}</li>" for n in notes)
    p.add(
        "training",
        "Training",
        f'<div class="grid2">{charts}</div>' + (f'<ul class="notes">{notes_html}</ul>' if notes else ""),
        nav="Training",
    )
    validated = [run for run in runs if run.validations]
    if validated:
        last = [run.validations[max(run.validations)] for run in validated]
        labels = [f"{run.name} step {max(run.validations)}" for run in validated]
        for evaluation, label in zip(last, labels, strict=True):
            evaluation.name = label
        _eval_sections(p, last, labels, "val_", "Last validation")
        for run in (run for run in validated if has_pivots(run.validations[max(run.validations)])):
            first_step, last_step = min(run.validations), max(run.validations)
            summary = pivot_summary(run.validations[first_step], run.validations[last_step], first_step, last_step)
            p.add(
                "pivots",
                f"Pivots: {run.name}",
                page.card(pivot_table_html(summary)),
                "Share of sampled turns that do what the demonstrated turn does, per pivot group.",
                nav="Pivots",
            )


def build_report(paths: Sequence[str | Path], out: str | Path) -> Path:
    """Read the runs, check they can be shown together, write the report; returns its path.

    Raises:
        ReportInputError: A folder without results, or runs that cannot be compared (one line, with the fix).
    """
    if not paths:
        raise ReportInputError("no results folder given; pass an evaluation's eval.save_path or a run's log_dir")
    runs = [load_results(path) for path in paths]
    check_comparable(runs)
    p = _Page(Redactor())
    kind = "Evaluation" if isinstance(runs[0], EvalRun) else "Training run"
    names = [run.name for run in runs]
    if len(set(names)) < len(names):  # two folders of one name: tell them apart by their parent
        names = [f"{run.path.parent.name}/{run.name}" for run in runs]
        for run, name in zip(runs, names, strict=True):
            run.name = name
    if len(runs) > 1 and len({tuple(run.retrieval_variants) for run in runs if isinstance(run, EvalRun)}) > 1:
        for run in runs:  # variant against variant: each run says which it searched with
            run.name = f"{run.name} [{', '.join(run.retrieval_variants) or 'no retrieval'}]"
        names = [run.name for run in runs]
    if isinstance(runs[0], EvalRun):
        _eval_sections(p, runs, names, "", kind)
    else:
        _training_sections(p, runs)
    title = f"{kind}: {names[0]}" if len(runs) == 1 else f"{kind}s compared: {' vs '.join(names)}"
    models = [run.config.get("policy_model") or (run.config.get("policy") or {}).get("model_name") for run in runs]
    meta = [f"tau2 {runs[0].tau2_version}", f"domains: {', '.join(runs[0].domains)}"]
    meta += [f"policy: {', '.join(str(m) for m in models if m)}"] if any(models) else []
    meta += [f"built {datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}"]
    data = {
        "runs": p.run_names,
        "episodes": p.episodes,
        "prompts": p.prompts,
        "prompt_texts": p.prompt_texts,
        "orders": p.orders,
        "outcome_colors": OUTCOME_COLORS,
    }
    text = page.render_page(title=title, meta=meta, nav=p.nav, body="".join(p.parts), models=p.models, data=data)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    return out


def write_run_report(folder: str | Path) -> Path | None:
    """``<folder>/report.html`` at the end of a run (``logger.report``); a run whose folder cannot be reported (it
    finished nothing) gets a warning, not a failure: the run itself succeeded."""
    try:
        return build_report([folder], Path(folder) / REPORT_FILE)
    except ReportInputError as e:
        logger.warning("no report: %s", e)
        return None
