"""The Gym stack's launcher: every server forked from one warm parent comes up, answers, logs its requests to its
own file and says so in a line; a killed server is reported (and its episodes are infrastructure errors, never
scores); stopping, or killing the launcher itself, leaves no process behind, and a stop does not wait on the fork
server's interpreter teardown."""

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import requests

from nemo_tau2.experience.rollouts import INFRASTRUCTURE_ERROR, SamplingParams, run_nemo_gym_rollout_sync
from nemo_tau2.gym.fork_server import ForkServer
from nemo_tau2.gym.fork_template import TEMPLATE_ENV
from nemo_tau2.gym.launch import FORK_SERVER_LOG, GymServers
from nemo_tau2.gym.stack import (
    AGENT,
    POLICY_MODEL,
    RESOURCES_SERVER_CLASS,
    USER_MODEL,
    ModelEndpoint,
    model_server_spec,
    tau2_stack,
)
from nemo_tau2.tau2_env.gym_rows import task_row
from nemo_tau2.testing import start_fake_server
from tests.process_state import gone
from tests.sigterm import as_from_a_terminal

FAST_RETRY = {"timeout_s": 3.0, "max_attempts": 2, "backoff_s": 0.05, "max_backoff_s": 0.1}
REPO = Path(__file__).resolve().parents[3]


def _wait_until(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


@pytest.fixture(scope="module")
def started(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("server_logs")
    with start_fake_server() as fake:
        specs = tau2_stack(
            ModelEndpoint([fake.base_url], "fake-policy"),
            ModelEndpoint([fake.base_url], "fake-user"),
            domains=["airline"],
            agent_config={"policy_retry": FAST_RETRY, "user_retry": FAST_RETRY},
        )
        handler = _Lines()
        logging.getLogger("nemo_tau2.gym.launch").addHandler(handler)
        logging.getLogger("nemo_tau2.gym.launch").setLevel(logging.INFO)
        try:
            servers = GymServers(specs, log_dir=log_dir).start()
        finally:
            logging.getLogger("nemo_tau2.gym.launch").removeHandler(handler)
        try:
            yield servers, handler.lines
        finally:
            servers.stop()


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def test_every_server_is_its_own_process_answers_and_logs_its_requests(started):
    servers, lines = started
    names = [spec.name for spec in servers.specs]
    for name in names:
        assert requests.get(servers.url(name) + "/", timeout=10).status_code == 200
    assert len(set(servers.process_ids())) == len(names) + 1  # the servers and their one fork server
    assert len(lines) == len(names) and all(any(f"server {name} up at" in line for line in lines) for name in names)
    for name in names:
        log = servers.log_path(name)
        _wait_until(lambda log=log: '"GET / HTTP/1.1" 200' in log.read_text(), 10, f"no request line in {log}")
        assert log.read_text().startswith(f"{time.strftime('%Y')}")  # our own start line opens each log
    assert "forked server" in (servers.log_dir / FORK_SERVER_LOG).read_text()


def test_a_killed_server_is_reported_its_episodes_fail_as_infrastructure_and_stop_leaves_nothing(started):
    servers, _ = started
    assert servers.exited() == []
    os.kill(servers.pid(USER_MODEL), signal.SIGKILL)
    _wait_until(lambda: servers.exited(), 10, "the fork server did not report the killed server")
    ((exit,),) = [servers.exited()]
    assert (exit.name, exit.returncode) == (USER_MODEL, -signal.SIGKILL)
    assert requests.get(servers.url(AGENT) + "/", timeout=10).status_code == 200  # the others go on
    (result,) = run_nemo_gym_rollout_sync(
        [task_row("airline", "11")], {AGENT: servers.url(AGENT)}, SamplingParams(0.0, 1.0), 1
    )
    assert result.status == INFRASTRUCTURE_ERROR and result.reward is None and "user" in result.error
    pids = servers.process_ids()
    servers.stop()
    _wait_until(lambda: all(gone(pid) for pid in pids), 15, f"processes left after stop: {pids}")


LAUNCHER = textwrap.dedent(
    """
    import json, sys, time
    from nemo_tau2.gym.launch import GymServers, ServerSpec

    spec = ServerSpec("tau2_resources_server", "resources_servers", "tau2",
                      "nemo_tau2.gym.resources_server.app:Tau2ResourcesServer", {"domain": "agent"})
    servers = GymServers([spec], log_dir=sys.argv[1]).start()
    print(json.dumps(servers.process_ids()), flush=True)
    time.sleep(600)
    """
)


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "killed"])
def test_a_launcher_interrupted_or_killed_takes_the_fork_server_and_its_servers_with_it(tmp_path, how):
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(tmp_path)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        preexec_fn=as_from_a_terminal,  # else a runner started in the background loses the Ctrl-C (seen twice)
    )
    try:
        pids = json.loads(launcher.stdout.readline())
        assert len(pids) == 2 and not any(gone(pid) for pid in pids)
        launcher.send_signal(how)
        launcher.wait(timeout=30)  # its stop is bounded (~8 s)
    finally:
        launcher.kill()
        launcher.wait()
    _wait_until(lambda: all(gone(pid) for pid in pids), 15, f"orphans after the launcher got {how!r}: {pids}")


def test_a_fork_server_stops_in_a_fraction_of_its_import_time(tmp_path):
    """The stop waits for the fork server to exit: with its imports' objects frozen, the interpreter's teardown no
    longer walks them (4.7 s against 8.5 s of imports on an idle box before; ~0.2 s now). Both are CPU work of the one
    process, so their ratio holds on a loaded box as on an idle one."""
    fork_server = ForkServer([RESOURCES_SERVER_CLASS], tmp_path / FORK_SERVER_LOG)
    try:
        fork_server.wait_ready(timeout_s=300)
        began = time.monotonic()
        fork_server.stop()
        stop_s = time.monotonic() - began
    finally:
        fork_server.stop()
    assert fork_server.process.returncode == 0
    assert stop_s < fork_server.preload_s / 5, f"stopped in {stop_s:.1f} s, imported in {fork_server.preload_s:.1f} s"


# A start-up hook's SIGTERM handler (coverage's `sigterm` one saves the process's data there): it notes the pid, then
# ends the process by SIGTERM as the default would.
SIGTERM_HOOK = """
import os, signal

def _noted(signum, frame):
    open(os.path.join(os.environ["SIGTERM_NOTES"], str(os.getpid())), "w").close()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)

signal.signal(signal.SIGTERM, _noted)
"""


def test_a_server_stopped_by_sigterm_ends_through_the_handler_its_interpreter_started_with(tmp_path, monkeypatch):
    """The fork server's own SIGTERM handler is not a server's; nor is the default where the interpreter started
    with a handler of its own: a server then ended before that handler ran (its coverage data never saved)."""
    hook, notes = tmp_path / "hook", tmp_path / "notes"
    hook.mkdir()
    notes.mkdir()
    (hook / "sitecustomize.py").write_text(SIGTERM_HOOK)
    monkeypatch.setenv(TEMPLATE_ENV, "")  # a fork server of its own, started by an interpreter with the hook
    spec = model_server_spec(POLICY_MODEL, ModelEndpoint(["http://127.0.0.1:9"], "fake-policy"))
    env = {"PYTHONPATH": os.pathsep.join([str(hook), str(REPO)]), "SIGTERM_NOTES": str(notes)}
    with GymServers([spec], log_dir=tmp_path / "logs", env=env) as servers:
        pid = servers.pid(POLICY_MODEL)
        os.kill(pid, signal.SIGTERM)
        _wait_until(lambda: servers.exited(), 30, "the server did not exit after SIGTERM")
        ((exit,),) = [servers.exited()]
        assert exit.returncode == -signal.SIGTERM  # ended by the signal, as before
    assert [path.name for path in notes.iterdir()] == [str(pid)]  # the server's, not the fork server's
