"""Training on banking_knowledge, which tau2 gives no train/test split: GRPO, RFT and SFT refuse a split tau2 does
not have, in one line naming both ways out (a split of ours, or an explicit list); a split of ours
(``ours_seed<N>_train``/``_test``) is disjoint, covers the domain, is the same on every call and differs by seed;
GRPO's rows of it come from the release (the variant's prompt and tools), each saying its split and variant."""

import pytest

from nemo_tau2.algorithms import grpo
from nemo_tau2.algorithms.grpo_config import GRPOMasterConfig
from nemo_tau2.algorithms.rft_config import RFTMasterConfig
from nemo_tau2.algorithms.sft_config import SFTMasterConfig
from nemo_tau2.config import ConfigError, apply_overrides, load_config, validate_config
from nemo_tau2.tau2_env import domains
from nemo_tau2.tau2_env.own_splits import own_split_ids
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
