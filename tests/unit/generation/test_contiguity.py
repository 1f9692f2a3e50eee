"""check_contiguity: each turn's prompt must extend the previous prompt + generation."""

from nemo_tau2.generation.contiguity import check_contiguity


def test_contiguous_turns_report_nothing():
    turns = [([1, 2], [3]), ([1, 2, 3, 9], [4, 5]), ([1, 2, 3, 9, 4, 5, 7], [8])]
    assert check_contiguity(turns) == []


def test_single_turn_and_empty_episode_are_contiguous():
    assert check_contiguity([]) == []
    assert check_contiguity([([1], [2])]) == []


def test_changed_token_is_reported_with_turn_and_position():
    turns = [([1, 2], [3]), ([1, 2, 30, 9], [4]), ([1, 2, 30, 9, 4], [5])]
    (problem,) = check_contiguity(turns)
    assert (problem.turn, problem.position, problem.expected, problem.actual) == (1, 2, 3, 30)
    expected = "turn 1: prompt differs from turn 0's prompt + generation at position 2 (expected id 3, got 30)"
    assert str(problem) == expected


def test_short_prompt_is_reported():
    (problem,) = check_contiguity([([1, 2], [3, 4]), ([1, 2, 3], [5])])
    assert problem.actual is None and problem.position == 3
    assert "shorter than turn 0's prompt + generation (4 tokens)" in problem.reason


def test_every_offending_turn_is_reported():
    turns = [([1], [2]), ([9], [3]), ([9, 3], [4]), ([0], [5])]
    assert [problem.turn for problem in check_contiguity(turns)] == [1, 3]
