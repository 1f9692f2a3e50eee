"""The prefix-correction splice on hand-made token ids (end of turn = 2)."""

import pytest

from nemo_tau2.generation.errors import BadRequestError
from nemo_tau2.generation.prefix import TokenPrefix, find_token_prefix, splice_prompt

EOT = frozenset({2})


def test_splice_keeps_recorded_ids_and_appends_what_follows_the_turn():
    # recorded: prompt [10, 11, 2, 12] (one closed turn + generation prompt), generated [30, 31, 2]
    prefix = TokenPrefix(prompt_token_ids=[10, 11, 2, 12], generation_token_ids=[30, 31, 2])
    # re-rendering tokenised the assistant text differently (40, 41) but closes it with 2, then "\n" (5) + user
    rendered = [10, 11, 2, 12, 40, 41, 2, 5, 13, 50, 2, 5, 12]
    assert splice_prompt(prefix, rendered, EOT) == [10, 11, 2, 12, 30, 31, 2, 5, 13, 50, 2, 5, 12]


def test_truncated_generation_gets_the_templates_closing_token():
    prefix = TokenPrefix(prompt_token_ids=[10, 2, 12], generation_token_ids=[30, 31])
    rendered = [10, 2, 12, 40, 2, 5, 13, 2, 12]
    assert splice_prompt(prefix, rendered, EOT) == [10, 2, 12, 30, 31, 2, 5, 13, 2, 12]


def test_splice_fails_clearly_when_turns_were_dropped():
    prefix = TokenPrefix(prompt_token_ids=[10, 2, 11, 2, 12], generation_token_ids=[30, 2])
    with pytest.raises(BadRequestError, match="closes only 1 turns"):
        splice_prompt(prefix, [10, 2, 12], EOT)


def test_the_last_assistant_message_with_ids_is_the_one_used():
    messages = [
        {"role": "assistant", "content": "a", "prompt_token_ids": [1], "generation_token_ids": [2]},
        {"role": "user", "content": "b"},
        {"role": "assistant", "content": "c", "prompt_token_ids": [1, 2, 3], "generation_token_ids": [4]},
        {"role": "user", "content": "d"},
    ]
    assert find_token_prefix(messages) == TokenPrefix([1, 2, 3], [4])


def test_messages_without_ids_need_no_splice():
    assert find_token_prefix([{"role": "user", "content": "hi"}]) is None


def test_non_integer_ids_are_a_bad_request():
    with pytest.raises(BadRequestError, match=r"messages\[0\].generation_token_ids"):
        find_token_prefix([{"role": "assistant", "prompt_token_ids": [1], "generation_token_ids": ["x"]}])
