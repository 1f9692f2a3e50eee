"""The data tools on tau2 v1.0.1, chosen by the runs' own ``tau2`` keys: prepare_data.py writes the release's rows
(its splits and tools, through its worker), SFT selection refuses the release's test split and rows of another
release; RFT samples the release's tasks and keeps its episodes; run_sft.py refuses rows of another release; and
Tau2Env (v0.2.1 in process only) refuses v1.0.1 in one line naming the key."""

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from nemo_tau2.algorithms import rft
from nemo_tau2.algorithms.rft_config import RFTMasterConfig
from nemo_tau2.algorithms.sft_data import ConversionReport, SFTDataError, select_rows, sft_row
from nemo_tau2.config import apply_overrides, load_config, validate_config
from nemo_tau2.env_api import Tau2Env
from nemo_tau2.experience.rollouts import RolloutResult
from nemo_tau2.gym.agent.episode_record import EpisodeStatus
from tests.tau2_v1_env import tau2_v1_python

ROOT = Path(__file__).resolve().parents[3]
DOMAINS = ("airline", "retail")
SFT_SMOKE = "examples/configs/sft_tau2_cpu_smoke.yaml"


def _prepare_data(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, str(ROOT / "examples/prepare_data.py"), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_prepare_data_writes_the_v101_releases_own_rows(worker, tmp_path):
    output = tmp_path / "rows.jsonl"
    done = _prepare_data(
        "--domains", ",".join(DOMAINS), "--split", "test", "--output", str(output), "tau2.version=v1.0.1",
        f"tau2.python={tau2_v1_python()}",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    expected = [(domain, task_id) for domain in DOMAINS for task_id in worker.request("splits", domain=domain)["test"]]
    assert [(row["domain"], row["task_id"]) for row in rows] == expected
    assert {row["tau2_version"] for row in rows} == {"v1.0.1"}
    retail_tools = {tool["name"] for tool in rows[-1]["responses_create_params"]["tools"]}
    assert "get_item_details" in retail_tools  # v1.0.1's new READ tool: the rows are the release's, not v0.2.1's


def test_a_misspelt_tau2_key_is_one_line_naming_it(tmp_path):
    done = _prepare_data("--domains", "airline", "--output", str(tmp_path / "rows.jsonl"), "tau2.versoin=v1.0.1")
    assert done.returncode == 2 and "tau2.versoin" in done.stderr and done.stderr.count("\n") == 1, done.stderr


def _rows(domain: str, task_ids: list[str], version: str) -> list[dict]:
    log = [{"role": "user", "token_ids": [1]}, {"role": "assistant", "token_ids": [2]}]
    return [
        sft_row(domain, task_id, log + [{"role": "user", "token_ids": [index + 3]}], reward=1.0, sample_index=0,
                source="rollout", tau2_version=version)
        for index, task_id in enumerate(task_ids)
    ]  # fmt: skip


def test_sft_selection_on_v101_refuses_its_test_split_and_rows_of_another_release(worker):
    splits = worker.request("splits", domain="retail")
    train, test = splits["train"][:2], splits["test"][:1]
    kept = select_rows(_rows("retail", train, "v1.0.1"), ConversionReport(), tau2=worker.config)
    assert [row["task_id"] for row in kept] == train and {row["tau2_version"] for row in kept} == {"v1.0.1"}
    with pytest.raises(SFTDataError, match=f"retail task {test[0]} is in tau2 v1.0.1's test split"):
        select_rows(_rows("retail", train + test, "v1.0.1"), ConversionReport(), tau2=worker.config)
    with pytest.raises(SFTDataError, match="played on tau2 v0.2.1, not tau2.version v1.0.1"):
        select_rows(_rows("retail", train, "v0.2.1"), ConversionReport(), tau2=worker.config)
    with pytest.raises(SFTDataError, match="played on tau2 v1.0.1, not tau2.version v0.2.1"):
        select_rows(_rows("retail", train, "v1.0.1"), ConversionReport())  # the default release is v0.2.1


def test_tau2env_refuses_v101_in_one_line_naming_the_key():
    with pytest.raises(ValueError, match="tau2.version v1.0.1: Tau2Env runs tau2 in this process") as error:
        Tau2Env("airline", split="test", user={"backend": "fake"}, tau2={"version": "v1.0.1"})
    assert "\n" not in str(error.value)


def _rft_config(*overrides: str):
    raw = apply_overrides(
        load_config(ROOT / "examples/configs/rft_tau2_cpu_smoke.yaml"),
        ["data.domains=[airline]", "data.train_split=train", "data.val_split=test", "data.task_ids=null", *overrides],
    )
    return validate_config(raw, RFTMasterConfig)


def _result(task_id: str, sample: int, version: str) -> RolloutResult:
    return RolloutResult(
        row_index=sample, group_index=0, sample_index=sample, domain="airline", task_id=task_id,
        status=EpisodeStatus.OK, reward=1.0, success=True, tau2_version=version,
        reward_components={"action_match_fraction": 1.0, "env_assertion_fraction": None, "communicate_fraction": 1.0},
        message_log=[{"role": "user", "token_ids": [1, 2]}, {"role": "assistant", "token_ids": [3 + sample]}],
    )  # fmt: skip


def test_rft_on_v101_samples_the_releases_tasks_and_keeps_its_episodes(worker):
    cfg = _rft_config("++tau2.version=v1.0.1", f"++tau2.python={tau2_v1_python()}")
    train_rows, val_rows = rft.load_rows(cfg)
    splits = worker.request("splits", domain="airline")
    assert [row["task_id"] for row in train_rows] == splits["train"]
    assert [row["task_id"] for row in val_rows] == splits["test"]
    assert {row["tau2_version"] for row in train_rows + val_rows} == {"v1.0.1"}
    results = [_result(splits["train"][0], 0, "v1.0.1"), _result(splits["train"][1], 1, "v1.0.1")]
    kept, _ = rft.keep(SimpleNamespace(cfg=cfg), results)
    assert [row["task_id"] for row in kept] == splits["train"][:2] and {row["tau2_version"] for row in kept} == {
        "v1.0.1"
    }
    with pytest.raises(SFTDataError, match="not tau2.version v0.2.1"):  # a v0.2.1 run given v1.0.1 episodes
        rft.keep(SimpleNamespace(cfg=_rft_config()), results)


def test_run_sft_refuses_rows_of_another_release_in_one_line_naming_the_key(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(row) + "\n" for row in _rows("airline", ["1"], "v0.2.1")))
    command = [
        sys.executable, str(ROOT / "examples/run_sft.py"), "--config", str(ROOT / SFT_SMOKE),
        f"data.train_data_path={rows}", f"data.val_data_path={rows}", f"logger.log_dir={tmp_path / 'logs'}",
        "++tau2.version=v1.0.1", f"++tau2.python={tau2_v1_python()}",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "data.train_data_path: the rows are of tau2 ['v0.2.1'], not tau2.version v1.0.1" in done.stderr
    assert done.stderr.strip().count("\n") == 0, done.stderr
