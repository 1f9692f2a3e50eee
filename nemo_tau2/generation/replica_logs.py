"""A Ray-placed generation replica's logs: read on its node (the last bytes, from a line's start), named on the head
by the replica's index there (:mod:`nemo_tau2.generation.ray_replicas` brings them back)."""

import os
import re
import shutil
from pathlib import Path


def read_log_tails(log_dir: str, max_bytes: int) -> dict[str, bytes]:
    """On a replica's node: the last ``max_bytes`` of each log in its folder (a line saying how much was left out
    first, when some was), then the folder removed."""
    tails: dict[str, bytes] = {}
    for path in sorted(Path(log_dir).glob("*.log")):
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - max_bytes))
            tail = f.read()
        if size > max_bytes:
            tail = tail[tail.find(b"\n") + 1 :]  # from a line's start
            tail = f"[nemo-tau2: the first {size - len(tail)} bytes of {path} are left out]\n".encode() + tail
        tails[path.name] = tail
    shutil.rmtree(log_dir, ignore_errors=True)
    return tails


def head_log_name(node_log_name: str, index: int) -> str:
    """A replica's log name on the head: its node's name (``vllm_replica0.log``: one replica per node folder) with
    the replica's index on the head (``vllm_replica3.log``)."""
    named, found = re.subn(r"replica\d+", f"replica{index}", node_log_name, count=1)
    return named if found else f"replica{index}_{node_log_name}"
