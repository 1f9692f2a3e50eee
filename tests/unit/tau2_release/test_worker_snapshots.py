"""The worker's shortcuts give tau2 v1.0.1's own answers.

Its per-domain DB snapshots and memoised DB hashes (``nemo_tau2_tau2_snapshots``) never carry one episode's writes
into another: after an episode that changes a user's address, the next episode of the same task reads the pristine
user and is scored on the pristine DB (a trajectory without the write fails the DB check, as tau2 v1.0.1 scores
it), and replaying the write scores 1.0 again, live (``verify``) and stateless (``evaluate``). Its memoised tool
specifications (``nemo_tau2_tau2_tool_specs``, the user's schemas per toolkit) equal what tau2 builds afresh.
A task's gold side warmed in a forked child (``nemo_tau2_tau2_warming``) holds up no other episode's requests while
it runs, and its task's verify then takes the child's hashes instead of hashing again (the parity test checks the
warmed scores against tau2's own).
"""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from nemo_tau2.tau2_release.trajectory import Trajectory
from tests.tau2_v1_env import tau2_v1_python
from tests.unit.tau2_release.episode_scripts import episode_scripts
from tests.unit.tau2_release.test_parity_v1 import CHANGED_GOLD
from tests.unit.tau2_release.worker_episodes import play

DOMAINS = ("airline", "retail", "telecom")
DOMAIN, TASK_ID = "retail", "33"  # DB-only basis; its last gold action rewrites the user's address


def _episode(worker, actions: list[dict], user_id: str) -> tuple[str, Trajectory, dict, dict]:
    """Seed, read the user, play ``actions``, read the user again: (episode id, trajectory, first, last read)."""
    episode_id = worker.request("seed", domain=DOMAIN, task_id=TASK_ID)["episode_id"]
    trajectory = Trajectory()
    trajectory.text("assistant", worker.request("greeting"))
    trajectory.text("user", "Please update my address.")
    reads = []
    calls = [("get_user_details", {"user_id": user_id})]
    calls += [(action["name"], action["arguments"]) for action in actions]
    calls += [("get_user_details", {"user_id": user_id})]
    for index, (name, arguments) in enumerate(calls):
        answer = worker.request(
            "call_tool", episode_id=episode_id, name=name, arguments=arguments, call_id=f"c{index}"
        )
        assert answer["error"] is False, answer
        trajectory.tool_call("assistant", f"c{index}", name, arguments, answer)
        if name == "get_user_details":
            reads.append(answer["content"])
    trajectory.text("assistant", "Done.")
    trajectory.text("user", "Thanks. ###STOP###")
    return episode_id, trajectory, reads[0], reads[-1]


def test_an_episode_s_writes_never_reach_the_next_episode_or_its_score(worker):
    task = next(task for task in worker.request("tasks", domain=DOMAIN, split="base") if task["id"] == TASK_ID)
    criteria = task["evaluation_criteria"]
    gold = criteria["actions"]
    assert criteria["reward_basis"] == ["DB"] and gold[-1]["name"] == "modify_user_address"
    user_id = gold[-1]["arguments"]["user_id"]

    first_id, written, pristine, changed = _episode(worker, gold, user_id)
    assert changed != pristine and gold[-1]["arguments"]["address1"] in changed
    assert worker.verify(first_id, written.messages, "user_stop")["reward"] == 1.0

    second_id, unwritten, before, after = _episode(worker, [], user_id)
    assert before == after == pristine  # the first episode's write is not in the second's DB
    second = worker.verify(second_id, unwritten.messages, "user_stop")
    assert second["reward"] == 0.0 and second["reward_info"]["db_check"]["db_match"] is False

    third_id, rewritten, before, after = _episode(worker, gold, user_id)
    assert before == pristine and after == changed
    assert worker.verify(third_id, rewritten.messages, "user_stop")["reward"] == 1.0

    # Stateless scoring (the scoring worker's op) replays each trajectory on a fresh fork, in any order.
    for trajectory, reward in ((unwritten, 0.0), (written, 1.0), (unwritten, 0.0), (rewritten, 1.0)):
        assert worker.score(DOMAIN, TASK_ID, trajectory.messages, "user_stop")["reward"] == reward


def test_tool_schemas_and_prompts_equal_tau2_s_own_on_every_seed(worker):
    # airline and retail share tool names (get_user_details, ...) with other docstrings; telecom has user tools.
    tasks = {domain: worker.request("tasks", domain=domain, split="base")[0]["id"] for domain in DOMAINS}
    reference = subprocess.run(
        [tau2_v1_python(), str(Path(__file__).with_name("v1_specs.py"))],
        input=json.dumps({"tasks": tasks}), capture_output=True, text=True, check=True,
    )  # fmt: skip
    theirs = json.loads(reference.stdout)
    for domain, task_id in tasks.items():
        assert worker.request("tool_schemas", domain=domain) == theirs[domain]["agent"]["tool_schemas"], domain
        assert worker.request("agent_system_prompt", domain=domain) == theirs[domain]["agent"]["system_prompt"]
        for _ in range(2):  # the second seed's specifications come from the memos
            seeded = worker.request("seed", domain=domain, task_id=task_id)
            worker.request("end", episode_id=seeded["episode_id"])
            assert seeded["user_system_prompt"] == theirs[domain]["user"]["system_prompt"], domain
            assert seeded["user_tools"] == theirs[domain]["user"]["tools"], domain
    assert theirs["telecom"]["user"]["tools"]


AIRLINE_WRITES = ("book_", "cancel_", "update_", "send_")


def _gold(task: dict) -> list[dict]:
    return task["evaluation_criteria"]["actions"] or []


def _state(pid: int) -> str:
    """The process's state letter (T: stopped); Z for one that ended, reaped or not."""
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0]
    except FileNotFoundError:
        return "Z"


def _stopped_warm_up(worker, task_ids: list[str]) -> tuple[str, int]:
    """Warm the tasks in turn until one's child is caught running, and stop it there (SIGSTOP): (task, pid)."""
    for task_id in task_ids:
        while worker.request("warming")["running"]:  # one child at a time: the one caught must be this task's
            time.sleep(0.01)
        if not worker.request("warm", domain="airline", task_id=task_id)["queued"]:
            continue  # warmed before
        deadline = time.monotonic() + 10
        while not (running := worker.request("warming")["running"]) and time.monotonic() < deadline:
            time.sleep(0.001)
        if running:
            ((domain, warmed, pid),) = running
            assert (domain, warmed) == ("airline", task_id)
            os.kill(pid, signal.SIGSTOP)
            while _state(pid) not in ("T", "Z"):  # a signal lands a moment later; Z: it had finished
                time.sleep(0.001)
            if _state(pid) == "T":
                return task_id, pid
    raise AssertionError("no warm-up child was caught running")


def test_a_warm_up_holds_up_no_other_episode_and_its_task_s_verify_takes_its_hashes(worker):
    tasks = worker.request("tasks", domain="airline", split="base")
    writes = [t["id"] for t in tasks if any(a["name"].startswith(AIRLINE_WRITES) for a in _gold(t))]
    fresh = [task_id for task_id in writes[::-1] if task_id not in CHANGED_GOLD["airline"]]  # parity CI's: hashed
    task_id, pid = _stopped_warm_up(worker, fresh[:10])
    try:
        # Another episode is seeded, played and scored while the child is stopped mid-warm-up.
        retail = next(task for task in worker.request("tasks", domain=DOMAIN, split="base") if task["id"] == TASK_ID)
        gold = retail["evaluation_criteria"]["actions"]
        episode_id, trajectory, _, _ = _episode(worker, gold, gold[-1]["arguments"]["user_id"])
        during = worker.request(
            "verify", wait_s=60, episode_id=episode_id, messages=trajectory.messages, termination_reason="user_stop"
        )
        before = worker.request("warming")
        assert before["running"] == [["airline", task_id, pid]]  # answered while the warm-up was still in flight
    finally:
        os.kill(pid, signal.SIGCONT)
    assert during["reward"] == 1.0

    assert _oracle(worker, tasks, task_id)["reward"] == 1.0  # its verify waited for the child
    after = worker.request("warming")
    assert after["warmed"] == before["warmed"] + 1 and after["failed"] == 0
    assert after["hashed"] == before["hashed"]  # the gold DB's hash: the child's (or known before: full parity)
    assert worker.score(DOMAIN, TASK_ID, trajectory.messages, "user_stop") == during  # the same answer after it

    # Another task's warmed gold DB is not this one's: adopted hashes are tau2's, one per content.
    # The first one not warmed before: the package's worker is shared, and the full parity test warms every other
    # task (a warm request for a warmed task is a no-op, and nothing would be replayed).
    other = next(
        (other for other in fresh if other != task_id and worker.request("warm", domain="airline", task_id=other)
         ["queued"]), None,
    )  # fmt: skip
    assert other is not None, "every candidate task was warmed before: the test needs one that was not"
    while worker.request("warming")["running"] or worker.request("warming")["queued"]:
        time.sleep(0.01)
    deadline, warming = time.monotonic() + 10, worker.request("warming")
    while warming["settled"] == after["settled"] and time.monotonic() < deadline:  # the parent replays it when idle
        time.sleep(0.01)
        warming = worker.request("warming")
    assert warming["settled"] > after["settled"] and warming["hashed"] == after["hashed"]  # memo hits only
    assert _oracle(worker, tasks, other)["reward"] == 1.0
    crossed = worker.score("airline", task_id, _oracle(worker, tasks, other)["messages"], "user_stop")
    assert crossed["reward"] == 0.0 and crossed["reward_info"]["db_check"]["db_match"] is False


def _oracle(worker, tasks: list[dict], task_id: str) -> dict:
    task = next(task for task in tasks if task["id"] == task_id)
    return play(worker, "airline", task_id, episode_scripts(task, worker.request("greeting"))["oracle"])
