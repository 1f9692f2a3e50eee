"""The prefix-correction splice on hand-made token ids (end of turn = 2): the one rule every backend uses."""

import pytest

from nemo_tau2.generation.errors import BadRequestError
from nemo_tau2.generation.prefix import find_token_prefix, splice_prompt
from nemo_tau2.generation.vllm_extension.nemo_tau2_token_splice import SpliceError, recorded_prefix, token_id_list

EOT = frozenset({2})


def test_splice_keeps_recorded_ids_and_appends_what_follows_the_turn():
    # recorded: prompt [10, 11, 2, 12] (one closed turn + generation prompt), generated [30, 31, 2]
    prefix = [10, 11, 2, 12] + [30, 31, 2]
    # re-rendering tokenised the assistant text differently (40, 41) but closes it with 2, then "\n" (5) + user
    rendered = [10, 11, 2, 12, 40, 41, 2, 5, 13, 50, 2, 5, 12]
    assert splice_prompt(prefix, rendered, EOT) == [10, 11, 2, 12, 30, 31, 2, 5, 13, 50, 2, 5, 12]


def test_a_template_that_drops_history_text_still_splices_after_the_same_turn():
    # the generation prompt carried an empty think block (14, 15) that the re-rendered history no longer has
    prefix = [10, 2, 12, 14, 15] + [30, 2]
    rendered = [10, 2, 12, 30, 2, 5, 13, 2, 12, 14, 15]
    assert splice_prompt(prefix, rendered, EOT) == [10, 2, 12, 14, 15, 30, 2, 5, 13, 2, 12, 14, 15]


def test_truncated_generation_gets_the_templates_closing_token():
    prefix = [10, 2, 12] + [30, 31]
    rendered = [10, 2, 12, 40, 2, 5, 13, 2, 12]
    assert splice_prompt(prefix, rendered, EOT) == [10, 2, 12, 30, 31, 2, 5, 13, 2, 12]


def test_no_recorded_ids_leave_the_rendering_as_it_is():
    assert splice_prompt([], [10, 2, 12], EOT) == [10, 2, 12]


def test_splice_fails_clearly_when_turns_were_dropped():
    with pytest.raises(BadRequestError, match="closes only 1"):
        splice_prompt([10, 2, 11, 2, 12, 30, 2], [10, 2, 12], EOT)


def test_the_last_assistant_message_with_ids_is_the_one_used():
    messages = [
        {"role": "assistant", "content": "a", "prompt_token_ids": [1], "generation_token_ids": [2]},
        {"role": "user", "content": "b"},
        {"role": "assistant", "content": "c", "prompt_token_ids": [1, 2, 3], "generation_token_ids": [4]},
        {"role": "user", "content": "d"},
    ]
    assert find_token_prefix(messages) == [1, 2, 3, 4]


def test_nemo_rls_required_prefix_wins_over_message_ids():
    messages = [{"role": "assistant", "content": "c", "prompt_token_ids": [1], "generation_token_ids": [4]}]
    assert find_token_prefix(messages, required_prefix=[7, 8, 2]) == [7, 8, 2]


def test_messages_without_ids_need_no_splice():
    assert find_token_prefix([{"role": "user", "content": "hi"}]) is None


@pytest.mark.parametrize(
    ("messages", "required", "field"),
    [
        ([{"role": "assistant", "prompt_token_ids": [1], "generation_token_ids": ["x"]}], None,
         "messages[0].generation_token_ids"),
        ([{"role": "assistant", "prompt_token_ids": "1 2", "generation_token_ids": [1]}], None,
         "messages[0].prompt_token_ids"),
        ([{"role": "assistant", "prompt_token_ids": [1, True], "generation_token_ids": [1]}], None,
         "messages[0].prompt_token_ids"),
        ([{"role": "assistant", "prompt_token_ids": [1]}], None, "messages[0].generation_token_ids"),
        ([{"role": "assistant", "prompt_token_ids": [1, -3], "generation_token_ids": [1]}], None,
         "messages[0].prompt_token_ids"),
        ([], [1, 2.5], "required_prefix_token_ids"),
        ([], {"ids": [1]}, "required_prefix_token_ids"),
    ],
)  # fmt: skip
def test_anything_but_token_ids_is_refused_naming_the_field(messages, required, field):
    with pytest.raises(SpliceError) as caught:
        recorded_prefix(messages, required)
    assert caught.value.field == field and field in str(caught.value)
    with pytest.raises(BadRequestError, match=field.replace("[", r"\[").replace("]", r"\]")):
        find_token_prefix(messages, required)


def test_ids_past_the_vocabulary_are_refused():
    with pytest.raises(SpliceError, match=r"required_prefix_token_ids\[1\] is 50"):
        token_id_list([3, 50], "required_prefix_token_ids", vocab_size=50)
    assert token_id_list([3, 49], "x", vocab_size=50) == [3, 49]
