"""Text pivots in mode ``continue`` (``pivot_text_reward: continue``): the sampled turn, then the episode played on
from a fork of the pivot's state by the policy and the simulated user, scored by tau2's reward.

The pivots are cut from live episodes of this stack (the oracle policy, the scripted user), one per domain: in
airline and retail the closing turn, after every gold call (the user must hear the task's ``communicate_info``); in
telecom the agent's last request for a device action, after the user's earlier device calls. Played on:

- the user simulator's first request after the pivot turn is the very request it got at that point of the live
  episode (its view rebuilt from the stored prefix: the agent's texts, its own messages, its device calls and their
  answers), the trajectory is the live one, and the reward is the live reward (1);
- a text that skips what the task needs (the closing question alone, without the information or the last device
  action) scores 0, where mode ``message`` (NeMo-Gym's rule) scores both texts 1;
- the response is the pivot turn alone (what trains), the whole trajectory is the answer's ``tau2_messages``;
- a prefix that does not replay is refused (400) with its reason;
- profiled through the agent (``profile_pivots.py --agent-url``), a policy right on every other sample makes each text
  pivot a pivot (rewards 1, 0, ...) in mode ``continue``, and none in mode ``message`` (every text 1).
"""

import asyncio
import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_tau2.gym.stack import AGENT
from nemo_tau2.pivots.candidates import StoredTrajectory, pivot_rows
from nemo_tau2.pivots.profile import AgentProfiler, Endpoint, ProfileSettings, profile_pivots
from nemo_tau2.tau2_env import domains
from nemo_tau2.tau2_env.gym_rows import task_row
from nemo_tau2.testing.scripts import DEFAULT_CLOSING_TEXT, Turn, TurnListScript
from nemo_tau2.testing.tau2_scripts import DEVICE_ACTION_PREFIX, ScriptedUser, Tau2Key, UserScriptConfig, oracle_turns
from tests.unit.gym.agent.conftest import CONTINUING_AGENT

REPO = Path(__file__).resolve().parents[4]
TASKS = {"airline": "3", "retail": "2", "telecom": domains.get_tasks("telecom", "base")[0].id}


class RecordingUser:
    """The scripted user of one task, keeping every request's messages (its view of the conversation)."""

    token_consistent = True

    def __init__(self, domain: str, task_id: str):
        self.user = ScriptedUser(domain, domains.get_task(domain, task_id), UserScriptConfig())
        self.requests: list[list[dict]] = []

    def respond(self, request):
        self.requests.append(request.messages)
        return self.user.respond(request)


def pivot_of(domain: str, task_id: str, messages: list[dict]) -> dict:
    """The live trajectory's pivot: the closing turn, or (telecom) the last request for a device action."""
    rows, _ = pivot_rows(StoredTrajectory(domain, task_id, messages, source="live"), task_row(domain, task_id))
    texts = [row for row in rows if row["expected_action"]["type"] == "message"]
    if domain == "telecom":
        return [row for row in texts if row["expected_action"]["content"].startswith(DEVICE_ACTION_PREFIX)][-1]
    return texts[-1]


def calls_and_texts(messages: list[dict]) -> list[tuple]:
    """A trajectory without its call ids (a continuation's calls get new ones)."""
    return [
        (m["role"], m.get("content"), [(c["name"], c["arguments"], c["requestor"]) for c in m.get("tool_calls") or []])
        for m in messages
    ]


@pytest.mark.parametrize("domain", list(TASKS))
def test_a_text_pivot_played_on_is_the_live_episode_and_a_text_that_skips_the_task_scores_0(fresh_stack, domain):
    task_id = TASKS[domain]
    fresh_stack.provider.user = live_user = RecordingUser(domain, task_id)
    status, live = fresh_stack.run(domain, task_id)
    assert status == 200 and live["reward"] == 1.0 and live["termination_reason"] == "user_stop", live
    pivot = pivot_of(domain, task_id, live["tau2_messages"])
    assert pivot["tau2_messages"] == live["tau2_messages"][: len(pivot["tau2_messages"])]
    if domain == "telecom":  # the rebuilt user view holds its own device calls and their answers
        assert any(m.get("requestor") == "user" and m["role"] == "tool" for m in pivot["tau2_messages"])

    rest = oracle_rest(pivot)
    assert rest[0].text == pivot["expected_action"]["content"]
    skipping = [Turn.say(DEFAULT_CLOSING_TEXT)]
    verdicts = {}
    for name, turns in (("oracle", rest), ("skipping", skipping)):
        for agent in (AGENT, CONTINUING_AGENT):
            fresh_stack.provider.policy = TurnListScript(turns)
            fresh_stack.provider.user = user = RecordingUser(domain, task_id)
            status, body = fresh_stack.run_row(pivot, agent)
            assert status == 200, body
            verdicts[name, agent] = body["reward"]
            category = body["reward_info"]["pivot"]["category"]
            assert category == ("message" if agent == AGENT else "continued"), body["reward_info"]
            if agent == CONTINUING_AGENT and name == "oracle":
                assert user.requests[0] in live_user.requests, "the user's view is not the live one at the pivot"
                assert calls_and_texts(body["tau2_messages"]) == calls_and_texts(live["tau2_messages"])
                assert body["termination_reason"] == "user_stop" and body["num_turns"] == len(rest)
                pivot_turn = body["response"]["output"]  # the pivot turn alone: what trains
                assert [item["type"] for item in pivot_turn] == ["message"], pivot_turn
                assert pivot_turn[0]["generation_token_ids"] and pivot_turn[0]["prompt_token_ids"]
    assert verdicts == {
        ("oracle", AGENT): 1.0, ("oracle", CONTINUING_AGENT): 1.0,
        ("skipping", AGENT): 1.0, ("skipping", CONTINUING_AGENT): 0.0,
    }  # fmt: skip


def test_a_prefix_that_does_not_replay_or_is_not_tau2s_is_refused_with_its_reason(fresh_stack):
    status, live = fresh_stack.run("airline", TASKS["airline"])
    assert status == 200, live
    pivot = pivot_of("airline", TASKS["airline"], live["tau2_messages"])
    tampered = copy.deepcopy(pivot)
    next(m for m in tampered["tau2_messages"] if m["role"] == "tool")["content"] = "an answer this data never gave"
    not_text = copy.deepcopy(pivot)
    not_text["tau2_messages"][1]["content"] = {"text": "hi"}
    cases = [
        (tampered, "cannot be forked"),
        (not_text, "tau2_messages[1] is not a tau2 message with text content"),
        ({key: value for key, value in pivot.items() if key != "tau2_messages"}, "must be a list of tau2 messages"),
        (pivot | {"tau2_messages": "hi"}, "must be a list of tau2 messages"),
        (pivot | {"expected_action": "say hi"}, "expected_action"),  # not an action: the server's 400, as ever
    ]
    for row, says in cases:
        status, body = fresh_stack.run_row(row, CONTINUING_AGENT)
        assert status == 400 and says in body["detail"] and "\n" not in body["detail"], body


class RightOnEvenSamples:
    """A policy that plays each task's pivot as its oracle on even samples and skips to the closing on odd ones."""

    token_consistent = True

    def __init__(self, pivots: list[dict]):
        self.scripts = {
            pivot["task_id"]: (TurnListScript(oracle_rest(pivot)), TurnListScript([Turn.say(DEFAULT_CLOSING_TEXT)]))
            for pivot in pivots
        }

    def respond(self, request):
        key = Tau2Key.parse(request.key)
        return self.scripts[key.task_id][key.sample_index % 2].respond(request)


def oracle_rest(pivot: dict) -> list[Turn]:
    return list(oracle_turns(domains.get_task(pivot["domain"], pivot["task_id"])))[pivot["turn"] - 1 :]


def test_profiling_through_the_agent_finds_text_pivots_only_when_they_are_played_on(fresh_stack, tmp_path):
    pivots = []
    for domain, task_id in TASKS.items():
        fresh_stack.provider.user = RecordingUser(domain, task_id)
        status, live = fresh_stack.run(domain, task_id)
        assert status == 200, live
        pivots.append(pivot_of(domain, task_id, live["tau2_messages"]))
    fresh_stack.provider.user = None  # the tau2 scripts' user, for every task
    fresh_stack.provider.policy = RightOnEvenSamples(pivots)
    profiled = {}
    for agent in (AGENT, CONTINUING_AGENT):
        profiler = AgentProfiler(Endpoint(fresh_stack.servers.url(agent), "agent"), ProfileSettings(samples=4))
        report = asyncio.run(profile_pivots(pivots, profiler, tmp_path / f"{agent}.jsonl", tmp_path / f"{agent}.kept"))
        lines = [json.loads(line) for line in (tmp_path / f"{agent}.jsonl").read_text().splitlines()]
        profiled[agent] = {line["domain"]: (line["rewards"], line["kept"]) for line in lines}
        categories = {category for line in lines for category in line["categories"]}
        assert categories == {"message" if agent == AGENT else "continued"}, lines
        assert report.samples_run == 4 * len(pivots)
    assert profiled[AGENT] == dict.fromkeys(TASKS, ([1.0] * 4, False))
    assert profiled[CONTINUING_AGENT] == dict.fromkeys(TASKS, ([1.0, 0.0, 1.0, 0.0], True))

    (tmp_path / "pivots.jsonl").write_text("".join(json.dumps(pivot) + "\n" for pivot in pivots))
    command = [sys.executable, "examples/profile_pivots.py", "--pivots", str(tmp_path / "pivots.jsonl"),
               "--output", str(tmp_path / "kept.jsonl"), "--samples", "2"]  # fmt: skip
    url = fresh_stack.servers.url(CONTINUING_AGENT)
    done = subprocess.run([*command, "--agent-url", url], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["by_domain"]["telecom"]["kept"] == 1, done.stdout
    assert len((tmp_path / "kept.jsonl").read_text().splitlines()) == len(pivots)
    both = subprocess.run([*command, "--agent-url", url, "--model", "m"], capture_output=True, text=True, timeout=60)
    assert both.returncode == 2 and "--agent-url profiles the agent's own policy" in both.stderr, both.stderr
