"""Leases on one box, with the real fork server and a real resources server: a server started under a lease serves
its own run (and NeMo-Gym's clients, which name none), refuses another run's requests with 409 naming both ids, and
ends itself, its fork server with it, once the lease is no longer renewed; a renewal sent long ago extends nothing.
(On a Ray cluster, test_ray_placement.py wakes a stopped node after its run and a head killed with -9.)"""

import os
import signal
import threading
import time

import pytest
import requests

from nemo_tau2.cluster import ClusterConfig
from nemo_tau2.gym.launch import GymServers, ServerSpec
from nemo_tau2.gym.stack import RESOURCES_SERVER_CLASS
from nemo_tau2.lease import LEASE_FILE_ENV, NodeLease, read_expiry
from nemo_tau2.request_guard import RUN_ID_ENV, RUN_ID_HEADER
from tests.process_state import gone

LEASE_S = 3.0
# how long after its lease's expiry a process may take to end: the server ends within a check (0.5 s), but the fork
# server unwinds a Python with tau2 and its servers' imports (~5 s on an idle 2-core box, three times that at load 6)
ENDED_WITHIN_S = 60.0


def test_a_leased_server_refuses_another_run_and_ends_with_its_lease(tmp_path):
    lease = NodeLease(tmp_path / "lease", LEASE_S)
    spec = ServerSpec(
        "tau2_resources_server", "resources_servers", "tau2", RESOURCES_SERVER_CLASS, {"domain": "agent"}
    )
    env = {LEASE_FILE_ENV: str(lease.path), RUN_ID_ENV: "run-a"}
    renewing = threading.Event()

    def renew() -> None:
        while not renewing.wait(0.5):
            lease.renew(time.time())

    renewer = threading.Thread(target=renew, daemon=True)
    renewer.start()
    servers = GymServers([spec], log_dir=tmp_path / "logs", env=env).start()
    try:
        pids = servers.process_ids()
        url = servers.url(spec.name)
        time.sleep(LEASE_S + 1)  # renewed: alive past its first lease
        assert not any(gone(pid) for pid in pids)
        other = requests.get(f"{url}/", headers={RUN_ID_HEADER: "run-b"}, timeout=10)
        assert other.status_code == 409
        assert other.json()["detail"] == "this server belongs to run run-a, not to run run-b"
        assert requests.get(f"{url}/", headers={RUN_ID_HEADER: "run-a"}, timeout=10).status_code == 200
        assert requests.get(f"{url}/", timeout=10).status_code == 200  # NeMo-Gym's own clients name no run
        before = read_expiry(lease.path)
        assert lease.renew(time.time() - 10 * LEASE_S) == before  # a renewal delivered late extends nothing
        renewing.set()
        renewer.join()
        expiry = read_expiry(lease.path)
        ended = _wait_until_gone(pids, expiry)
        print(f"ended {', '.join(f'{t - expiry:+.1f} s' for t in ended.values())} from the lease's expiry")
    finally:
        renewing.set()
        servers.stop()
        for pid in servers.process_ids():
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)


def test_the_lease_is_refused_shorter_than_the_watchers_detection_time():
    with pytest.raises(ValueError, match=r"cluster.lease_timeout_s=20 is shorter than the watcher's detection time"):
        ClusterConfig(lease_timeout_s=20)  # 3 x (2 + 5) = 21 s
    assert ClusterConfig().lease_timeout_s >= 2 * ClusterConfig().gym_detection_s


def _wait_until_gone(pids: list[int], expiry: float) -> dict[int, float]:
    """When each of ``pids`` was first seen gone (wall clock, as the lease), checking that none ends before the lease
    expires: each check reads the clock after the process state, so a process seen gone with that reading still
    before ``expiry`` ended early, however late the check ran on a loaded box."""
    ended: dict[int, float] = {}
    while len(ended) < len(pids):
        for pid in set(pids) - set(ended):
            if gone(pid):
                ended[pid] = now = time.time()
                assert now >= expiry, f"pid {pid} ended {expiry - now:.2f} s before its lease expired"
        now = time.time()
        assert now < expiry + ENDED_WITHIN_S, f"{set(pids) - set(ended)} alive {now - expiry:.1f} s after the lease"
        time.sleep(0.05)
    return ended
