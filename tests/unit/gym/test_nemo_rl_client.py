"""NeMo-RL's own code trains and evaluates on our servers, on the NeMo-Gym commit NeMo-RL pins (c3bac96, Python 3.13,
openai 2.6.1, ray 2.56.1), unmodified: NeMo-RL at 7ea279a from ../shared/vendor, in the environment
``scripts/setup.sh nemo-rl`` builds, runs the shipped examples/configs/nemo_rl/ files through its own config loader,
starts our servers through its ``NemoGym`` actor (NeMo-Gym builds each server's venv: ours resolve beside that Gym,
which ``nemo-gym==0.7.0`` made unsatisfiable), converts every episode with its contiguity assert and turns them into
GRPO's batch (nemo_rl_driver.py says what is stood in and why). From a working directory that is not the project
root, as docs/nemo-rl.md types it: rows from examples/prepare_data.py, ``NEMO_GYM_EXTRA_ROOTS`` naming the checkout.

Four runs in one NeMo-RL process, on one checkout (its imports, Ray and our servers' venvs once: the episode configs
had a process and a checkout of their own, 176 s of set-up on the CI box, issue 58): PivotRL through NeMo-RL's own
GRPO (grpo_tau2_pivot.yaml on the tau2_pivot environment), GRPO on tau2 v0.2.1 with the oracle (two samples of one
task per domain), the v1.0.1 eval (trajectory collection, tau2 v1.0.1's own scoring through our worker), and GRPO on
banking_knowledge (grpo_tau2_banking.yaml: a task of our own seeded split on bm25_grep, its retrieval recorded); and
every shipped config against NeMo-RL's own GRPO config. A real model's episode, on NeMo-Gym 0.4.0, runs in
test_nemo_rl_client_gym04.py."""

import re
import shutil

import pytest

from nemo_tau2.generation.smollm2 import smollm2_hf_dir
from nemo_tau2.tau2_release.client import Tau2Worker
from nemo_tau2.tau2_release.config import Tau2ReleaseConfig
from nemo_tau2.testing import start_fake_server
from nemo_tau2.testing.release_tasks import write_release_tasks
from tests.env_python import environment_python
from tests.tau2_v1_env import tau2_v1_python
from tests.unit.gym.cli_shell import ROOT, clean_copy, uv_cache_dir
from tests.unit.gym.nemo_rl_client import (
    CONFIGS,
    Run,
    check_metric_keys,
    machine_overrides,
    nemo_rl_environment,
    oracle_batch,
    prepare_rows,
    run_nemo_rl,
)

PIVOT_EXAMPLE = ROOT / "resources_servers" / "tau2_pivot" / "data" / "example.jsonl"
V1_TASKS = "5,[service_issue]airplane_mode_on|lock_sim_card_pin[PERSONA:Easy]"  # airline 5, retail 5, telecom
BANKING = "banking_knowledge"


@pytest.fixture(scope="module")
def nemo_rl_runs(tmp_path_factory):
    python = environment_python("NEMO_TAU2_NEMO_RL_PYTHON", "nemo-rl", "NeMo-RL on its pinned NeMo-Gym (Python 3.13)")
    checkout = clean_copy(tmp_path_factory.mktemp("nemo-tau2"))
    workdir = tmp_path_factory.mktemp("nemo-rl-run")  # where the user runs NeMo-RL: not our project root
    v1_python = tau2_v1_python()
    (workdir / "data" / "tau2_pivot").mkdir(parents=True)
    for split in ("train", "test"):  # the tau2_pivot environment's own example pivots
        shutil.copy(PIVOT_EXAMPLE, workdir / "data" / "tau2_pivot" / f"{split}.jsonl")
    # NeMo-RL's data setup reads a train and a validation file; what is played is the validation rows, so the train
    # file is the same rows (one release's worker start fewer)
    prepare_rows(workdir, "data/tau2/test.jsonl", "--split", "test", "--num-tasks", "1")
    # v1.0.1 tasks whose gold v1.0.1 left as v0.2.1 had it (the scripted oracle plays v0.2.1's gold)
    prepare_rows(workdir, "data/tau2_v1/test.jsonl", "--split", "base", "--task-ids", V1_TASKS,
                 "tau2.version=v1.0.1", f"tau2.python={v1_python}")  # fmt: skip
    # banking_knowledge as grpo_tau2_banking.yaml's comment types it: the first task of our seeded test split
    prepare_rows(workdir, "data/banking/test.jsonl", "--domains", BANKING, "--split", "ours_seed0_test",
                 "--num-tasks", "1", "tau2.version=v1.0.1", "tau2.retrieval_variant=bm25_grep",
                 f"tau2.python={v1_python}")  # fmt: skip
    for release in ("tau2", "tau2_v1", "banking"):
        shutil.copy(workdir / "data" / release / "test.jsonl", workdir / "data" / release / "train.jsonl")
    base = machine_overrides(smollm2_hf_dir(), uv_cache_dir())
    with Tau2Worker(Tau2ReleaseConfig(version="v1.0.1", python=v1_python)) as worker:  # the oracle plays its gold
        banking = {BANKING: worker.request("tasks", domain=BANKING, split=None)}
    scripts = {"release_tasks": str(write_release_tasks(workdir / "banking_tasks.json", banking))}
    # the first run builds the servers' venvs as NeMo-Gym does by default; the later ones find them built
    built = "++env.nemo_gym.skip_venv_if_present=true"
    with start_fake_server(mode="subprocess", tau2=scripts) as fake:
        runs = [
            Run("grpo_pivot_oracle", str(CONFIGS / "grpo_tau2_pivot.yaml"), fake.base_url,
                [*base, "grpo.val_num_generations_per_prompt=2"]),
            Run("grpo_v021_oracle", str(CONFIGS / "grpo_tau2.yaml"), fake.base_url,
                [*base, "grpo.val_num_generations_per_prompt=2", built]),
            Run("eval_v101_oracle", str(CONFIGS / "eval_tau2_v1.yaml"), fake.base_url,
                [*base, "data.validation.repeat=1", built]),
            Run("grpo_banking_oracle", str(CONFIGS / "grpo_tau2_banking.yaml"), fake.base_url,
                [*base, "grpo.val_num_generations_per_prompt=2", built]),
        ]  # fmt: skip
        env = nemo_rl_environment(
            python,
            NEMO_GYM_EXTRA_ROOTS=str(checkout),
            NEMO_TAU2_TAU2_V1_PYTHON=v1_python,
            USER_SIM_BASE_URL=fake.base_url,  # the scripted user (the shipped configs read these three)
            USER_SIM_MODEL="fake-model",
            USER_SIM_API_KEY="EMPTY",
        )
        configs = sorted(str(path) for path in CONFIGS.glob("*.yaml"))
        return run_nemo_rl(python, runs, workdir, workdir / "summary.json", env, configs) | {"_checkout": checkout}


def test_grpo_on_tau2_pivots_plays_one_turn_per_pivot_scored_in_a_fork(nemo_rl_runs):
    """grpo_tau2_pivot.yaml through the tau2_pivot environment: each pivot (resources_servers/tau2_pivot's example: the
    first two calls of airline 7's and retail 0's gold) one policy turn, scored by /verify_pivot. The oracle answers
    a new conversation with the task's first gold call: right at each task's first pivot, wrong at its second."""
    run = nemo_rl_runs["grpo_pivot_oracle"]
    assert not run["is_trajectory_collection"] and run["validation_rows"] == 4
    (batch,) = run["batches"]
    assert batch["batch_size"] == 8 and sorted(batch["rewards"]) == [0.0] * 4 + [1.0] * 4, batch["rewards"]
    assert batch["loss_mask_tokens"] == batch["generated_tokens"] and all(n > 0 for n in batch["generated_tokens"])
    assert batch["logprobs_outside_mask"] == 0.0 and batch["sample_mask"] == [1.0] * 8
    assert all(episode["turns"] == 1 for episode in batch["episodes"])  # one turn, its tokens trained
    check_metric_keys(batch)
    # the servers NeMo-Gym installed beside the pinned commit resolved nemo-gym to a release that accepts its openai
    log = nemo_rl_runs["_log"]
    assert "+ nemo-gym==0.5.1" in log and "unsatisfiable" not in log
    # and our servers' venvs got filelock below 3.30, which installs no audit hook: our dependency carries the bound
    # wherever NeMo-Gym builds them (NeMo-Gym's own model server, which copies no tau2 state, gets what it resolves)
    filelocks = _filelocks_in_server_venvs(nemo_rl_runs["_checkout"])
    ours = ["resources_servers/tau2", "resources_servers/tau2_pivot", "responses_api_agents/tau2_agent"]
    assert sorted(filelocks) == ours, filelocks
    assert all(len(found) == 1 and found[0] < (3, 30) for found in filelocks.values()), filelocks


def _filelocks_in_server_venvs(checkout) -> dict[str, list[tuple[int, int]]]:
    """Each server folder's venv (built by NeMo-Gym in the checkout's copy): the filelock releases installed there."""
    found = {}
    for site in checkout.glob("*/*/.venv/lib/python3.*/site-packages"):
        infos = site.glob("filelock-*.dist-info")
        versions = [re.match(r"filelock-(\d+)\.(\d+)", info.name).groups() for info in infos]
        found[str(site.parents[3].relative_to(checkout))] = [(int(major), int(minor)) for major, minor in versions]
    return found


def test_the_shipped_configs_have_every_key_nemo_rls_own_grpo_config_has(nemo_rl_runs):
    """NeMo-RL reads its config with [] throughout setup(): a key of its own example that ours lacks is a KeyError on
    a GPU node. Left out: the subtrees of backends these configs do not use (Megatron, its generation, NIXL refit, the
    data plane, distillation) and the math example's own data and environment keys. (Each config also passed
    NeMo-RL's MasterConfig validation there.)"""
    missing = nemo_rl_runs["_missing_keys"]
    assert sorted(missing) == sorted(str(path) for path in CONFIGS.glob("*.yaml")) and len(missing) == 6
    unused_here = ("policy.megatron_cfg.", "policy.generation.mcore_generation_config", "policy.generation.refit_cfg",
                   "data_plane", "on_policy_distillation", "env.math", "data.train.")  # fmt: skip
    for path, keys in missing.items():
        assert [key for key in keys if not key.startswith(unused_here)] == [], path


def test_grpo_on_tau2_v021_with_the_oracle_converts_every_turn_and_batches(nemo_rl_runs):
    # three tasks, two samples each
    batch = oracle_batch(nemo_rl_runs["grpo_v021_oracle"], collection=False, rows=3, episodes=6)
    assert sorted({e["domain"] for e in batch["episodes"]}) == ["airline", "retail", "telecom"]
    # the servers NeMo-Gym installed beside the pinned commit resolved nemo-gym to a release that accepts its openai
    log = nemo_rl_runs["_log"]
    assert "+ nemo-gym==0.5.1" in log and "unsatisfiable" not in log


def test_the_v101_eval_is_tau2_v101s_scoring_through_nemo_rls_trajectory_collection(nemo_rl_runs):
    oracle_batch(nemo_rl_runs["eval_v101_oracle"], collection=True, rows=3, episodes=3)


def test_grpo_on_banking_knowledge_plays_a_task_of_our_split_with_its_retrieval_recorded(nemo_rl_runs):
    """The shipped banking config as NeMo-RL runs it: its rows (our seeded split, bm25_grep) through its NemoGym
    actor, the oracle's episodes scored 1.0 by tau2 v1.0.1, each carrying its variant and what its searches found."""
    episodes = oracle_batch(nemo_rl_runs["grpo_banking_oracle"], collection=False, rows=1, episodes=2)["episodes"]
    assert {(e["domain"], e["retrieval_variant"]) for e in episodes} == {(BANKING, "bm25_grep")}
    assert len({e["task_id"] for e in episodes}) == 1
    found = {"searches", "documents_found", "document_recall", "tools_unlocked", "unlock_recall"}
    assert all(found <= set(e["retrieval_keys"]) for e in episodes), episodes
