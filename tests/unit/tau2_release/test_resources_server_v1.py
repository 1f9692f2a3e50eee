"""The resources server on tau2 v1.0.1, over HTTP, as a real Gym server process with its workers: a /verify waiting
on the NL judge holds up no other session's tool call (it scores on a worker and thread of its own), its retries
are answered by that one scoring, a judge fault is a 502 naming it (never a score, on either NeMo-Gym release), and a
worker that dies is a 502 naming it (an infrastructure error), not a 500."""

import contextlib
import json
import os
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest
import requests

from nemo_tau2.gym.launch import GymServers, ServerSpec
from nemo_tau2.gym.resources_server.bodies import verify_body
from nemo_tau2.tau2_release.client import WORKER_FILE
from nemo_tau2.tau2_release.template import TEMPLATE_ENV, TEMPLATE_FILE
from nemo_tau2.tau2_release.trajectory import Trajectory
from tests.tau2_v1_env import tau2_v1_python
from tests.unit.gym import forks_http
from tests.unit.tau2_release.episode_scripts import episode_scripts
from tests.unit.tau2_release.worker_episodes import JUDGE_ATTEMPTS

NAME = "tau2_resources_server"
NL_TASK = "2"  # retail 2 carries nl_assertions: its verify asks the judge
WAIT_S = 60.0  # what a request may take here before the test calls it held up


@pytest.fixture(scope="module")
def server_url(judge):
    config = {
        "domain": "agent",
        "domains": ["retail"],
        "tau2": {
            "version": "v1.0.1",
            "python": tau2_v1_python(),
            "judge": {"model": "scripted-judge", "base_url": judge.base_url, "max_attempts": JUDGE_ATTEMPTS},
        },
    }
    server_class = "nemo_tau2.gym.resources_server.app:Tau2ResourcesServer"
    spec = ServerSpec(NAME, "resources_servers", "tau2", server_class, config)
    # its workers started as a run's are (children of the server), not forked from this test process's template
    with GymServers([spec], env={TEMPLATE_ENV: ""}) as servers:
        yield servers.url(NAME)


@pytest.fixture(scope="module")
def nl_oracle(worker) -> dict:
    task = next(task for task in worker.request("tasks", domain="retail", split="base") if task["id"] == NL_TASK)
    return episode_scripts(task, worker.request("greeting"))["oracle"]


def play(url: str, task_id: str, script: dict) -> tuple[requests.Session, bytes]:
    """Seed and play ``script`` over HTTP; the session and its /verify body (bytes, so a retry repeats them)."""
    session = requests.Session()
    assert session.post(f"{url}/seed_session", json={"domain": "retail", "task_id": task_id}).status_code == 200
    trajectory = Trajectory()
    for index, step in enumerate(script["steps"]):
        if step[0] == "text":
            trajectory.text(step[1], step[2])
            continue
        _, requestor, name, arguments = step
        route = f"/{name}" if requestor == "assistant" else f"/user_tools/{name}"
        answer = session.post(url + route, json=arguments, headers={"X-Tool-Call-Id": f"c{index}"})
        assert answer.status_code == 200, answer.text
        error = answer.headers["X-Tau2-Tool-Error"] == "1"
        trajectory.tool_call(requestor, f"c{index}", name, arguments, {"content": answer.text, "error": error})
    texts = [m["content"] for m in trajectory.messages if m["role"] == "assistant" and m.get("content")]
    body = verify_body(texts, script["termination_reason"]) | {"tau2_messages": trajectory.messages}
    return session, json.dumps(body).encode()


def post_verify(session: requests.Session, url: str, body: bytes) -> requests.Response:
    return session.post(f"{url}/verify", data=body, headers={"Content-Type": "application/json"}, timeout=WAIT_S)


def test_a_verify_waiting_on_the_judge_holds_up_no_other_session_and_its_retry_is_scored_once(
    server_url, judge, nl_oracle
):
    first, body = play(server_url, NL_TASK, nl_oracle)
    other = requests.Session()
    assert other.post(f"{server_url}/seed_session", json={"domain": "retail", "task_id": "0"}).status_code == 200
    retry = requests.Session()
    retry.cookies.update(first.cookies)  # the same Gym session: a retry of the same /verify
    answered: dict[str, tuple[float, requests.Response]] = {}

    def verify(name: str, session: requests.Session) -> None:
        answer = post_verify(session, server_url, body)
        answered[name] = (time.monotonic(), answer)

    judge.hold()
    judged_before = judge.requests
    verifies = [threading.Thread(target=verify, args=("first", first))]
    try:
        verifies[0].start()
        assert judge.holding.wait(WAIT_S), "the NL judge never received the first /verify"
        verifies.append(threading.Thread(target=verify, args=("retry", retry)))
        verifies[1].start()
        tool = other.post(f"{server_url}/list_all_product_types", json={}, timeout=WAIT_S)
        tool_answered = time.monotonic()
        assert tool.status_code == 200 and tool.headers["X-Tau2-Tool-Error"] == "0", tool.text
        assert not answered, "the other session's tool call was answered while the judge still held the verify"
        changed = post_verify(retry, server_url, body.replace(b"user_stop", b"agent_stop"))
        assert changed.status_code == 409 and "being verified" in changed.text
        ended = retry.post(f"{server_url}/list_all_product_types", json={}, timeout=WAIT_S)
        assert ended.status_code == 409 and "being verified" in ended.text
    finally:
        judge.release()
        for thread in verifies:
            thread.join(WAIT_S)
    (first_at, first_answer), (_, retry_answer) = answered["first"], answered["retry"]
    assert tool_answered < first_at
    assert first_answer.status_code == retry_answer.status_code == 200, (first_answer.text, retry_answer.text)
    assert first_answer.json() == retry_answer.json() and first_answer.json()["reward"] == 1.0
    assert judge.requests - judged_before == 1, "one scoring, one judge call, for the verify and its retry"
    assert post_verify(retry, server_url, body).headers["X-Idempotent-Replay"] == "1"  # later: the kept verdict


def test_a_session_seeded_again_while_its_verify_waits_on_the_judge_keeps_its_new_episode(
    server_url, judge, nl_oracle
):
    session, body = play(server_url, NL_TASK, nl_oracle)
    answered: list[requests.Response] = []
    judge.hold()
    verify = threading.Thread(target=lambda: answered.append(post_verify(session, server_url, body)))
    try:
        verify.start()
        assert judge.holding.wait(WAIT_S), "the NL judge never received the /verify"
        again = session.post(f"{server_url}/seed_session", json={"domain": "retail", "task_id": "0"}, timeout=WAIT_S)
        assert again.status_code == 200, again.text
    finally:
        judge.release()
        verify.join(WAIT_S)
    assert answered and answered[0].status_code == 200 and answered[0].json()["reward"] == 1.0
    tool = session.post(f"{server_url}/list_all_product_types", json={}, timeout=WAIT_S)
    assert tool.status_code == 200, tool.text  # the verdict of the old episode did not end the new one


def _server_workers() -> list[int]:
    """The resources server's tau2 workers: processes running the worker file below this test process but not its
    children nor its worker template's (the package's own workers; the server's run under the fork server and the
    server)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().split(b"\0")
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if str(WORKER_FILE).encode() in command and parent not in _ours() and _descends_from_us(parent):
            found.append(int(entry.name))
    return found


def _ours() -> set[int]:
    """This process and its tau2 worker template, the parents of the workers this process starts."""
    ours = {os.getpid()}
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.NoSuchProcess):  # ended between the listing and the look
            if str(TEMPLATE_FILE) in " ".join(child.cmdline()):
                ours.add(child.pid)
    return ours


def _descends_from_us(pid: int) -> bool:
    while pid > 1:
        if pid == os.getpid():
            return True
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
    return False


def test_a_judge_fault_is_a_502_naming_it_never_a_score_and_the_retry_scores(server_url, judge, nl_oracle):
    """NeMo-Gym 0.7.0 wraps /verify in ``judge_failsafe``, which answers a judge fault with reward 0 and
    ``mask_sample``; ours stays an infrastructure error (502 naming the cause, no reward) on either release, and the
    retry, with the judge back, gets the clean score."""
    session, body = play(server_url, NL_TASK, nl_oracle)
    judge.inject("http_500", count=JUDGE_ATTEMPTS)
    faulted = post_verify(session, server_url, body)
    assert faulted.status_code == 502 and "InternalServerError" in faulted.text, faulted.text
    assert "reward" not in faulted.json() and "mask_sample" not in faulted.text
    retried = post_verify(session, server_url, body)
    assert retried.status_code == 200 and retried.json()["reward"] == 1.0, retried.text


VERDICT = ("reward", "success", "termination_reason", "reward_info", "num_tool_calls", "num_tool_errors")


def test_a_stored_episode_is_rescored_without_its_session_by_the_release_and_its_judge(server_url, judge, nl_oracle):
    """NeMo-Gym's reverify posts a stored rollout with no session: the release's evaluator and judge score its
    trajectory again, to the live verdict; a judge fault there is a 502 too, and another release's row a 400."""
    session, body = play(server_url, NL_TASK, nl_oracle)
    live = post_verify(session, server_url, body).json()
    stored = json.loads(body) | {"domain": "retail", "task_id": NL_TASK, "tau2_version": "v1.0.1"}
    judge.inject("http_500", count=JUDGE_ATTEMPTS)
    faulted = requests.post(f"{server_url}/verify", json=stored, timeout=WAIT_S)
    assert faulted.status_code == 502 and "InternalServerError" in faulted.text, faulted.text
    again = requests.post(f"{server_url}/verify", json=stored, timeout=WAIT_S)
    assert again.status_code == 200, again.text
    assert {key: again.json()[key] for key in VERDICT} == {key: live[key] for key in VERDICT}
    assert live["reward"] == 1.0 and live["reward_info"]["nl_assertions"]  # the judge's verdict, again
    other = requests.post(f"{server_url}/verify", json=stored | {"tau2_version": "v0.2.1"}, timeout=WAIT_S)
    assert other.status_code == 400 and "the row is of tau2 v0.2.1" in other.text, other.text
    assert requests.get(f"{server_url}/reverify_mode", timeout=WAIT_S).json() == "stateless"


FORK_TASKS = {  # the last gold action writes, and answers otherwise the second time
    "airline": "7",
    "retail": "0",
    "telecom": "[mobile_data_issue]user_abroad_roaming_disabled_off[PERSONA:Hard]",  # the user's toggle_roaming
    "banking_knowledge": "task_010",  # the user's submit_referral
}


@pytest.mark.parametrize("domain", list(FORK_TASKS))
def test_forks_of_a_live_session_and_of_a_stored_prefix_are_isolated(server_url, worker, domain):
    task = _release_task(worker, domain, FORK_TASKS[domain])
    keys = ("requestor", "name", "arguments")
    actions = [{key: action[key] for key in keys} for action in task["evaluation_criteria"]["actions"]]
    measured = forks_http.check_forks(server_url, domain, task["id"], actions)
    assert measured["live_fork_s"] < WAIT_S and measured["stored_fork_s"] < WAIT_S, measured


PIVOT_MUTATIONS = {  # for each domain's fork task: an assistant gold action given arguments that write elsewhere
    "airline": {3: {"reservation_id": "59XX6W"}},  # cancels the other reservation
    "retail": {4: {"order_id": "#W2378156", "item_ids": ["1151293680"], "new_item_ids": ["7706410293"],
                   "payment_method_id": "credit_card_9513926"}},  # exchanges one item of two
    "telecom": {0: {"customer_id": "C1001", "line_id": "L1001"}},  # roaming on another of the customer's lines
    "banking_knowledge": {0: "time_verified"},  # the verification logged at another time
}  # fmt: skip


@pytest.mark.parametrize("domain", list(FORK_TASKS))
def test_gold_turns_score_1_and_a_write_elsewhere_0_by_the_release_s_own_state(server_url, worker, domain):
    """``/verify_pivot`` on v1.0.1: the worker's forks and its state digest (tau2's DB hashes, unlocked tools)."""
    task = _release_task(worker, domain, FORK_TASKS[domain])
    keys = ("requestor", "name", "arguments")
    actions = [{key: action[key] for key in keys} for action in task["evaluation_criteria"]["actions"]]
    mutated = {
        index: arguments if isinstance(arguments, dict) else actions[index]["arguments"] | {arguments: "2025-11-14"}
        for index, arguments in PIVOT_MUTATIONS[domain].items()
    }
    categories = forks_http.check_gold_pivots(server_url, domain, task["id"], actions, mutated)
    assert any(str(key).endswith("mutated") for key in categories), categories


def test_a_banking_fork_has_the_tools_it_unlocked_and_no_other_fork_s(server_url, worker):
    task = _release_task(worker, "banking_knowledge", "task_087")
    verification, unlock, call = task["evaluation_criteria"]["actions"][:3]
    assert (unlock["name"], call["name"]) == ("unlock_discoverable_agent_tool", "call_discoverable_agent_tool")
    http = forks_http
    parent = http.seeded(server_url, "banking_knowledge", "task_087")
    http.play(parent, server_url, verification)
    first, second = http.adopted(server_url, http.fork(parent, server_url, {"n": 2}))
    locked = http.play(second, server_url, call)
    assert "has not been unlocked" in locked["content"], locked
    http.play(first, server_url, unlock)
    assert "has not been unlocked" not in http.play(first, server_url, call)["content"]
    assert http.play(second, server_url, call) == locked and http.play(parent, server_url, call) == locked
    http.play(parent, server_url, unlock)
    (after_unlock,) = http.adopted(server_url, http.fork(parent, server_url, {"n": 1}))
    assert "has not been unlocked" not in http.play(after_unlock, server_url, call)["content"]


def _release_task(worker, domain: str, task_id: str) -> dict:
    return next(task for task in worker.request("tasks", domain=domain, split=None) if task["id"] == task_id)


def test_a_worker_that_dies_is_a_502_naming_it_not_a_500(server_url, nl_oracle):
    session, body = play(server_url, NL_TASK, nl_oracle)
    # the episode worker and the scoring worker; an earlier test's worker may still be exiting (slower under
    # coverage, which writes its data as a process ends): it has a few seconds to go
    deadline = time.monotonic() + 10
    while len(workers := _server_workers()) != 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(workers) == 2, workers
    for pid in workers:
        os.kill(pid, signal.SIGKILL)
    tool = session.post(f"{server_url}/list_all_product_types", json={}, timeout=WAIT_S)
    assert tool.status_code == 502 and "tau2 v1.0.1" in tool.text and "worker" in tool.text, tool.text
    verdict = post_verify(session, server_url, body)
    assert verdict.status_code == 502 and "worker" in verdict.text, verdict.text
    fresh = requests.post(f"{server_url}/seed_session", json={"domain": "retail", "task_id": "0"}, timeout=WAIT_S)
    assert fresh.status_code == 502 and "worker" in fresh.text, fresh.text
