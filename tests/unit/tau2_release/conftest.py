"""The two servers every tau2 v1.0.1 test talks to: the scripted NL-assertion judge and our worker in v1.0.1's
environment, wired to that judge. One of each for the package: the worker takes ~35 s to start on a loaded box."""

import pytest

from nemo_tau2.testing.scripted_judge import ScriptedJudge
from tests.unit.tau2_release.episode_scripts import JUDGE_FAIL_MARKER
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
