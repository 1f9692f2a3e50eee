"""prepare_sft_data.py on a real evaluation's rollouts.jsonl (run_eval.py over the Gym servers, the scripted fake as
policy and user): token ids exactly the rollout's, the test-split refusal, dedup, the reward filter; and OpenAI
conversations tokenized with a chat template, refused when the template cannot reproduce the training format."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_tau2.algorithms.sft_data import SFTDataError, message_log_from_conversation
from nemo_tau2.generation.tiny_model import build_tiny_tokenizer

EXAMPLES = Path(__file__).parents[3] / "examples"
FAKE_EVAL = EXAMPLES / "configs" / "evals" / "tau2_fake.yaml"
SAMPLES = 4


@pytest.fixture(scope="module")
def rollouts(tmp_path_factory) -> Path:
    """Airline test tasks, 4 samples each; samples 1 and 3 play the wrong-argument policy (reward 0)."""
    save = tmp_path_factory.mktemp("eval")
    command = [
        sys.executable, str(EXAMPLES / "run_eval.py"), "--config", str(FAKE_EVAL), f"eval.save_path={save}",
        "data.domains=[airline]", "data.split=test", "data.num_tasks=3", f"eval.num_tests_per_prompt={SAMPLES}",
        "eval.k_values=[1]", "eval.bootstrap_samples=0",
        "+policy.generation.fake_cfg.tau2.policy.variant=wrong_argument",
        "+policy.generation.fake_cfg.tau2.policy.variant_every=2",
    ]  # fmt: skip
    run = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    return save / "rollouts.jsonl"


def _prepare(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(EXAMPLES / "prepare_sft_data.py"), *args], capture_output=True, text=True, timeout=300
    )


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_test_split_tasks_are_refused_unless_allowed(rollouts, tmp_path):
    refused = _prepare("--rollouts", str(rollouts), "--output", str(tmp_path / "rows.jsonl"))
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1 and "test split" in refused.stderr
    assert "--allow-test-split" in refused.stderr
    assert not (tmp_path / "rows.jsonl").exists()
    allowed = _prepare("--rollouts", str(rollouts), "--allow-test-split", "--output", str(tmp_path / "rows.jsonl"))
    assert allowed.returncode == 0, allowed.stderr
    assert _records(tmp_path / "rows.jsonl")


def test_rows_keep_the_rollouts_token_ids_and_assistant_masks(rollouts, tmp_path):
    out = tmp_path / "rows.jsonl"
    run = _prepare("--rollouts", str(rollouts), "--allow-test-split", "--keep-duplicates", "--output", str(out))
    assert run.returncode == 0, run.stderr
    rows = _records(out)
    episodes = {(r["domain"], r["task_id"], r["sample_index"]): r for r in _records(rollouts) if r["status"] == "ok"}
    assert len(rows) == len(episodes) >= 2 * SAMPLES  # a task without a write action has no wrong-argument variant
    for row in rows:
        turns = [item for item in episodes[(row["domain"], row["task_id"], row["sample_index"])]["transcript"]
                 if item.get("generation_token_ids")]  # fmt: skip
        # the whole episode is the last turn's prompt followed by its generation, id for id
        ids = [t for m in row["message_log"] for t in m["token_ids"]]
        assert ids == turns[-1]["prompt_token_ids"] + turns[-1]["generation_token_ids"]
        # and exactly the generated ids are the assistant (loss) tokens
        assistant = [m["token_ids"] for m in row["message_log"] if m["role"] == "assistant"]
        assert assistant == [turn["generation_token_ids"] for turn in turns]


def test_min_reward_keeps_only_successes_and_dedup_drops_identical_trajectories(rollouts, tmp_path):
    records = [r for r in _records(rollouts) if r["status"] == "ok"]
    successes = [r for r in records if r["reward"] >= 1.0]
    assert 0 < len(successes) < len(records)  # the wrong-argument samples failed
    out = tmp_path / "rows.jsonl"
    kept_all = _prepare("--rollouts", str(rollouts), "--allow-test-split", "--min-reward", "1.0", "--keep-duplicates",
                        "--output", str(out))  # fmt: skip
    assert kept_all.returncode == 0, kept_all.stderr
    rows = _records(out)
    assert len(rows) == len(successes) and all(row["reward"] >= 1.0 for row in rows)
    # the fake is deterministic: a task's successful samples are one trajectory, kept once
    deduped = _prepare("--rollouts", str(rollouts), "--allow-test-split", "--min-reward", "1.0", "--output", str(out))
    assert deduped.returncode == 0, deduped.stderr
    rows = _records(out)
    assert len(rows) == len({r["task_id"] for r in successes}) == 3
    assert len({row["trajectory_hash"] for row in rows}) == len(rows)
    capped = _prepare("--rollouts", str(rollouts), "--allow-test-split", "--keep-duplicates", "--max-per-task", "1",
                      "--output", str(out))  # fmt: skip
    assert capped.returncode == 0 and len(_records(out)) == 3


def test_an_episode_whose_token_ids_broke_contiguity_is_not_trained_on(rollouts, tmp_path):
    records = _records(rollouts)
    broken = next(i for i, r in enumerate(records) if r["status"] == "ok")
    records[broken]["token_contiguity_breaks"] = ["turn 2: prompt differs from turn 1's prompt + generation at 17"]
    edited = tmp_path / "rollouts.jsonl"
    edited.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "rows.jsonl"
    run = _prepare("--rollouts", str(edited), "--allow-test-split", "--keep-duplicates", "--output", str(out))
    assert run.returncode == 0, run.stderr
    kept = {(r["task_id"], r["sample_index"]) for r in _records(out)}
    assert len(kept) == sum(r["status"] == "ok" for r in records) - 1
    assert (records[broken]["task_id"], records[broken]["sample_index"]) not in kept
    assert "contiguity" in run.stdout + run.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--rollouts", "/nonexistent/rollouts.jsonl"], "no such file"),
        (["--rollouts", "/tmp/other.jsonl"], "expected a rollouts.jsonl"),
        (["--conversations", "/nonexistent.jsonl", "--tokenizer", "/nonexistent-model"], "no such file"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message, tmp_path):
    run = _prepare(*args, "--output", str(tmp_path / "rows.jsonl"))
    assert run.returncode == 2 and message in run.stderr and run.stderr.count("\n") == 1, run.stderr


def _conversation() -> tuple[list[dict], list[dict]]:
    call = {"id": "c1", "type": "function", "function": {"name": "get_user", "arguments": '{"user_id": "u1"}'}}
    messages = [
        {"role": "system", "content": "You are an agent."},
        {"role": "assistant", "content": "Hi! How can I help you today?", "weight": 0},
        {"role": "user", "content": "Look me up, I am u1."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"name": "Ann"}'},
        {"role": "assistant", "content": "Found you, Ann. Anything else?"},
    ]
    tools = [{"type": "function", "function": {"name": "get_user", "description": "d", "parameters": {}}}]
    return messages, tools


def test_conversations_are_tokenized_as_the_generation_backend_renders_and_generates_them():
    tokenizer = build_tiny_tokenizer()
    messages, tools = _conversation()
    log = message_log_from_conversation(messages, tools, tokenizer)
    assert [m["role"] for m in log] == ["user", "assistant", "user", "assistant"]  # the greeting (weight 0) is prompt
    for index, turn in ((3, 1), (5, 3)):
        prompt = tokenizer.apply_chat_template(
            messages[:index], tools=tools, add_generation_prompt=True, tokenize=False
        )
        prompt_ids = tokenizer(prompt, add_special_tokens=False).input_ids
        assert [t for m in log[:turn] for t in m["token_ids"]] == prompt_ids
        assert log[turn]["token_ids"][-1] == tokenizer.eos_token_id


def test_a_template_that_does_not_reproduce_the_training_format_is_refused():
    tokenizer = build_tiny_tokenizer()
    # a template that drops earlier assistant turns from later prompts (as reasoning-stripping templates do)
    tokenizer.chat_template = (
        "{% for m in messages %}{% if m.role != 'assistant' or loop.last %}<|im_start|>{{ m.role }}\n"
        "{{ m.content or '' }}<|im_end|>\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    messages, tools = _conversation()
    with pytest.raises(SFTDataError, match="does not reproduce the training format"):
        message_log_from_conversation(messages, tools, tokenizer)
