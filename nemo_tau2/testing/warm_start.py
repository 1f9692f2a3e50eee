"""A tiny policy for CPU smoke runs and the "it learns" test: a random small Llama, SFT warm-started on tau2 tasks.

GRPO from a random model gets no signal (every episode fails, every group has zero variance), which is why the slime
tau2 pipeline runs SFT before GRPO. This module does that warm start at toy scale, with no download: it builds the
tiny byte-level-BPE Llama of :mod:`nemo_tau2.generation.tiny_model`, then fine-tunes it on each training row's first
two policy turns as the scripted fake user will play them: the opening request answered by the first gold tool call
(with probability ``correct_fraction``; otherwise the same call with one argument wrong, which tau2 scores 0), and
the tool result answered by the closing question that makes the scripted user stop. The result is a policy whose
success rate starts near ``correct_fraction`` and that GRPO can improve, saved with ``save_pretrained``.

Rows should be compact (:func:`nemo_tau2.tau2_env.gym_rows.compact_rows`): a short system prompt and only the tools
the task uses, so that prompts fit the tiny model's context.
"""

import hashlib
import json
import logging
import shutil
from pathlib import Path

import torch
import transformers
from transformers import LlamaForCausalLM

from nemo_tau2.algorithms.tiny_policy import TinyPolicyConfig, tiny_policy_architecture
from nemo_tau2.env_cache import CacheUnusable, build_once, cache_root
from nemo_tau2.generation.tiny_model import build_tiny_tokenizer, tool_call_text
from nemo_tau2.tau2_env import domains
from nemo_tau2.tau2_env.episode import Episode
from nemo_tau2.tau2_env.gym_rows import compact_rows
from nemo_tau2.testing.tau2_scripts import DEFAULT_CLOSING_TEXT, corrupt_arguments, opening_text

logger = logging.getLogger(__name__)
Example = tuple[list[int], list[int], float]  # a warm-start turn: prompt ids, reply ids, its weight


def _chat_tools(row: dict) -> list[dict]:
    return [
        {"type": "function", "function": {key: tool[key] for key in ("name", "description", "parameters")}}
        for tool in row["responses_create_params"]["tools"]
    ]


def _examples(row: dict, correct: bool) -> list[tuple[list[dict], str]]:
    """(messages, reply) pairs for the row's first two policy turns."""
    domain, task_id = row["domain"], str(row["task_id"])
    task = domains.get_task(domain, task_id)
    action = task.evaluation_criteria.actions[0]
    arguments = action.arguments if correct else corrupt_arguments(dict(action.arguments))[0]
    call = tool_call_text(action.name, arguments)
    result = Episode.start(domain, task_id).call_tool(action.name, arguments).content
    start = [
        {"role": message["role"], "content": message["content"]} for message in row["responses_create_params"]["input"]
    ]
    opening = start + [{"role": "user", "content": opening_text(task)}]
    after_call = opening + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_0", "type": "function", "function": {"name": action.name, "arguments": arguments}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_0", "content": result},
    ]
    return [(opening, call), (after_call, DEFAULT_CLOSING_TEXT)]


def _encode(tokenizer, messages: list[dict], tools: list[dict], reply: str) -> tuple[list[int], list[int]]:
    """Prompt ids (chat template, generation prompt) and reply ids (ending in EOS), as the policy sees a turn."""
    prompt = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    prompt_ids = tokenizer(prompt, add_special_tokens=False).input_ids
    return prompt_ids, tokenizer(reply, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]


def build_tiny_policy(cfg: TinyPolicyConfig, rows: list[dict], output_dir: str | Path) -> Path:
    """Build, warm-start and save the tiny policy (model + tokenizer with its chat template) into ``output_dir``.

    The warm start is deterministic (seeded, full-batch) and takes tens of seconds on 2 cores, and every smoke run and
    test with a fresh ``policy.model_name`` asks for the same one: the saved files are kept under
    ``<cache_root>/tiny-policies/<key>`` and copied from there when the key matches. The key covers everything the
    weights depend on: the settings, the architecture, the token ids and weights of every warm-start example (so the
    rows, the tokenizer and its chat template), this module's code, and the torch and transformers versions."""
    tokenizer = build_tiny_tokenizer()
    config = tiny_policy_architecture(cfg, tokenizer)
    examples = _warm_start_examples(cfg, _task_rows(rows), tokenizer)
    key = _cache_key(cfg, config, examples)
    output = Path(output_dir)

    def build_into(folder: Path) -> None:
        _warm_start(cfg, config, tokenizer, examples).save_pretrained(folder)
        tokenizer.save_pretrained(folder)

    cached = cache_root() / "tiny-policies" / key
    if cached.is_dir():
        logger.info("tiny policy: the warm start for these settings and rows is cached (%s)", cached)
    try:  # one build per key, whatever the number of runs or test workers asking
        built = build_once(cached, build_into)
    except CacheUnusable as error:  # a read-only home: build without the cache
        logger.warning("tiny policy: %s; building without it", error)
        build_into(output)
        return output
    shutil.copytree(built, output, dirs_exist_ok=True)
    return output


def _task_rows(rows: list[dict]) -> list[dict]:
    """The rows as tasks: a pivot row (PivotRL's turn, ``expected_action``) stands for its task's compact row, so a
    pivot run warm-starts the same tiny policy as an episode run on those tasks (the same cache key)."""
    tasks, seen = [], set()
    for row in rows:
        if "expected_action" not in row:
            tasks.append(row)
        elif (key := (row["domain"], str(row["task_id"]))) not in seen:
            seen.add(key)
            tasks += compact_rows(*key[:1], [key[1]])
    return tasks


def _warm_start_examples(cfg: TinyPolicyConfig, rows: list[dict], tokenizer) -> list[Example]:
    """(prompt ids, reply ids, weight) for the first two policy turns of every row with a gold action."""
    rows_with_actions = [
        row for row in rows if domains.get_task(row["domain"], str(row["task_id"])).evaluation_criteria.actions
    ]
    if not rows_with_actions:
        raise ValueError("tiny_policy: no training row has a gold action to warm-start on")
    # Each distinct (prompt, reply) once, weighted: the right and the wrong first call in the ratio
    # correct_fraction : 1 - correct_fraction, so that the model's sampling probabilities end near that ratio.
    examples: list[Example] = []
    for row in rows_with_actions:
        tools = _chat_tools(row)
        for correct, weight in ((True, cfg.correct_fraction), (False, 1.0 - cfg.correct_fraction)):
            for messages, reply in _examples(row, correct):
                prompt_ids, reply_ids = _encode(tokenizer, messages, tools, reply)
                if len(prompt_ids) + len(reply_ids) > cfg.max_position_embeddings:
                    raise ValueError(
                        f"tiny_policy: a warm-start prompt of task {row['task_id']} has "
                        f"{len(prompt_ids)} tokens; raise max_position_embeddings or use compact rows"
                    )
                examples.append((prompt_ids, reply_ids, weight))
    return examples


def _cache_key(cfg: TinyPolicyConfig, config, examples: list[Example]) -> str:
    digest = hashlib.sha256()
    for part in (
        cfg.model_dump_json(),
        config.to_json_string(use_diff=False),
        json.dumps(examples),
        Path(__file__).read_text(),
        torch.__version__,
        transformers.__version__,
    ):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:24]


def _batch(examples: list[Example], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The examples right-padded into one batch of ids, and which positions' next token is a reply token."""
    width = max(len(p) + len(r) for p, r, _ in examples)
    ids = torch.full((len(examples), width), pad_token_id)
    reply_mask = torch.zeros((len(examples), width), dtype=torch.bool)
    for i, (prompt_ids, reply_ids, _) in enumerate(examples):
        ids[i, : len(prompt_ids) + len(reply_ids)] = torch.tensor(prompt_ids + reply_ids)
        reply_mask[i, len(prompt_ids) : len(prompt_ids) + len(reply_ids)] = True
    return ids, reply_mask[:, 1:]


def _reply_nll(model: LlamaForCausalLM, ids: torch.Tensor, predicted: torch.Tensor) -> torch.Tensor:
    """Each example's mean negative log-likelihood of its reply tokens.

    Only the reply tokens are predicted: the vocabulary projection runs on their positions alone (the prompts are
    ~95% of the tokens, and the projection with its softmax was most of a step). No attention mask: the padding is on
    the right, where causal attention keeps it from every real token, and without a mask the attention kernel skips
    the blocks above the diagonal instead of computing and masking them (200 -> 168 ms a step on 2 cores:
    bench/warm_start_step.py).
    """
    targets, example_of = ids[:, 1:][predicted], predicted.nonzero()[:, 0]
    hidden = model.model(input_ids=ids).last_hidden_state[:, :-1][predicted]
    logprobs = torch.log_softmax(model.lm_head(hidden).float(), dim=-1)
    token_nll = -logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return torch.zeros(len(ids)).index_add(0, example_of, token_nll) / predicted.sum(-1)


def _warm_start(cfg: TinyPolicyConfig, config, tokenizer, examples: list[Example]) -> LlamaForCausalLM:
    """The random tiny Llama fine-tuned on the weighted examples' reply tokens, full batch, ``warm_start_steps``."""
    torch.manual_seed(cfg.seed)
    model = LlamaForCausalLM(config)
    ids, predicted = _batch(examples, tokenizer.pad_token_id)
    weights = torch.tensor([weight for _, _, weight in examples])
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate)
    model.train()
    loss = torch.tensor(float("nan"))
    for _ in range(cfg.warm_start_steps):
        optimizer.zero_grad()
        loss = (weights * _reply_nll(model, ids, predicted)).sum() / weights.sum()
        loss.backward()
        optimizer.step()
    logger.info("tiny policy warm start: final loss %.4f over %d examples", loss.item(), len(examples))
    return model.eval()


def first_call_preference(model_dir: str | Path, rows: list[dict]) -> float:
    """Mean over rows of log P(right first call) - log P(wrong first call) under the model at ``model_dir``.

    The success of a sampled episode is a noisy read of what GRPO changed; this is the exact one: the warm start sets
    it near log(correct_fraction / (1 - correct_fraction)), learning raises it, a frozen policy leaves it unchanged.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()

    def reply_logprob(messages: list[dict], tools: list[dict], reply: str) -> float:
        prompt_ids, reply_ids = _encode(tokenizer, messages, tools, reply)
        ids = torch.tensor([prompt_ids + reply_ids])
        with torch.no_grad():
            logprobs = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), dim=-1)
        targets = ids[0, len(prompt_ids) :]
        return logprobs[len(prompt_ids) - 1 :].gather(-1, targets.unsqueeze(-1)).sum().item()

    margins = []
    for row in rows:
        tools = _chat_tools(row)
        (messages, right), _ = _examples(row, correct=True)
        (_, wrong), _ = _examples(row, correct=False)
        margins.append(reply_logprob(messages, tools, right) - reply_logprob(messages, tools, wrong))
    return sum(margins) / len(margins)
