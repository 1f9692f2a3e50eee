"""``Tau2Env.fork`` on tau2 v0.2.1 (in process): forks at the policy's turn continue the conversation with the user
simulator, each with a database of its own."""

from nemo_tau2.env_api import Tau2Env
from tests.unit.env_api.conftest import play_forked


def test_forks_continue_the_episode_each_with_its_own_database(fake):
    env = fake.env("airline", cls=Tau2Env, task_ids=["7"])  # its oracle's later turns write (two cancellations)
    try:
        (parent, first, second), (parent_saw, first_saw, _) = play_forked(env, 0)
    finally:
        env.close()
    assert (parent["reward"], first["reward"], second["reward"]) == (1.0, 1.0, 0.0)
    assert first_saw == parent_saw and parent_saw  # the same answers: neither saw the other's writes
    assert second["db_match"] is False  # the writes of its parent and sibling after the fork are not in its DB
    assert first["num_turns"] == parent["num_turns"] > second["num_turns"]
