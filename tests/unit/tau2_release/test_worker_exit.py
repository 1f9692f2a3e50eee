"""A worker that dies is named with its exit status, not "status None" (its pipes close before it is reaped)."""

import subprocess
import sys

import pytest

from nemo_tau2.tau2_release.client import Tau2Worker, Tau2WorkerError
from nemo_tau2.tau2_release.config import Tau2ReleaseConfig

# Closes its answers, then takes a moment to exit: what a worker dying in tau2's teardown looks like to the client.
_DIES_SLOWLY = "import os, sys, time; os.close(1); time.sleep(0.3); sys.exit(3)"


def test_a_dead_worker_is_named_with_its_exit_status():
    process = subprocess.Popen([sys.executable, "-c", _DIES_SLOWLY], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    worker = Tau2Worker.__new__(Tau2Worker)  # the reading side only: no tau2 environment needed to start one
    worker.config = Tau2ReleaseConfig(version="v1.0.1")
    worker._process, worker._answers, worker._pending = process, process.stdout.fileno(), bytearray()
    try:
        with pytest.raises(Tau2WorkerError, match=r"worker exited with status 3 while answering seed"):
            worker._read_line(10.0, "answering seed")
    finally:
        process.kill()
        process.wait()
        process.stdin.close()
        process.stdout.close()
