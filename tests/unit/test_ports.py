"""Free ports for our servers come from outside the kernel's ephemeral range, and a restart waits for its own port.

A restarted generation replica rebinds its old port (its URL is what the Gym model servers know). A port picked by
``bind(0)`` lies in the range the kernel also gives outgoing connections; under three xdist workers a Ray or HTTP
client's connection took a dead replica's port and its restart was dropped ('Address already in use', 2026-12-04)."""

import socket
import threading
import time

import pytest

from nemo_tau2.generation.errors import GenerationStartupError
from nemo_tau2.generation.serving import bind_socket, reserve_port
from nemo_tau2.ports import EPHEMERAL_RANGE_FILE, LOWEST_SERVING_PORT, free_port


def test_every_free_port_we_pick_lies_outside_the_ephemeral_range_and_is_free():
    low, high = (int(part) for part in EPHEMERAL_RANGE_FILE.read_text().split())
    picked = [free_port() for _ in range(20)] + [reserve_port("127.0.0.1", None, key="k") for _ in range(20)]
    with bind_socket("127.0.0.1", None, key="k") as sock:
        picked.append(sock.getsockname()[1])
    assert all(LOWEST_SERVING_PORT <= port < 65536 and not low <= port <= high for port in picked), picked
    for port in picked[:5]:
        with socket.socket() as server:
            server.bind(("127.0.0.1", port))  # free: a server can bind it


def test_a_restart_waits_for_its_port_while_the_old_server_lets_go_and_names_a_port_never_freed():
    holder = socket.socket()
    holder.bind(("127.0.0.1", free_port()))
    holder.listen()
    port = holder.getsockname()[1]
    with pytest.raises(GenerationStartupError, match=f"k: port {port} on 127.0.0.1 is already in use"):
        bind_socket("127.0.0.1", port, key="k")  # a configured port that is taken: said at once
    started = time.monotonic()
    with pytest.raises(GenerationStartupError, match=f"port {port} on 127.0.0.1 is already in use"):
        bind_socket("127.0.0.1", port, key="k", wait_s=1.0)
    assert time.monotonic() - started >= 1.0
    threading.Timer(1.0, holder.close).start()  # the old server's process going away
    with bind_socket("127.0.0.1", port, key="k", wait_s=30.0) as sock:
        assert sock.getsockname()[1] == port
