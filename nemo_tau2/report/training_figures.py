"""The charts of a training run, or of several overlaid (one colour per run, one dash per domain): training and
validation success and reward per domain over steps, loss, async ages and buffer, the step's time stacked by phase,
tokens/s and infrastructure errors. A chart whose metrics a run never logged (an SFT run has no rollouts, a sync
run no buffer) is left out and named in the page's notes."""

from typing import Any

from bokeh.models import ColumnDataSource, HoverTool

from nemo_tau2.report.charts import finish_legend, new_figure, run_color
from nemo_tau2.report.sources import TrainingRun

DASHES = ["solid", "dashed", "dotted", "dotdash", "dashdot"]
TIMING_PHASES = [
    ("timing/rollout_s", "rollout", "#4c78a8"),
    ("timing/train_s", "train", "#f58518"),
    ("timing/weight_sync_s", "weight sync", "#54a24b"),
    ("timing/validation_s", "validation", "#b279a2"),
]


def _series(run: TrainingRun, key: str) -> tuple[list[int], list[float]]:
    points = [(row["step"], float(row[key])) for row in run.steps if isinstance(row.get(key), int | float)]
    return [p[0] for p in points], [p[1] for p in points]


def _lines_figure(title: str, runs: list[TrainingRun], lines: list[tuple[str, str, str]], y_label: str, **kwargs):
    """``lines``: (metric key with ``{domain}`` filled per domain or not, label, dash); None when no run logged any."""
    fig = new_figure(title, x_axis_label="step", y_axis_label=y_label, **kwargs)
    drawn = False
    for i, run in enumerate(runs):
        for key, label, dash in lines:
            xs, ys = _series(run, key)
            if not xs:
                continue
            name = label if len(runs) == 1 else f"{run.name}: {label}"
            source = ColumnDataSource({"x": xs, "y": ys, "series": [name] * len(xs)})
            fig.line(
                "x",
                "y",
                source=source,
                color=run_color(i) if len(runs) > 1 else _line_color(lines, key),
                line_dash=dash,
                line_width=2,
                legend_label=name,
            )
            fig.scatter(
                "x",
                "y",
                source=source,
                size=5,
                legend_label=name,
                color=run_color(i) if len(runs) > 1 else _line_color(lines, key),
            )
            drawn = True
    if not drawn:
        return None
    fig.add_tools(HoverTool(tooltips=[("", "@series"), ("step", "@x"), ("value", "@y{0.000}")]))
    finish_legend(fig, "top_left")
    return fig


def _line_color(lines: list[tuple[str, str, str]], key: str) -> str:
    return run_color([k for k, _, _ in lines].index(key))


def _per_domain(runs: list[TrainingRun], train_key: str, val_key: str, train: str, val: str) -> list:
    domains = sorted({d for run in runs for d in run.domains})
    lines = [(train_key.format(scope="rollout"), f"train {train}", "solid")]
    lines += [(train_key.format(scope=d), f"train {d}", DASHES[(j + 1) % len(DASHES)]) for j, d in enumerate(domains)]
    lines += [(val_key.format(scope="overall"), f"val {val}", "solid")]
    lines += [(val_key.format(scope=d), f"val {d}", DASHES[(j + 1) % len(DASHES)]) for j, d in enumerate(domains)]
    return lines


def training_figures(runs: list[TrainingRun]) -> tuple[list, list[str]]:
    """The training charts in page order, and a note for each chart no run had metrics for."""
    specs: list[tuple[str, list[tuple[str, str, str]], str, dict[str, Any]]] = [
        (
            "Success: train batches, validation pass@1",
            _per_domain(runs, "train/{scope}/success_rate", "val/{scope}/pass@1", "success", "pass@1"),
            "success",
            {"y_range": (-0.03, 1.03)},
        ),
        (
            "Reward over steps",
            _per_domain(runs, "train/{scope}/mean_reward", "val/{scope}/mean_reward", "reward", "reward"),
            "reward",
            {},
        ),
        ("Loss", [("train/loss", "train loss", "solid"), ("val/loss", "validation loss", "dashed")], "loss", {}),
        (
            "Async GRPO: trajectory age",
            [
                ("train/async/trajectory_age_mean", "mean age", "solid"),
                ("train/async/trajectory_age_max", "max age", "dashed"),
            ],
            "steps",
            {},
        ),
        (
            "Async GRPO: replay buffer",
            [
                ("train/async/buffer_size", "groups in buffer", "solid"),
                ("train/async/groups_dropped_for_age", "dropped for age", "dashed"),
            ],
            "groups",
            {},
        ),
        ("Training throughput", [("train/tokens_per_s", "tokens/s", "solid")], "tokens/s", {}),
        (
            "Infrastructure errors per step",
            [
                ("train/rollout/num_infrastructure_errors", "train rollouts", "solid"),
                ("val/overall/num_infra_errors", "validation", "dashed"),
            ],
            "episodes",
            {},
        ),
    ]
    figures, notes = [], []
    for title, lines, y_label, kwargs in specs:
        fig = _lines_figure(title, runs, lines, y_label, **kwargs)
        if fig is None:
            notes.append(f"{title}: not logged by {'this run' if len(runs) == 1 else 'these runs'}")
        else:
            figures.append(fig)
    for i, run in enumerate(runs):
        fig = timing_figure(run, i)
        if fig is None:
            notes.append(f"Time per step: {run.name} logged no timing/* metrics")
        else:
            figures.append(fig)
    return figures, notes


def timing_figure(run: TrainingRun, index: int):
    """Seconds per step stacked by phase (rollout, train, weight sync, validation)."""
    phases = [(key, label, color) for key, label, color in TIMING_PHASES if any(key in row for row in run.steps)]
    if not phases:
        return None
    data = {"step": [row["step"] for row in run.steps]}
    for key, label, _ in phases:
        data[label] = [float(row.get(key) or 0.0) for row in run.steps]
    fig = new_figure(f"{run.name}: time per step by phase", x_axis_label="step", y_axis_label="seconds")
    fig.vbar_stack(
        [label for _, label, _ in phases],
        x="step",
        width=0.8,
        source=ColumnDataSource(data),
        color=[color for _, _, color in phases],
        legend_label=[label for _, label, _ in phases],
    )
    fig.add_tools(
        HoverTool(tooltips=[("step", "@step"), *((label, f"@{{{label}}}{{0.0}} s") for _, label, _ in phases)])
    )
    fig.y_range.start = 0
    fig.add_layout(fig.legend[0], "right")  # beside the bars, never over them
    finish_legend(fig)
    return fig
