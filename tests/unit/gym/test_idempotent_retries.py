"""Nothing applied twice: a resources server that stalls, errors or drops the connection *after* it applied a
request, behind the real agent and its real retries, in all three domains, for every write tool (agent and user
device tools), for /seed_session and /verify; and the replay contract itself over HTTP."""

import asyncio
import functools
import re
import threading
from collections import Counter

import pytest
import requests

from nemo_tau2.gym.launch import GymServers
from nemo_tau2.gym.stack import AGENT, RESOURCES_SERVER, ModelEndpoint, tau2_stack
from nemo_tau2.tau2_env import domains
from nemo_tau2.testing import Turn, TurnListScript, device_action_request, start_fake_server
from tests.unit.gym.agent.conftest import FAST_RETRY, Stack

FAULT_KINDS = ["timeout", "http_500", "http_503", "drop"]
# every episode at once against one resources server: at load 9 its answers took over 1 s, three times in a row
RESOURCES_RETRY = {"timeout_s": 3.0, "max_attempts": 4, "backoff_s": 0.05, "max_backoff_s": 0.2}
HOLD_S = 3.5  # > RESOURCES_RETRY timeout: the agent gives up on the first attempt, which has applied the write
EXTRAS_SAMPLE = 7  # the sample index of the scripted telecom episode below
MATRIX: Counter = Counter()  # (fault, route kind, outcome) -> count, printed at the end of the module

# Telecom write tools no task's gold actions use, played by a scripted policy (the scripted user performs the
# device actions it is asked for).
TELECOM_LINE = {"customer_id": "C1001", "line_id": "L1002"}
EXTRAS_POLICY = TurnListScript(
    [
        Turn.call("suspend_line", TELECOM_LINE | {"reason": "travel"}),
        Turn.call("disable_roaming", TELECOM_LINE),
        Turn.say(device_action_request("toggle_wifi", {})),
        Turn.say(device_action_request("connect_vpn", {})),
        Turn.say(device_action_request("set_apn_settings", {"apn_settings": {"apn_name": "internet"}})),
        Turn.say("Your line is set up. Is there anything else I can help you with?"),
    ]
)


def write_tools(domain: str, side: str) -> set[str]:
    env = domains.new_environment(domain)
    toolkit = env.tools if side == "assistant" else env.user_tools
    if toolkit is None:
        return set()
    return {name for name in toolkit.get_tools() if toolkit.tool_type(name).value == "write"}


@functools.cache
def covering_tasks(domain: str) -> list[str]:
    """Few base tasks whose gold actions use every write tool that any gold action uses (greedy cover)."""
    writes = write_tools(domain, "assistant") | {f"user:{name}" for name in write_tools(domain, "user")}
    used = {}
    for task in domains.get_tasks(domain, "base"):
        names = {
            (a.name if a.requestor == "assistant" else f"user:{a.name}") for a in task.evaluation_criteria.actions
        }
        used[task.id] = (names & writes, len(task.evaluation_criteria.actions))
    chosen, left = [], set().union(*(names for names, _ in used.values()))
    while left:
        task_id = max(used, key=lambda t: (len(used[t][0] & left), -used[t][1]))
        chosen.append(task_id)
        left -= used[task_id][0]
    return chosen


def untested_by_gold(domain: str) -> set[str]:
    gold = {a.name for task in domains.get_tasks(domain, "base") for a in task.evaluation_criteria.actions}
    return (write_tools(domain, "assistant") | write_tools(domain, "user")) - gold


def write_route_pattern() -> str:
    agent = set().union(*(write_tools(d, "assistant") for d in ("airline", "retail", "telecom")))
    user = write_tools("telecom", "user")
    return rf"^/({'|'.join(sorted(agent))})$|^/user_tools/({'|'.join(sorted(user))})$"


class ExtrasProvider:
    """The scripted policy for the extras episode; every other conversation is the tau2 oracle + scripted user."""

    def script_for(self, key: str):
        return EXTRAS_POLICY if key.endswith(f"-{EXTRAS_SAMPLE}|policy") else None


@pytest.fixture(scope="module")
def stack():
    with start_fake_server(providers=[ExtrasProvider()]) as fake:
        specs = tau2_stack(
            ModelEndpoint([fake.base_url], "fake-policy", return_token_ids=True),
            ModelEndpoint([fake.base_url], "fake-user"),
            domains=["airline", "retail", "telecom"],
            agent_config={"policy_retry": FAST_RETRY, "user_retry": FAST_RETRY, "resources_retry": RESOURCES_RETRY},
        )
        specs[0].server_class = "nemo_tau2.testing.faulty_resources:FaultyTau2ResourcesServer"
        with GymServers(specs) as servers:
            yield Stack(fake, None, servers.url(AGENT), servers)
    print("\nfault matrix (fault, route, outcome): count")
    for (fault, route, outcome), count in sorted(MATRIX.items()):
        print(f"  {fault:9s} {route:28s} {outcome:40s} {count}")


def _control(stack, **body) -> None:
    url = stack.servers.url(RESOURCES_SERVER)
    requests.post(f"{url}/fault/control", json=body, timeout=30).raise_for_status()


def _stats(stack) -> dict:
    return requests.get(stack.servers.url(RESOURCES_SERVER) + "/fault/stats", timeout=30).json()


def _jobs() -> list[tuple[str, str, dict]]:
    jobs = [(d, t, {"sample_index": 0}) for d in ("airline", "retail", "telecom") for t in covering_tasks(d)]
    extras_task = next(t for t in covering_tasks("telecom") if "enable_roaming" in {a.name for a in
                       domains.get_task("telecom", t).evaluation_criteria.actions})  # fmt: skip
    return jobs + [("telecom", extras_task, {"sample_index": EXTRAS_SAMPLE})]


def _play(stack, jobs) -> tuple[list[tuple[int, dict]], dict]:
    results = asyncio.run(stack.run_many(jobs, concurrency=len(jobs)))
    return results, _stats(stack)


@pytest.fixture(scope="module")
def baseline(stack):
    """Every episode once with no faults: the rewards, executed calls and final states to compare against."""
    _control(stack, clear=True)
    results, stats = _play(stack, _jobs())
    assert all(status == 200 and body["status"] == "ok" for status, body in results), results
    assert stats["live_sessions"] == 0
    return {(b["domain"], b["task_id"], b["sample_index"]): b["reward"] for _, b in results}, stats["episodes"]


def test_the_episodes_exercise_every_write_tool_of_every_domain():
    for domain in ("airline", "retail", "telecom"):
        covered = {
            a.name for t in covering_tasks(domain) for a in domains.get_task(domain, t).evaluation_criteria.actions
        }
        scripted = {c.name for turn in EXTRAS_POLICY.turns for c in turn.tool_calls} | {
            "toggle_wifi", "connect_vpn", "set_apn_settings"}  # fmt: skip
        all_writes = write_tools(domain, "assistant") | write_tools(domain, "user")
        assert all_writes - covered - (scripted if domain == "telecom" else set()) == set(), domain
        assert untested_by_gold(domain) <= (scripted if domain == "telecom" else set())


@pytest.mark.parametrize("kind", FAULT_KINDS)
def test_a_write_whose_answer_is_lost_after_it_was_applied_is_not_applied_again(stack, baseline, kind):
    rewards, expected = baseline
    _control(stack, clear=True, faults=[{"kind": kind, "route": "any", "key_pattern": write_route_pattern(),
                                        "count": None, "hold_s": HOLD_S}])  # fmt: skip
    results, stats = _play(stack, _jobs())
    for status, body in results:
        assert status == 200 and body["status"] == "ok", body
        key = (body["domain"], body["task_id"], body["sample_index"])
        assert body["reward"] == rewards[key], key
    faulted_writes = sum(stats["faults"].values())
    assert faulted_writes >= 25  # every write of every episode was hit once
    for name, episode in expected.items():  # same calls executed, once each; same final databases
        assert stats["episodes"][name] == episode, name
    assert stats["replayed_answers"] >= faulted_writes and stats["live_sessions"] == 0
    for fault in stats["faults"]:
        route = fault.split(" ", 1)[1]
        MATRIX[(kind, "user write tool" if route.startswith("/user_tools/") else "agent write tool",
                "replayed: applied once, same reward")] += stats["faults"][fault]  # fmt: skip


@pytest.mark.parametrize("kind", FAULT_KINDS)
@pytest.mark.parametrize("route", ["/seed_session", "/verify"])
def test_a_seed_or_verify_whose_answer_is_lost_is_answered_again_from_the_record(stack, baseline, kind, route):
    rewards, expected = baseline
    jobs = [("airline", covering_tasks("airline")[0], {"sample_index": 0}),
            ("telecom", covering_tasks("telecom")[0], {"sample_index": 0})]  # fmt: skip
    _control(stack, clear=True, faults=[{"kind": kind, "route": "any", "key": route, "count": None,
                                        "hold_s": HOLD_S}])  # fmt: skip
    results, stats = _play(stack, jobs)
    for status, body in results:
        assert status == 200 and body["status"] == "ok", body
        assert body["reward"] == rewards[(body["domain"], body["task_id"], 0)]
    assert sum(stats["faults"].values()) == len(jobs)
    assert stats["replayed_answers"] == len(jobs)
    assert stats["live_sessions"] == 0  # a re-seed did not leave the first session behind
    assert stats["episodes"] == {name: expected[name] for name in stats["episodes"]}
    MATRIX[(kind, route, "replayed: same session / same verdict")] += len(jobs)


# ---------------------------------------------------------------- the replay contract, over HTTP


def _seeded(url: str, key: str | None = None) -> requests.Session:
    session = requests.Session()
    headers = {"Idempotency-Key": key} if key else {}
    response = session.post(f"{url}/seed_session", json={"domain": "airline", "task_id": "0"}, headers=headers)
    assert response.status_code == 200, response.text
    return session


CERTIFICATE = {"user_id": "mia_li_3668", "amount": 100}


def _certificates(session: requests.Session, url: str) -> int:
    user = session.post(f"{url}/get_user_details", json={"user_id": "mia_li_3668"}).text
    return len(set(re.findall(r"certificate_\d+", user)))


def test_a_repeated_key_replays_status_body_and_tool_error_flag_without_running_again(stack):
    url = stack.servers.url(RESOURCES_SERVER)
    _control(stack, clear=True)
    session = _seeded(url)
    before = _certificates(session, url)
    first = session.post(f"{url}/send_certificate", json=CERTIFICATE, headers={"Idempotency-Key": "k1"})
    again = session.post(f"{url}/send_certificate", json=CERTIFICATE, headers={"Idempotency-Key": "k1"})
    assert (again.status_code, again.text, again.headers["X-Tau2-Tool-Error"]) == (
        first.status_code, first.text, first.headers["X-Tau2-Tool-Error"])  # fmt: skip
    assert again.headers["X-Idempotent-Replay"] == "1" and "X-Idempotent-Replay" not in first.headers
    assert _certificates(session, url) == before + 1
    error = session.post(f"{url}/send_certificate", json={"user_id": "nobody"}, headers={"Idempotency-Key": "k2"})
    replayed_error = session.post(f"{url}/send_certificate", json={"user_id": "nobody"},
                                  headers={"Idempotency-Key": "k2"})  # fmt: skip
    assert error.headers["X-Tau2-Tool-Error"] == replayed_error.headers["X-Tau2-Tool-Error"] == "1"
    assert replayed_error.text == error.text
    new_key = session.post(f"{url}/send_certificate", json=CERTIFICATE, headers={"Idempotency-Key": "k3"})
    assert new_key.status_code == 200 and _certificates(session, url) == before + 2  # a new key is a new call


def test_the_same_key_with_other_arguments_is_a_409_naming_both(stack):
    url = stack.servers.url(RESOURCES_SERVER)
    session = _seeded(url)
    session.post(f"{url}/send_certificate", json=CERTIFICATE, headers={"Idempotency-Key": "k"})
    other = session.post(f"{url}/send_certificate", json=CERTIFICATE | {"amount": 250},
                         headers={"Idempotency-Key": "k"})  # fmt: skip
    assert other.status_code == 409
    detail = other.json()["detail"]
    assert '"amount": 100' in detail and '"amount": 250' in detail and "/send_certificate" in detail
    another_tool = session.post(f"{url}/cancel_reservation", json={"reservation_id": "X"},
                                headers={"Idempotency-Key": "k"})  # fmt: skip
    assert another_tool.status_code == 409 and "/cancel_reservation" in another_tool.json()["detail"]


def test_concurrent_attempts_with_one_key_apply_once(stack):
    url = stack.servers.url(RESOURCES_SERVER)
    session = _seeded(url)
    before = _certificates(session, url)
    answers = []

    def attempt():
        answers.append(session.post(f"{url}/send_certificate", json=CERTIFICATE, headers={"Idempotency-Key": "c"}))

    threads = [threading.Thread(target=attempt) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert {a.status_code for a in answers} == {200} and len({a.text for a in answers}) == 1
    assert _certificates(session, url) == before + 1


def test_a_retried_seed_gets_the_first_session_back_and_no_second_one(stack):
    url = stack.servers.url(RESOURCES_SERVER)
    live = _stats(stack)["live_sessions"]
    first = _seeded(url, key="seed-1")
    retry = _seeded(url, key="seed-1")  # a fresh client: the first answer (and its cookie) never arrived
    assert _stats(stack)["live_sessions"] == live + 1
    first.post(f"{url}/send_certificate", json=CERTIFICATE)
    assert _certificates(retry, url) == _certificates(first, url)  # the same episode


def test_a_retried_verify_gets_the_first_verdict_and_another_body_a_409(stack):
    from nemo_tau2.gym.resources_server.bodies import verify_body

    url = stack.servers.url(RESOURCES_SERVER)
    session = _seeded(url)
    session.post(f"{url}/send_certificate", json=CERTIFICATE)
    body = verify_body(["Done."])
    first = session.post(f"{url}/verify", json=body)
    again = session.post(f"{url}/verify", json=body)
    assert first.status_code == again.status_code == 200
    assert again.json() == first.json() and again.headers["X-Idempotent-Replay"] == "1"
    other = session.post(f"{url}/verify", json=verify_body(["Something else."]))
    assert other.status_code == 409 and "already verified" in other.json()["detail"]
    assert session.post(f"{url}/send_certificate", json=CERTIFICATE).status_code == 404
