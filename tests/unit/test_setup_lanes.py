"""scripts/lanes.sh, how `scripts/setup.sh` builds its parts side by side: lanes overlap, a lane's parts keep their
order, a failing part ends its lane (never the others) and fails the set-up naming it, and a signal stops them all."""

import os
import signal
import subprocess
import time

from tests import env_python

LANES = env_python.ROOT / "scripts" / "lanes.sh"
SETUP = env_python.ROOT / "scripts" / "setup.sh"

# Parts in miniature: each records itself in $WORK/order; a1 waits (up to 20 s) for b1 to have started, which only
# happens if the lanes run side by side.
PARTS = r"""
set -euo pipefail
source "$LANES"
log() { echo "[setup] $*" >&2; }
mark() { echo "$1" >>"$WORK/order"; }
wait_for() { for _ in $(seq 200); do grep -qx "$1" "$WORK/order" 2>/dev/null && return 0; sleep 0.1; done; return 1; }
setup_a1() { mark a1; wait_for b1; echo "a1 saw b1" >&2; }
setup_a2() { mark a2; }
setup_b1() { mark b1; }
setup_bad_part() { echo "the reason it failed" >&2; false; mark "after-false"; }
setup_after_bad() { mark after-bad; }
setup_sleeper() { sleep 300 & echo "$!" >"$WORK/sleeper.pid"; mark sleeper; wait; }
"""


def lanes(tmp_path, *lane_list: str, wait: bool = True):
    script = PARTS + 'run_lanes "$WORK/logs" ' + " ".join(f'"{lane}"' for lane in lane_list)
    env = os.environ | {"LANES": str(LANES), "WORK": str(tmp_path)}
    process = subprocess.Popen(["bash", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=env)  # fmt: skip
    if not wait:
        return process
    stdout, stderr = process.communicate(timeout=60)
    return process.returncode, stdout, stderr, (tmp_path / "order").read_text().split()


def test_lanes_run_side_by_side_each_in_its_order_with_a_line_per_part_and_its_log(tmp_path):
    status, stdout, stderr, order = lanes(tmp_path, "a1 a2", "b1")
    assert status == 0, stderr
    assert order.index("a1") < order.index("a2") and sorted(order) == ["a1", "a2", "b1"]
    assert (tmp_path / "logs" / "a1.log").read_text() == "a1 saw b1\n"  # a1 waited on b1: both lanes ran at once
    for part in ("a1", "a2", "b1"):
        assert f"[setup] {part}: started (its log: {tmp_path}/logs/{part}.log)" in stderr
        assert f"[setup] {part}: done in " in stderr
    assert stdout == "" and not list((tmp_path / "logs").glob("lane-*"))


def test_a_failing_part_ends_its_lane_only_and_fails_the_set_up_with_its_logs_last_lines(tmp_path):
    """errexit holds inside a part (its `false` stops it), the part after it in its lane never starts, the other lane
    still finishes (what it builds stays cached)."""
    status, _, stderr, order = lanes(tmp_path, "bad-part after-bad", "b1")
    assert status == 1
    assert order == ["b1"]  # neither the rest of the failing part nor the part after it ran
    assert "[setup] bad-part: FAILED (exit 1) after " in stderr
    assert "[setup]   bad-part| the reason it failed" in stderr
    assert "[setup] b1: done in " in stderr and "after-bad" not in stderr


def test_a_signal_stops_every_lane_with_what_it_started(tmp_path):
    process = lanes(tmp_path, "sleeper", "a2", wait=False)
    pid_file = tmp_path / "sleeper.pid"
    deadline = time.monotonic() + 30
    while not pid_file.exists() or not pid_file.read_text().strip():
        assert time.monotonic() < deadline, "the sleeper part never started"
        time.sleep(0.1)
    sleeper = int(pid_file.read_text())
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 143
    assert "stopped: every part still running was ended" in stderr
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{sleeper}") and "Z" not in _process_state(sleeper):
        assert time.monotonic() < deadline, "the sleeper part outlived the set-up"
        time.sleep(0.1)


def _process_state(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return "Z"


def test_setups_lanes_hold_every_part_once():
    arrays = subprocess.run(
        ["bash", "-c", f'eval "$(grep -E "^(PARTS|LANES)=" {SETUP})"; '
                       'echo "${PARTS[*]}"; printf "%s|" "${LANES[@]}"'],
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    parts = arrays[0].split()
    default_lanes = [lane.split() for lane in arrays[1].rstrip("|").split("|")]
    default = [part for lane in default_lanes for part in lane]
    assert sorted(default) == sorted(parts) and len(set(default)) == len(parts)
    assert ["project", "smollm2"] in default_lanes  # SmolLM2 is converted in the project's environment
    assert ["chromium", "sandbox"] in default_lanes  # both may run apt-get, which holds one lock
