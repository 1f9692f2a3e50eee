"""Token contiguity of a multi-turn episode: every turn's prompt must extend the previous prompt + generation.

Training on a multi-turn rollout concatenates each turn's generation with the tokens between turns; that is only
the sequence the model actually saw if prompt(t) starts with prompt(t - 1) + generation(t - 1), token for token.
A chat template that re-renders history differently (dropped reasoning, a different tool call format, a BPE merge
across a turn boundary) breaks this silently; this check names the turn and the first differing position.
"""

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ContiguityBreak:
    """A turn whose prompt does not start with the previous turn's prompt + generation."""

    turn: int
    position: int  # first index where prompt(turn) differs from prompt(turn - 1) + generation(turn - 1)
    expected: int | None  # the id prompt(turn - 1) + generation(turn - 1) has there
    actual: int | None  # the id prompt(turn) has there (None: the prompt ends before it)
    reason: str

    def __str__(self) -> str:
        return self.reason


def check_contiguity(turns: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[ContiguityBreak]:
    """Report every turn whose prompt does not extend the previous turn's prompt + generation.

    Args:
        turns: per turn, in order, ``(prompt_token_ids, generation_token_ids)``.

    Returns:
        One :class:`ContiguityBreak` per offending turn (empty if the episode is contiguous); ``str()`` of each is
        a sentence naming the turn, the position and the two ids.
    """
    breaks = []
    for turn in range(1, len(turns)):
        previous_prompt, previous_generation = turns[turn - 1]
        expected = list(previous_prompt) + list(previous_generation)
        prompt = turns[turn][0]
        found = _first_difference(expected, prompt)
        if found is None:
            continue
        position, actual = found
        if actual is None:
            reason = (
                f"turn {turn}: prompt has {len(prompt)} tokens, shorter than turn {turn - 1}'s prompt + generation "
                f"({len(expected)} tokens)"
            )
        else:
            reason = (
                f"turn {turn}: prompt differs from turn {turn - 1}'s prompt + generation at position {position} "
                f"(expected id {expected[position]}, got {actual})"
            )
        breaks.append(ContiguityBreak(turn, position, expected[position], actual, reason))
    return breaks


def _first_difference(expected: Sequence[int], prompt: Sequence[int]) -> tuple[int, int | None] | None:
    """The first position where ``prompt`` fails to start with ``expected`` and the id it has there."""
    if list(prompt[: len(expected)]) == expected:
        return None
    for position, token_id in enumerate(expected):
        if position >= len(prompt):
            return position, None
        if prompt[position] != token_id:
            return position, prompt[position]
    raise AssertionError("unreachable: the prefixes differ but no position does")
