"""The fork template (nemo_tau2/gym/fork_template.py) the test session forks its stacks' fork servers from: a fork of
it is the fork server a fresh interpreter would have been for that launcher (the launcher's environment, folder and
log; its own session; it ends with the launcher), and where the template cannot serve a launcher (gone, another
interpreter) the launcher starts a fork server of its own, as a user's run always does."""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
import requests

from nemo_tau2.gym.fork_protocol import TemplateFork, fork_from_template
from nemo_tau2.gym.fork_server import ForkServer
from nemo_tau2.gym.fork_template import TEMPLATE_ENV, ForkTemplate
from nemo_tau2.gym.stack import RESOURCES_SERVER_CLASS
from nemo_tau2.request_guard import RUN_ID_ENV, RUN_ID_HEADER
from nemo_tau2.testing import start_fake_server
from tests.process_state import gone

REPO = Path(__file__).resolve().parents[3]

# a launcher as a user's script is one: its own folder, and a run id (an environment variable the test session does not
# have, which its servers read: a request naming another run is refused, naming theirs)
LAUNCHER = textwrap.dedent(
    """
    import json, os, sys, time
    from nemo_tau2.gym.launch import GymServers, ServerSpec

    spec = ServerSpec("tau2_resources_server", "resources_servers", "tau2",
                      "nemo_tau2.gym.resources_server.app:Tau2ResourcesServer", {"domain": "agent"})
    servers = GymServers([spec], log_dir=sys.argv[1]).start()
    fork_server = servers._fork_server
    sleeper = os.fork()  # holds the launcher's end of the control socket: its closing cannot say the launcher ended
    if sleeper == 0:
        time.sleep(600)
        os._exit(0)
    print(json.dumps({"pids": servers.process_ids(), "fork_server": fork_server.process.pid, "sleeper": sleeper,
                      "preload_s": fork_server.preload_s, "url": servers.url(spec.name)}), flush=True)
    time.sleep(600)
    """
)


def _launch(tmp_path: Path, template: str) -> tuple[subprocess.Popen, dict]:
    env = os.environ | {TEMPLATE_ENV: template, RUN_ID_ENV: "the-launchers-run"}
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(tmp_path / "logs")],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    return launcher, json.loads(launcher.stdout.readline())


def _wait_gone(pids: list[int], what: str) -> None:
    deadline = time.monotonic() + 15
    while not all(gone(pid) for pid in pids):
        assert time.monotonic() < deadline, f"{what}: {[pid for pid in pids if not gone(pid)]}"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """A template of this module's own: the session's may be turned off (``NEMO_TAU2_FORK_TEMPLATE=''``)."""
    folder = tmp_path_factory.mktemp("template")
    started = ForkTemplate(folder / "t.sock", [RESOURCES_SERVER_CLASS], folder / "template.log")
    yield started
    started.stop()


@pytest.mark.parametrize("mode", ["template", "own interpreter"])
def test_a_stack_forked_from_the_template_is_the_one_a_fresh_fork_server_starts(template, tmp_path, mode):
    """Either way: the server answers, has the launcher's environment and folder, is in a session of its own, and
    a killed launcher takes the fork server and the server with it, even where a process it forked still holds its
    end of the control socket. From the template, the fork server is the
    template's child and spends nothing on imports."""
    launcher, started = _launch(tmp_path, str(template.socket_path) if mode == "template" else "")
    try:
        assert requests.get(started["url"] + "/session_stats", timeout=30).ok
        refused = requests.get(started["url"] + "/session_stats", headers={RUN_ID_HEADER: "another"}, timeout=30)
        assert refused.status_code == 409 and "the-launchers-run" in refused.text, refused.text
        fork_server = psutil.Process(started["fork_server"])
        (server,) = set(started["pids"]) - {fork_server.pid}
        if mode == "template":
            assert fork_server.ppid() == template.process.pid and started["preload_s"] < 1.0, started
        else:
            assert fork_server.ppid() == launcher.pid and started["preload_s"] > 1.0, started
        for process in (fork_server, psutil.Process(server)):
            assert Path(process.cwd()) == tmp_path
            assert os.getpgid(process.pid) == process.pid  # its own process group, as start_new_session gives
        assert (tmp_path / "logs" / "tau2_resources_server.log").stat().st_size > 0
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(timeout=30)
        _wait_gone(started["pids"], f"orphans after the launcher was killed ({mode})")
    finally:
        launcher.kill()
        launcher.wait()
        os.kill(started["sleeper"], signal.SIGKILL)


def test_a_launcher_the_template_cannot_serve_starts_its_own_fork_server(tmp_path, monkeypatch):
    """Another interpreter than the template's is refused (its imports would be another environment's); a template
    that has ended is not there to ask. Either way the fork server starts as an interpreter of its own."""
    template = ForkTemplate(tmp_path / "t.sock", [RESOURCES_SERVER_CLASS], tmp_path / "template.log")
    try:
        with monkeypatch.context() as patched:
            patched.setattr(sys, "executable", "/usr/bin/python3")
            with open(tmp_path / "refused.log", "ab") as log:
                request = {"preload": [], "env": {}}
                assert fork_from_template(str(template.socket_path), request, [log.fileno()]) is None
        forked = ForkServer([RESOURCES_SERVER_CLASS], tmp_path / "forked.log", template=str(template.socket_path))
        try:
            assert isinstance(forked.process, TemplateFork)
            forked.wait_ready(timeout_s=300)
        finally:
            forked.stop()
        assert forked.process.poll() is not None
    finally:
        template.stop()
    assert template.process.returncode is not None and not template.socket_path.exists()
    own = ForkServer([RESOURCES_SERVER_CLASS], tmp_path / "own.log", template=str(template.socket_path))
    try:
        assert isinstance(own.process, subprocess.Popen)
        own.wait_ready(timeout_s=300)
        assert own.preload_s > 1.0
    finally:
        own.stop()


# a launcher of a fake server in a process of its own (the `fake` generation backend's way): it prints the server's
# pid and URL, then waits to be killed
FAKE_LAUNCHER = textwrap.dedent(
    """
    import json, sys, time
    from nemo_tau2.testing import start_fake_server

    fake = start_fake_server(mode="subprocess", log_file=sys.argv[1])
    print(json.dumps({"pid": fake.pid, "url": fake.root_url}), flush=True)
    time.sleep(600)
    """
)


@pytest.mark.parametrize("mode", ["template", "own interpreter"])
def test_a_fake_server_subprocess_is_a_fork_of_the_template_that_serves_logs_and_ends_with_its_launcher(
    template, tmp_path, monkeypatch, mode
):
    """``start_fake_server(mode="subprocess")`` where a template serves the launcher: a fork of the template (its
    parent) calls the fake server's ``main``, its imports done; it serves at the URL it printed, its log is the
    launcher's file, ``close()`` ends it, and so does the launcher's end. Without a template: an interpreter of its
    own, the launcher its parent, the same in every other way."""
    socket_path = str(template.socket_path) if mode == "template" else ""
    monkeypatch.setenv(TEMPLATE_ENV, socket_path)
    with start_fake_server(mode="subprocess") as fake:
        expected_parent = template.process.pid if mode == "template" else os.getpid()
        assert psutil.Process(fake.pid).ppid() == expected_parent
        assert requests.get(f"{fake.root_url}/v1/models", timeout=10).json()["data"][0]["id"] == "fake-model"
        pid = fake.pid
    _wait_gone([pid], f"the fake server after close() ({mode})")

    log = tmp_path / "fake.log"
    launcher = subprocess.Popen(
        [sys.executable, "-c", FAKE_LAUNCHER, str(log)], cwd=tmp_path, stdout=subprocess.PIPE, text=True
    )
    try:
        started = json.loads(launcher.stdout.readline())
        expected_parent = template.process.pid if mode == "template" else launcher.pid
        assert psutil.Process(started["pid"]).ppid() == expected_parent
        assert requests.get(f"{started['url']}/health", timeout=10).status_code == 200
        assert f"fake server (pid {started['pid']}) serving at {started['url']}" in log.read_text()
    finally:
        launcher.kill()
        launcher.wait()
    _wait_gone([started["pid"]], f"the fake server after its launcher was killed ({mode})")


@pytest.mark.parametrize("mode", ["template", "own interpreter"])
def test_a_fake_server_that_cannot_listen_is_reported_at_once_with_its_exit_code_and_log(
    template, tmp_path, monkeypatch, mode
):
    """A fake server subprocess that ends before its ready line (here: its port is taken) is reported as soon as its
    stdout ends, with the exit code it ended with (a fork of the template says it: the template, not the launcher,
    reaps it) and where its log is; the traceback is in that log."""
    monkeypatch.setenv(TEMPLATE_ENV, str(template.socket_path) if mode == "template" else "")
    log = tmp_path / "fake.log"
    with socket.create_server(("127.0.0.1", 0)) as taken:
        started = time.monotonic()
        with pytest.raises(RuntimeError) as failed:
            start_fake_server(mode="subprocess", port=taken.getsockname()[1], log_file=log, startup_timeout_s=60)
    assert time.monotonic() - started < 30  # not the start-up timeout
    assert str(failed.value) == (
        f"the fake server subprocess failed to start (exit code 1): it printed nothing; its log: {log}"
    )
    assert "address already in use" in log.read_text().lower()
