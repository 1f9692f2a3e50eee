"""Supervised fine-tuning rows: multi-turn episodes as the policy's own token ids, with the assistant turns marked.

One row (one JSON line of ``prepare_sft_data.py``'s output) is one episode::

    {"domain", "task_id", "sample_index", "reward", "source",
     "message_log": [{"role": "user", "token_ids": [...]}, {"role": "assistant", "token_ids": [...]}, ...],
     "trajectory_hash"}

``message_log`` is NeMo-RL's (see ``experience.rollouts``): per policy turn, the new prompt tokens (system, user,
tool) as a ``user`` message and the generated tokens as an ``assistant`` message; only assistant tokens carry loss.

Two sources, one row format:

- **Rollouts** (``rollouts.jsonl`` of ``run_eval.py``, or a :class:`RolloutResult` in RFT): the ids are the ones
  the generator saw and produced, taken as they are (no re-tokenization: slime re-tokenizes text, which can train
  on ids the model never generated).
- **OpenAI conversations** (``{"messages": [...], "tools": [...]}``, e.g. a stronger model's episodes): rendered
  with the policy's chat template the way the generation backend renders a prompt, each assistant turn tokenized
  as the model would generate it (its text, then end of turn). The rendering must reproduce the training format:
  every turn's prompt must extend the previous prompt and generation token for token, else the conversation is
  refused with the turn and position where the template breaks it.

Selection (:func:`select_rows`): minimum reward (1.0 = rejection sampling), a cap per task, dedup of identical
trajectories, domains, and a refusal of tau2 ``test``-split tasks unless allowed, so the test set cannot leak into
training by accident.
"""

import hashlib
import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nemo_tau2.experience.message_log import message_log_from_output
from nemo_tau2.experience.rollouts import OK, RolloutResult
from nemo_tau2.generation.contiguity import check_contiguity
from nemo_tau2.tau2_env import domains
from nemo_tau2.tau2_release.config import Tau2ReleaseConfig

if TYPE_CHECKING:  # the trainer (torch, Ray) is not loaded to convert data
    from nemo_tau2.models.policy.data import TrainingSequence

TEST_SPLIT = "test"


class SFTDataError(ValueError):
    """Input that cannot become SFT rows; the message names the record and the fix."""


def trajectory_hash(message_log: Sequence[dict[str, Any]]) -> str:
    """Identical token ids in identical roles give the same hash (dedup of identical trajectories)."""
    digest = hashlib.sha256()
    for message in message_log:
        digest.update(message["role"].encode() + b":" + json.dumps(message["token_ids"]).encode() + b"\n")
    return digest.hexdigest()


def sft_row(
    domain: str,
    task_id: str,
    message_log: Sequence[dict[str, Any]],
    *,
    reward: float | None,
    sample_index: int | None,
    source: str,
    tau2_version: str = "v0.2.1",
) -> dict[str, Any]:
    """One SFT row; ``message_log`` keeps only roles and token ids (logprobs are sampling data, not SFT data);
    ``tau2_version``: the tau2 release whose task the episode played."""
    log = [{"role": m["role"], "token_ids": [int(t) for t in m["token_ids"]]} for m in message_log]
    if not any(m["role"] == "assistant" and m["token_ids"] for m in log):
        raise SFTDataError(f"{domain}/{task_id}: the episode has no assistant tokens to train on")
    return {
        "domain": str(domain),
        "task_id": str(task_id),
        "sample_index": sample_index,
        "reward": reward,
        "source": source,
        "tau2_version": tau2_version,
        "message_log": log,
        "trajectory_hash": trajectory_hash(log),
    }


def row_from_result(result: RolloutResult) -> dict[str, Any] | None:
    """The SFT row of one rollout (RFT), or None if it has no trainable tokens or broke token contiguity."""
    if not result.ok or not result.message_log or result.token_contiguity_breaks:
        return None
    return sft_row(
        result.domain,
        result.task_id,
        result.message_log,
        reward=result.reward,
        sample_index=result.sample_index,
        source="rollout",
        tau2_version=result.tau2_version or "v0.2.1",
    )


@dataclass
class ConversionReport:
    """What happened to each input record (printed by the converter, returned for tests)."""

    read: int = 0
    skipped: Counter = field(default_factory=Counter)

    def skip(self, reason: str) -> None:
        self.skipped[reason] += 1


def rows_from_rollout_records(records: Iterable[dict[str, Any]], report: ConversionReport) -> list[dict[str, Any]]:
    """SFT rows from ``rollouts.jsonl`` records (as :class:`~nemo_tau2.evals.results.RolloutLog` reads them).

    The token ids come from each record's transcript (``prompt_token_ids`` / ``generation_token_ids`` of every
    policy turn), rebuilt into the message log by the same function the rollout used.
    """
    rows = []
    for record in records:
        report.read += 1
        where = f"{record.get('domain')}/{record.get('task_id')} sample {record.get('sample_index')}"
        if record.get("status") != OK:
            report.skip("infrastructure error (not an episode)")
            continue
        transcript = record.get("transcript")
        if transcript is None:
            raise SFTDataError(
                f"rollout {where} has no transcript: rerun the evaluation with eval.keep_transcripts=true"
            )
        if record.get("token_contiguity_breaks"):  # the agent checked every turn's ids against the one before
            report.skip("token contiguity broken (ids would not be what the model saw)")
            continue
        log = message_log_from_output(transcript, first_break_turn=None)
        if not log:
            raise SFTDataError(
                f"rollout {where} has no token ids in its transcript: run with env.nemo_gym.return_token_ids=true"
            )
        rows.append(
            sft_row(
                record["domain"],
                record["task_id"],
                log,
                reward=record.get("reward"),
                sample_index=record.get("sample_index"),
                source="rollout",
                tau2_version=record.get("tau2_version") or "v0.2.1",
            )  # fmt: skip
        )
    return rows


# ---------------------------------------------------------------------------------------- OpenAI conversations


def _render(tokenizer: Any, messages: list[dict], tools: list[dict] | None, add_generation_prompt: bool) -> str:
    from nemo_tau2.generation.protocol import normalize_messages, normalize_tools

    return tokenizer.apply_chat_template(
        normalize_messages(messages), tools=normalize_tools(tools), add_generation_prompt=add_generation_prompt,
        tokenize=False,
    )  # fmt: skip


def message_log_from_conversation(messages: list[dict], tools: list[dict] | None, tokenizer: Any) -> list[dict]:
    """NeMo-RL's message log of an OpenAI conversation, tokenized as the generation backend would see and produce it.

    Assistant messages with ``"weight": 0`` (OpenAI's fine-tuning format) are prompt, not trained on (e.g. a
    scripted greeting). For every other assistant message i: prompt = the template's rendering of the messages
    before it with the generation prompt (what the hf backend renders), generation = the text the template puts
    between that prompt and the end of turn, tokenized, then the end-of-turn token (what a model emits).

    Raises :class:`SFTDataError` when the template does not reproduce that format: the rendering with message i is
    not the prompt followed by the reply, or a later prompt does not extend the earlier prompt + generation token
    for token (e.g. a template that drops earlier reasoning, or a tokenizer that merges across the turn boundary).
    """
    eos_text, eos_id = tokenizer.eos_token, tokenizer.eos_token_id
    if eos_text is None or eos_id is None:
        raise SFTDataError("the tokenizer has no eos token: cannot tell where a generated turn ends")
    turns: list[tuple[list[int], list[int]]] = []
    for index, message in enumerate(messages):
        if message.get("role") != "assistant" or message.get("weight", 1) == 0:
            continue
        prompt_text = _render(tokenizer, messages[:index], tools, add_generation_prompt=True)
        full_text = _render(tokenizer, messages[: index + 1], tools, add_generation_prompt=False)
        if not full_text.startswith(prompt_text):
            raise SFTDataError(
                f"messages[{index}]: the chat template does not render the conversation up to this assistant turn "
                "as its prompt followed by the reply; it cannot reproduce the training format"
            )
        reply = full_text[len(prompt_text) :]
        if eos_text not in reply:
            raise SFTDataError(
                f"messages[{index}]: the chat template ends an assistant turn without the tokenizer's eos token "
                f"{eos_text!r}, which ends a generation"
            )
        reply_text = reply[: reply.index(eos_text)]
        prompt_ids = tokenizer(prompt_text, add_special_tokens=False).input_ids
        reply_ids = tokenizer(reply_text, add_special_tokens=False).input_ids + [eos_id]
        turns.append((prompt_ids, reply_ids))
    if not turns:
        raise SFTDataError("the conversation has no assistant message to train on")
    breaks = check_contiguity(turns)
    if breaks:
        raise SFTDataError(f"the chat template does not reproduce the training format: {breaks[0]}")
    log, seen = [], 0
    for prompt_ids, reply_ids in turns:
        log.append({"role": "user", "token_ids": prompt_ids[seen:]})
        log.append({"role": "assistant", "token_ids": reply_ids})
        seen = len(prompt_ids) + len(reply_ids)
    return log


def conversation_from_episode(row: dict[str, Any], output: list[dict[str, Any]]) -> dict[str, Any]:
    """The OpenAI conversation of a Gym episode: the row's input (its assistant messages, e.g. tau2's greeting, are
    prompt: ``weight`` 0) and the agent's transcript (``response.output``), converted as the model server converts a
    policy request; tools in Chat Completions form."""
    from nemo_tau2.gym.model_server.conversion import chat_messages, chat_tools

    params = row["responses_create_params"]
    prompt = [message | {"weight": 0} if message["role"] == "assistant" else message
              for message in chat_messages(list(params["input"]), with_token_ids=False)]  # fmt: skip
    return {
        "domain": str(row["domain"]),
        "task_id": str(row["task_id"]),
        "messages": prompt + chat_messages(list(output), with_token_ids=False),
        "tools": chat_tools(params.get("tools") or []),
    }


def row_from_conversation(record: dict[str, Any], tokenizer: Any) -> dict[str, Any]:
    """An SFT row from ``{"messages", "tools"?, "domain"?, "task_id"?, "reward"?}`` (Chat Completions tools)."""
    messages = record.get("messages")
    if not isinstance(messages, list) or not messages:
        raise SFTDataError(f"a conversation needs a non-empty messages list, got keys {sorted(record)}")
    log = message_log_from_conversation(messages, record.get("tools") or None, tokenizer)
    reward = record.get("reward")
    return sft_row(
        str(record.get("domain", "unknown")), str(record.get("task_id", "unknown")), log,
        reward=None if reward is None else float(reward), sample_index=record.get("sample_index"),
        source="conversation",
    )  # fmt: skip


# ---------------------------------------------------------------------------------------- selection


def test_split_task_ids(domain: str) -> frozenset[str]:
    """The ids of tau2's ``test`` split of a domain (empty if it has none, e.g. mock)."""
    return frozenset(domains.task_splits(domain).get(TEST_SPLIT, ()))


def release_test_split_ids(tau2: Tau2ReleaseConfig, domains_: list[str]) -> dict[str, frozenset[str]]:
    """The release's test split of each domain: v0.2.1's in process, another release's from its worker."""
    if not domains_:
        return {}
    if tau2.version == "v0.2.1":
        return {domain: test_split_task_ids(domain) for domain in domains_}
    from nemo_tau2.tau2_release.rows import release_split_ids

    return release_split_ids(tau2, domains_, TEST_SPLIT)


def select_rows(
    rows: Iterable[dict[str, Any]],
    report: ConversionReport,
    *,
    min_reward: float | None = None,
    max_per_task: int | None = None,
    domain_filter: Sequence[str] | None = None,
    allow_test_split: bool = False,
    dedup: bool = True,
    tau2: Tau2ReleaseConfig | None = None,
) -> list[dict[str, Any]]:
    """Filter rows in order: domain, test-split refusal, minimum reward, identical trajectories, cap per task.
    ``tau2``: the release the rows must be of (v0.2.1 by default), whose test split is refused.

    Raises:
        SFTDataError: A row is a tau2 test-split task and ``allow_test_split`` is False (training on it would make
            the test score meaningless); the message names the task and the flag. Or a row is of another tau2
            release than ``tau2.version``.
    """
    tau2 = tau2 or Tau2ReleaseConfig()
    selected = []
    for row in rows:
        if domain_filter is not None and row["domain"] not in domain_filter:
            report.skip("domain not selected")
        else:
            selected.append(row)
    rows = selected
    for row in rows:
        if row.get("tau2_version", "v0.2.1") != tau2.version:
            raise SFTDataError(
                f"{row['domain']} task {row['task_id']} was played on tau2 {row.get('tau2_version', 'v0.2.1')}, not "
                f"tau2.version {tau2.version}: set tau2.version to the release the episodes played"
            )
    tau2_domains = [] if allow_test_split else sorted({row["domain"] for row in rows} & set(domains.DOMAINS))
    test_ids = release_test_split_ids(tau2, tau2_domains)
    kept: list[dict[str, Any]] = []
    seen: set[str] = set()
    per_task: Counter = Counter()
    for row in rows:
        domain, task_id = row["domain"], row["task_id"]
        if task_id in test_ids.get(domain, ()):
            raise SFTDataError(
                f"{domain} task {task_id} is in tau2 {tau2.version}'s test split: training on it leaks the test set; "
                "pass --allow-test-split if that is what you want"
            )
        if min_reward is not None and (row.get("reward") is None or row["reward"] < min_reward):
            report.skip(f"reward below {min_reward}")
            continue
        if dedup and row["trajectory_hash"] in seen:
            report.skip("identical trajectory already kept")
            continue
        if max_per_task is not None and per_task[(domain, task_id)] >= max_per_task:
            report.skip(f"task already has {max_per_task} rows")
            continue
        seen.add(row["trajectory_hash"])
        per_task[(domain, task_id)] += 1
        kept.append(row)
    return kept


# ---------------------------------------------------------------------------------------- reading for training


def read_sft_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows written by ``prepare_sft_data.py`` (one JSON object per line)."""
    path = Path(path)
    if not path.is_file():
        raise SFTDataError(f"{path}: no such SFT data file; make one with examples/prepare_sft_data.py")
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise SFTDataError(f"{path}:{number}: not JSON ({e.msg}); make it with prepare_sft_data.py") from None
        problem = _row_problem(row)
        if problem:
            raise SFTDataError(f"{path}:{number}: not an SFT row ({problem}); make it with prepare_sft_data.py")
        rows.append(row)
    return rows


def _row_problem(row: Any) -> str | None:
    """What makes ``row`` unusable for training, or None: checked on read so that a hand-edited or foreign file is
    one line naming its line, not a traceback from the trainer."""
    if not isinstance(row, dict) or not isinstance(row.get("message_log"), list):
        return "no message_log list"
    for index, message in enumerate(row["message_log"]):
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            return f"message {index} is not a user or assistant message"
        ids = message.get("token_ids")
        if not isinstance(ids, list) or not all(type(t) is int and t >= 0 for t in ids):
            return f"message {index}: token_ids must be a list of non-negative integers"
    if not any(m["role"] == "assistant" and m["token_ids"] for m in row["message_log"]):
        return "no assistant tokens to train on"
    return None


def training_sequence(row: dict[str, Any], max_total_sequence_length: int) -> "TrainingSequence":
    """The row as the trainer sees it: loss on assistant tokens only (``token_mask``), cut to the length limit."""
    from nemo_tau2.models.policy.data import sequence_from_message_log

    return sequence_from_message_log(
        row["message_log"], 0.0, max_total_sequence_length=max_total_sequence_length, truncate=True,
        with_generation_logprobs=False,
    )  # fmt: skip
