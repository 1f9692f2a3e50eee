"""The Gym episode settings have one schema: each key is declared once, with one default, and every config that
carries it (the agent server's, ``env.nemo_gym`` of eval and GRPO, ``Tau2EnvConfig``) is that schema."""

import ast
from pathlib import Path

import pytest

from nemo_tau2.env_api.config import Tau2EnvConfig
from nemo_tau2.gym.agent.app import Tau2AgentConfig
from nemo_tau2.gym.episode_config import EpisodeLimits, EpisodeSettings, NemoGymEnvConfig, UserSimulatorConfig

PACKAGE = Path(__file__).resolve().parents[3] / "nemo_tau2"


@pytest.mark.parametrize("config", [Tau2AgentConfig, NemoGymEnvConfig, Tau2EnvConfig])
def test_every_config_that_carries_the_limits_is_the_one_schema(config):
    assert issubclass(config, EpisodeLimits)
    for name, field in EpisodeLimits.model_fields.items():
        theirs = config.model_fields[name]
        assert (theirs.annotation, theirs.default, theirs.metadata) == (
            field.annotation,
            field.default,
            field.metadata,
        )
        assert theirs.get_default(call_default_factory=True) == field.get_default(call_default_factory=True), name


def test_each_episode_setting_is_declared_in_one_module():
    names = set(EpisodeSettings.model_fields)
    declared: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if (
                        isinstance(item, ast.AnnAssign)
                        and isinstance(item.target, ast.Name)
                        and item.target.id in names
                    ):
                        declared.setdefault(item.target.id, []).append(f"{path.relative_to(PACKAGE)}:{node.name}")
    assert {name: places for name, places in declared.items() if len(places) != 1} == {}
    assert {place.split(":")[0] for places in declared.values() for place in places} == {"gym/episode_config.py"}


def test_the_agent_gets_the_eval_limits_and_the_user_block_as_one_object():
    user = UserSimulatorConfig(generation={"backend": "fake", "temperature": 0.0, "top_p": 1.0}, seed=7)
    settings = user.episode_settings(NemoGymEnvConfig(max_steps=12, max_turns=3))
    agent_yaml = settings.model_dump(mode="json", exclude_unset=True)
    agent = Tau2AgentConfig.model_validate(
        agent_yaml
        | {
            "entrypoint": "app.py",
            "name": "tau2_agent",
            "host": "127.0.0.1",
            "port": 1,
            "resources_server": {"type": "resources_servers", "name": "r"},
            "model_server": {"type": "responses_api_models", "name": "p"},
            "user_model_server": {"type": "responses_api_models", "name": "u"},
        }
    )
    assert (agent.max_steps, agent.max_turns, agent.max_errors, agent.user_seed) == (12, 3, 10, 7)
    assert agent.user_responses_create_params == {"temperature": 0.0, "top_p": 1.0, "max_output_tokens": 1024}
    assert UserSimulatorConfig.model_fields["seed"].default == EpisodeSettings.model_fields["user_seed"].default


def test_the_user_sampling_keeps_its_output_cap_unless_overridden():
    assert EpisodeSettings().user_responses_create_params == {"temperature": 0.0, "max_output_tokens": 1024}
    warmer = EpisodeSettings(user_responses_create_params={"temperature": 0.7})
    assert warmer.user_responses_create_params == {"temperature": 0.7, "max_output_tokens": 1024}
    uncapped = EpisodeSettings(user_responses_create_params={"max_output_tokens": None})
    assert uncapped.user_responses_create_params["max_output_tokens"] is None
