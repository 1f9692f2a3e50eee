import pytest

from nemo_tau2.gym.launch import GymServers, ServerSpec

RESOURCES_SERVER = "tau2_resources_server"


def resources_server_spec(**config) -> ServerSpec:
    return ServerSpec(
        name=RESOURCES_SERVER,
        server_type="resources_servers",
        impl="tau2",
        server_class="nemo_tau2.gym.resources_server.app:Tau2ResourcesServer",
        config={"domain": "agent", **config},
    )


@pytest.fixture(scope="session")
def resources_server_url():
    """One real resources server process on 127.0.0.1 for the whole test session."""
    with GymServers([resources_server_spec()]) as servers:
        yield servers.url(RESOURCES_SERVER)
