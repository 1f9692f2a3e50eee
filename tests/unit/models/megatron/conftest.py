"""The Megatron scenarios run in two spawns shared by this folder's tests: one process (conversion, training against
the torch Policy) and two processes (TP=2 conversion; DP=2, TP=2, PP=2 training). Each spawn imports torch,
transformers and megatron-core once for all its scenarios (see ``scenario_bodies._in_sequence``)."""

import pytest

from tests.unit.models.megatron.scenarios import run_spawned


@pytest.fixture(scope="session")
def one_process(tmp_path_factory) -> dict:
    return run_spawned("one_process", world_size=1, tmp=tmp_path_factory.mktemp("one_process"))


@pytest.fixture(scope="session")
def two_processes(tmp_path_factory) -> dict:
    return run_spawned("two_processes", world_size=2, tmp=tmp_path_factory.mktemp("two_processes"))
