"""scripts/coverage_by_package.py judges the tests on the statements two runs share: a line the tests stopped
covering is a drop, named by file and line, while new code that lowers a package's figure is not."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "coverage_by_package.py"

MODULE = """
def covered():
    return 1


def later_uncovered():
    return 2


def never():
    return 3
"""


def _measure(tmp_path: Path, calls: str, name: str) -> Path:
    """A real coverage.py run of a driver calling ``calls`` in the package ``nemo_tau2.pkg`` under ``tmp_path``."""
    data_file = tmp_path / name
    (tmp_path / "driver.py").write_text(f"from nemo_tau2.pkg.mod import *\n{calls}\n")
    env = {key: value for key, value in os.environ.items() if not key.startswith("COVERAGE")}  # not the suite's
    command = [sys.executable, "-m", "coverage", "run", f"--data-file={data_file}", "--source=nemo_tau2", "driver.py"]
    subprocess.run(command, cwd=tmp_path, env=env | {"PYTHONPATH": str(tmp_path)}, check=True)
    return data_file


def _script(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True)


def test_a_line_no_longer_covered_is_a_drop_and_new_uncovered_code_is_not(tmp_path):
    package = tmp_path / "nemo_tau2" / "pkg"
    package.mkdir(parents=True)
    (tmp_path / "nemo_tau2" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "mod.py").write_text(MODULE)
    before = _measure(tmp_path, "covered()\nlater_uncovered()", "before.coverage")
    figures, lines = tmp_path / "before.json", tmp_path / "before_lines.json"
    first = _script(before, "--save-lines", lines)
    assert first.returncode == 0, first.stdout + first.stderr
    figures.write_text(first.stdout.splitlines()[-1])

    # new code the tests do not reach, above the old lines (their numbers move): the figure falls, no drop
    (package / "mod.py").write_text("def added():\n    return 0\n" + MODULE)
    grown = _measure(tmp_path, "covered()\nlater_uncovered()", "grown.coverage")
    judged = _script(grown, "--compare", figures, "--lines", lines)
    assert judged.returncode == 0, judged.stdout
    row = next(line for line in judged.stdout.splitlines() if line.startswith("| nemo_tau2.pkg |"))
    assert "(new code)" in row and "DROPPED" not in row, row
    assert "lost:" not in judged.stdout
    # without --lines the package's figure alone decides: the rule before
    assert _script(grown, "--compare", figures).returncode == 1

    # the tests stop calling a function they covered: its line is lost, named by its number now
    lost = _measure(tmp_path, "covered()", "lost.coverage")
    judged = _script(lost, "--compare", figures, "--lines", lines)
    assert judged.returncode == 1, judged.stdout
    assert "lost: nemo_tau2/pkg/mod.py lines 9" in judged.stdout, judged.stdout
    row = next(line for line in judged.stdout.splitlines() if line.startswith("| nemo_tau2.pkg |"))
    assert row.count("DROPPED") == 2, row


def test_a_missing_earlier_file_is_named_with_exit_2(tmp_path):
    result = _script(tmp_path / "none.coverage")
    assert result.returncode == 2 and "no coverage data" in result.stdout
    (tmp_path / "data").write_text("")
    result = _script(tmp_path / "data", "--lines", tmp_path / "missing.json")
    assert result.returncode == 2 and "missing.json" in result.stdout, result.stdout
