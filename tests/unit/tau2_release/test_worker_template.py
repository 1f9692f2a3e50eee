"""A tau2 worker forked from a template (nemo_tau2/tau2_release/template.py) is the worker a fresh interpreter is:
the same answers on a scripted episode, its exit status and signals as ``Popen`` gives them; a template that
cannot give that worker (an environment its imports did not see, another interpreter, none listening) refuses,
and the worker starts as its own interpreter."""

import logging
import os

import pytest

from nemo_tau2.tau2_release.client import WORKER_FILE, Tau2Worker, worker_environment
from nemo_tau2.tau2_release.config import NLJudgeConfig, Tau2ReleaseConfig
from nemo_tau2.tau2_release.template import TEMPLATE_ENV, ForkedWorkerProcess, Tau2WorkerTemplate, forked_worker
from tests.tau2_v1_env import TEMPLATE_ANSWER_WAIT_S, tau2_v1_python
from tests.unit.tau2_release.episode_scripts import episode_scripts
from tests.unit.tau2_release.worker_episodes import play, summary

TASKS = {"airline": "1", "retail": "1"}


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """A template of this module's own, whatever the session's (``$NEMO_TAU2_TAU2_TEMPLATE=''`` included)."""
    folder = tmp_path_factory.mktemp("worker_template")
    started = Tau2WorkerTemplate(tau2_v1_python(), folder / "t.sock", worker_environment(), folder / "t.log")
    yield started
    started.stop()


def _parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])


def _worker(judge) -> Tau2Worker:
    judge_config = NLJudgeConfig(model="scripted-judge", base_url=judge.base_url, max_attempts=2, timeout_s=10)
    return Tau2Worker(Tau2ReleaseConfig(version="v1.0.1", python=tau2_v1_python(), judge=judge_config))


def test_a_forked_worker_plays_episodes_as_a_started_one(judge, template, monkeypatch, caplog):
    played = {}
    for how in ("forked", "started"):
        monkeypatch.setenv(TEMPLATE_ENV, str(template.socket_path) if how == "forked" else "")
        with caplog.at_level(logging.INFO, logger="nemo_tau2.tau2_release.template"), _worker(judge) as worker:
            forked = isinstance(worker._process, ForkedWorkerProcess)
            assert forked == (how == "forked"), caplog.text  # the template's refusal, if it refused
            if forked:
                assert _parent_of(worker._process.pid) == template.process.pid
            greeting = worker.request("greeting")
            played[how] = {
                f"{domain}/{name}": summary(play(worker, domain, task["id"], script))
                for domain, task_id in TASKS.items()
                for task in worker.request("tasks", domain=domain, split=None)
                if task["id"] == task_id
                for name, script in episode_scripts(task, greeting).items()
            }
        assert worker._process.returncode == 0
    assert len(played["forked"]) >= 2 * len(TASKS)
    assert played["forked"] == played["started"]


@pytest.mark.parametrize(
    ("variable", "value", "refusal"),
    [
        ("LITELLM_LOG", "DEBUG", "$LITELLM_LOG differs"),  # litellm reads it at import
        ("TAU2_DATA_DIR", "/nonexistent", "$TAU2_DATA_DIR differs"),  # tau2's data folder, fixed at import
        ("https_proxy", "http://127.0.0.1:9", "the *_proxy variables differ"),  # httpx's clients made at import
        ("NEMO_TAU2_NOT_READ_BY_TAU2", "1", None),
    ],
)
def test_an_environment_the_imports_did_not_see_is_refused(template, monkeypatch, caplog, variable, value, refusal):
    monkeypatch.setenv(TEMPLATE_ENV, str(template.socket_path))
    env = worker_environment() | {variable: value}
    with caplog.at_level(logging.INFO, logger="nemo_tau2.tau2_release.template"):
        process = forked_worker(tau2_v1_python(), WORKER_FILE, env, None, TEMPLATE_ANSWER_WAIT_S)
    if refusal is None:
        assert isinstance(process, ForkedWorkerProcess)
        process.stdin.close()  # the worker ends at its stdin's end, as a started one does
        assert process.wait(timeout=30) == 0
    else:
        assert process is None
        assert refusal in caplog.text


def test_a_forked_workers_exit_status_and_kill_are_popens(template, monkeypatch):
    monkeypatch.setenv(TEMPLATE_ENV, str(template.socket_path))
    process = forked_worker(tau2_v1_python(), WORKER_FILE, worker_environment(), None, TEMPLATE_ANSWER_WAIT_S)
    assert process.poll() is None
    process.kill()
    assert process.wait(timeout=30) == -9
    assert process.poll() == -9
    process.kill()  # a second kill of an ended worker signals nothing (its pid may be another's by now)
    process.stdin.close()
    process.stdout.close()


def test_without_a_listening_template_a_worker_starts_as_its_own(tmp_path, monkeypatch, caplog, template):
    for path in ("", str(tmp_path / "none.sock")):
        monkeypatch.setenv(TEMPLATE_ENV, path)
        assert forked_worker(tau2_v1_python(), WORKER_FILE, worker_environment(), None, TEMPLATE_ANSWER_WAIT_S) is None
    monkeypatch.setenv(TEMPLATE_ENV, str(template.socket_path))
    other_python = os.path.realpath(tau2_v1_python()) + "-not-this-one"
    with caplog.at_level(logging.INFO, logger="nemo_tau2.tau2_release.template"):
        assert forked_worker(other_python, WORKER_FILE, worker_environment(), None, TEMPLATE_ANSWER_WAIT_S) is None
    assert f"another interpreter: {other_python}" in caplog.text
