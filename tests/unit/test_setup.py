"""The set-up: `scripts/setup.sh` builds what the suite needs, and the tests find it with nothing exported; a missing
environment is a failure naming the command that builds it, never a skip."""

import subprocess

import pytest

from tests import env_python


def test_an_environment_variable_naming_nothing_fails_the_test_naming_the_command(monkeypatch):
    monkeypatch.setenv("NEMO_TAU2_PROBE_PYTHON", "/nowhere/bin/python")
    with pytest.raises(pytest.fail.Exception, match=r"does not exist: unset it .*`scripts/setup.sh vllm`"):
        env_python.environment_python("NEMO_TAU2_PROBE_PYTHON", "vllm", "vLLM")


def test_a_part_that_cannot_be_built_fails_the_test_naming_the_command(monkeypatch):
    monkeypatch.delenv("NEMO_TAU2_PROBE_PYTHON", raising=False)
    with pytest.raises(pytest.fail.Exception, match=r"no probe environment: `scripts/setup.sh no-such-part` failed"):
        env_python.environment_python("NEMO_TAU2_PROBE_PYTHON", "no-such-part", "probe")


@pytest.mark.parametrize("arguments", [["no-such-part"], ["vllm", "smollm2"]])
def test_setup_refuses_bad_arguments_in_one_line(arguments):
    run = subprocess.run([str(env_python.SETUP), *arguments], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.count("\n") == 1 and "project chromium vllm smollm2 tau2-v1 gym07" in run.stderr


def test_ci_runs_exactly_the_set_up_and_the_test_command():
    commands = [line for line in (env_python.ROOT / ".ci" / "run").read_text().splitlines() if line and line[0] != "#"]
    assert commands[-3:] == ["pip install uv", "scripts/setup.sh", "uv run pytest tests/unit"]
    assert commands[:-3] == ["set -euo pipefail", 'cd "$(dirname "$0")/.."']
