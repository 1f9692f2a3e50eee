"""Rows whose prompt alone fills the policy's context are refused before a training run starts anything.

An episode whose first prompt is already beyond ``policy.max_total_sequence_length`` ends at its first turn with
nothing to train on. One such row among others is the run's to report (its episodes are counted as untrainable); a
run where every row is such a one would start servers and a trainer and then train on nothing, step after step.
banking_knowledge's ``full_kb`` variant is the case in practice: its system prompt is the whole knowledge base (866,655
characters, ~200k tokens), whatever the task. The count is the system prompt's own tokens under the policy's tokenizer,
a lower bound of the prompt (the template, the greeting and the tools add to it), so a row refused here can never fit.
"""

from typing import Any

from nemo_tau2.evals.results import system_prompt
from nemo_tau2.models.policy.building import load_tokenizer
from nemo_tau2.models.policy.config import PolicyConfig
from nemo_tau2.tau2_release.client import KNOWLEDGE_DOMAINS


class PromptsTooLongError(ValueError):
    """No row's prompt fits the policy's context (a config to change: scripts exit 2 with its one line)."""


def check_prompts_fit(policy: PolicyConfig, retrieval_variant: str | None, *row_groups: list[dict]) -> None:
    """For each group of rows (a run's training rows, its validation rows), raise :class:`PromptsTooLongError` (one
    line: the count, the limit, the fix) when none of its system prompts fits in ``policy.max_total_sequence_length``
    tokens; a group passes at its first prompt that fits (one count, for most runs). The tokenizer is loaded once,
    and a prompt the groups share is counted once."""
    groups = [rows for rows in row_groups if rows]
    if not groups:
        return
    limit = policy.max_total_sequence_length
    tokenizer: Any = load_tokenizer(policy)
    counted: dict[str, int] = {}
    for rows in groups:
        counts = []
        for prompt in dict.fromkeys(system_prompt(row) or "" for row in rows):
            if prompt not in counted:
                counted[prompt] = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
            if counted[prompt] < limit:
                break
            counts.append(counted[prompt])
        else:
            raise PromptsTooLongError(_refusal(policy, rows, retrieval_variant, min(counts)))


def _refusal(policy: PolicyConfig, rows: list[dict], retrieval_variant: str | None, shortest: int) -> str:
    knowledge = any(str(row.get("domain")) in KNOWLEDGE_DOMAINS for row in rows)
    because = ""
    if knowledge and retrieval_variant is not None:
        because = f" with tau2.retrieval_variant {retrieval_variant}"
        if retrieval_variant == "full_kb":
            because += " (the whole knowledge base in the system prompt)"
    fix = "use a retrieval variant that searches (bm25_grep) or " if knowledge else ""
    limit = policy.max_total_sequence_length
    return (
        f"every row's system prompt alone is beyond policy.max_total_sequence_length {limit}{because}: "
        f"{shortest:,} tokens at the shortest with {policy.tokenizer_name}: nothing could be trained on; "
        f"{fix}raise policy.max_total_sequence_length for a model with that context"
    )
