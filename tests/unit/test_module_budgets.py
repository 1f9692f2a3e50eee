"""The module budgets (tests/module_times.py): a session records each module's wall time, its module fixtures
included, and fails when a module runs past its budget with the margin; a table naming a module that does not exist
stops the session; the times are written as the session goes. Tiny modules in pytester's folder, with a table of
their own."""

import json

import pytest

from tests import module_times
from tests.module_times import BUDGETS_FILE, Budgets, print_times

pytest_plugins = ["pytester"]

SLEEPY_MODULE = """
import time
import pytest

@pytest.fixture(scope="module")
def slow_start():
    time.sleep({fixture_s})
    yield

def test_one(slow_start):
    time.sleep({test_s})

def test_two(slow_start):
    pass
"""

QUICK_MODULE = SLEEPY_MODULE.format(fixture_s=0, test_s=0)


def _table(budgets: dict[str, float], default_s: float = 60.0) -> str:
    lines = [f"default_s = {default_s}", "margin_factor = 1.5", "margin_s = 0.1", "[budgets]"]
    return "\n".join([*lines, *(f'"{module}" = {seconds}' for module, seconds in budgets.items())]) + "\n"


def _run(pytester: pytest.Pytester, budgets: dict[str, float], **modules: str) -> pytest.RunResult:
    pytester.makefile(".toml", budgets=_table(budgets))
    pytester.makepyfile(**modules)
    times = pytester.path / "times.json"
    return pytester.runpytest_inprocess(
        "-p", "tests.module_times", "--module-budgets", "budgets.toml", "--module-times", str(times), "-p", "no:xdist",
        "-p", "no:cacheprovider", "-o", "addopts=", "-o", "asyncio_default_fixture_loop_scope=function",
    )  # fmt: skip


def test_a_module_past_its_budget_fails_the_session_naming_it_and_its_budget(pytester):
    """``test_slow``'s module fixture sleeps 0.4 s, a test 0.4 s: past 0.2 s x 1.5 + 0.1 s; ``test_quick`` is within
    the default. Every test passes, and the session fails."""
    slow = SLEEPY_MODULE.format(fixture_s=0.4, test_s=0.4)
    result = _run(pytester, {"test_slow.py": 0.2}, test_slow=slow, test_quick=QUICK_MODULE)
    result.assert_outcomes(passed=4)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        ["*modules past their budget*", "test_slow.py: * s, past its budget of 0.2 s (allowed 0.4 s*"]
    )
    assert "test_quick.py:" not in result.stdout.str()
    records = {r["module"]: r for r in json.loads((pytester.path / "times.json").read_text())["modules"]}
    assert records["test_slow.py"]["seconds"] >= 0.8  # the module fixture's sleep is in its time
    assert records["test_slow.py"]["budget_s"] == 0.2 and records["test_quick.py"]["budget_s"] == 60.0


def test_modules_within_their_budgets_pass_and_the_times_print_slowest_first(pytester, capsys):
    result = _run(
        pytester, {"test_slow.py": 2.0},
        test_slow=SLEEPY_MODULE.format(fixture_s=0.2, test_s=0.2), test_quick=QUICK_MODULE,
    )  # fmt: skip
    result.assert_outcomes(passed=4)
    assert result.ret == pytest.ExitCode.OK
    capsys.readouterr()
    assert print_times(pytester.path / "times.json") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("module times (2 modules,")
    assert [line.split()[-1] for line in lines[2:]] == ["test_slow.py", "test_quick.py"]
    # when each ran, and where: one after the other (file order), in this process
    records = {r["module"]: r for r in json.loads((pytester.path / "times.json").read_text())["modules"]}
    quick, slow = records["test_quick.py"], records["test_slow.py"]
    assert 0 <= quick["started_s"] <= quick["ended_s"] <= slow["started_s"] < slow["ended_s"], records
    assert slow["ended_s"] - slow["started_s"] >= 0.4 and {quick["worker"], slow["worker"]} == {"main"}


def test_under_xdist_each_module_names_the_worker_that_ran_it(pytester):
    pytester.makefile(".toml", budgets=_table({}))
    pytester.makepyfile(test_a=QUICK_MODULE, test_b=QUICK_MODULE)
    times = pytester.path / "times.json"
    result = pytester.runpytest_subprocess(
        "-p", "tests.module_times", "--module-budgets", "budgets.toml", "--module-times", str(times), "-n", "2",
        "-p", "no:cacheprovider", "-o", "addopts=", "-o", "asyncio_default_fixture_loop_scope=function",
    )  # fmt: skip
    result.assert_outcomes(passed=4)
    workers = {r["module"]: r["worker"] for r in json.loads(times.read_text())["modules"]}
    assert set(workers) == {"test_a.py", "test_b.py"} and set(workers.values()) <= {"gw0", "gw1"}, workers


def test_a_session_that_runs_nothing_leaves_no_times_and_the_printer_says_so(pytester, capsys):
    (pytester.path / "times.json").write_text("{}")  # the last session's
    result = _run(pytester, {}, test_empty="")
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    capsys.readouterr()
    assert print_times(pytester.path / "times.json") == 1
    assert "the session ran no test" in capsys.readouterr().err


def test_a_table_naming_a_module_that_does_not_exist_stops_the_session(pytester):
    result = _run(pytester, {"test_renamed.py": 10}, test_quick=QUICK_MODULE)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "budgets.toml names modules that do not exist: ['test_renamed.py']" in result.stderr.str()


def test_the_suites_table_is_read_and_its_margin_is_generous():
    budgets = Budgets.load(BUDGETS_FILE)
    assert budgets.default_s > 0 and budgets.margin_factor >= 1.5 and budgets.margin_s >= 60
    assert budgets.allowed("no/such_module.py") == budgets.default_s * budgets.margin_factor + budgets.margin_s


def test_a_session_writes_its_times_as_it_goes_so_one_killed_midway_leaves_them(pytester, monkeypatch):
    monkeypatch.setattr(module_times, "PARTIAL_EVERY_S", 0.0)
    times = pytester.path / "times.json"
    monkeypatch.setenv("MODULE_TIMES", str(times))
    reads_them = """
import json, os
from pathlib import Path

def test_the_times_so_far():
    times = json.loads(Path(os.environ["MODULE_TIMES"]).read_text())
    assert times["finished"] is None and "test_a_first.py" in [r["module"] for r in times["modules"]]
"""
    result = _run(pytester, {}, test_a_first=QUICK_MODULE, test_b_second=reads_them)
    result.assert_outcomes(passed=3)
    assert json.loads(times.read_text())["finished"] is not None
