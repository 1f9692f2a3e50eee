"""A template's Unix socket (the tau2 release's worker template, the Gym fork template) appears at its path only once
it listens, and only its owner can reach it: a requester that sees the path (``wait_for_listener``) is queued, never
refused. Bound in place, a template was refused to requesters in the moment between ``bind`` and ``listen`` (~1 start
in 100 on a loaded box; stop 75's red: a forked worker the test expected was started instead). Here each template
runs with its ``listen`` slowed by a second, which makes that moment long enough to be met every time."""

import contextlib
import os
import signal
import socket
import stat
import subprocess
import sys
import time

import pytest

from nemo_tau2.tau2_release.client import TAU2_V1_PYTHON_ENV
from nemo_tau2.tau2_release.template import TEMPLATE_FILE
from tests.env_python import environment_python

SLOW_LISTEN = """
import runpy, socket, sys, time
listen, delay_s, target = socket.socket.listen, float(sys.argv[1]), sys.argv[2]
def slow_listen(self, *args):
    time.sleep(delay_s)
    return listen(self, *args)
socket.socket.listen = slow_listen
sys.argv = sys.argv[2:]
if target.endswith(".py"):
    runpy.run_path(target, run_name="__main__")
else:
    runpy.run_module(target, run_name="__main__", alter_sys=True)
"""


def _template(which: str) -> tuple[str, str]:
    """The interpreter and the file or module of ``which`` template."""
    if which == "tau2 release":
        return environment_python(TAU2_V1_PYTHON_ENV, "tau2-v1", "tau2 v1.0.1"), str(TEMPLATE_FILE)
    return sys.executable, "nemo_tau2.gym.fork_template"


@pytest.mark.parametrize("which", ["tau2 release", "gym fork"])
def test_a_templates_socket_appears_only_once_it_listens_and_is_its_owners_alone(which, tmp_path):
    python, target = _template(which)
    folder, log_path = tmp_path / "sockets", tmp_path / "template.log"
    folder.mkdir()
    path = folder / "t.sock"
    with open(log_path, "wb") as log:
        template = subprocess.Popen(
            [python, "-c", SLOW_LISTEN, "1.0", target, str(path)],
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while not path.exists():
            assert template.poll() is None, f"the template ended: {log_path.read_text()}"
            assert time.monotonic() < deadline, "the template's socket did not appear within 60 s"
            time.sleep(0.001)
        mode = stat.S_IMODE(os.stat(path).st_mode)
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as requester:
            requester.connect(str(path))  # ConnectionRefusedError: the path was there before the listen
        assert mode == 0o600
        assert [each.name for each in folder.iterdir()] == ["t.sock"]  # nothing left of the staging name
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(template.pid, signal.SIGKILL)
        template.wait()
