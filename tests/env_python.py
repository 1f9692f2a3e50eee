"""Where the tests find an interpreter of another environment (vLLM's, tau2 v1.0.1's): nothing to export.

``$variable`` when set (a config's choice: it must exist). Otherwise the environment at its default place under
``~/.cache/nemo-tau2``, built there on first use by ``scripts/setup.sh <part>`` (the set-up's own command: seconds
when it is cached, which it is after the set-up; else the build, minutes, its progress shown on the terminal), then
exported as ``$variable`` for the processes the tests start. The
build scripts hold a file lock per environment, so parallel test sessions build it once. No test skips for a
missing environment: one that cannot be built fails, naming the command that builds it.
"""

import functools
import os
import subprocess
import sys
from contextlib import nullcontext
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SETUP = ROOT / "scripts" / "setup.sh"

_pytest_config: pytest.Config | None = None
"""Set by tests/conftest.py: its capture manager lets a build's progress reach the terminal."""


def environment_python(variable: str, part: str, what: str) -> str:
    """The interpreter ``$variable`` names, else the one ``scripts/setup.sh part`` builds (or finds) and prints."""
    python = os.environ.get(variable)
    if python:
        if not os.path.isfile(python):
            pytest.fail(
                f"${variable} is {python!r}, which does not exist: unset it (the tests then build {what} "
                f"with `scripts/setup.sh {part}`) or point it at an interpreter that does"
            )
        return python
    built = _set_up(part)
    if isinstance(built, str):
        # exported for what the tests start (a run's processes, a Ray cluster's nodes): they find it as a user's
        # run does, through the variable
        os.environ[variable] = built
        return built
    pytest.fail(
        f"no {what} environment: `scripts/setup.sh {part}` failed ({built}); run it to see why and fix "
        f"that, or export {variable} as an interpreter of one"
    )


@functools.cache
def _set_up(part: str) -> str | Exception:
    """Once per session: the interpreter the part prints last, or what went wrong (cached too: one try only)."""
    capture = _pytest_config.pluginmanager.getplugin("capturemanager") if _pytest_config else None
    with capture.global_and_fixture_disabled() if capture else nullcontext():
        print(f"\n[tests] scripts/setup.sh {part} (its environment, built on first use)", file=sys.stderr, flush=True)
        try:
            done = subprocess.run([str(SETUP), part], cwd=ROOT, stdout=subprocess.PIPE, text=True, timeout=3600)
        except (OSError, subprocess.TimeoutExpired) as e:
            return e
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines or not os.path.isfile(lines[-1]):
        return RuntimeError(f"exit status {done.returncode}, last line {lines[-1] if lines else ''!r}")
    return lines[-1]
