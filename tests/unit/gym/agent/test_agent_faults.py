"""Failures are data: an episode whose model keeps failing is an infrastructure error, never a zero reward."""

import time

import pytest
import requests

from nemo_tau2.testing import PolicyScriptConfig

POLICY = r"\|policy$"
USER = r"\|user$"


def _live_sessions(stack) -> int:
    return requests.get(stack.servers.url("tau2_resources_server") + "/session_stats").json()["live_sessions"]


@pytest.mark.parametrize(
    ("kind", "key_pattern", "cause"),
    [
        ("http_500", POLICY, "policy model"),
        ("timeout", POLICY, "no answer within 3 s"),
        ("garbage", USER, "user simulator"),
        ("http_503", USER, "user simulator"),
    ],
)
def test_an_endpoint_that_keeps_failing_ends_the_episode_as_an_infrastructure_error(
    fresh_stack, kind, key_pattern, cause
):
    fresh_stack.fake.inject_fault(kind, count=None, key_pattern=key_pattern, hold_s=30)
    started = time.monotonic()
    status, body = fresh_stack.run("airline", "11")
    assert time.monotonic() - started < 60
    assert status == 502
    assert body["status"] == "infrastructure_error" and cause in body["error"]
    assert body["tau2_failure_kind"] == "infrastructure"
    assert "reward" not in body
    assert _live_sessions(fresh_stack) == 0  # the failed episode's tau2 session was ended


def test_an_endpoint_that_recovers_after_two_failures_gives_a_normal_episode(fresh_stack):
    fresh_stack.fake.inject_fault("http_500", count=2, key_pattern=POLICY)
    fresh_stack.fake.inject_fault("drop", count=2, key_pattern=USER)
    status, body = fresh_stack.run("airline", "11")
    assert status == 200 and body["status"] == "ok" and body["reward"] == 1.0
    assert fresh_stack.fake.stats().faults_by_kind == {"http_500": 2, "drop": 2}


def test_the_agent_server_keeps_serving_after_failures(fresh_stack):
    fresh_stack.fake.inject_fault("http_500", count=None, key_pattern=POLICY)
    assert fresh_stack.run("airline", "11")[0] == 502
    fresh_stack.fake.clear_faults()
    status, body = fresh_stack.run("airline", "11")
    assert status == 200 and body["reward"] == 1.0


def test_contiguity_check_flags_a_token_inconsistent_policy_when_history_is_re_rendered(fresh_stack):
    fresh_stack.fake.set_tau2_scripts(policy=PolicyScriptConfig(token_consistent=False))
    fresh_stack.fake.set_prefix_correction(False)  # stock vLLM: history re-tokenised from text
    status, body = fresh_stack.run("airline", "11")
    assert status == 200 and body["reward"] == 1.0
    breaks = body["token_contiguity"]["breaks"]
    assert len(breaks) == body["num_turns"] - 1 and "differs from turn 0's prompt + generation" in breaks[0]

    fresh_stack.fake.set_prefix_correction(True)  # NeMo-RL's vLLM: the carried token ids are spliced in
    status, body = fresh_stack.run("airline", "11")
    assert status == 200 and body["token_contiguity"]["breaks"] == []
