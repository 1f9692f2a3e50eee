"""Shared Bokeh pieces: one figure style, one colour per run, and the glyphs several charts draw (lines with
interval whiskers, dodged bars, box plots). Bokeh because its standalone output inlines one 1.4 MB script, renders
to canvas (hundreds of grid cells stay fast) and runs JavaScript callbacks on taps without a server."""

from collections.abc import Sequence
from typing import Any

import numpy as np
from bokeh.models import ColumnDataSource, FactorRange, HoverTool
from bokeh.palettes import Category10_10
from bokeh.plotting import figure
from bokeh.transform import dodge

RUN_COLORS = Category10_10
FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif"


def run_color(index: int) -> str:
    return RUN_COLORS[index % len(RUN_COLORS)]


def new_figure(title: str, *, height: int = 280, **kwargs: Any):
    """A figure in the report's style: stretches to its card, light grid, tools limited to what helps reading."""
    fig = figure(
        title=title,
        height=height,
        sizing_mode="stretch_width",
        tools="pan,wheel_zoom,box_zoom,reset,save",
        toolbar_location="right",
        **kwargs,
    )
    fig.toolbar.logo = None
    fig.title.text_font = FONT
    fig.title.text_font_size = "13px"
    fig.title.text_font_style = "bold"
    fig.outline_line_color = None
    fig.grid.grid_line_alpha = 0.35
    for axis in (fig.xaxis, fig.yaxis):
        axis.axis_label_text_font = FONT
        axis.axis_label_text_font_style = "normal"
        axis.major_label_text_font = FONT
    return fig


def finish_legend(fig, location: str = "top_right", *, outside: bool = False) -> None:
    """Style the legend; ``outside`` moves it below the plot (several runs: a key over the data would hide it)."""
    if fig.legend:
        if outside and fig.legend[0] not in fig.below:
            fig.add_layout(fig.legend[0], "below")
            fig.legend.orientation = "vertical"
        fig.legend.location = location
        fig.legend.click_policy = "hide"
        fig.legend.label_text_font = FONT
        fig.legend.label_text_font_size = "11px"
        fig.legend.background_fill_alpha = 0.7
        fig.legend.spacing = 0
        fig.legend.padding = 4


def line_with_interval(fig, xs, ys, lows, highs, *, color: str, label: str, dash: str = "solid", marker="circle"):
    """A line with its points and, where an interval is known, a vertical whisker from low to high."""
    source = ColumnDataSource({"x": xs, "y": ys, "low": lows, "high": highs, "series": [label] * len(xs)})
    fig.line("x", "y", source=source, color=color, line_width=2, line_dash=dash, legend_label=label)
    fig.scatter("x", "y", source=source, color=color, size=7, marker=marker, legend_label=label)
    known = [i for i, (lo, hi) in enumerate(zip(lows, highs, strict=True)) if lo is not None and hi is not None]
    if known:
        fig.segment(
            [xs[i] for i in known],
            [lows[i] for i in known],
            [xs[i] for i in known],
            [highs[i] for i in known],
            color=color,
            line_width=1.5,
            alpha=0.6,
            legend_label=label,
        )
    return source


def _legend(label: str, series: list) -> dict[str, str]:
    """A legend entry only when there is more than one series (one run needs no key)."""
    return {"legend_label": label} if len(series) > 1 else {}


def dodged_bars(title: str, factors: Sequence[Any], series: list[tuple[str, str, list[float]]], *, y_label: str):
    """Bars on categorical ``factors`` (flat or (group, item) pairs), one bar per series side by side."""
    x_range = FactorRange(*factors)
    fig = new_figure(title, x_range=x_range, y_axis_label=y_label)
    width = 0.8 / max(len(series), 1)
    for i, (label, color, values) in enumerate(series):
        offset = -0.4 + width * (i + 0.5)
        source = ColumnDataSource({"x": list(factors), "value": values, "series": [label] * len(values)})
        fig.vbar(
            x=dodge("x", offset, range=x_range),
            top="value",
            width=width * 0.9,
            source=source,
            color=color,
            alpha=0.85,
            **_legend(label, series),
        )
    fig.add_tools(HoverTool(tooltips=[("", "@series"), ("", "@x"), ("value", "@value{0.000}")]))
    fig.xaxis.major_label_orientation = 1.2
    fig.height = 330
    fig.xgrid.grid_line_color = None
    fig.y_range.start = 0
    finish_legend(fig, "top_left", outside=len(series) > 1)
    return fig


def box_plot(title: str, groups: Sequence[str], series: list[tuple[str, str, list[list[float]]]], *, y_label: str):
    """A box (quartiles), whiskers (5th-95th percentile) and median per group, one box per series side by side:
    a distribution per domain that stays readable when runs are overlaid."""
    x_range = FactorRange(*groups)
    fig = new_figure(title, x_range=x_range, y_axis_label=y_label)
    width = 0.8 / max(len(series), 1)
    for i, (label, color, per_group) in enumerate(series):
        offset = -0.4 + width * (i + 0.5)
        rows = {"x": [], "q1": [], "q2": [], "q3": [], "lo": [], "hi": [], "n": [], "series": []}
        for group, values in zip(groups, per_group, strict=True):
            if not values:
                continue
            lo, q1, q2, q3, hi = np.percentile(values, [5, 25, 50, 75, 95])
            for key, value in (("x", group), ("q1", q1), ("q2", q2), ("q3", q3), ("lo", lo), ("hi", hi)):
                rows[key].append(value)
            rows["n"].append(len(values))
            rows["series"].append(label)
        source = ColumnDataSource(rows)
        x = dodge("x", offset, range=x_range)
        fig.segment(x0=x, y0="lo", x1=x, y1="hi", source=source, color=color, line_width=1.5)
        fig.vbar(
            x=x,
            bottom="q1",
            top="q3",
            width=width * 0.8,
            source=source,
            fill_color=color,
            fill_alpha=0.35,
            line_color=color,
            **_legend(label, series),
        )
        fig.segment(
            x0=dodge("x", offset - width * 0.4, range=x_range),
            y0="q2",
            x1=dodge("x", offset + width * 0.4, range=x_range),
            y1="q2",
            source=source,
            color=color,
            line_width=2.5,
        )
    fig.add_tools(
        HoverTool(
            tooltips=[("", "@series @x"), ("median", "@q2{0.0}"), ("quartiles", "@q1{0.0} - @q3{0.0}"), ("n", "@n")]
        )
    )
    fig.xgrid.grid_line_color = None
    finish_legend(fig, "top_left", outside=len(series) > 1)
    return fig
