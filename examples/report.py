"""Write one self-contained HTML report (works offline, opened from disk) of an evaluation or a training run; with
two or more folders, compare them.

    uv run examples/report.py results/tau2_eval                              # -> results/tau2_eval/report.html
    uv run examples/report.py results/base results/step_200 --out compare.html
    uv run examples/report.py results/grpo_cpu_smoke/logs                    # a training run's logger.log_dir

A folder without results, or runs that cannot be compared (other domains, tau2 release or tasks): one line on stderr,
exit 2.
"""

import argparse
import sys
from pathlib import Path

import nemo_tau2  # noqa: F401  (offline settings before tau2 loads litellm)
from nemo_tau2.report.build import REPORT_FILE, build_report
from nemo_tau2.report.sources import ReportInputError


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", type=Path, help="evaluation folders (eval.save_path) or run log_dirs")
    parser.add_argument(
        "--out", type=Path, default=None, help=f"the HTML file (default: <first folder>/{REPORT_FILE})"
    )
    args = parser.parse_args()
    out = args.out or args.results[0] / REPORT_FILE
    try:
        path = build_report(args.results, out)
    except ReportInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"report: {path.resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
