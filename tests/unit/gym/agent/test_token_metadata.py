"""History the agent replays is valid under NeMo-Gym's token-metadata rule (0.7.0 validates it on every item: an
item with ``routed_experts`` must carry the three token fields): stripped turns lose ``routed_experts`` with them."""

from nemo_gym.openai_utils import NeMoGymResponseCreateParamsNonStreaming

from nemo_tau2.gym.agent.turns import read_turn, with_last_token_ids_only, without_token_ids

TOKENS = {"prompt_token_ids": [1, 2], "generation_token_ids": [3], "generation_log_probs": [-0.1]}


def _policy_turn(call_id: str) -> list[dict]:
    """One policy turn as vllm_model answers it: the token fields and ``routed_experts: null`` on its last item."""
    call = {"type": "function_call", "call_id": call_id, "name": "f", "arguments": "{}", "id": call_id}
    return [call | {"status": "completed"} | TOKENS | {"routed_experts": None}]


def test_a_stripped_item_loses_routed_experts_with_the_token_fields():
    (item,) = _policy_turn("c1")
    assert without_token_ids(item) == {
        "type": "function_call",
        "call_id": "c1",
        "name": "f",
        "arguments": "{}",
        "id": "c1",
        "status": "completed",
    }


def test_the_replayed_history_of_a_multi_turn_episode_validates():
    history = [{"role": "user", "content": "Hi"}]
    for turn in range(3):
        history += _policy_turn(f"c{turn}")
        history.append({"type": "function_call_output", "call_id": f"c{turn}", "output": "{}"})
    replayed = with_last_token_ids_only(history)
    assert [("routed_experts" in item, "prompt_token_ids" in item) for item in replayed if "call_id" in item] == [
        (False, False),
        (False, False),
        (False, False),
        (False, False),
        (True, True),
        (False, False),
    ]
    NeMoGymResponseCreateParamsNonStreaming.model_validate({"input": replayed})  # 0.7.0: 422 before the fix


def test_calls_written_as_text_keep_the_whole_token_metadata_on_the_new_last_item():
    message = {"type": "message", "role": "assistant", "content": '<tool_call>{"name": "f", "arguments": {}}'}
    turn = read_turn({"output": [message | TOKENS | {"routed_experts": "nrlre1:blob"}]}, lenient=True)
    assert {key: turn.items[-1].get(key) for key in (*TOKENS, "routed_experts")} == TOKENS | {
        "routed_experts": "nrlre1:blob"
    }
    assert all("routed_experts" not in item for item in turn.items[:-1])
