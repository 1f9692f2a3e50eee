"""A fixture for test folders that run tiny torch models in this process (import it into their conftest)."""

import pytest
import torch


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread():
    # On 2 shared cores, one intra-op thread runs tiny models several times faster than two contended ones.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
