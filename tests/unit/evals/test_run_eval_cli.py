"""The entry points' front door as a user meets it: one-line errors (exit 2, nothing written), the default config
found from any directory, and a rerun with nothing left to do that starts no server."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_tau2.config import apply_overrides, load_config
from nemo_tau2.evals.eval import run_eval, setup_eval

ROOT = Path(__file__).resolve().parents[3]
RUN_EVAL = ROOT / "examples" / "run_eval.py"
FAKE = ROOT / "examples" / "configs" / "evals" / "tau2_fake.yaml"
DEMO = ROOT / "examples" / "configs" / "evals" / "tau2_cpu_demo.yaml"


def _run(script: Path, *args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, cwd=cwd, timeout=timeout
    )


def _assert_one_line_user_error(result: subprocess.CompletedProcess, *needles: str) -> None:
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    for needle in needles:
        assert needle in errors[0], errors[0]


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--config", "nowhere.yaml"], ["config file not found", "pass --config"]),
        (["data.split=tset"], ["data.split:", "has no split 'tset'", "set data.split to one of them"]),
        (["eval.num_tests_per_prompt=1"], ["k_values [1, 2, 4]", "add the override eval.k_values=[1]"]),
        (["+generation={backend: fake}"], ["generation and policy.generation: both set"]),
        (["data.task_ids=[nope]", "data.domains=[airline]"], ["data.task_ids: not found", "data.task_ids=null"]),
        (["data.data_path=missing.jsonl"], ["data.data_path: no such file", "examples/prepare_data.py"]),
        (
            ["eval.rollout_mode=single_turn", "user=null", "env.nemo_gym=null", "+eval.verifier=contains"],
            ["data.domains=null"],
        ),
    ],
    ids=[
        "missing-config",
        "unknown-split",
        "leftover-k-values",
        "two-generation-blocks",
        "task-ids",
        "rows-file",
        "mode-switch",
    ],
)
def test_user_errors_are_one_line_with_the_fix_exit_2_and_write_nothing(tmp_path, args, needles):
    save = tmp_path / "results"
    if args[0] != "--config":
        args = ["--config", str(FAKE), *args]
    result = _run(RUN_EVAL, *args, f"eval.save_path={save}", cwd=tmp_path)
    _assert_one_line_user_error(result, *needles)
    assert not save.exists()


def test_the_default_config_is_found_from_another_directory_and_a_finished_run_starts_nothing(tmp_path):
    """The mission's line, run elsewhere: it must load tau2_cpu_demo.yaml beside the script. Its episodes are done
    already (played by the fake backend on the same tasks), so it must say so and exit without starting servers."""
    save = tmp_path / "demo"
    demo = load_config(DEMO)
    overrides = [
        f"eval.save_path={save}",
        "eval.bootstrap_samples=0",
        "policy.generation={backend: fake, temperature: 1.0, top_p: 1.0, fake_cfg: {}}",
        "user.generation={backend: fake, temperature: 0.0, top_p: 1.0, fake_cfg: {}}",
    ]
    raw = apply_overrides(demo, overrides)
    run_eval(setup_eval(raw), raw)
    shutil.rmtree(save / "server_logs")

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = _run(RUN_EVAL, "eval.rollout_mode=nemo_gym", f"eval.save_path={save}", cwd=elsewhere, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"config: {DEMO}" in result.stderr
    assert "nothing left to do: all 4 episodes are already done" in result.stderr
    assert not (save / "server_logs").exists()  # no server was started
    assert json.loads((save / "summary.json").read_text())["metrics"]["eval/overall/num_episodes"] == 4


def test_a_partly_done_run_says_how_much_is_resumed(tmp_path):
    save = tmp_path / "out"
    raw = apply_overrides(
        load_config(FAKE),
        [f"eval.save_path={save}", "data.domains=[airline]", "data.num_tasks=1", "eval.bootstrap_samples=0"],
    )
    run_eval(setup_eval(raw), raw)
    lines = (save / "rollouts.jsonl").read_text().splitlines(keepends=True)
    (save / "rollouts.jsonl").write_text("".join(lines[:3]))  # one of the four episodes is lost
    result = _run(
        RUN_EVAL,
        "--config",
        str(FAKE),
        f"eval.save_path={save}",
        "data.domains=[airline]",
        "data.num_tasks=1",
        "eval.bootstrap_samples=0",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resuming: 3 of 4 episodes already done" in result.stderr
    assert f"report: {save / 'report.html'}" in result.stdout  # logger.report is on by default
    assert "Evaluation: out" in (save / "report.html").read_text()
    (save / "report.html").unlink()
    off = _run(RUN_EVAL, "--config", str(FAKE), f"eval.save_path={save}", "data.domains=[airline]",
               "data.num_tasks=1", "eval.bootstrap_samples=0", "logger.report=false", cwd=tmp_path)  # fmt: skip
    assert off.returncode == 0 and "report:" not in off.stdout and not (save / "report.html").exists()


def _torch_checkpoint(checkpoints: Path, step: int) -> None:
    """The files of a torch-backend checkpoint of ``step`` (empty: the runs below refuse or finish before reading)."""
    folder = checkpoints / f"step_{step}"
    (folder / "policy").mkdir(parents=True)
    for name in ("policy/.metadata", "scheduler.pt", "rng_state.pt"):
        (folder / name).touch()
    (folder / "trainer_state.json").write_text(json.dumps({"step": step}))


def test_grpo_with_its_last_step_checkpointed_starts_nothing(tmp_path):
    _torch_checkpoint(tmp_path / "checkpoints", 3)
    result = _run(
        ROOT / "examples" / "run_grpo.py",
        "--config",
        str(ROOT / "examples" / "configs" / "grpo_tau2_cpu_smoke.yaml"),
        "grpo.max_num_steps=3",
        f"checkpointing.checkpoint_dir={tmp_path / 'checkpoints'}",
        f"logger.log_dir={tmp_path / 'logs'}",
        f"policy.model_name={tmp_path / 'tiny'}",
        cwd=tmp_path,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "nothing left to do: step 3 of grpo.max_num_steps=3 is done" in result.stderr
    assert not (tmp_path / "logs").exists() and not (tmp_path / "tiny").exists()  # no server, no model, no files


def test_grpo_on_the_megatron_backend_refuses_a_torch_checkpoint_in_one_line(tmp_path):
    _torch_checkpoint(tmp_path / "checkpoints", 2)
    result = _run(
        ROOT / "examples" / "run_grpo.py",
        "--config",
        str(ROOT / "examples" / "configs" / "grpo_tau2_cpu_smoke.yaml"),
        "policy.megatron_cfg.enabled=true",
        f"checkpointing.checkpoint_dir={tmp_path / 'checkpoints'}",
        f"logger.log_dir={tmp_path / 'logs'}",
        f"policy.model_name={tmp_path / 'tiny'}",
        cwd=tmp_path,
        timeout=240,
    )
    _assert_one_line_user_error(result, "written by the torch backend (policy/)", "checkpointing.checkpoint_dir")
    assert not (tmp_path / "logs").exists() and not (tmp_path / "tiny").exists()  # refused before anything started


def test_grpo_unknown_split_is_one_line(tmp_path):
    result = _run(
        ROOT / "examples" / "run_grpo.py",
        "--config",
        str(ROOT / "examples" / "configs" / "grpo_tau2_cpu_smoke.yaml"),
        "data.train_split=tset",
        f"checkpointing.checkpoint_dir={tmp_path / 'checkpoints'}",
        f"logger.log_dir={tmp_path / 'logs'}",
        cwd=tmp_path,
        timeout=240,
    )
    _assert_one_line_user_error(result, "has no split 'tset'", "data.train_split")
    assert not (tmp_path / "logs").exists()
