"""The catalog serves tau2's own tasks, splits, tools and prompts."""

import pytest
from tau2.agent.llm_agent import LLMAgent
from tau2.registry import registry
from tau2.user.user_simulator import UserSimulator

from nemo_tau2.tau2_env import domains, prompts


@pytest.mark.parametrize(
    ("domain", "split", "count"),
    [
        ("airline", "train", 30),
        ("airline", "test", 20),
        ("airline", "base", 50),
        ("retail", "train", 74),
        ("retail", "test", 40),
        ("retail", "base", 114),
        ("telecom", "train", 74),
        ("telecom", "test", 40),
        ("telecom", "base", 114),
        ("telecom", "full", 2285),
        ("mock", "base", 9),
    ],
)
def test_splits_have_tau2s_sizes(domain, split, count):
    assert len(domains.get_tasks(domain, split)) == count


def test_train_and_test_partition_base():
    for domain in ("airline", "retail", "telecom"):
        splits = domains.task_splits(domain)
        assert set(splits["train"]) | set(splits["test"]) == set(splits["base"])
        assert not set(splits["train"]) & set(splits["test"])


def test_unknown_split_and_domain_errors_name_the_choices():
    with pytest.raises(domains.UnknownTaskError, match="splits are: .*train"):
        domains.get_tasks("airline", "validation")
    with pytest.raises(domains.UnknownDomainError, match="airline, retail, telecom"):
        domains.get_tasks("banking", "base")


@pytest.mark.parametrize("domain", ["airline", "retail", "telecom"])
def test_tools_and_prompts_are_tau2s(domain):
    env = registry.get_env_constructor(domain)()
    assert domains.chat_tool_schemas(domain) == [tool.openai_schema for tool in env.get_tools()]
    assert [tool["name"] for tool in domains.responses_tool_schemas(domain)] == [t.name for t in env.get_tools()]
    agent = LLMAgent(tools=env.get_tools(), domain_policy=env.get_policy())
    assert prompts.agent_system_prompt(domain) == agent.system_prompt
    task = domains.get_tasks(domain, "base")[0]
    user_tools = env.get_user_tools() if env.user_tools else None
    user = UserSimulator(tools=user_tools, instructions=str(task.user_scenario))
    assert prompts.user_system_prompt(domain, task.id) == user.system_prompt


def test_only_telecom_users_have_tools():
    assert domains.user_tool_names("telecom") and not domains.user_tool_names("airline")
    assert domains.responses_tool_schemas("airline", side="user") == []


def test_stop_tokens_end_the_episode():
    assert prompts.is_user_stop("Thanks! ###STOP###") and prompts.is_user_stop("###TRANSFER###")
    assert (
        prompts.is_user_stop("###OUT-OF-SCOPE###")
        and not prompts.is_user_stop("thanks")
        and not prompts.is_user_stop(None)
    )
