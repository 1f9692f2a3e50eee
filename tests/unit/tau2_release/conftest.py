"""The two servers every tau2 v1.0.1 test talks to: the scripted NL-assertion judge and our worker in v1.0.1's
environment, wired to that judge. One of each for the package: the worker takes ~35 s to start on a loaded box.
And the two workers of banking_knowledge's shell variants, started as a server holding credentials is: planted keys
in their environment, a planted secret in their home and in the machine's temporary folder (``planted``)."""

from pathlib import Path

import pytest

from nemo_tau2.testing.release_tasks import write_release_tasks
from nemo_tau2.testing.scripted_judge import ScriptedJudge
from tests.unit.tau2_release.episode_scripts import JUDGE_FAIL_MARKER
from tests.unit.tau2_release.shell_workers import Planted, plant_secrets, shell_worker
from tests.unit.tau2_release.worker_episodes import JUDGE_ATTEMPTS, judged_worker


@pytest.fixture(scope="package")
def judge():
    server = ScriptedJudge(fail_marker=JUDGE_FAIL_MARKER)
    yield server
    server.close()


@pytest.fixture(scope="package")
def worker(judge):
    with judged_worker(judge, max_attempts=JUDGE_ATTEMPTS, timeout_s=10) as started:
        yield started


@pytest.fixture(scope="package")
def release_tasks(worker, tmp_path_factory) -> Path:
    """The release's banking tasks, for the scripted policy (gold actions) and user (scenario)."""
    tasks = worker.request("tasks", domain="banking_knowledge", split=None)
    assert len(tasks) == 97
    return write_release_tasks(tmp_path_factory.mktemp("tasks") / "banking.json", {"banking_knowledge": tasks})


@pytest.fixture(scope="package")
def planted(tmp_path_factory) -> Planted:
    with plant_secrets(tmp_path_factory.mktemp("home")) as secrets:
        yield secrets


@pytest.fixture(scope="package")
def writable(judge, planted):
    with shell_worker(judge, "terminal_use_write", planted) as started:
        yield started


@pytest.fixture(scope="package")
def read_only(judge, planted):
    with shell_worker(judge, "terminal_use", planted) as started:
        yield started
