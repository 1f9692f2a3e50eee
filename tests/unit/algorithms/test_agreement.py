"""Trainer/generator agreement counts only the turns the trainer's current weights sampled: async GRPO's older turns
differ by their staleness, which would hide (or fake) a broken weight sync."""

import math

from nemo_tau2.algorithms.agreement import generation_agreement
from nemo_tau2.models.policy.data import sequence_from_message_log


def _episode(turns: list[tuple[int | None, float]], generated: float = -1.0):
    """An episode whose turn k was sampled by ``turns[k][0]`` and is scored ``turns[k][1]`` by the trainer."""
    log = []
    for version, _ in turns:
        log.append({"role": "user", "token_ids": [1, 2]})
        turn = {"role": "assistant", "token_ids": [3, 4], "generation_logprobs": [generated, generated]}
        if version is not None:
            turn["weight_version"] = version
        log.append(turn)
    sequence = sequence_from_message_log(log, advantage=1.0)
    trained = iter([score for _, score in turns for _ in range(2)])
    sequence.prev_logprobs = [next(trained) if m else 0.0 for m in sequence.token_mask]
    return sequence


def test_only_turns_sampled_by_the_current_weights_are_compared():
    fresh = _episode([(3, -1.001), (3, -1.001)])
    spanning = _episode([(2, -2.0), (3, -1.002)])  # its first turn came from the weights before
    stale = _episode([(2, -2.0)])
    unlabelled = _episode([(None, -1.003)])  # a generator that does not say: counted
    assert fresh.generation_weight_versions == [3, 3] and unlabelled.generation_weight_versions == []

    agreement = generation_agreement([fresh, spanning, stale, unlabelled], weight_version=3)
    assert agreement["num_stale_turns"] == 2 and agreement["num_tokens"] == 8
    assert math.isclose(agreement["max_abs_logprob_diff"], 0.003, abs_tol=1e-9)

    everything = generation_agreement([fresh, spanning, stale, unlabelled])  # no version: every token
    assert everything["num_tokens"] == 12 and math.isclose(everything["max_abs_logprob_diff"], 1.0)
    assert "num_stale_turns" not in everything
    assert generation_agreement([stale], weight_version=3) == {"num_stale_turns": 1.0}
