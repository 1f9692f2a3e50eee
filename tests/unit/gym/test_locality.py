"""Each agent replica uses the resources replicas of its own failure domain (its node, or a labelled group of nodes),
so a lost domain fails only its own episodes (measured on a Ray cluster in ``test_ray_placement.py``); the agent
config the servers read is what says so. The user-simulator and policy routes stay the agent's own model servers."""

from nemo_tau2.gym.stack import (
    AGENT,
    POLICY_MODEL,
    RESOURCES_SERVER,
    USER_MODEL,
    ModelEndpoint,
    tau2_local_resources,
    tau2_replicas,
    tau2_stack,
)

ENDPOINT = ModelEndpoint(["http://127.0.0.1:1/v1"], "m")


def _groups(agents: int, resources: int):
    return tau2_replicas(tau2_stack(ENDPOINT, ENDPOINT, ["airline"]), agents, resources)


def _resources_of(groups) -> dict[str, list[str]]:
    used = {}
    for spec in (spec for group in groups for spec in group.specs if spec.server_type == "responses_api_agents"):
        refs = [spec.config["resources_server"], *spec.config["resources_server_replicas"]]
        used[spec.name] = [ref["name"] for ref in refs]
    return used


def test_each_agent_uses_the_resources_replicas_of_its_own_domain_and_keeps_its_model_servers():
    groups = _groups(agents=3, resources=3)
    domain_of = {spec.name: f"node{i}" for i, group in enumerate(groups[:3]) for spec in group.specs}
    domain_of |= {spec.name: f"node{(i + 1) % 3}" for i, group in enumerate(groups[3:]) for spec in group.specs}
    uses = tau2_local_resources(groups, domain_of)
    expected = {
        AGENT: [f"{RESOURCES_SERVER}_1"],
        f"{AGENT}_1": [f"{RESOURCES_SERVER}_2"],
        f"{AGENT}_2": [RESOURCES_SERVER],
    }
    assert uses == _resources_of(groups) == expected
    agent = next(spec for group in groups for spec in group.specs if spec.name == f"{AGENT}_1")
    assert agent.config["model_server"]["name"] == f"{POLICY_MODEL}_1"
    assert agent.config["user_model_server"]["name"] == f"{USER_MODEL}_1"


def test_a_domain_of_several_nodes_shares_its_replicas_and_one_without_any_keeps_them_all():
    groups = _groups(agents=3, resources=2)
    rack = {RESOURCES_SERVER: "rack=a", f"{RESOURCES_SERVER}_1": "rack=a"}
    agents = {AGENT: "rack=a", f"{AGENT}_1": "rack=a", f"{AGENT}_2": "rack=b"}
    domain_of = {spec.name: (rack | agents).get(spec.name, "-") for group in groups for spec in group.specs}
    both = [RESOURCES_SERVER, f"{RESOURCES_SERVER}_1"]
    assert tau2_local_resources(groups, domain_of) == {AGENT: both, f"{AGENT}_1": both, f"{AGENT}_2": both}
