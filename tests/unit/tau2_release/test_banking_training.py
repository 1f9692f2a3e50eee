"""Training on banking_knowledge, which tau2 gives no train/test split: GRPO, RFT and SFT refuse a split tau2 does
not have, in one line naming both ways out (a split of ours, or an explicit list); a split of ours
(``ours_seed<N>_train``/``_test``) is disjoint, covers the domain, is the same on every call and differs by seed;
GRPO's rows of it come from the release (the variant's prompt and tools), each saying its split and variant."""

import json

import pytest

from nemo_tau2.algorithms import grpo
from nemo_tau2.algorithms.grpo_config import GRPOMasterConfig
from nemo_tau2.algorithms.rft_config import RFTMasterConfig
from nemo_tau2.algorithms.sft_config import SFTMasterConfig
from nemo_tau2.config import ConfigError, apply_overrides, load_config, validate_config
from nemo_tau2.tau2_env import domains
from nemo_tau2.tau2_env.own_splits import own_split_ids
from nemo_tau2.testing.warm_start import build_tiny_policy
from tests.tau2_v1_env import tau2_v1_python

DOMAIN = "banking_knowledge"
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
