"""NeMo-RL's message log from an episode's transcript: what training reads of a policy's turns (token ids, logprobs,
the weight version that sampled each)."""


def message_log_from_output(output: list[dict], first_break_turn: int | None) -> list[dict]:
    """NeMo-RL's message log from a transcript's policy turns (items carrying ``generation_token_ids``); each
    assistant message keeps the ``weight_version`` that sampled it when the server reported one.

    Stops at ``first_break_turn``, the first turn whose prompt does not extend what came before (the agent found it:
    :class:`TokenContiguity`), since from there token ids would no longer be the sequence the model saw.
    """
    turns = [item for item in output if item.get("generation_token_ids")]
    log, seen = [], 0
    for item in turns[:first_break_turn]:
        prompt, generated = item["prompt_token_ids"], item["generation_token_ids"]
        log.append({"role": "user", "content": "", "token_ids": list(prompt[seen:])})
        assistant = {
            "role": "assistant",
            "content": "",
            "token_ids": list(generated),
            "generation_logprobs": list(item.get("generation_log_probs") or []),
        }
        if item.get("weight_version") is not None:  # which weights sampled this turn (async GRPO's staleness)
            assistant["weight_version"] = item["weight_version"]
        log.append(assistant)
        seen = len(prompt) + len(generated)
    return log


def turn_weight_versions(message_log: list[dict]) -> list[int]:
    """The weight version of each policy turn of a message log, in order (turns whose server did not say are left
    out): an episode that ran through an in-flight weight update shows two or more."""
    return [message["weight_version"] for message in message_log if "weight_version" in message]
