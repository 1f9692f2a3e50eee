"""Training sequences from message logs, collation and the token-frame shift, checked on hand-made examples."""

import math

import pytest
import torch

from nemo_tau2.models.policy.data import (
    TrainingSequence,
    chunks,
    collate,
    even_split,
    sequence_from_message_log,
    token_logprobs,
)

MESSAGE_LOG = [
    {"role": "user", "content": "", "token_ids": [10, 11, 12]},
    {"role": "assistant", "content": "", "token_ids": [20, 21], "generation_logprobs": [-0.1, -0.2]},
    {"role": "user", "content": "", "token_ids": [13]},
    {"role": "assistant", "content": "", "token_ids": [22], "generation_logprobs": [-0.3]},
]


def test_message_log_becomes_one_sequence_with_loss_only_on_assistant_tokens():
    seq = sequence_from_message_log(MESSAGE_LOG, advantage=0.5, loss_multiplier=0.0)
    assert seq.token_ids == [10, 11, 12, 20, 21, 13, 22]
    assert seq.token_mask == [0, 0, 0, 1, 1, 0, 1]
    assert seq.generation_logprobs == [0.0, 0.0, 0.0, -0.1, -0.2, 0.0, -0.3]
    assert seq.advantage == 0.5 and seq.loss_multiplier == 0.0
    assert seq.prev_logprobs is None and seq.reference_logprobs is None


def test_overlong_episode_is_an_error_unless_truncation_is_asked_for():
    with pytest.raises(ValueError, match="7 tokens, more than max_total_sequence_length 5"):
        sequence_from_message_log(MESSAGE_LOG, 1.0, max_total_sequence_length=5)
    seq = sequence_from_message_log(MESSAGE_LOG, 1.0, max_total_sequence_length=5, truncate=True)
    assert seq.token_ids == [10, 11, 12, 20, 21]
    assert seq.token_mask == [0, 0, 0, 1, 1]
    assert seq.generation_logprobs == [0.0, 0.0, 0.0, -0.1, -0.2]
    assert sequence_from_message_log(MESSAGE_LOG, 1.0, max_total_sequence_length=7).token_ids[-1] == 22


@pytest.mark.parametrize(
    ("log", "message"),
    [
        ([{"role": "user", "token_ids": [1, 2]}, {"role": "assistant", "token_ids": [3, 4]}], "generation_logprobs"),
        (
            [{"role": "user", "token_ids": [1]}, {"role": "assistant", "token_ids": [3], "generation_logprobs": []}],
            r"message_log\[1\] \(assistant\).*1 token_ids, generation_logprobs 0",
        ),
        ([{"role": "user", "content": "hi"}], r"message_log\[0\] has no token_ids"),
        ([{"role": "assistant", "token_ids": [3, 4], "generation_logprobs": [-1, -1]}], r"token_mask\[0\] must be 0"),
    ],
)
def test_malformed_message_logs_are_errors_that_say_what_is_wrong(log, message):
    with pytest.raises(ValueError, match=message):
        sequence_from_message_log(log, 1.0)


def test_sequence_checks_its_per_token_lists():
    with pytest.raises(ValueError, match="generation_logprobs has 2 entries for 3 tokens"):
        TrainingSequence([1, 2, 3], [0, 1, 1], [0.0, -1.0], advantage=1.0)
    with pytest.raises(ValueError, match="advantage has 2 entries for 3 tokens"):
        TrainingSequence([1, 2, 3], [0, 1, 1], [0.0, -1.0, -1.0], advantage=[1.0, 1.0])
    with pytest.raises(ValueError, match="only 0 and 1"):
        TrainingSequence([1, 2, 3], [0, 2, 1], [0.0, -1.0, -1.0], advantage=1.0)


def test_collate_right_pads_every_tensor_in_the_token_frame():
    first = sequence_from_message_log(MESSAGE_LOG, advantage=0.5)
    second = TrainingSequence([7, 8, 9, 6], [0, 1, 1, 0], [0.0, -1.0, -2.0, 0.0], advantage=-1.0, loss_multiplier=0.0)
    first.prev_logprobs = [0.0, -1, -1, -1, -1, -1, -1]
    second.prev_logprobs = [0.0, -2, -2, -2]
    batch = collate([first, second], pad_token_id=3, pad_to_multiple_of=4)
    assert batch.input_ids.tolist() == [[10, 11, 12, 20, 21, 13, 22, 3], [7, 8, 9, 6, 3, 3, 3, 3]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0, 0, 0]]
    assert batch.token_mask.tolist() == [[0, 0, 0, 1, 1, 0, 1, 0], [0, 1, 1, 0, 0, 0, 0, 0]]
    assert batch.generation_logprobs[1].tolist() == [0.0, -1.0, -2.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert batch.prev_logprobs is not None and batch.prev_logprobs[1].tolist() == [0, -2, -2, -2, 0, 0, 0, 0]
    assert batch.reference_logprobs is None  # absent on every sequence
    assert batch.advantages.tolist() == [0.5, -1.0] and batch.sample_mask.tolist() == [1.0, 0.0]
    assert batch.lengths == [7, 4]


def test_collate_spreads_scalar_advantages_when_another_sequence_has_per_token_ones():
    a = TrainingSequence([1, 2, 3], [0, 1, 1], [0.0, -1.0, -1.0], advantage=[0.0, 0.5, 0.25])
    b = TrainingSequence([4, 5], [0, 1], [0.0, -1.0], advantage=2.0)
    assert collate([a, b], pad_token_id=0).advantages.tolist() == [[0.0, 0.5, 0.25], [2.0, 2.0, 0.0]]


def test_token_logprobs_score_token_t_with_the_logits_of_position_t_minus_1():
    p0, p1 = [0.5, 0.25, 0.25], [0.1, 0.2, 0.7]
    logits = torch.tensor([[p0, p1, [1.0, 1.0, 1.0]]]).log() + 3.0  # any shift: log-softmax removes it
    out = token_logprobs(logits, torch.tensor([[2, 1, 2]]))
    assert out.shape == (1, 3) and out.dtype == torch.float32
    assert out[0, 0].item() == 0.0  # the first token has no context
    assert out[0, 1].item() == pytest.approx(math.log(0.25), abs=1e-6)  # p0[token 1]
    assert out[0, 2].item() == pytest.approx(math.log(0.7), abs=1e-6)  # p1[token 2]


def test_splits_keep_order_and_cover_everything():
    assert chunks(list(range(5)), 2) == [[0, 1], [2, 3], [4]]
    assert even_split(list(range(5)), 2) == [[0, 1, 2], [3, 4]]
    assert even_split(list(range(1)), 3) == [[0], [], []]
