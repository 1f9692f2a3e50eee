"""The report of a 400-episode evaluation: its file size, build time, and how long a browser takes to open it.

    uv run bench/report_speed.py                         # runs the evaluation first (the fake backend, minutes)
    uv run bench/report_speed.py --results results/x     # an evaluation folder already there

The evaluation is tau2's test split (20 airline + 40 retail + 40 telecom tasks) x 4 samples on the fake generation
backend, its policy wrong in every other sample (failures, infrastructure errors and transcripts of every kind),
with token ids kept, as a training-grade eval writes them. Open time: from navigation to Bokeh's document idle
(every chart drawn), in headless Chromium from the OS (``/usr/bin/chromium``), median of 3 opens. Reference, opened in
the same browser in the same run: Bokeh's own standalone page of one empty figure (the floor any Bokeh page pays).
Targets (issue 38): under 5 MB and under 2 s. Last line: JSON with the figures.
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import nemo_tau2  # noqa: F401  (offline settings before tau2 loads litellm)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.browser: the same Chromium launch the tests use

FAKE = ROOT / "examples" / "configs" / "evals" / "tau2_fake.yaml"
OPENS = 3


def run_evaluation(save_path: Path) -> Path:
    from nemo_tau2.config import apply_overrides, load_config
    from nemo_tau2.evals.eval import run_eval, setup_eval

    raw = apply_overrides(
        load_config(FAKE),
        [
            f"eval.save_path={save_path}",
            "data.split=test",
            "eval.num_tests_per_prompt=4",
            "eval.k_values=[1,2,4]",
            "policy.generation.fake_cfg={tau2: {policy: {variant: wrong_argument, variant_every: 2}}}",
        ],
    )
    run_eval(setup_eval(raw), raw)
    return save_path


def open_seconds(browser, path: Path) -> float:
    from tests.browser import open_report

    opened = open_report(browser, path)
    seconds = opened.page.evaluate("() => performance.now()") / 1000
    if opened.console_errors:
        raise RuntimeError(f"console errors opening {path}: {opened.console_errors[:3]}")
    opened.page.context.close()
    return seconds


def reference_page(path: Path) -> Path:
    """One empty Bokeh figure with the same inlined Bokeh script as the report."""
    from bokeh.embed import components
    from bokeh.plotting import figure

    from nemo_tau2.report.page import BOKEH_JS

    script, div = components(figure())
    path.write_text(f"<!DOCTYPE html><html><head>{BOKEH_JS.render_js()}</head><body>{div}{script}</body></html>")
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=None, help="an evaluation folder (default: run one)")
    args = parser.parse_args()
    from nemo_tau2.report.build import build_report
    from nemo_tau2.report.sources import load_eval
    from tests.browser import chromium

    work = Path(tempfile.mkdtemp(prefix="report_speed_"))
    results = args.results or run_evaluation(work / "eval")
    episodes = len(load_eval(results).records)
    started = time.perf_counter()
    report = build_report([results], work / "report.html")
    build_s = time.perf_counter() - started
    reference = reference_page(work / "reference.html")
    with chromium() as browser:
        open_s = statistics.median(open_seconds(browser, report) for _ in range(OPENS))
        reference_s = statistics.median(open_seconds(browser, reference) for _ in range(OPENS))
    size_mb = report.stat().st_size / 1e6
    figures = {
        "episodes": episodes,
        "report_mb": round(size_mb, 3),
        "rollouts_jsonl_mb": round((results / "rollouts.jsonl").stat().st_size / 1e6, 1),
        "build_s": round(build_s, 2),
        "open_s": round(open_s, 3),
        "reference_open_s": round(reference_s, 3),
        "open_ratio_vs_reference": round(open_s / reference_s, 2),
        "meets_5mb": size_mb < 5,
        "meets_2s": open_s < 2,
    }
    print(f"report: {report}")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
