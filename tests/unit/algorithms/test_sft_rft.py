"""SFT and RFT end to end on CPU: real Gym servers, the hf backend, the scripted fake user, the tiny policy.

The start is the tiny Llama warm-started to pick the right first call of tau2's mock tasks about 1 time in 5. SFT on
the oracle teacher's episodes (examples/oracle_sft_data.py, tokenized with the policy's chat template) must raise
its pass@1 on the train tasks well above the same run with the learning rate at zero; two RFT rounds (sample, keep
the successes, fine-tune) must raise it over the start; a round with no success is reported, not an error. And the
NLL loss reads the assistant tokens only: NaN anywhere else changes nothing.
"""

import contextlib
import io
import json
import logging
import runpy
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer

from nemo_tau2.algorithms import rft, sft, training_setup
from nemo_tau2.algorithms.loss import NLLLossFn, nll_loss
from nemo_tau2.algorithms.rft_config import RFTMasterConfig
from nemo_tau2.algorithms.sft_config import SFTMasterConfig
from nemo_tau2.algorithms.sft_data import row_from_conversation, training_sequence
from nemo_tau2.config import apply_overrides, load_config, validate_config
from nemo_tau2.experience.rollouts import RolloutResult
from nemo_tau2.gym.agent.episode_record import EpisodeStatus
from nemo_tau2.models.policy.lm_policy import Policy
from nemo_tau2.tau2_env.gym_rows import load_rows
from nemo_tau2.testing.warm_start import build_tiny_policy

EXAMPLES = Path(__file__).parents[3] / "examples"
SFT_SMOKE = EXAMPLES / "configs" / "sft_tau2_cpu_smoke.yaml"
RFT_SMOKE = EXAMPLES / "configs" / "rft_tau2_cpu_smoke.yaml"
TASKS = ["update_task_1", "create_task_1"]


@pytest.fixture(scope="module")
def start(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("tiny") / "policy"
    cfg = validate_config(load_config(SFT_SMOKE), SFTMasterConfig)
    rows = load_rows(domains_=["mock"], split="base", task_ids=TASKS, compact=True)
    return build_tiny_policy(cfg.tiny_policy, rows, directory)


@pytest.fixture(scope="module")
def oracle_rows(start, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("oracle")
    command = [sys.executable, str(EXAMPLES / "oracle_sft_data.py"), "--domains", "mock", "--split", "base",
               "--task-ids", *TASKS, "--compact-rows", "--output", str(folder / "oracle.jsonl")]  # fmt: skip
    run = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr + _log_tails(folder / "oracle_logs")
    tokenizer = AutoTokenizer.from_pretrained(start)
    conversations = [json.loads(line) for line in (folder / "oracle.jsonl").read_text().splitlines()]
    assert len(conversations) == len(TASKS)
    rows = [row_from_conversation(conversation, tokenizer) for conversation in conversations]
    path = folder / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _log_tails(folder: Path, lines: int = 40) -> str:
    """The last lines of each server log under ``folder``: what a failed run's servers said."""
    tails = [(log, log.read_text(errors="replace").splitlines()[-lines:]) for log in sorted(folder.rglob("*.log"))]
    return "".join(f"\n--- {log.relative_to(folder)}\n" + "\n".join(tail) for log, tail in tails)


def _sft_config(tmp: Path, model: Path, rows: Path, *overrides: str) -> SFTMasterConfig:
    raw = apply_overrides(
        load_config(SFT_SMOKE),
        [f"policy.model_name={model}", f"data.train_data_path={rows}", f"data.val_data_path={rows}",
         f"checkpointing.checkpoint_dir={tmp / 'checkpoints'}", f"logger.log_dir={tmp / 'logs'}",
         "logger.tensorboard_enabled=false", "sft.val_period=0", "sft.val_at_start=false", "sft.val_at_end=false",
         "checkpointing.enabled=false", *overrides],
    )  # fmt: skip
    return validate_config(raw, SFTMasterConfig)


def _rft_config(tmp: Path, model: Path, *overrides: str) -> RFTMasterConfig:
    raw = apply_overrides(
        load_config(RFT_SMOKE),
        [f"policy.model_name={model}", f"checkpointing.checkpoint_dir={tmp / 'checkpoints'}",
         f"logger.log_dir={tmp / 'logs'}", "logger.tensorboard_enabled=false", *overrides],
    )  # fmt: skip
    return validate_config(raw, RFTMasterConfig)


def _tool_conversation(user_id: str) -> dict:
    call = {"id": "c1", "type": "function", "function": {"name": "get_user", "arguments": json.dumps({"id": user_id})}}
    messages = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": f"Look me up, I am {user_id}."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"name": "Ann"}'},
        {"role": "assistant", "content": "Found you, Ann. Anything else?"},
    ]
    return {"messages": messages, "tools": [{"type": "function", "function": {"name": "get_user", "parameters": {}}}]}


def test_nll_reads_only_the_assistant_tokens_nan_elsewhere_changes_nothing(start):
    tokenizer = AutoTokenizer.from_pretrained(start)
    rows = [row_from_conversation(_tool_conversation(user_id), tokenizer) for user_id in ("u1", "u22", "u333")]
    cfg = _sft_config(Path("/unused"), start, Path("/unused/rows.jsonl"))
    clean = [training_sequence(row, cfg.policy.max_total_sequence_length) for row in rows]
    for seq in clean:
        assert any(seq.token_mask) and not all(seq.token_mask[1:])  # both kinds of tokens are there
    # the loss function alone: NaN log-probabilities on masked positions, gradient only on the assistant tokens
    curr = torch.randn(2, 6, requires_grad=True)
    mask = torch.tensor([[0, 0, 1, 1, 0, 0], [0, 1, 1, 0, 0, 0]], dtype=torch.float32)
    poisoned = torch.where(mask > 0, curr, torch.full_like(curr, float("nan")))
    loss, metrics = nll_loss(curr_logprobs=poisoned, token_mask=mask, sample_mask=torch.ones(2))
    loss.backward()
    assert loss.item() == pytest.approx(-(curr * mask).sum().item() / 4)
    assert torch.equal(curr.grad, -mask / 4) and metrics["num_valid_tokens"] == 4
    # through the trainer: NaN in every per-token input the SFT loss must not read gives the same update
    poisoned_seqs = [training_sequence(row, cfg.policy.max_total_sequence_length) for row in rows]
    for seq in poisoned_seqs:
        seq.generation_logprobs = [float("nan")] * len(seq)
        seq.prev_logprobs = [float("nan")] * len(seq)
        seq.advantage = [float("nan")] * len(seq)
    weights = []
    for sequences in (clean, poisoned_seqs):
        torch.manual_seed(0)
        with Policy(cfg.policy) as policy:
            metrics = policy.train(sequences, NLLLossFn())
            assert metrics["num_optimizer_steps"] == 1
            weights.append(policy.state_dict_for_generation())
    assert all(torch.equal(weights[0][name], weights[1][name]) for name in weights[0])


def _sft_and_validate(tmp: Path, start: Path, rows: Path, *overrides: str, before: bool = True) -> dict:
    cfg = _sft_config(tmp, start, rows, *overrides)
    eval_rows = load_rows(domains_=["mock"], split="base", task_ids=TASKS, compact=True)
    s = sft.setup(cfg, [json.loads(line) for line in rows.read_text().splitlines()], [], eval_rows)
    try:
        before = sft.validate(s, 0)["val/overall/pass@1"] if before else None
        history = sft.sft_train(s)
        after = sft.validate(s, len(history))["val/overall/pass@1"]
    finally:
        s.close()
    assert (tmp / "checkpoints" / "final_hf" / "config.json").is_file()
    losses = {"first_loss": history[0]["train/loss"], "loss": history[-1]["train/loss"]}
    return {"before": before, "after": after} | losses


def test_sft_on_oracle_episodes_raises_pass_at_1_and_the_frozen_control_does_not(start, oracle_rows, tmp_path):
    learned = _sft_and_validate(
        tmp_path / "learned", start, oracle_rows, "sft.max_num_steps=60", "sft.max_num_epochs=60"
    )
    frozen = _sft_and_validate(tmp_path / "frozen", start, oracle_rows, "sft.max_num_steps=3",
                               "policy.optimizer.kwargs.lr=0.0", before=False)  # fmt: skip
    # measured: 0.22 -> 0.94 in 40 steps (32 episodes each); 30 steps (loss 0.045) once gave only 0.19 -> 0.38,
    # since sampling at temperature 1 needs every token of a tool call right
    assert learned["loss"] < learned["first_loss"] / 4, learned
    assert learned["after"] > learned["before"] + 0.3, learned
    assert learned["after"] > frozen["after"] + 0.3, (learned, frozen)
    # the control (no updates) ends with the start's weights, bit for bit: its pass@1 is another sample of the start's
    # rate (CI once saw it at 0.16 before, 0.38 after: 32 episodes at ~0.2 have a sigma of ~0.07)
    final = load_file(tmp_path / "frozen" / "checkpoints" / "final_hf" / "model.safetensors")
    initial = load_file(start / "model.safetensors")
    assert final and set(final) <= set(initial)
    assert all(torch.equal(final[name], initial[name].to(final[name].dtype)) for name in final)


def _sft_weights(tmp: Path, start: Path, rows: Path, *overrides: str) -> tuple[dict, list[dict], int]:
    cfg = _sft_config(tmp, start, rows, "checkpointing.enabled=true", "checkpointing.save_period=3",
                      "checkpointing.keep_top_k=null", "sft.max_num_epochs=10", *overrides)  # fmt: skip
    s = sft.setup(cfg, [json.loads(line) for line in rows.read_text().splitlines()], [], [])
    try:
        start_step = s.start_step
        history = sft.sft_train(s)
        return s.policy.state_dict_for_generation(), history, start_step
    finally:
        s.close()


def test_an_interrupted_sft_run_resumes_to_the_same_weights(start, oracle_rows, tmp_path):
    whole, whole_history, _ = _sft_weights(tmp_path / "whole", start, oracle_rows, "sft.max_num_steps=7")
    _sft_weights(tmp_path / "cut", start, oracle_rows, "sft.max_num_steps=3")  # as if stopped after step 3
    resumed, resumed_history, start_step = _sft_weights(tmp_path / "cut", start, oracle_rows, "sft.max_num_steps=7")
    assert start_step == 3 and len(resumed_history) == 4
    # the same rows in the same order from step 4 on (the order is a function of seed and epoch), the same weights
    assert [h["train/loss"] for h in resumed_history] == [h["train/loss"] for h in whole_history[3:]]
    assert all(torch.equal(whole[name], resumed[name]) for name in whole)
    assert (tmp_path / "cut" / "checkpoints" / "final_hf" / "config.json").is_file()
    # the checkpoint names the release its rows were of (and no retrieval variant: mock is no knowledge domain); a run
    # of another release, or one playing a retrieval variant, refuses it
    latest = max((tmp_path / "cut" / "checkpoints").glob("step_*"), key=lambda path: int(path.name[5:]))
    state = json.loads((latest / "trainer_state.json").read_text())
    assert (state["tau2_version"], state["retrieval_variant"]) == ("v0.2.1", None)
    training_setup.check_checkpoint_release(latest, {"tau2_version": "v0.2.1", "retrieval_variant": None})
    with pytest.raises(ValueError, match=r"was trained on tau2 v0.2.1, this run is tau2.version v1.0.1: resume"):
        training_setup.check_checkpoint_release(latest, {"tau2_version": "v1.0.1", "retrieval_variant": None})
    with pytest.raises(ValueError, match=r"was trained with retrieval variant None, this run plays bm25_grep "):
        training_setup.check_checkpoint_release(latest, {"tau2_version": "v0.2.1", "retrieval_variant": "bm25_grep"})


def test_two_rft_rounds_raise_pass_at_1_on_the_train_tasks(start, tmp_path):
    cfg = _rft_config(tmp_path, start, "rft.num_rounds=2")
    train_rows, val_rows = rft.load_rows(cfg)
    s = rft.setup(cfg, train_rows, val_rows)
    try:
        before = rft.validate(s, 0)["val/overall/pass@1"]
        history = rft.rft_train(s)
    finally:
        s.close()
    assert len(history) == 2 and all(h["rft/num_kept"] > 0 for h in history), history
    after = history[-1]["val/overall/pass@1"]
    # measured with 32 samples per task (7 runs): 0.12-0.28 -> 0.78-1.0 on validation; the sampled episodes of
    # round 2 (after round 1's update) succeed 0.70-0.83 against 0.14-0.23 in round 1. With 16 samples per task a
    # round-1 task sometimes found no success and was never learned (full-suite runs of 2026-11-26 and -28: 0.25 ->
    # 0.44, 0.22 -> 0.31; probe: 1 of 4 runs). A policy that does not learn passes each of the two checks below by
    # chance with ~5-8% (32 validation episodes), both together ~1%.
    assert after > before + 0.15, (before, [h["val/overall/pass@1"] for h in history])
    assert history[1]["train/overall/pass@1"] > history[0]["train/overall/pass@1"] + 0.2, history
    assert (tmp_path / "checkpoints" / "final_hf" / "config.json").is_file()


def test_a_round_without_success_is_reported_and_trains_nothing(start, tmp_path, caplog):
    cfg = _rft_config(tmp_path, start, "rft.num_rounds=1", "rft.min_reward=1.5", "rft.val_at_start=false",
                      "rft.num_generations_per_prompt=2", "rft.partial_fallback=null")  # fmt: skip
    train_rows, _ = rft.load_rows(cfg)
    s = rft.setup(cfg, train_rows, [])
    try:
        weights_before = s.policy.state_dict_for_generation()
        with caplog.at_level(logging.WARNING):
            history = rft.rft_train(s)
        weights_after = s.policy.state_dict_for_generation()
    finally:
        s.close()
    assert history[0]["rft/num_kept"] == 0 and "train/loss" not in history[0]
    assert "no episode" in caplog.text and "nothing to fine-tune" in caplog.text
    assert all(torch.equal(weights_before[name], weights_after[name]) for name in weights_before)


def _episode(task_id: str, sample: int, success: bool, action_match: float, tokens: list[int]) -> RolloutResult:
    return RolloutResult(
        row_index=sample, group_index=0, sample_index=sample, domain="mock", task_id=task_id, status=EpisodeStatus.OK,
        reward=float(success), success=success,
        reward_components={"action_match_fraction": action_match, "env_assertion_fraction": None,
                           "communicate_fraction": 1.0},
        message_log=[{"role": "user", "token_ids": [1, 2]}, {"role": "assistant", "token_ids": tokens}],
    )  # fmt: skip


def test_rft_keeps_a_tasks_best_partial_episode_when_none_succeeds(tmp_path):
    """slime's filter: reward >= 1, else the task's best episode with partial credit >= 0.6 (weights 0.5 / 0.15 of
    action and communication here: 0.8 action match gives 0.85, 0.0 gives 0.23)."""
    results = [
        _episode("create_task_1", 0, True, 1.0, [5]),
        _episode("create_task_1", 1, False, 0.5, [6]),  # its task has a success: not a fallback
        _episode("update_task_1", 0, False, 0.8, [7]),
        _episode("update_task_1", 1, False, 0.0, [8]),
        _episode("create_task_1_nl_eval", 0, False, 0.0, [9]),  # best partial 0.23 < 0.6: nothing
    ]
    cfg = _rft_config(tmp_path, Path("/unused"))
    kept, metrics = rft.keep(SimpleNamespace(cfg=cfg), results)
    assert [(row["task_id"], row["sample_index"]) for row in kept] == [("create_task_1", 0), ("update_task_1", 0)]
    assert metrics["rft/num_kept"] == 2 and metrics["rft/num_partial_kept"] == 1
    cfg.rft.partial_fallback = None
    kept, metrics = rft.keep(SimpleNamespace(cfg=cfg), results)
    assert [row["task_id"] for row in kept] == ["create_task_1"] and metrics["rft/num_partial_kept"] == 0


@pytest.mark.parametrize("name", sorted(p.name for p in (EXAMPLES / "configs").glob("[sr]ft_*.yaml")))
def test_shipped_sft_and_rft_configs_validate(name):
    schema = SFTMasterConfig if name.startswith("sft_") else RFTMasterConfig
    cfg = validate_config(load_config(EXAMPLES / "configs" / name), schema)
    assert cfg.policy.model_name


def test_rft_refuses_to_train_on_the_test_split_unless_allowed():
    raw = apply_overrides(load_config(RFT_SMOKE), ["data.domains=[airline]", "data.train_split=test"])
    with pytest.raises(Exception, match="leaks the test set"):
        validate_config(raw, RFTMasterConfig)
    allowed = apply_overrides(raw, ["+rft.allow_test_split=true"])
    assert validate_config(allowed, RFTMasterConfig).rft.allow_test_split


def _script(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(EXAMPLES / name), *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (None, "no such SFT data file"),
        ([{"message_log": [{"role": "assistant", "token_ids": ["a"]}]}], "1: not an SFT row (message 0: token_ids"),
        ([{"message_log": [{"role": "tool", "token_ids": [1]}]}], "1: not an SFT row (message 0 is not a user or"),
        ([{"message_log": [{"role": "user", "token_ids": [1]}, {"role": "assistant", "token_ids": [10**6]}]}],
         "token id 1000000, beyond"),
    ],
)  # fmt: skip
def test_run_sft_refuses_bad_rows_in_one_line(start, tmp_path, rows, message):
    path = tmp_path / "rows.jsonl"
    if rows is not None:
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    run = _script("run_sft.py", "--config", str(SFT_SMOKE), f"policy.model_name={start}",
                  f"data.train_data_path={path}", "data.val_data_path=null", f"logger.log_dir={tmp_path / 'logs'}",
                  f"checkpointing.checkpoint_dir={tmp_path / 'checkpoints'}")  # fmt: skip
    assert run.returncode == 2 and message in run.stderr, run.stderr
    assert run.stderr.strip().count("\n") == 0, run.stderr
    assert not (tmp_path / "checkpoints").exists()


def _in_process(name: str, *args: str) -> SimpleNamespace:
    """The script's ``__main__`` run in this process (its exit status, stdout, stderr): the front door's answers
    without a process start each (the scripts run as processes in the tests that train)."""
    stdout, stderr = io.StringIO(), io.StringIO()
    argv = sys.argv
    sys.argv = [str(EXAMPLES / name), *args]
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            runpy.run_path(str(EXAMPLES / name), run_name="__main__")
        code = 0
    except SystemExit as stop:
        code = stop.code
    finally:
        sys.argv = argv
    return SimpleNamespace(returncode=code, stdout=stdout.getvalue(), stderr=stderr.getvalue())


def test_the_training_scripts_share_one_front_door(tmp_path):
    """A wrong key is one line and exit 2 in each; --plan prints the plan of a shipped recipe and exits 0."""
    for script, config, override in (("run_sft.py", SFT_SMOKE, "sft.max_num_stepz=3"),
                                      ("run_rft.py", RFT_SMOKE, "rft.num_roundz=1")):  # fmt: skip
        run = _in_process(script, "--config", str(config), override)
        assert run.returncode == 2 and "num_" in run.stderr and "error:" in run.stderr, run.stderr
    # RFT's recipe starts from SFT's output, which does not exist yet: planned with the base model's shape
    for script, config, overrides in (("run_sft.py", "sft_tau2_qwen3_4b.yaml", []),
                                      ("run_rft.py", "rft_tau2_qwen3_4b.yaml",
                                       ["policy.model_name=Qwen/Qwen3-4B-Instruct-2507"])):  # fmt: skip
        run = _in_process(script, "--config", str(EXAMPLES / "configs" / config), *overrides, "--plan")
        assert run.returncode == 0 and "plan: fits" in run.stdout, run.stdout + run.stderr
        assert "Gym capacity" in run.stdout  # both run Gym servers (SFT for its validation episodes)
    unplanned = _in_process("run_rft.py", "--config", str(EXAMPLES / "configs" / "rft_tau2_qwen3_4b.yaml"), "--plan")
    assert unplanned.returncode == 2 and "no config.json for 'results/sft_qwen3_4b" in unplanned.stderr


def test_the_oracle_says_why_an_episode_was_not_kept():
    """An episode the oracle did not pass is an outage (its error, never a score) or a task it cannot pass (its reward
    and tau2's checks): the line names which, so a run that wrote nothing can be read."""
    reason = runpy.run_path(str(EXAMPLES / "oracle_sft_data.py"))["not_kept_reason"]
    common = {"row_index": 0, "group_index": 0, "sample_index": 0, "domain": "mock", "task_id": "update_task_1"}
    outage = RolloutResult(**common, status=EpisodeStatus.INFRASTRUCTURE_ERROR, error="agent: 502 from the policy")
    assert reason(outage) == "infrastructure error: agent: 502 from the policy"
    checks = {"db_match": 0.0, "communicate": 1.0}
    scored = RolloutResult(**common, status=EpisodeStatus.OK, reward=0.0, success=False, reward_components=checks,
                           tau2_failure_kind="max_steps")  # fmt: skip
    assert reason(scored) == "reward 0.0 (communicate 1.0, db_match 0.0); ended max_steps"
