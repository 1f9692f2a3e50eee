"""Progress off a terminal: plain lines at an interval (no carriage returns), saying what a start-up waits for."""

import io
import logging
import re
import subprocess
import sys
import time
from pathlib import Path

from nemo_tau2.evals.progress_display import WAITING, EpisodeProgress, StepProgress
from nemo_tau2.experience.progress import RolloutProgress

ROOT = Path(__file__).resolve().parents[3]


def test_off_a_terminal_each_line_says_done_running_turns_errors_and_rate(caplog):
    with (
        caplog.at_level(logging.INFO, logger="nemo_tau2.evals.progress_display"),
        EpisodeProgress(total=4, done=1, stream=io.StringIO(), interval_s=0.0) as progress,
    ):
        progress.on_progress(RolloutProgress(4, 1, 3, 1.0, policy_turns=0, user_turns=0, generation_tokens=0))
        progress.on_progress(RolloutProgress(4, 1, 3, 2.0, policy_turns=6, user_turns=2, generation_tokens=90))
        progress.update(ok=True, success=True)
        progress.update(ok=False, success=False)
    lines = [record.getMessage() for record in caplog.records]
    assert lines[0].startswith("episodes 1/4 (pass=-), " + WAITING + ", infra_errors=0, ")
    assert lines[1].startswith("episodes 1/4 (pass=-), 3 running, 6 turns, 45 tok/s, infra_errors=0, ")
    assert lines[-1].startswith("episodes 3/4 (pass=100.0%), ") and "infra_errors=1" in lines[-1]
    assert all(line.endswith(" ep/s") for line in lines)


def test_grpo_lines_say_steps_the_rollout_inside_the_step_infra_errors_and_rates(caplog):
    with (
        caplog.at_level(logging.INFO, logger="nemo_tau2.evals.progress_display"),
        StepProgress(total=4, done=1, stream=io.StringIO(), interval_s=0.0) as progress,
    ):
        progress.on_progress(RolloutProgress(16, 0, 16, 1.0, policy_turns=0, user_turns=0, generation_tokens=0))
        progress.on_progress(RolloutProgress(16, 8, 8, 4.0, policy_turns=30, user_turns=9, generation_tokens=400))
        progress.step_done(infra_errors=2)
        progress.on_progress(RolloutProgress(16, 0, 16, 0.5, policy_turns=0, user_turns=0, generation_tokens=0))
        progress.step_done(infra_errors=1)
    lines = [record.getMessage() for record in caplog.records]
    assert lines[0] == f"steps 1/4, {WAITING}, infra_errors=0"
    assert lines[1] == "steps 1/4, rollouts 8/16, 8 running, 30 turns, 100 tok/s, 2.00 rollouts/s, infra_errors=0"
    assert re.fullmatch(r"steps 2/4, infra_errors=2, \d+ s/step", lines[2])
    assert lines[3].startswith("steps 2/4, rollouts 0/16, 16 running, 0 turns, ")  # not waiting: a model answered
    assert re.fullmatch(r"steps 3/4, infra_errors=3, \d+ s/step", lines[-1])


def test_lines_come_at_most_once_per_interval(caplog):
    with (
        caplog.at_level(logging.INFO, logger="nemo_tau2.evals.progress_display"),
        EpisodeProgress(total=100, done=0, stream=io.StringIO(), interval_s=3600) as progress,
    ):
        for _ in range(100):
            progress.update(ok=True, success=False)
    assert [record.getMessage().split(",")[0] for record in caplog.records] == ["episodes 100/100 (pass=0.0%)"]


def test_an_eval_logged_to_a_file_has_no_carriage_returns_and_few_lines(tmp_path):
    log = tmp_path / "eval.log"
    started = time.monotonic()
    with log.open("wb") as out:
        done = subprocess.run(
            [sys.executable, str(ROOT / "examples/run_eval.py"), "--config"]
            + [str(ROOT / "examples/configs/evals/tau2_fake.yaml"), f"eval.save_path={tmp_path / 'out'}"]
            + ["data.domains=[airline]", "data.num_tasks=5", "eval.bootstrap_samples=0"],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
            timeout=600,
        )
    elapsed = time.monotonic() - started
    text = log.read_bytes()
    assert done.returncode == 0, text[-3000:]
    assert b"\r" not in text
    progress_lines = [line for line in text.decode().splitlines() if re.match(r"episodes \d+/\d+ \(", line)]
    assert progress_lines[-1].startswith("episodes 20/20 (pass=100.0%)")
    assert len(progress_lines) <= elapsed / 30 + 2
