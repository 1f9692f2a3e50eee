"""Line coverage per package of nemo_tau2, from a coverage.py data file (``uv run pytest tests/unit --cov
--cov-report=`` writes ``.coverage``): a markdown table, and the same figures as one JSON line last.

    uv run python scripts/coverage_by_package.py [.coverage] [--compare before.json] [--lines before_lines.json]
                                                 [--save-lines lines.json]

``--compare`` takes an earlier run's JSON line (saved to a file) and adds its column and the change; a package
whose coverage dropped is marked, and the exit status is 1 when any did (the house rule: no package may drop).

A package's figure also falls when code is added that its tests cover less than the rest, whatever the tests do.
``--save-lines`` writes which statements a run covered, each named by its text (the stripped line and how many
times that text came before it in its file), not its number; ``--lines`` reads such a file from an earlier run and
judges the tests on the statements both runs have: the table adds their coverage then and now, and the lines lost
(covered then, there still, not covered now), named file by file. With it, a package is marked as dropped when the
kept statements' coverage fell (a line or two lost beside as many gained is the run-to-run wobble of concurrent code
paths, named for a reviewer); a fall of the whole package's figure alone is marked as new code's. Edited lines count
as new; a renamed file's lines as new too.
"""

import argparse
import hashlib
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

import coverage


def package_of(path: str) -> str:
    parts = Path(path).parts
    start = parts.index("nemo_tau2")
    inner = parts[start + 1 : -1]
    return "nemo_tau2" + (f".{inner[0]}" if inner else "")


def relative_path(path: str) -> str:
    parts = Path(path).parts
    return "/".join(parts[parts.index("nemo_tau2") :])


KEY_CHARS = 8  # 32 bits: two statements of one file share a key with odds of ~1 in 50,000 at 400 statements


def statement_keys(path: str, lines: list[int]) -> dict[int, str]:
    """Each statement's name across edits of its file: a hash of its stripped text and that text's occurrence."""
    text = Path(path).read_text(encoding="utf-8").splitlines()
    seen: Counter[str] = Counter()
    keys = {}
    for number in sorted(lines):
        stripped = text[number - 1].strip() if number <= len(text) else ""
        keys[number] = hashlib.sha1(f"{stripped}\0{seen[stripped]}".encode()).hexdigest()[:KEY_CHARS]
        seen[stripped] += 1
    return keys


def measure(data_file: str) -> dict[str, dict[str, list]]:
    """Per measured file of nemo_tau2 (its path from ``nemo_tau2/``): its statements' keys, covered or missed, and
    the numbers of the missed ones."""
    cov = coverage.Coverage(data_file=data_file)
    cov.load()
    files = {}
    for path in cov.get_data().measured_files():
        if "nemo_tau2" not in Path(path).parts or not Path(path).is_file():
            continue
        _, statements, _, missing, _ = cov.analysis2(path)
        keys, missed = statement_keys(path, statements), set(missing)
        files[relative_path(path)] = {
            "covered": [keys[n] for n in statements if n not in missed],
            "missed": [keys[n] for n in statements if n in missed],
            "missed_lines": sorted(missed),
        }
    return dict(sorted(files.items()))


def per_package(files: dict[str, dict[str, list]]) -> dict[str, dict[str, int]]:
    totals: dict[str, dict[str, int]] = defaultdict(lambda: {"statements": 0, "covered": 0})
    for path, entry in files.items():
        totals[package_of(path)]["statements"] += len(entry["covered"]) + len(entry["missed"])
        totals[package_of(path)]["covered"] += len(entry["covered"])
    return dict(sorted(totals.items()))


def kept_lines(files: dict, before: dict) -> tuple[dict[str, dict[str, int]], dict[str, list[int]]]:
    """Per package, over the statements both runs have: how many, covered then, covered now; and per file the
    numbers of the lines lost (covered then, missed now)."""
    totals: dict[str, dict[str, int]] = defaultdict(lambda: {"kept": 0, "covered_before": 0, "covered_now": 0})
    lost: dict[str, list[int]] = {}
    for path, entry in files.items():
        then = before.get(path)
        if then is None:
            continue
        covered_then, missed_then = _split_keys(then["covered"]), _split_keys(then["missed"])
        package = totals[package_of(path)]
        for key in entry["covered"]:
            if key in covered_then or key in missed_then:
                package["kept"] += 1
                package["covered_before"] += key in covered_then
                package["covered_now"] += 1
        missed_numbers = dict(zip(entry["missed"], entry["missed_lines"], strict=True))
        for key in entry["missed"]:
            if key in covered_then or key in missed_then:
                package["kept"] += 1
                package["covered_before"] += key in covered_then
        if gone := sorted(missed_numbers[key] for key in entry["missed"] if key in covered_then):
            lost[path] = gone
    return dict(totals), lost


def _split_keys(joined: str) -> set[str]:
    return {joined[i : i + KEY_CHARS] for i in range(0, len(joined), KEY_CHARS)}


def saved_lines(files: dict[str, dict[str, list]]) -> str:
    """What ``--save-lines`` writes: per file, its covered and its missed statements' keys, each list one string."""
    joined = {path: {kind: "".join(entry[kind]) for kind in ("covered", "missed")} for path, entry in files.items()}
    return json.dumps({"files": joined}, indent=0) + "\n"


def percent(covered: int, statements: int) -> float:
    return 100.0 * covered / statements if statements else 100.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_file", nargs="?", default=".coverage")
    parser.add_argument("--compare", type=Path, help="an earlier run's JSON line, saved to a file")
    parser.add_argument("--lines", type=Path, help="an earlier run's --save-lines file: judge the kept statements")
    parser.add_argument("--save-lines", type=Path, help="write this run's covered statements, for a later --lines")
    args = parser.parse_args()
    if not Path(args.data_file).is_file():
        print(f"error: no coverage data at {args.data_file} (run: uv run pytest tests/unit --cov --cov-report=)")
        return 2
    for option in (args.compare, args.lines):
        if option is not None and not option.is_file():
            print(f"error: no file at {option} (an earlier run's output of this script)")
            return 2
    files = measure(args.data_file)
    now = per_package(files)
    before = json.loads(args.compare.read_text().strip().splitlines()[-1]) if args.compare else None
    kept, lost = kept_lines(files, json.loads(args.lines.read_text())["files"]) if args.lines else ({}, {})
    dropped = []
    header = "| package | statements | covered | line coverage |" + (" before | change |" if before else "")
    header += " kept statements | their coverage before | now | lines lost |" if args.lines else ""
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for package, entry in now.items():
        row = f"| {package} | {entry['statements']} | {entry['covered']} | {percent(**entry):.1f}% |"
        old, keep = (before or {}).get(package), kept.get(package)
        if keep:  # the decisive figure where there is one: the same statements, then and now
            fell = percent(keep["covered_now"], keep["kept"]) - percent(keep["covered_before"], keep["kept"]) < -0.05
        else:
            fell = bool(old) and not args.lines and percent(**entry) - percent(**old) < -0.05
        dropped += [package] if fell else []
        if old:
            change = percent(**entry) - percent(**old)
            mark = " DROPPED" if fell else " (new code)" if change < -0.05 else ""
            row += f" {percent(**old):.1f}% | {change:+.1f}{mark} |"
        elif before:
            row += " - | new |"
        if args.lines:
            lost_here = sum(len(numbers) for path, numbers in lost.items() if package_of(path) == package)
            row += (
                f" {keep['kept']} | {percent(keep['covered_before'], keep['kept']):.1f}% |"
                f" {percent(keep['covered_now'], keep['kept']):.1f}%{' DROPPED' * fell} | {lost_here} |"
                if keep
                else " 0 | - | - | 0 |"
            )
        print(row)
    for path, numbers in lost.items():
        print(f"lost: {path} lines {', '.join(map(str, numbers[:20]))}" + (" ..." if len(numbers) > 20 else ""))
    if args.save_lines:
        args.save_lines.write_text(saved_lines(files))
    print(json.dumps(now))
    return 1 if dropped else 0


if __name__ == "__main__":
    sys.exit(main())
