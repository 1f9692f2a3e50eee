"""Request bodies for the tau2 resources server, for clients other than the agent (scripts, tests, benchmarks)."""

from typing import Any


def assistant_message_item(text: str, item_id: str = "msg") -> dict[str, Any]:
    """A Responses API output item: one assistant text message."""
    return {
        "type": "message",
        "role": "assistant",
        "id": item_id,
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def verify_body(
    assistant_texts: list[str], termination_reason: str = "user_stop", input_items: list[dict] | None = None
) -> dict[str, Any]:
    """A ``/verify`` request whose transcript holds ``assistant_texts`` (what tau2's COMMUNICATE check reads)."""
    output = [assistant_message_item(text, f"msg_{i}") for i, text in enumerate(assistant_texts)]
    return {
        "responses_create_params": {"input": input_items or []},
        "response": {
            "id": "resp",
            "created_at": 0,
            "model": "",
            "object": "response",
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
        },
        "termination_reason": termination_reason,
    }
