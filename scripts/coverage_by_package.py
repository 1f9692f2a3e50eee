"""Line coverage per package of nemo_tau2, from a coverage.py data file (``uv run pytest tests/unit --cov
--cov-report=`` writes ``.coverage``): a markdown table, and the same figures as one JSON line last.

    uv run python scripts/coverage_by_package.py [.coverage] [--compare before.json]

``--compare`` takes an earlier run's JSON line (saved to a file) and adds its column and the change; a package
whose coverage dropped is marked, and the exit status is 1 when any did (the house rule: no package may drop).
"""

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import coverage


def package_of(path: str) -> str:
    parts = Path(path).parts
    start = parts.index("nemo_tau2")
    inner = parts[start + 1 : -1]
    return "nemo_tau2" + (f".{inner[0]}" if inner else "")


def per_package(data_file: str) -> dict[str, dict[str, int]]:
    cov = coverage.Coverage(data_file=data_file)
    cov.load()
    totals: dict[str, dict[str, int]] = defaultdict(lambda: {"statements": 0, "covered": 0})
    for path in cov.get_data().measured_files():
        if "nemo_tau2" not in Path(path).parts:
            continue
        _, statements, _, missing, _ = cov.analysis2(path)
        totals[package_of(path)]["statements"] += len(statements)
        totals[package_of(path)]["covered"] += len(statements) - len(missing)
    return dict(sorted(totals.items()))


def percent(entry: dict[str, int]) -> float:
    return 100.0 * entry["covered"] / entry["statements"] if entry["statements"] else 100.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_file", nargs="?", default=".coverage")
    parser.add_argument("--compare", type=Path, help="an earlier run's JSON line, saved to a file")
    args = parser.parse_args()
    if not Path(args.data_file).is_file():
        print(f"error: no coverage data at {args.data_file} (run: uv run pytest tests/unit --cov --cov-report=)")
        return 2
    now = per_package(args.data_file)
    before = json.loads(args.compare.read_text().strip().splitlines()[-1]) if args.compare else None
    dropped = []
    header = "| package | statements | covered | line coverage |" + (" before | change |" if before else "")
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for package, entry in now.items():
        row = f"| {package} | {entry['statements']} | {entry['covered']} | {percent(entry):.1f}% |"
        old = before.get(package) if before else None
        if old:
            change = percent(entry) - percent(old)
            mark = " DROPPED" if change < -0.05 else ""
            dropped += [package] if mark else []
            row += f" {percent(old):.1f}% | {change:+.1f}{mark} |"
        elif before:
            row += " - | new |"
        print(row)
    print(json.dumps(now))
    return 1 if dropped else 0


if __name__ == "__main__":
    sys.exit(main())
