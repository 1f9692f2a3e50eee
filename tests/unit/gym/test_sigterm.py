"""Each Gym server of ours (the tau2 agent, the resources server, fast_vllm_model) exits within seconds of SIGTERM
with requests in flight, as when a cluster job is stopped. One stack in front of the fake endpoint, whose answers are
held for a minute so that the requests are still in flight at the signal; the agent goes first (it needs the model
servers alive to have episodes in flight)."""

import json
import socket
import time
import urllib.request

import pytest

from nemo_tau2.gym.launch import GymServers
from nemo_tau2.gym.stack import AGENT, POLICY_MODEL, RESOURCES_SERVER, ModelEndpoint, tau2_stack
from nemo_tau2.tau2_env.gym_rows import task_row
from nemo_tau2.testing import start_fake_server
from tests.sigterm import STOP_BOUND_S, seconds_to_exit_after_sigterm, start_in_flight, wait_for

HELD_S = 60.0


@pytest.fixture(scope="module")
def stack():
    with start_fake_server() as fake:
        fake.inject_fault("timeout", count=None, hold_s=HELD_S)  # dropped, not answered, when the fake stops
        specs = tau2_stack(
            ModelEndpoint([fake.base_url], "fake-policy", return_token_ids=True),
            ModelEndpoint([fake.base_url], "fake-user"),
            domains=["mock"],
        )
        with GymServers(specs) as servers:
            yield fake, servers


def _post(url: str, body: dict) -> None:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    urllib.request.urlopen(request, timeout=120).close()


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def _stops_in_time(servers: GymServers, name: str) -> float:
    exited = lambda: any(exit.name == name for exit in servers.exited())  # noqa: E731
    return seconds_to_exit_after_sigterm(servers.pid(name), exited)


def test_agent_with_episodes_in_flight(stack):
    fake, servers = stack
    url = servers.url(AGENT)
    start_in_flight(lambda: _post(f"{url}/run", task_row("mock", "create_task_1")), count=4)
    wait_for(lambda: _get(f"{url}/progress")["running_episodes"] == 4, 30, "4 episodes did not start")
    wait_for(lambda: fake.stats().requests_by_route["chat"] >= 4, 30, "the episodes did not reach the model")
    assert _stops_in_time(servers, AGENT) < STOP_BOUND_S


def test_fast_vllm_model_with_model_calls_in_flight(stack):
    fake, servers = stack
    url, calls_before = servers.url(POLICY_MODEL), fake.stats().requests_by_route["chat"]
    body = {"input": [{"role": "user", "content": "Hello"}]}
    start_in_flight(lambda: _post(f"{url}/v1/responses", body), count=4)
    wait_for(lambda: fake.stats().requests_by_route["chat"] >= calls_before + 4, 30, "the calls did not arrive")
    assert _stops_in_time(servers, POLICY_MODEL) < STOP_BOUND_S


def test_resources_server_with_requests_in_flight(stack):
    """Its routes answer in milliseconds, so what is in flight are requests whose bodies are still arriving (a slow
    or stalled client), beside a stream of complete ones."""
    _, servers = stack
    url = servers.url(RESOURCES_SERVER)
    host, port = url.removeprefix("http://").split(":")
    stalled = []
    for _ in range(4):
        connection = socket.create_connection((host, int(port)))
        connection.sendall(b"POST /seed_session HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")
        connection.sendall(b'Content-Length: 1000\r\n\r\n{"domain": "mock", ')
        stalled.append(connection)
    start_in_flight(lambda: _post(f"{url}/seed_session", {"domain": "mock", "task_id": "create_task_1"}), count=8)
    time.sleep(0.5)
    try:
        assert _stops_in_time(servers, RESOURCES_SERVER) < STOP_BOUND_S
    finally:
        for connection in stalled:
            connection.close()
