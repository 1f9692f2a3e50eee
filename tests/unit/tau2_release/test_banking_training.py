"""Training on banking_knowledge, which tau2 gives no train/test split: GRPO, RFT and SFT refuse a split tau2 does
not have, in one line naming both ways out (a split of ours, or an explicit list); a split of ours
(``ours_seed<N>_train``/``_test``) is disjoint, covers the domain, is the same on every call and differs by seed;
GRPO's rows of it come from the release (the variant's prompt and tools), each saying its split and variant."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_tau2.algorithms import grpo
from nemo_tau2.algorithms.grpo_config import GRPOMasterConfig
from nemo_tau2.algorithms.prompt_fit import check_prompts_fit
from nemo_tau2.algorithms.rft_config import RFTMasterConfig
from nemo_tau2.algorithms.sft_config import SFTMasterConfig
from nemo_tau2.config import ConfigError, apply_overrides, load_config, validate_config
from nemo_tau2.tau2_env import domains
from nemo_tau2.tau2_env.own_splits import own_split_ids
from nemo_tau2.testing.warm_start import build_tiny_policy
from nemo_tau2.trained_tasks import TRAINED_ON_FILE
from tests.tau2_v1_env import tau2_v1_python

DOMAIN = "banking_knowledge"
ROOT = Path(__file__).resolve().parents[3]
CONFIGS = {
    "grpo": ("examples/configs/grpo_tau2_cpu_smoke.yaml", GRPOMasterConfig),
    "rft": ("examples/configs/rft_tau2_cpu_smoke.yaml", RFTMasterConfig),
    "sft": ("examples/configs/sft_tau2_cpu_smoke.yaml", SFTMasterConfig),
}


def _config(kind: str, *overrides: str):
    path, schema = CONFIGS[kind]
    v1 = ["++tau2.version=v1.0.1", f"++tau2.python={tau2_v1_python()}", f"data.domains=[{DOMAIN}]"]
    return validate_config(apply_overrides(load_config(path), [*v1, *overrides]), schema)


@pytest.mark.parametrize("kind", ["grpo", "rft", "sft"])
def test_a_split_tau2_does_not_have_is_refused_naming_both_ways_out(kind):
    split = "data.val_split=test" if kind == "sft" else "data.train_split=train"
    with pytest.raises(ConfigError) as refused:
        _config(kind, split)
    message = str(refused.value)
    assert "domain 'banking_knowledge' has no train/test split in tau2 (only 'base', all its tasks); use a split of " \
        "ours (data.train_split=ours_seed0_train, data.val_split=ours_seed0_test) or an explicit list " \
        "(data.train_split=base with data.task_ids)" in message  # fmt: skip
    assert len(refused.value.problems) == 1 and "\n" not in refused.value.problems[0]
    with pytest.raises(ConfigError, match=r"domain 'banking_knowledge' is tau2 v1.0.1's \(not in v0.2.1\)"):
        _config(kind, split, "++tau2.version=v0.2.1")


def test_our_splits_are_disjoint_cover_the_domain_and_depend_on_the_seed_only(worker):
    ids = [str(task["id"]) for task in worker.request("tasks", domain=DOMAIN, split=None)]
    train, test = (own_split_ids(DOMAIN, ids, f"ours_seed0_{part}") for part in ("train", "test"))
    assert len(test) == 20 and len(train) == 77 and not set(train) & set(test) and set(train) | set(test) == set(ids)
    assert own_split_ids(DOMAIN, ids, "ours_seed0_test") == test  # the same on every call (and machine: a hash)
    assert own_split_ids(DOMAIN, ids, "ours_seed1_test") != test
    assert test == [task_id for task_id in ids if task_id in test]  # in the release's order
    airline = [task.id for task in domains.get_tasks("airline", "ours_seed0_test")]  # v0.2.1's domains have them too
    assert len(airline) == 10 and set(airline) <= {task.id for task in domains.get_tasks("airline", "base")}


def test_grpo_rows_of_a_split_of_ours_come_from_the_release_and_say_their_split(worker):
    cfg = _config("grpo", "data.train_split=ours_seed0_train", "data.val_split=ours_seed0_test", "data.task_ids=null")
    train_rows, val_rows = grpo.load_rows(cfg)
    assert (len(train_rows), len(val_rows)) == (77, 20)
    assert {row["split"] for row in train_rows} == {"ours_seed0_train"}
    assert {row["split"] for row in val_rows} == {"ours_seed0_test"}
    assert {row["retrieval_variant"] for row in train_rows + val_rows} == {"bm25_grep"}
    ids = [str(task["id"]) for task in worker.request("tasks", domain=DOMAIN, split=None)]
    assert [row["task_id"] for row in val_rows] == own_split_ids(DOMAIN, ids, "ours_seed0_test")
    listed = _config("grpo", "data.train_split=base", "data.val_split=null", "data.task_ids=[task_001,task_004]")
    assert [row["task_id"] for row in grpo.load_rows(listed)[0]] == ["task_001", "task_004"]


def test_one_grpo_step_on_banking_trains_on_its_episodes_and_its_checkpoint_names_the_variant(release_tasks, tmp_path):
    """The tiny policy (warm-started on mock, cached) plays two banking tasks twice each through the Gym servers
    (compact rows), the scripted user the release's scenarios; the step trains on the episodes that have tokens,
    records all four with their variant, and its checkpoint says the release and variant it trained on: a run of
    another variant refuses to resume from it. A step with no episode to train on updates nothing."""
    smoke = validate_config(load_config(CONFIGS["grpo"][0]), GRPOMasterConfig)
    policy = build_tiny_policy(smoke.tiny_policy, grpo.load_rows(smoke)[0], tmp_path / "policy")
    overrides = [
        f"policy.model_name={policy}", "data.train_split=base", "data.val_split=null",
        "data.task_ids=[task_001,task_005]", "grpo.max_num_steps=1",
        "grpo.num_prompts_per_step=2", "grpo.num_generations_per_prompt=2", "grpo.val_at_end=false",
        "grpo.val_period=0", "policy.train_global_batch_size=4",
        "policy.train_micro_batch_size=2", f"++user.generation.fake_cfg.tau2.release_tasks={release_tasks}",
        f"logger.log_dir={tmp_path / 'logs'}", f"checkpointing.checkpoint_dir={tmp_path / 'checkpoints'}",
        "logger.tensorboard_enabled=false", "+logger.save_rollouts=all", "+logger.report=false",
    ]  # fmt: skip
    cfg = _config("grpo", *overrides)
    train_rows, val_rows = grpo.load_rows(cfg)
    s = grpo.setup(cfg, train_rows, val_rows)
    try:
        (step,) = grpo.grpo_train(s)
    finally:
        s.close()
    assert step["train/rollout/num_episodes"] == 4 and step["train/rollout/num_infrastructure_errors"] == 0, step
    # task_005's prompt (its tools) is beyond the tiny policy's 2048 positions: its generations end at the first turn
    # with no token, and the step trains on task_001's two episodes
    assert step["train/num_sequences"] == 2 and step["train/num_untrainable_episodes"] == 2, step
    records = [json.loads(line) for line in (tmp_path / "logs/train/step_1/rollouts.jsonl").read_text().splitlines()]
    assert sorted(r["task_id"] for r in records) == ["task_001", "task_001", "task_005", "task_005"]
    assert all(r["retrieval_variant"] == "bm25_grep" and isinstance(r["retrieval"], dict) for r in records)
    state = json.loads((tmp_path / "checkpoints/step_1/trainer_state.json").read_text())
    assert (state["tau2_version"], state["retrieval_variant"]) == ("v1.0.1", "bm25_grep")
    other = _config("grpo", *overrides, "++tau2.retrieval_variant=grep_only")
    with pytest.raises(ValueError, match=r"was trained with retrieval variant bm25_grep, this run plays grep_only "):
        grpo.setup(other, *grpo.load_rows(other))
    assert grpo.train(s, [], 1) == {}  # every generation cut at its first turn: no update, a warning


def _script(name: str, *arguments: str) -> str:
    """One of examples/ as a user runs it (the project's interpreter, from the root); its output, or the failure's."""
    run = subprocess.run([sys.executable, f"examples/{name}", *arguments], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)  # fmt: skip
    assert run.returncode == 0, f"{name}: exit {run.returncode}\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    return run.stdout


def _trained_on(checkpoints: Path) -> tuple[str, str]:
    latest = max(checkpoints.glob("step_*"), key=lambda path: int(path.name[5:]))
    state = json.loads((latest / "trainer_state.json").read_text())
    return state["tau2_version"], state["retrieval_variant"]


def test_sft_on_the_oracles_banking_episodes_then_an_rft_round_train_the_tiny_policy_and_name_the_variant(tmp_path):
    """The SFT/RFT path on banking_knowledge, script by script as the docstrings type it: the oracle teacher plays a
    banking task on the release (its gold, its scenario, bm25_grep), its episodes become SFT rows in the tiny policy's
    tokens, run_sft.py fine-tunes on them and validates by playing the task through the Gym servers, and run_rft.py
    samples that model on the task and fine-tunes on its own episodes. Each checkpoint names the release and variant,
    each validation episode its variant."""
    smoke = validate_config(load_config(CONFIGS["grpo"][0]), GRPOMasterConfig)
    policy = build_tiny_policy(smoke.tiny_policy, grpo.load_rows(smoke)[0], tmp_path / "policy")
    release = ["tau2.version=v1.0.1", f"tau2.python={tau2_v1_python()}", "tau2.retrieval_variant=bm25_grep"]
    oracle = tmp_path / "oracle.jsonl"
    _script("oracle_sft_data.py", "--domains", DOMAIN, "--split", "base", "--task-ids", "task_001", "--compact-rows",
            "--samples-per-task", "2", "--output", str(oracle), *release)  # fmt: skip
    conversations = [json.loads(line) for line in oracle.read_text().splitlines()]
    assert [(c["task_id"], c["tau2_version"], c["retrieval_variant"], c["reward"]) for c in conversations] == [
        ("task_001", "v1.0.1", "bm25_grep", 1.0)] * 2  # fmt: skip
    rows = tmp_path / "sft_rows.jsonl"
    _script("prepare_sft_data.py", "--conversations", str(oracle), "--tokenizer", str(policy), "--output", str(rows),
            *release)  # fmt: skip
    # the scripted user plays the release's scenario: the tasks the oracle script wrote beside its output
    scenario = f"++user.generation.fake_cfg.tau2.release_tasks={oracle.with_name('oracle.release_tasks.json')}"
    on_banking = [f"data.domains=[{DOMAIN}]", "data.task_ids=[task_001]", "logger.tensorboard_enabled=false",
                  *(f"++{override}" for override in release), scenario]  # fmt: skip
    _script("run_sft.py", "--config", CONFIGS["sft"][0], f"policy.model_name={policy}", f"data.train_data_path={rows}",
            f"data.val_data_path={rows}", "data.val_split=base", "sft.max_num_steps=4", "sft.max_num_epochs=4",
            "sft.val_period=0", "sft.val_at_start=false", "sft.val_num_generations_per_prompt=2",
            f"checkpointing.checkpoint_dir={tmp_path / 'sft'}", "checkpointing.save_period=2",
            f"logger.log_dir={tmp_path / 'sft_logs'}", *on_banking)  # fmt: skip
    steps = [json.loads(line) for line in (tmp_path / "sft_logs/metrics.jsonl").read_text().splitlines()]
    losses = [step["train/loss"] for step in steps if "train/loss" in step]
    assert len(losses) == 4 and losses[-1] < losses[0], losses
    assert _trained_on(tmp_path / "sft") == ("v1.0.1", "bm25_grep")
    played = (tmp_path / "sft_logs/validation/step_4/rollouts.jsonl").read_text().splitlines()
    assert [(r["task_id"], r["retrieval_variant"], r["status"]) for r in map(json.loads, played)] == [
        ("task_001", "bm25_grep", "ok")] * 2  # fmt: skip
    # RFT from the fine-tuned model; every episode kept (min_reward 0): the tiny policy rarely solves a banking task,
    # and what is checked is that a round samples, keeps and fine-tunes on its own banking episodes
    _script("run_rft.py", "--config", CONFIGS["rft"][0], f"policy.model_name={tmp_path / 'sft/final_hf'}",
            "data.train_split=base", "data.val_split=null", "rft.num_rounds=1", "rft.num_generations_per_prompt=4",
            "rft.num_epochs_per_round=2", "rft.val_at_start=false", "rft.min_reward=0.0",
            f"checkpointing.checkpoint_dir={tmp_path / 'rft'}", f"logger.log_dir={tmp_path / 'rft_logs'}",
            *on_banking)  # fmt: skip
    (round_1,) = [json.loads(line) for line in (tmp_path / "rft_logs/metrics.jsonl").read_text().splitlines()]
    assert round_1["train/rollout/num_episodes"] == 4 and round_1["train/rollout/num_infrastructure_errors"] == 0
    assert round_1["rft/num_kept"] >= 1 and round_1["train/loss"] > 0, round_1
    assert _trained_on(tmp_path / "rft") == ("v1.0.1", "bm25_grep")
    # the exported models say what they trained on (RFT's: its own tasks and those of the SFT model it started from);
    # an eval of RFT's model on task_001 and task_004 says which of them were not held out
    sft_record = json.loads((tmp_path / "sft/final_hf" / TRAINED_ON_FILE).read_text())
    assert sft_record == {"tau2_version": "v1.0.1", "retrieval_variant": "bm25_grep",
                          "train_tasks": [f"{DOMAIN}/task_001"]}  # fmt: skip
    assert json.loads((tmp_path / "rft/final_hf" / TRAINED_ON_FILE).read_text()) == sft_record
    printed = _script("run_eval.py", "--config", "examples/configs/evals/tau2_fake.yaml",
                      "policy.generation.backend=hf", f"+policy.generation.model_name={tmp_path / 'rft/final_hf'}",
                      "policy.generation.max_new_tokens=64", "data.split=base", "data.task_ids=[task_001,task_004]",
                      "eval.num_tests_per_prompt=1", "eval.k_values=[1]", f"eval.save_path={tmp_path / 'eval'}",
                      on_banking[0], *on_banking[3:], "++tau2.retrieval_variant=grep_only")  # fmt: skip
    found = json.loads((tmp_path / "eval/summary.json").read_text())["checkpoint_trained_on"]
    assert (found["num_eval_tasks"], found["eval_tasks_trained_on"]) == (2, [f"{DOMAIN}/task_001"])
    assert f"checkpoint: trained on 1 of these 2 tasks, not held out: {DOMAIN}/task_001 (" in printed
    assert "checkpoint: trained with retrieval variant bm25_grep, evaluated on grep_only" in printed
    report = (tmp_path / "eval/report.html").read_text()  # beside the scores in the report too
    assert f"checkpoint: trained on 1 of these 2 tasks, not held out: {DOMAIN}/task_001 (" in report


def test_full_kb_beyond_the_policys_context_is_refused_before_anything_starts_naming_variant_and_count(tmp_path):
    """full_kb puts the whole knowledge base in every system prompt: with the tiny policy (2048 positions) run_grpo.py
    refuses it in one line, exit 2, naming the variant and the token count, before a server or trainer starts (the
    release's own prompts: compact rows have a short prompt of their own); the same tasks on bm25_grep, compact,
    pass that check (the first row fits)."""
    smoke = validate_config(load_config(CONFIGS["grpo"][0]), GRPOMasterConfig)
    policy = build_tiny_policy(smoke.tiny_policy, grpo.load_rows(smoke)[0], tmp_path / "policy")
    release = ["++tau2.version=v1.0.1", f"++tau2.python={tau2_v1_python()}", f"data.domains=[{DOMAIN}]",
               "data.train_split=base", "data.val_split=null", "data.task_ids=[task_001,task_004]",
               f"policy.model_name={policy}", f"logger.log_dir={tmp_path / 'logs'}",
               f"checkpointing.checkpoint_dir={tmp_path / 'checkpoints'}"]  # fmt: skip
    full_kb = ["++tau2.retrieval_variant=full_kb", "data.compact_rows=false"]
    run = subprocess.run([sys.executable, "examples/run_grpo.py", "--config", CONFIGS["grpo"][0], *release, *full_kb],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert run.returncode == 2, run.stderr[-3000:]
    (line,) = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert re.fullmatch(
        r"error: every row's system prompt alone is beyond policy.max_total_sequence_length 2048 with "
        r"tau2.retrieval_variant full_kb \(the whole knowledge base in the system prompt\): [0-9,]{7,} tokens at the "
        r"shortest with .*: nothing could be trained on; use a retrieval variant that searches \(bm25_grep\) or "
        r"raise policy.max_total_sequence_length for a model with that context",
        line,
    ), line
    assert "Traceback" not in run.stderr and not (tmp_path / "logs" / "server_logs").exists()
    fits = _config("grpo", *release[3:])  # bm25_grep, the default, compact rows: the same tasks and policy
    rows = grpo.load_rows(fits)[0]
    assert [row["task_id"] for row in rows] == ["task_001", "task_004"]
    check_prompts_fit(fits.policy, fits.tau2.retrieval_variant, rows)  # its first row fits: no error
