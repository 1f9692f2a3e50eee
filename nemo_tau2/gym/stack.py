"""The four NeMo-Gym servers of a tau2 run, as launcher specs: resources server, agent, policy and user models.

Each model server is ``fast_vllm_model`` (ours, the default: NeMo-Gym ``vllm_model``'s config and answers at a
fraction of its CPU per call), NeMo-Gym's own ``vllm_model`` (what NeMo-RL runs), or ``openai_model`` (any
OpenAI-compatible endpoint, no token ids). ``return_token_id_information: true`` gives training its per-turn token
ids. Instance names follow NeMo-Gym/NeMo-RL conventions (``policy_model``), so the same names work in a
``gym env start`` config.
"""

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from nemo_tau2.gym.launch import ServerSpec, replica_name

ModelServerKind = Literal["vllm_model", "fast_vllm_model", "openai_model"]
RESOURCES_SERVER = "tau2_resources_server"
AGENT = "tau2_agent"
POLICY_MODEL = "policy_model"
USER_MODEL = "user_model"

RESOURCES_SERVER_CLASS = "nemo_tau2.gym.resources_server.app:Tau2ResourcesServer"
AGENT_CLASS = "nemo_tau2.gym.agent.app:Tau2Agent"
_MODEL_SERVER_CLASSES = {
    "vllm_model": "responses_api_models.vllm_model.app:VLLMModel",
    "fast_vllm_model": "nemo_tau2.gym.model_server.app:FastVLLMModel",
    "openai_model": "responses_api_models.openai_model.app:SimpleModelServer",
}


@dataclass
class ModelEndpoint:
    """An OpenAI-compatible endpoint and how the Gym model server in front of it talks to it."""

    base_urls: list[str]  # each ending in /v1
    model: str
    api_key: str = "EMPTY"
    server: ModelServerKind = "fast_vllm_model"
    return_token_ids: bool = False  # (fast_)vllm_model only: per-turn token ids and logprobs (training)
    extra: dict[str, Any] = field(default_factory=dict)  # more keys for the model server's config


def model_server_spec(name: str, endpoint: ModelEndpoint) -> ServerSpec:
    if endpoint.server in ("vllm_model", "fast_vllm_model"):
        config = {
            "base_url": endpoint.base_urls,
            "api_key": endpoint.api_key,
            "model": endpoint.model,
            "return_token_id_information": endpoint.return_token_ids,
            "uses_reasoning_parser": False,
        }
    else:
        if len(endpoint.base_urls) != 1 or endpoint.return_token_ids:
            raise ValueError(f"{name}: openai_model takes exactly one base URL and returns no token ids")
        config = {
            "openai_base_url": endpoint.base_urls[0],
            "openai_api_key": endpoint.api_key,
            "openai_model": endpoint.model,
        }
    return ServerSpec(
        name, "responses_api_models", endpoint.server, _MODEL_SERVER_CLASSES[endpoint.server], config | endpoint.extra
    )


def tau2_stack_classes(policy_server: ModelServerKind, user_server: ModelServerKind) -> list[str]:
    """The server classes of :func:`tau2_stack` (known before the endpoints are: a fork server can warm up)."""
    return sorted(
        {RESOURCES_SERVER_CLASS, AGENT_CLASS}
        | {_MODEL_SERVER_CLASSES[policy_server], _MODEL_SERVER_CLASSES[user_server]}
    )


def tau2_stack(
    policy: ModelEndpoint,
    user: ModelEndpoint,
    domains: list[str],
    agent_config: dict[str, Any] | None = None,
    resources_config: dict[str, Any] | None = None,
) -> list[ServerSpec]:
    """Specs for the resources server, the agent and the two model servers, wired by name."""
    ref = {"type": "responses_api_models"}
    agent = {
        "resources_server": {"type": "resources_servers", "name": RESOURCES_SERVER},
        "model_server": ref | {"name": POLICY_MODEL},
        "user_model_server": ref | {"name": USER_MODEL},
        "domains": domains,
        **(agent_config or {}),
    }
    return [
        resources_server_spec(domains, resources_config),
        ServerSpec(AGENT, "responses_api_agents", "tau2_agent", AGENT_CLASS, agent),
        model_server_spec(POLICY_MODEL, policy),
        model_server_spec(USER_MODEL, user),
    ]


def resources_server_spec(domains: list[str], resources_config: dict[str, Any] | None = None) -> ServerSpec:
    """The tau2 resources server's spec (alone: what re-scoring stored episodes needs)."""
    config = {"domain": "agent", "domains": domains, **(resources_config or {})}
    return ServerSpec(RESOURCES_SERVER, "resources_servers", "tau2", RESOURCES_SERVER_CLASS, config)


@dataclass
class ServerGroup:
    """Servers placed together on one node (one placement-group bundle); ``role`` names their placement group."""

    role: Literal["resources", "agent"]
    specs: list[ServerSpec]


def tau2_replicas(specs: list[ServerSpec], agent_replicas: int, resources_replicas: int) -> list[ServerGroup]:
    """:func:`tau2_stack`'s servers as ``resources_replicas`` resources servers and ``agent_replicas`` agents.

    Each agent replica comes with its own policy and user model servers on its node (they cost about as much CPU
    per turn as the agent) and knows every resources replica, until placement narrows that to its own failure domain's
    (:func:`tau2_local_resources`); it keeps each episode on one of them (the session's database lives there).
    Replica 0 of each keeps the instance's own name."""
    by_name = {spec.name: spec for spec in specs}
    resources = [replica_name(RESOURCES_SERVER, i) for i in range(resources_replicas)]
    groups = [
        ServerGroup("resources", [dataclasses.replace(by_name[RESOURCES_SERVER], name=name)]) for name in resources
    ]
    for i in range(agent_replicas):
        agent = by_name[AGENT]
        config = copy.deepcopy(agent.config)
        config["model_server"]["name"] = replica_name(POLICY_MODEL, i)
        config["user_model_server"]["name"] = replica_name(USER_MODEL, i)
        config["resources_server_replicas"] = [{"type": "resources_servers", "name": name} for name in resources[1:]]
        models = [
            dataclasses.replace(by_name[name], name=replica_name(name, i)) for name in (POLICY_MODEL, USER_MODEL)
        ]
        groups.append(ServerGroup("agent", [dataclasses.replace(agent, name=replica_name(AGENT, i), config=config)]))
        groups[-1].specs.extend(models)
    return groups


def tau2_local_resources(groups: list[ServerGroup], domain_of: dict[str, str]) -> dict[str, list[str]]:
    """Point each agent at the resources replicas of its own failure domain (``domain_of``: server name -> domain,
    its node unless configured), so that losing a domain fails only the episodes it held; an agent whose domain has
    no resources replica keeps them all. Returns agent name -> the resources replicas it uses."""
    resources = [spec.name for group in groups if group.role == "resources" for spec in group.specs]
    uses = {}
    for group in groups:
        for spec in group.specs:
            if spec.server_type != "responses_api_agents":
                continue
            local = [name for name in resources if domain_of[name] == domain_of[spec.name]] or resources
            spec.config["resources_server"] = {"type": "resources_servers", "name": local[0]}
            spec.config["resources_server_replicas"] = [
                {"type": "resources_servers", "name": name} for name in local[1:]
            ]
            uses[spec.name] = local
    return uses
