"""The charts of an evaluation, or of several overlaid (one colour per run): pass^k and pass@k against k with the
evaluator's bootstrap intervals, the task x sample outcome grid, reward components, termination reasons, and the
per-episode distributions of turns, tokens and wall time. Every chart covers each domain and the overall scope."""

from collections import Counter
from typing import Any

from bokeh.models import ColumnDataSource, CustomJS, FactorRange, HoverTool, TapTool

from nemo_tau2.experience.row_keys import episode_task
from nemo_tau2.report.charts import box_plot, dodged_bars, finish_legend, line_with_interval, new_figure, run_color
from nemo_tau2.report.episodes import COMPONENTS, OUTCOME_COLORS, OUTCOMES, components, outcome, wall_seconds
from nemo_tau2.report.sources import EvalRun

OVERALL = "overall"


def scopes(run: EvalRun) -> list[str]:
    return [OVERALL, *run.domains]


def _in_scope(record: dict[str, Any], scope: str) -> bool:
    return scope == OVERALL or str(record["domain"]) == scope


def _metric(run: EvalRun, scope: str, name: str) -> tuple[float | None, float | None, float | None]:
    """A metric and its interval (None where the evaluator computed none: too few episodes, or no bootstrap)."""
    base = f"eval/{scope}/{name}"
    level = next(
        (key[len(base) + 1 : -4] for key in run.metrics if key.startswith(base + "_ci") and key.endswith("_low")), None
    )
    low = run.metrics.get(f"{base}_{level}_low") if level else None
    high = run.metrics.get(f"{base}_{level}_high") if level else None
    return run.metrics.get(base), low, high


def pass_k_figures(runs: list[EvalRun]) -> list:
    """Per scope: pass^k (solid) and pass@k (dashed) against k, one colour per run, 95% intervals as whiskers."""
    figures = []
    for scope in scopes(runs[0]):
        fig = new_figure(
            f"{scope}: pass^k and pass@k", height=260, x_axis_label="k", y_axis_label="score", y_range=(-0.03, 1.03)
        )
        for i, run in enumerate(runs):
            for name, dash, marker in (("pass^", "solid", "circle"), ("pass@", "dashed", "square")):
                points = [(k, *_metric(run, scope, f"{name}{k}")) for k in run.k_values]
                points = [p for p in points if p[1] is not None]
                if points:
                    xs, ys, lows, highs = (list(column) for column in zip(*points, strict=True))
                    label = f"{name}k" if len(runs) == 1 else f"{run.name} {name}k"
                    line_with_interval(
                        fig, xs, ys, lows, highs, color=run_color(i), label=label, dash=dash, marker=marker
                    )
        fig.xaxis.ticker = sorted({k for run in runs for k in run.k_values})
        fig.add_tools(
            HoverTool(
                tooltips=[
                    ("", "@series"),
                    ("k", "@x"),
                    ("score", "@y{0.000}"),
                    ("95% CI", "@low{0.000} - @high{0.000}"),
                ]
            )
        )
        finish_legend(fig, "bottom_left", outside=len(runs) > 1)
        if len(runs) > 1:
            fig.height += 30 * len(runs) * 2  # room for the key below
        figures.append(fig)
    return figures


def task_label(record: dict[str, Any]) -> str:
    return f"{record['domain']}/{episode_task(record['task_id'], record.get('pivot_id'))}"


MAX_ROW_LABEL = 34


def row_labels(tasks: list[str]) -> dict[str, str]:
    """Each task's row label on the grid: its name, or (telecom's long ids) its start and end, kept unique."""
    labels: dict[str, str] = {}
    for task in tasks:
        label = task if len(task) <= MAX_ROW_LABEL else f"{task[:20]}…{task[-(MAX_ROW_LABEL - 21) :]}"
        base, n = label, 2
        while label in labels.values():
            label, n = f"{base} ({n})", n + 1
        labels[task] = label
    return labels


def task_orders(run: EvalRun) -> dict[str, list[str]]:
    """The grid's row orders: by task (domain, then id) and by difficulty (lowest pass rate first)."""
    by_task = list(dict.fromkeys(task_label(r) for r in run.records))
    rates = pass_rates(run)
    by_difficulty = sorted(by_task, key=lambda t: (rates.get(t, 2.0), by_task.index(t)))
    labels = row_labels(by_task)
    # the grid draws its first factor at the bottom: reversed, the first task is on top
    return {"task": [labels[t] for t in by_task[::-1]], "difficulty": [labels[t] for t in by_difficulty[::-1]]}


def pass_rates(run: EvalRun) -> dict[str, float]:
    """Each task's share of valid episodes that succeeded (tasks with none left out)."""
    counts: dict[str, list[int]] = {}
    for record in run.records:
        if record["status"] == "ok":
            tally = counts.setdefault(task_label(record), [0, 0])
            tally[0] += bool(record["success"])
            tally[1] += 1
    return {task: successes / total for task, (successes, total) in counts.items()}


def episode_key(run_index: int, record: dict[str, Any]) -> str:
    """The viewer's id of an episode: run index, domain, task id, sample."""
    return f"{run_index}|{record['domain']}|{task_label(record).partition('/')[2]}|{record['sample_index']}"


def outcome_grid(run: EvalRun, run_index: int):
    """Task x sample, one cell per episode coloured by outcome; tapping a cell opens its transcript."""
    rates = pass_rates(run)
    labels = row_labels(list(dict.fromkeys(task_label(r) for r in run.records)))
    data: dict[str, list] = {
        k: [] for k in ("row", "task", "sample", "outcome", "reward", "key", "pass_rate", "turns")
    }
    for record in run.records:
        data["row"].append(labels[task_label(record)])
        data["task"].append(task_label(record))
        data["sample"].append(str(record["sample_index"]))
        data["outcome"].append(outcome(record))
        data["reward"].append(record.get("reward") if record.get("reward") is not None else float("nan"))
        data["key"].append(episode_key(run_index, record))
        data["pass_rate"].append(rates.get(task_label(record), float("nan")))
        data["turns"].append(record.get("num_turns") or 0)
    data["color"] = [OUTCOME_COLORS[o] for o in data["outcome"]]
    source = ColumnDataSource(data, name=f"grid_source_{run_index}")
    orders = task_orders(run)
    samples = sorted({int(s) for s in data["sample"]})
    y_range = FactorRange(*orders["task"], name=f"grid_rows_{run_index}")
    fig = new_figure(
        f"{run.name}: outcome of every episode (click a cell to read it)",
        height=max(220, 60 + 16 * len(orders["task"])),
        x_range=FactorRange(*[str(s) for s in samples]),
        y_range=y_range,
        x_axis_label="sample",
        x_axis_location="above",
    )
    fig.rect(
        "sample",
        "row",
        0.94,
        0.9,
        source=source,
        fill_color="color",
        line_color=None,
        legend_field="outcome",
        name="cells",
    )
    fig.add_tools(
        HoverTool(
            tooltips=[
                ("task", "@task"),
                ("sample", "@sample"),
                ("outcome", "@outcome"),
                ("reward", "@reward{0.00}"),
                ("task pass rate", "@pass_rate{0%}"),
                ("turns", "@turns"),
            ]
        )
    )
    opener = CustomJS(args={"source": source}, code="window.nemoReport.openFromSource(source);")
    fig.add_tools(TapTool(callback=opener))
    fig.grid.grid_line_color = None
    fig.yaxis.major_label_text_font_size = "10px"
    fig.legend.orientation = "horizontal"
    fig.add_layout(fig.legend[0], "below")
    finish_legend(fig)
    return fig, orders


def component_figure(runs: list[EvalRun]):
    """Mean score of each reward component per scope (over the episodes whose reward counts it)."""
    factors, series = [], []
    present = [k for k in COMPONENTS if any(k in components(r) for run in runs for r in run.records)]
    for scope in scopes(runs[0]):
        factors += [(scope, COMPONENTS[key][0]) for key in present]
    for i, run in enumerate(runs):
        values = []
        for scope in scopes(runs[0]):
            for key in present:
                scored = [components(r)[key] for r in run.records if _in_scope(r, scope) and key in components(r)]
                values.append(sum(scored) / len(scored) if scored else 0.0)
        series.append((run.name, run_color(i), values))
    return dodged_bars("Reward components: mean score", factors, series, y_label="mean score")


def termination_figure(runs: list[EvalRun]):
    """The share of episodes per termination reason (infrastructure errors as their own reason), per scope."""

    def reason(record: dict[str, Any]) -> str:
        return "infrastructure error" if record["status"] != "ok" else record.get("termination_reason") or "unknown"

    reasons = sorted({reason(r) for run in runs for r in run.records})
    factors = [(scope, name) for scope in scopes(runs[0]) for name in reasons]
    series = []
    for i, run in enumerate(runs):
        values = []
        for scope in scopes(runs[0]):
            counts = Counter(reason(r) for r in run.records if _in_scope(r, scope))
            total = sum(counts.values()) or 1
            values += [counts[name] / total for name in reasons]
        series.append((run.name, run_color(i), values))
    return dodged_bars("Termination reasons: share of episodes", factors, series, y_label="share")


def outcome_figure(runs: list[EvalRun]):
    """The share of episodes per outcome (success, each failure kind, infrastructure error), stacked, per scope (and
    per run when comparing)."""
    present = [o for o in OUTCOMES if any(outcome(r) == o for run in runs for r in run.records)]
    factors = [scope if len(runs) == 1 else (scope, run.name) for scope in scopes(runs[0]) for run in runs]
    data: dict[str, list] = {"x": factors, **{name: [] for name in present}}
    for scope in scopes(runs[0]):
        for run in runs:
            counts = Counter(outcome(r) for r in run.records if _in_scope(r, scope))
            total = sum(counts.values()) or 1
            for name in present:
                data[name].append(counts[name] / total)
    fig = new_figure("Outcomes: share of episodes", x_range=FactorRange(*factors), y_axis_label="share", height=330)
    fig.vbar_stack(
        present,
        x="x",
        width=0.7,
        source=ColumnDataSource(data),
        color=[OUTCOME_COLORS[name] for name in present],
        legend_label=present,
    )
    fig.add_tools(HoverTool(tooltips=[("", "@x"), *((name, f"@{{{name}}}{{0%}}") for name in present)]))
    fig.y_range.start, fig.y_range.end = 0, 1
    fig.xgrid.grid_line_color = None
    fig.xaxis.major_label_orientation = 0.6 if len(runs) > 1 else 0
    fig.add_layout(fig.legend[0], "right")
    finish_legend(fig)
    return fig


def distribution_figures(runs: list[EvalRun]) -> list:
    """Turns, tokens and wall time per valid episode, as box plots per scope."""
    measures = [
        ("Policy turns per episode", "turns", lambda r: r.get("num_turns")),
        ("Tokens per episode (whole sequence)", "tokens", lambda r: r.get("total_tokens")),
        ("Wall time per episode", "seconds", wall_seconds),
    ]
    figures = []
    for title, unit, measure in measures:
        groups = scopes(runs[0])
        series = []
        for i, run in enumerate(runs):
            per_group = []
            for scope in groups:
                values = [measure(r) for r in run.records if r["status"] == "ok" and _in_scope(r, scope)]
                per_group.append([float(v) for v in values if v is not None])
            series.append((run.name, run_color(i), per_group))
        figures.append(box_plot(title, groups, series, y_label=unit))
    return figures
