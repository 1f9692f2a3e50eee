"""Task curriculum: weights from success rates, seeded weighted sampling, JSON state round trip."""

import json

import pytest
from pydantic import ValidationError

from nemo_tau2.algorithms.curriculum import CurriculumConfig, TaskCurriculum

KEYS = ["solved", "unsolved", "middle", "young", "at_high", "at_low"]


def tracked(cfg: CurriculumConfig | None = None, seed: int = 0) -> TaskCurriculum:
    curriculum = TaskCurriculum(KEYS, cfg or CurriculumConfig(), seed)
    curriculum.record("solved", [True, True, True, True, False])  # 0.8 > 0.75 after 5 attempts -> 0.1
    curriculum.record("unsolved", [True, False, False, False, False])  # 0.2 < 0.25 -> 0.5
    curriculum.record("middle", [True, True, True, False, False])  # 0.6 -> 1.0
    curriculum.record("young", [True] * 4)  # 4 < min_attempts -> 1.0
    curriculum.record("at_high", [True] * 6 + [False] * 2)  # exactly 0.75 -> 1.0
    curriculum.record("at_low", [True] * 2 + [False] * 6)  # exactly 0.25 -> 1.0
    return curriculum


def test_weights_follow_success_rates_after_min_attempts():
    curriculum = tracked()
    assert curriculum.weights().tolist() == [0.1, 0.5, 1.0, 1.0, 1.0, 1.0]
    assert curriculum.success_rate("solved") == pytest.approx(0.8)
    assert curriculum.metrics() == {
        "train/curriculum/num_tasks_seen": 5,
        "train/curriculum/num_tasks_solved": 1,
        "train/curriculum/num_tasks_unsolved": 1,
    }


def test_counts_accumulate_across_steps():
    curriculum = TaskCurriculum(["t"], CurriculumConfig(), seed=0)
    curriculum.record("t", [True, True, True])
    assert curriculum.weights().tolist() == [1.0]
    curriculum.record("t", [True, True])  # 5/5
    assert curriculum.weights().tolist() == [0.1]
    assert TaskCurriculum(["t"], CurriculumConfig(), seed=0).success_rate("t") is None


def test_disabled_curriculum_samples_uniformly():
    assert tracked(CurriculumConfig(enabled=False)).weights().tolist() == [1.0] * 6


def test_sampling_frequencies_follow_weights():
    curriculum = TaskCurriculum(["solved", "normal"], CurriculumConfig(), seed=1)
    curriculum.record("solved", [True] * 5)
    draws = curriculum.sample(20_000, replace=True)
    assert draws.count(1) / len(draws) == pytest.approx(1 / 1.1, abs=0.01)  # P(normal) = 1 / (1 + 0.1)


def test_sampling_without_replacement_is_distinct_and_bounded():
    curriculum = tracked()
    assert sorted(curriculum.sample(6)) == list(range(6))
    with pytest.raises(ValueError, match="cannot draw 7 distinct tasks from 6"):
        curriculum.sample(7)


def test_sampling_is_deterministic_for_a_seed():
    assert tracked(seed=3).sample(4) == tracked(seed=3).sample(4)
    assert [tracked(seed=s).sample(6) for s in range(5)] != [tracked(seed=3).sample(6)] * 5


def test_state_round_trips_through_json_and_resumes_the_same_draws():
    original = tracked(seed=5)
    original.sample(3)
    state = json.loads(json.dumps(original.state_dict()))
    expected = [original.sample(2) for _ in range(5)]

    resumed = TaskCurriculum(KEYS, CurriculumConfig(), seed=999)
    resumed.load_state_dict(state)
    assert resumed.weights().tolist() == [0.1, 0.5, 1.0, 1.0, 1.0, 1.0]
    assert [resumed.sample(2) for _ in range(5)] == expected


def test_state_for_other_tasks_is_rejected():
    state = tracked().state_dict()
    with pytest.raises(ValueError, match="different task set"):
        TaskCurriculum(["a", "b"], CurriculumConfig(), seed=0).load_state_dict(state)


def test_bad_records_and_config():
    curriculum = tracked()
    with pytest.raises(TypeError, match="must be bools"):
        curriculum.record("middle", [1.0, 0.0])
    with pytest.raises(KeyError, match="unknown task 'nope'"):
        curriculum.record("nope", [True])
    with pytest.raises(ValueError, match="unique"):
        TaskCurriculum(["a", "a"], CurriculumConfig(), seed=0)
    with pytest.raises(ValidationError, match="low_success_rate"):
        CurriculumConfig(low_success_rate=0.9, high_success_rate=0.5)
    with pytest.raises(ValidationError, match="high_weight"):
        CurriculumConfig(high_weight=0.0)
