"""Free ports for the servers we start, drawn outside the kernel's ephemeral range.

A port the kernel picks (``bind(0)``) comes from ``net.ipv4.ip_local_port_range``, the range it also hands out to
every outgoing connection of the machine. A server that must come back at the same URL (a generation replica
restarted by its watcher), or that is given a port to bind a moment later (a Gym server, a vLLM process), can then
find that port taken by a Ray or HTTP client's connection: the restarted replica failed with 'Address already in use'.
Outside the range, only another explicit bind can take it.
"""

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_SERVING_PORT = 10000
"""Ports are drawn from here to 65535, less the ephemeral range (below 10000: the well-known services' ports)."""


def serving_port_candidates(tries: int = 64) -> list[int]:
    """Random ports outside the ephemeral range, then 0 (the kernel's choice) should none of them be free; 0 alone
    where the range cannot be read (not Linux)."""
    try:
        low, high = (int(part) for part in EPHEMERAL_RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        return [0]
    outside = [*range(LOWEST_SERVING_PORT, min(low, 65536)), *range(max(high + 1, LOWEST_SERVING_PORT), 65536)]
    return [*random.sample(outside, min(tries, len(outside))), 0]


def bind_free_port(host: str, *, reuse_address: bool) -> socket.socket:
    """A socket bound to a free port of ``host`` outside the ephemeral range (``OSError`` if none is free)."""
    for candidate in serving_port_candidates():
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        if reuse_address:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, candidate))
        except OSError:
            sock.close()
            continue
        return sock
    raise OSError(f"no free port on {host}")


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now, outside the ephemeral range, for a server that binds it itself."""
    with bind_free_port(host, reuse_address=False) as sock:
        return sock.getsockname()[1]
