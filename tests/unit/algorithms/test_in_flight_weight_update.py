"""An in-flight weight update reaching a running tau2 episode (async GRPO's ``in_flight_weight_updates``), end to end:
the hf engine serves a tiny policy to real Gym servers (tau2's mock domain, the scripted fake as user); new weights
load while the episode runs. The turns before the load report weight version 0 and carry the old weights'
logprobs, the turns after it report the new label and carry the new weights' logprobs, and the training sequence
built from the episode hands each turn's own generator logprobs to the loss."""

import copy
import threading
import time

import torch

from nemo_tau2.algorithms.grpo_config import GRPODataConfig
from nemo_tau2.algorithms.training_setup import train_and_val_rows
from nemo_tau2.experience.message_log import turn_weight_versions
from nemo_tau2.experience.rollouts import SamplingParams, run_nemo_gym_rollout_sync
from nemo_tau2.generation import GenerationConfig
from nemo_tau2.generation.launch import start_generation
from nemo_tau2.generation.tiny_model import TinyModel, build_tiny_model, teach_reply
from nemo_tau2.gym.environment import Tau2Environment, Tau2EnvironmentSpec
from nemo_tau2.gym.episode_config import NemoGymEnvConfig
from nemo_tau2.models.policy.data import sequence_from_message_log
from tests.forward_logprobs import forward_logprobs

NEW_VERSION = 7  # a trainer step's label, not a count of loads


def _talking_policy(seed: int) -> TinyModel:
    """A tiny model taught to answer with text (an untrained one writes only newlines, an empty turn that ends the
    episode); two seeds give two different sets of weights."""
    tiny = build_tiny_model(seed=seed)
    teach_reply(tiny, [{"role": "user", "content": "Hi! I need help."}], "I can help with that.", steps=80)
    return tiny


def test_turns_after_an_in_flight_update_report_its_label_and_carry_the_new_weights_logprobs():
    old, new = _talking_policy(seed=1), _talking_policy(seed=2)
    hf_cfg = {"max_model_len": 8192}  # tau2's prompt is longer than the tiny model's 1024 positions (RoPE copes)
    policy_cfg = GenerationConfig(backend="hf", model_name="tiny", temperature=1.0, top_p=1.0, hf_cfg=hf_cfg)
    user = GenerationConfig(backend="fake", fake_cfg={"latency_ms": 400}, temperature=0.0, top_p=1.0)
    rows, _ = train_and_val_rows(
        GRPODataConfig(
            domains=["mock"], train_split="base", val_split=None, task_ids=["update_task_1"], compact_rows=True
        )
    )
    sampling = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=12)
    with start_generation(policy_cfg, model=copy.deepcopy(old.model), tokenizer=old.tokenizer) as policy:
        spec = Tau2EnvironmentSpec(
            policy=policy, user=user, domains=["mock"], gym=NemoGymEnvConfig(return_token_ids=True, max_turns=8)
        )
        with Tau2Environment(spec) as env:
            results = []
            episode = threading.Thread(
                target=lambda: results.extend(run_nemo_gym_rollout_sync(rows[:1], env.agent_urls, sampling, 1))
            )
            episode.start()
            # the user speaks first; its second request means the policy's first turn is done, and the user's
            # 400 ms answer leaves the load (milliseconds for this model) well inside the episode
            deadline = time.monotonic() + 120
            while env.user.engine.stats().requests_by_route["chat"] < 2:
                assert episode.is_alive() and time.monotonic() < deadline, results
                time.sleep(0.01)
            assert policy.update_weights(new.model.state_dict(), weight_version=NEW_VERSION) == NEW_VERSION
            episode.join(timeout=300)
    (result,) = results
    assert result.ok, result.error
    versions = turn_weight_versions(result.message_log)
    assert versions[0] == 0 and versions[-1] == NEW_VERSION and versions == sorted(versions), versions

    sequence = sequence_from_message_log(result.message_log, advantage=1.0)
    position, checked = 0, set()
    for message in result.message_log:
        ids = message["token_ids"]
        if message["role"] == "assistant":
            weights = {0: old.model, NEW_VERSION: new.model}[message["weight_version"]]
            context = sequence.token_ids[:position]
            expected = forward_logprobs(weights, context, ids)
            reported = torch.tensor(message["generation_logprobs"])
            assert torch.allclose(reported, expected, atol=1e-4), (message["weight_version"], reported - expected)
            other = forward_logprobs(new.model if weights is old.model else old.model, context, ids)
            assert not torch.allclose(reported, other, atol=1e-2)  # the two weights do differ on these tokens
            # what the loss gets as the generator's logprobs at these positions: this turn's own
            assert sequence.generation_logprobs[position : position + len(ids)] == message["generation_logprobs"]
            checked.add(message["weight_version"])
        position += len(ids)
    assert checked == {0, NEW_VERSION}
