"""The HTML around the charts: the page template, the tables (metrics, flipped tasks, contiguity breaks) and the
embedded data the viewer reads (episodes and system prompts gzipped once each, base64 in a JSON script tag).

Everything the page needs is in the one file: Bokeh's JavaScript inlined, the report's own CSS and script from
this package's ``assets/``; its Content-Security-Policy forbids any network request, so a report that renders
offline renders everywhere.
"""

import base64
import gzip
import html
import json
from importlib import resources
from string import Template
from typing import Any

from bokeh.embed import components
from bokeh.resources import Resources

from nemo_tau2.evals.failure_kinds import KINDS, kind_key, kind_label
from nemo_tau2.report.charts import run_color
from nemo_tau2.report.compare import FlippedTask
from nemo_tau2.report.sources import EvalRun

ASSETS = resources.files("nemo_tau2.report") / "assets"
BOKEH_JS = Resources(mode="inline", components=["bokeh"])  # core only: the widgets' and MathJax's 3 MB stay out


def packed(value: Any) -> str:
    """gzip + base64 of compact JSON: what the viewer inflates on demand."""
    raw = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    return base64.b64encode(gzip.compress(raw, compresslevel=9, mtime=0)).decode("ascii")


def script_json(value: Any) -> str:
    """JSON safe inside a ``<script>`` element (no ``</script>`` can end it early)."""
    return json.dumps(value, separators=(",", ":")).replace("</", "<\\/").replace("<!--", "<\\!--")


def esc(value: Any) -> str:
    return html.escape(str(value))


def section(anchor: str, title: str, content: str, hint: str = "") -> str:
    hint_html = f'<p class="hint">{esc(hint)}</p>' if hint else ""
    return f'<section id="{esc(anchor)}"><h2>{esc(title)}</h2>{hint_html}{content}</section>'


def card(content: str) -> str:
    return f'<div class="card">{content}</div>'


def swatch(index: int) -> str:
    return f'<span class="swatch" style="background:{run_color(index)}"></span>'


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def metrics_table(runs: list[EvalRun], scopes: list[str]) -> str:
    """pass@k, pass^k (percent) and mean reward with their 95% intervals, per run and scope, and the counts."""
    head = "".join(f"<th>{esc(s)}</th>" for s in scopes)
    rows = [f"<tr><th>metric</th>{head}</tr>"]
    for i, run in enumerate(runs):
        if len(runs) > 1:
            rows.append(f'<tr class="run-head"><td colspan="{len(scopes) + 1}">{swatch(i)}{esc(run.name)}</td></tr>')
        names = [f"pass^{k}" for k in run.k_values] + [f"pass@{k}" for k in run.k_values] + ["mean_reward"]
        for name in names:
            cells = []
            for scope in scopes:
                value = run.metrics.get(f"eval/{scope}/{name}")
                low = next(
                    (
                        v
                        for k, v in run.metrics.items()
                        if k.startswith(f"eval/{scope}/{name}_ci") and k.endswith("_low")
                    ),
                    None,
                )
                high = next(
                    (
                        v
                        for k, v in run.metrics.items()
                        if k.startswith(f"eval/{scope}/{name}_ci") and k.endswith("_high")
                    ),
                    None,
                )
                scale = (lambda v: "-" if v is None else f"{v:.3f}") if name == "mean_reward" else _pct
                ci = f' <span class="ci">[{scale(low)}, {scale(high)}]</span>' if low is not None else ""
                cells.append(f"<td>{scale(value)}{ci}</td>")
            label = "mean reward" if name == "mean_reward" else f"{name} (%)"
            rows.append(f"<td>{esc(label)}</td>{''.join(cells)}")
        for label, key in (("episodes", "num_episodes"), ("infra errors", "num_infra_errors"), ("tasks", "num_tasks")):
            cells = "".join(f"<td>{int(run.metrics.get(f'eval/{s}/{key}', 0))}</td>" for s in scopes)
            rows.append(f"<td>{label}</td>{cells}")
    body = "".join(r if r.startswith("<tr") else f"<tr>{r}</tr>" for r in rows)
    return f'<table class="data" id="metrics-table">{body}</table>'


# NeMo-Gym's tau2 agent's shares (its compute_metrics names), shown beside the failure kinds
_NEMO_GYM_SHARES = {
    "trajectory_transfer_to_human_agents/pct": "transfer to human (NeMo-Gym)",
    "trajectory_missing_tool_call/pct": "no tool call (NeMo-Gym)",
}


def failure_kinds_table(runs: list[EvalRun], scopes: list[str]) -> str:
    """How episodes ended: each failure kind's share (percent of the scope's episodes), per run and scope, then
    NeMo-Gym's shares under its names; a run whose summary has no kinds (written before them) shows ``-``."""
    head = "".join(f"<th>{esc(s)}</th>" for s in scopes)
    rows = [f"<tr><th>how it ended</th>{head}</tr>"]
    for i, run in enumerate(runs):
        if len(runs) > 1:
            rows.append(f'<tr class="run-head"><td colspan="{len(scopes) + 1}">{swatch(i)}{esc(run.name)}</td></tr>')
        named = [(kind_key(kind), kind_label(kind), kind) for kind in KINDS]
        named += [(key, label, key.split("/")[0]) for key, label in _NEMO_GYM_SHARES.items()]
        for key, label, row_id in named:
            cells = "".join(f"<td>{_pct(run.metrics.get(f'eval/{s}/{key}'))}</td>" for s in scopes)
            rows.append(f'<tr data-kind="{esc(row_id)}"><td>{esc(label)} (%)</td>{cells}</tr>')
    return f'<table class="data" id="failure-kinds-table">{"".join(rows)}</table>'


def flipped_table(flipped: list[FlippedTask], before: str, after: str, keys: dict[str, str]) -> str:
    """The flipped tasks with their pass rates on each side; each task links to its first episode after."""
    if not flipped:
        return '<p class="muted" id="flipped-none">No task flipped.</p>'
    rows = [f"<tr><th>task</th><th>change</th><th>pass rate {esc(before)}</th><th>pass rate {esc(after)}</th></tr>"]
    for f in flipped:
        arrow = "up" if f.direction == "failed -> passed" else "down"
        link = f'<a href="#" data-episode="{esc(keys[f.task])}">{esc(f.task)}</a>' if f.task in keys else esc(f.task)
        rows.append(
            f'<tr class="flipped" data-task="{esc(f.task)}"><td>{link}</td><td class="{arrow}">{esc(f.direction)}</td>'
            f"<td>{100 * f.before:.0f}%</td><td>{100 * f.after:.0f}%</td></tr>"
        )
    return f'<table class="data" id="flipped-table">{"".join(rows)}</table>'


def contiguity_table(runs: list[EvalRun], keys_of) -> str:
    """Every token-contiguity break (the agent found a turn whose prompt does not extend the previous one)."""
    rows = []
    for i, run in enumerate(runs):
        for record in run.records:
            for found in record.get("token_contiguity_breaks") or []:
                key = keys_of(i, record)
                rows.append(
                    f'<tr><td>{swatch(i) if len(runs) > 1 else ""}<a href="#" data-episode="{esc(key)}">'
                    f"{esc(record['domain'])}/{esc(record['task_id'])} #{esc(record['sample_index'])}</a></td>"
                    f'<td style="text-align:left">{esc(found)}</td></tr>'
                )
    if not rows:
        return '<p class="muted">None: every policy turn extended the previous prompt and generation.</p>'
    return (
        f'<table class="data"><tr><th>episode</th><th style="text-align:left">break</th></tr>{"".join(rows)}</table>'
    )


def grid_toolbar(run_index: int) -> str:
    return (
        f'<div class="toolbar">rows: <button type="button" class="active" data-run="{run_index}" data-sort="task">'
        f'by task</button><button type="button" data-run="{run_index}" data-sort="difficulty">hardest first</button>'
        "</div>"
    )


def render_page(
    *, title: str, meta: list[str], nav: list[tuple[str, str]], body: str, models: dict[str, Any], data: dict[str, Any]
) -> str:
    """The whole file: template, CSS, Bokeh's JavaScript, the charts' document and the embedded data.

    ``body`` holds ``{{name}}`` placeholders, one per chart in ``models``, replaced by the chart's ``<div>``."""
    script, divs = components(models) if models else ("", {})
    for name, div in divs.items():
        body = body.replace("{{" + name + "}}", div)
    template = Template((ASSETS / "report.html").read_text())
    return template.substitute(
        title=esc(title),
        meta="".join(f"<span>{esc(m)}</span>" for m in meta),
        nav="".join(f'<a href="#{esc(a)}">{esc(label)}</a>' for a, label in nav),
        css=(ASSETS / "report.css").read_text(),
        js=(ASSETS / "report.js").read_text(),
        bokeh_js=BOKEH_JS.render_js(),
        bokeh_script=script,
        body=body,
        data=script_json(data),
    )
