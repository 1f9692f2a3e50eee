"""A tau2 harness that sends no conversation key (tau2's own runner, through litellm): the fake server recognises
each request's task and side (``missing_key: tau2``), so the oracle and the scripted user play it, concurrently."""

from concurrent.futures import ThreadPoolExecutor

import pytest

from nemo_tau2.tau2_env import domains
from nemo_tau2.testing import PolicyScriptConfig, start_fake_server
from nemo_tau2.testing.config import ControlRequest, FakeServerConfig
from nemo_tau2.testing.scripts import ScriptError
from nemo_tau2.testing.tau2_inferred_keys import Tau2KeyInference
from nemo_tau2.testing.tau2_scripts import opening_text

CASES = [("airline", "3"), ("airline", "7"), ("retail", "2"), ("telecom", None)]


def _telecom_task() -> str:  # one where the user acts on the device: the user side's tool calls are recognised too
    tasks = domains.get_tasks("telecom", "base")
    return next(t.id for t in tasks if {a.requestor for a in t.evaluation_criteria.actions} == {"user", "assistant"})


def _run_tau2(base_url: str, domain: str, task_id: str, seed: int = 1) -> float:
    from tau2.run import run_task

    llm_args = {"api_base": base_url, "api_key": "unused", "temperature": 0.0}
    simulation = run_task(
        domain, domains.get_task(domain, task_id), agent="llm_agent", user="user_simulator",
        llm_agent="openai/fake-model", llm_args_agent=llm_args, llm_user="openai/fake-model", llm_args_user=llm_args,
        max_steps=60, seed=seed,
    )  # fmt: skip
    return simulation.reward_info.reward


@pytest.fixture(scope="module")
def keyless_fake():
    config = FakeServerConfig(missing_key="tau2", inferred_key_domains=["airline", "retail", "telecom"])
    with start_fake_server(config) as fake:
        yield fake


def test_tau2s_own_runner_without_keys_is_played_by_the_oracle_concurrently(keyless_fake):
    """airline and retail by their openings; telecom (tasks of one issue share an opening) by the run's seed."""
    cases = [(domain, task_id or _telecom_task()) for domain, task_id in CASES] * 2  # each task twice, at once
    seeds = {1000 + i: case for i, case in enumerate(cases) if case[0] == "telecom"}  # one per telecom episode
    keyless_fake.control(ControlRequest(inferred_key_seeds={seed: "|".join(case) for seed, case in seeds.items()}))
    with ThreadPoolExecutor(len(cases)) as pool:
        rewards = list(
            pool.map(lambda i: _run_tau2(keyless_fake.base_url, *cases[i], seed=1000 + i), range(len(cases)))
        )
    assert rewards == [1.0] * len(cases)
    keys = set(keyless_fake.stats().requests_by_key)
    opened = {f"tau2|{d}|{t}|inferred|{side}" for d, t in set(cases) if d != "telecom" for side in ("policy", "user")}
    seeded = {f"tau2|telecom|{c[1]}|seed{s}|{side}" for s, c in seeds.items() for side in ("policy", "user")}
    assert opened | seeded <= keys


def test_a_mistaken_policy_is_recognised_as_well(keyless_fake):
    keyless_fake.set_tau2_scripts(policy=PolicyScriptConfig(variant="wrong_argument"))
    try:
        assert _run_tau2(keyless_fake.base_url, "retail", "2") == 0.0
    finally:
        keyless_fake.set_tau2_scripts(policy=PolicyScriptConfig())


def test_what_names_no_task_is_refused_in_words():
    inference = Tau2KeyInference(["airline"])
    with pytest.raises(ScriptError, match="not a tau2 conversation of a task of"):
        inference.key_of({"messages": [{"role": "system", "content": "hi"}, {"role": "user", "content": "Hi! no"}]})
    opening = opening_text(domains.get_task("airline", "3"))
    policy = [{"role": "system", "content": "p"}, {"role": "user", "content": opening}]
    assert inference.key_of({"messages": policy}) == "tau2|airline|3|inferred|policy"
    telecom = Tau2KeyInference(["telecom"])
    with pytest.raises(ScriptError, match="is the same: a keyless request cannot say which"):
        telecom.key_of({"messages": policy[:1] + [{"role": "user", "content": _telecom_opening()}]})
    with pytest.raises(ValueError, match="inferred_key_seeds\\[3\\] is 'telecom'"):
        FakeServerConfig(missing_key="tau2", inferred_key_domains=["telecom"], inferred_key_seeds={3: "telecom"})
    with pytest.raises(ValueError, match="inferred_key_seeds\\[3\\] is 'telecom'"):  # POST /fake/control: a 400
        ControlRequest(inferred_key_seeds={3: "telecom"})
    with pytest.raises(ValueError, match="inferred_key_domains"):
        FakeServerConfig(missing_key="tau2")


def _telecom_opening() -> str:
    return opening_text(domains.get_task("telecom", _telecom_task()))
