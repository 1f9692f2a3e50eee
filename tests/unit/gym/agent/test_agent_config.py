"""Config errors stop the agent server at start-up with a message that says what to fix."""

import pytest
from pydantic import ValidationError

from nemo_tau2.gym.agent.app import Tau2AgentConfig
from nemo_tau2.gym.launch import GymServers, ServerStartError
from nemo_tau2.gym.stack import AGENT, ModelEndpoint, tau2_stack

BASE = {
    "host": "127.0.0.1",
    "port": 1,
    "entrypoint": "app.py",
    "name": "tau2_agent",
    "resources_server": {"type": "resources_servers", "name": "tau2_resources_server"},
    "model_server": {"type": "responses_api_models", "name": "policy_model"},
    "user_model_server": {"type": "responses_api_models", "name": "user_model"},
}


def _agent_only(**agent_config):
    endpoint = ModelEndpoint(["http://127.0.0.1:9/v1"], "unused")
    specs = tau2_stack(endpoint, endpoint, ["airline"], agent_config=agent_config)
    return GymServers([spec for spec in specs if spec.name == AGENT], startup_timeout_s=60)


def test_missing_user_model_stops_the_agent_at_start_up():
    with pytest.raises(ServerStartError, match="needs a user simulator: set user_model_server") as error:
        _agent_only(user_model_server=None).start()
    assert "Traceback" not in str(error.value)


def test_unknown_domain_stops_the_agent_at_start_up():
    with pytest.raises(ServerStartError, match=r"unknown domain\(s\) \['banking'\]"):
        _agent_only(domains=["airline", "banking"]).start()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"max_step": 50}, "'max_step' (did you mean 'max_steps'?)"),
        ({"user_responses_create_params": {"top_k": 20}}, "may not set ['top_k']"),
        ({"max_errors": 0}, "greater than 0"),
        ({"pivot_text_reward": "rollout"}, "'message' or 'continue'"),
        ({"policy_retry": {"timeout": 5}}, "Extra inputs are not permitted"),
        ({"user_strategy": {"strategy": "socratic"}}, "'llm', 'react', 'verify' or 'reflection'"),
        ({"user_strategy": {"max_checks": 2}}, "max_checks applies only to strategy verify or reflection"),
    ],
)
def test_bad_agent_config_values_name_the_key(change, message):
    with pytest.raises(ValidationError) as error:
        Tau2AgentConfig.model_validate(BASE | change)
    assert message in str(error.value)


def test_a_reference_to_a_missing_server_is_named():
    endpoint = ModelEndpoint(["http://127.0.0.1:9/v1"], "unused")
    specs = tau2_stack(
        endpoint,
        endpoint,
        ["airline"],
        agent_config={"user_model_server": {"type": "responses_api_models", "name": "judge"}},
    )
    without_user_model = [spec for spec in specs if spec.name != "user_model"]
    with pytest.raises(ServerStartError, match="its user server 'judge' is not in the config") as error:
        GymServers(without_user_model, startup_timeout_s=120).start()
    assert "Traceback" not in str(error.value)
