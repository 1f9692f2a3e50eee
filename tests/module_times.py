"""Each test module's wall time, recorded and held to a budget (a pytest plugin; tests/conftest.py loads it).

A module's time is the sum of its tests' set-up, call and tear-down durations as pytest reports them: its module
fixtures start in its first test's set-up and stop in its last test's tear-down, so they are inside; a fixture a whole
package or the session shares counts in the first module that uses it. Under pytest-xdist the reports reach the
controller, which does the sums, so a module's time is its wall time on the worker that ran it. Each record also
says which worker ran the module and when (seconds from the session's start to its first set-up and its last
tear-down): the timeline ``scripts/cpu_profile.py`` lays the box's idle CPU over, to find the modules that wait.

At the end of the session the times are written to :data:`TIMES_FILE` (``.ci/run`` prints them, sorted, with
``python -m tests.module_times``; every 30 s meanwhile too, so a session killed midway leaves its times so far), and
a module that ran past its budget fails the session: past ``budget x margin_factor + margin_s`` (a noisy box's
margin), the budget being its entry in ``tests/module_budgets.toml`` or that table's ``default``. So a new slow module
carries its budget in the same change, where a reviewer sees it.
``--no-module-budgets`` records without checking (a debugger session, a coverage run's overhead).
"""

import json
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUDGETS_FILE = ROOT / "tests" / "module_budgets.toml"
TIMES_FILE = ROOT / ".pytest_cache" / "module_times.json"
UNIT_PREFIX = "tests/unit/"
PARTIAL_EVERY_S = 30.0


@dataclass(frozen=True)
class Budgets:
    """The table of ``tests/module_budgets.toml``: seconds per module (keys as in ``tests/conftest.py``'s lists:
    relative to tests/unit), the default for a module it does not name, and the margin."""

    budgets: dict[str, float]
    default_s: float
    margin_factor: float
    margin_s: float

    @classmethod
    def load(cls, path: Path) -> "Budgets":
        table = tomllib.loads(path.read_text())
        return cls(
            budgets={module: float(seconds) for module, seconds in table["budgets"].items()},
            default_s=float(table["default_s"]),
            margin_factor=float(table["margin_factor"]),
            margin_s=float(table["margin_s"]),
        )

    def budget(self, module: str) -> float:
        return self.budgets.get(module, self.default_s)

    def allowed(self, module: str) -> float:
        """The most the module may take before it fails the session."""
        return self.budget(module) * self.margin_factor + self.margin_s


def module_of(nodeid: str) -> str:
    """A test's module as the budget table names it: its path relative to tests/unit (else to the rootdir)."""
    return nodeid.split("::", 1)[0].removeprefix(UNIT_PREFIX)


def pytest_addoption(parser):
    group = parser.getgroup("module budgets")
    group.addoption("--module-budgets", default=str(BUDGETS_FILE), help="the table of module budgets (TOML)")
    group.addoption("--module-times", default=str(TIMES_FILE), help="where the session writes each module's time")
    group.addoption("--no-module-budgets", action="store_true", help="record module times without checking them")


def pytest_configure(config):
    if hasattr(config, "workerinput"):  # an xdist worker: the controller sums the reports
        return
    budgets = Budgets.load(Path(config.getoption("--module-budgets")))
    # a renamed module would otherwise drop out of the table silently, onto the default
    missing = sorted(
        m for m in budgets.budgets if not any((config.rootpath / d / m).is_file() for d in ("", UNIT_PREFIX))
    )
    if missing:
        raise pytest.UsageError(f"{config.getoption('--module-budgets')} names modules that do not exist: {missing}")
    config.pluginmanager.register(ModuleClock(config, budgets), "nemo_tau2_module_clock")


class ModuleClock:
    def __init__(self, config: pytest.Config, budgets: Budgets) -> None:
        self.config, self.budgets = config, budgets
        self.path = Path(config.getoption("--module-times"))
        self.seconds: dict[str, float] = {}
        self.spans: dict[str, tuple[str, float, float]] = {}  # module: (worker, first start, last stop), epoch s
        self.started = time.time()
        self.over: list[str] = []
        self.written = time.monotonic()
        self.path.unlink(missing_ok=True)  # a session that runs nothing leaves no times behind, not the last ones

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.failed:
            self._say_failed(report)
        module = module_of(report.nodeid)
        self.seconds[module] = self.seconds.get(module, 0.0) + report.duration
        worker = getattr(getattr(report, "node", None), "gateway", None)  # pytest-xdist's worker, on the controller
        _, first, last = self.spans.get(module, ("", report.start, report.stop))
        self.spans[module] = (getattr(worker, "id", "main"), min(first, report.start), max(last, report.stop))
        if time.monotonic() - self.written > PARTIAL_EVERY_S:  # a session killed midway leaves its times so far
            self._write(finished=None)

    def _say_failed(self, report: pytest.TestReport) -> None:
        """A failure's line at once, not only in the summary: a run CI kills at its limit never prints the summary,
        and its log then named no failed test (stop 60: three Fs, no names)."""
        terminal = self.config.pluginmanager.get_plugin("terminalreporter")
        if terminal is None:
            return
        crash = getattr(report.longrepr, "reprcrash", None)  # the assertion or exception, where pytest has one
        lines = [line.strip() for line in report.longreprtext.splitlines() if line.strip()]
        reason = (crash.message if crash is not None else lines[-1] if lines else "").replace("\n", " ")[:300]
        terminal.write_line("")
        terminal.write_line(f"FAILED {report.nodeid} ({report.when}, {report.duration:.0f} s): {reason}", red=True)

    def _write(self, finished: float | None) -> list[dict]:
        records = [
            {"module": module, "seconds": round(seconds, 1), "budget_s": self.budgets.budget(module),
             "allowed_s": self.budgets.allowed(module), "worker": self.spans[module][0],
             "started_s": round(self.spans[module][1] - self.started, 1),
             "ended_s": round(self.spans[module][2] - self.started, 1)}
            for module, seconds in sorted(self.seconds.items(), key=lambda item: -item[1])
        ]  # fmt: skip
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(f"{self.path.name}.tmp")
        times = {"started": self.started, "finished": finished, "modules": records}
        temporary.write_text(json.dumps(times, indent=1) + "\n")
        temporary.replace(self.path)
        self.written = time.monotonic()
        return records

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if not self.seconds:
            self.path.unlink(missing_ok=True)
            return
        records = self._write(finished=time.time())
        if self.config.getoption("--no-module-budgets"):
            return
        self.over = [
            f"{r['module']}: {r['seconds']:.0f} s, past its budget of {r['budget_s']:g} s (allowed "
            f"{r['allowed_s']:g} s on a noisy box)"
            for r in records
            if r["seconds"] > r["allowed_s"]
        ]
        if self.over and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.over:
            terminalreporter.section("modules past their budget (tests/module_budgets.toml)", red=True)
            for line in self.over:
                terminalreporter.write_line(line)
            terminalreporter.write_line(
                "a slower module needs its budget raised in tests/module_budgets.toml, in the change that slows it"
            )


def print_times(path: Path = TIMES_FILE) -> int:
    """The recorded module times, slowest first, beside each module's budget; 1 if none were recorded."""
    if not path.is_file():
        print(f"no module times at {path}: the session ran no test", file=sys.stderr)
        return 1
    times = json.loads(path.read_text())
    records = times["modules"]
    cut_short = "" if times["finished"] else ", so far: the session did not finish"
    print(f"module times ({len(records)} modules, {sum(r['seconds'] for r in records):.0f} s in all{cut_short}):")
    print(f"{'seconds':>8} {'budget':>7} {'allowed':>8} {'worker':>6} {'from':>6}  module")
    for r in records:
        flag = "  OVER" if r["seconds"] > r["allowed_s"] else ""
        started = r.get("started_s")  # absent from a file an older version of this plugin wrote
        start = "-" if started is None else f"{int(started // 60)}:{int(started % 60):02d}"
        where = f"{r.get('worker', '-'):>6} {start:>6}"
        print(f"{r['seconds']:8.1f} {r['budget_s']:7g} {r['allowed_s']:8g} {where}  {r['module']}{flag}")
    return 0


if __name__ == "__main__":
    sys.exit(print_times(Path(sys.argv[1]) if len(sys.argv) > 1 else TIMES_FILE))
