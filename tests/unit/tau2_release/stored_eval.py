"""The stored-rollout tools' eval: tau2 v1.0.1 over all four domains on the fake servers (the scripted oracle plays
each task's gold actions, the scripted user its scenario, the scripted judge grades), one episode per task, and a
judge that gives no verdict on one retail NL task (that episode an infrastructure error, its trajectory kept). And
how the tests run NeMo-Gym 0.7.0's and tau2 v1.0.1's CLIs, each from its own environment."""

import os
import subprocess
import tempfile
from pathlib import Path

from omegaconf import OmegaConf

from nemo_tau2.config import apply_overrides, load_config
from nemo_tau2.evals.eval import run_eval, setup_eval
from tests.env_python import environment_python
from tests.tau2_v1_env import tau2_v1_python
from tests.unit.tau2_release.worker_episodes import JUDGE_ATTEMPTS

ROOT = Path(__file__).resolve().parents[3]
FAKE = "examples/configs/evals/tau2_fake.yaml"
DOMAINS = ["airline", "retail", "telecom", "banking_knowledge"]
TELECOM_TASK = "[service_issue]airplane_mode_on|lock_sim_card_pin[PERSONA:Easy]"
FAULTY_NL_TASK = "60"  # retail 60's NL assertion names this price: the judge gives no verdict on it
FAULTY_NL_ASSERTION = "$242.92"
# airline 2 and 5, retail 2 (NL) and 5 and 60 (the judge's outage), the telecom task, banking's task_001
TASK_IDS = ["2", "5", TELECOM_TASK, "task_001", FAULTY_NL_TASK]


def run_stored_eval(
    save: Path, judge, release_tasks: Path, task_ids: list[str] | None = TASK_IDS, faulty_judge: bool = True
) -> dict:
    """The eval into ``save`` (``task_ids`` None: every base task of the four domains; ``faulty_judge`` false: the
    judge grades every task); returns its summary."""
    raw = apply_overrides(
        load_config(FAKE),
        [
            f"eval.save_path={save}",
            "eval.num_tests_per_prompt=1",
            "eval.k_values=[1]",
            "eval.bootstrap_samples=0",
            "data.split=base",
            "logger.report=false",
            "++tau2.version=v1.0.1",
            f"++tau2.python={tau2_v1_python()}",
            "++tau2.judge.model=scripted-judge",
            f"++tau2.judge.base_url={judge.base_url}",
            f"++tau2.judge.max_attempts={JUDGE_ATTEMPTS}",
            f"++policy.generation.fake_cfg.tau2.release_tasks={release_tasks}",
            f"++user.generation.fake_cfg.tau2.release_tasks={release_tasks}",
        ],
    )
    raw.data.domains = OmegaConf.create(DOMAINS)
    raw.data.task_ids = OmegaConf.create(task_ids) if task_ids else None  # ids with brackets and pipes: set
    judge.inject("invalid_json", count=1000 if faulty_judge else 0, when=FAULTY_NL_ASSERTION)  # every attempt
    try:
        summary, _ = run_eval(setup_eval(raw), raw)
    finally:
        judge.inject("invalid_json", count=0)
    return summary


# ==================================================================== the CLIs, run as their users run them


def gym07() -> Path:
    return Path(environment_python("NEMO_TAU2_GYM07_PYTHON", "gym07", "NeMo-Gym 0.7.0 (Python 3.13)"))


def tau2_cli() -> Path:
    return Path(tau2_v1_python()).parent / "tau2"


def environment(**extra: str) -> dict[str, str]:
    return os.environ | {"PYTHONPATH": str(ROOT), "LITELLM_LOCAL_MODEL_COST_MAP": "True"} | extra


def start(command: list, cwd: Path = ROOT, stdin: str | None = None, **env: str) -> subprocess.Popen:
    """Start a command, its output into a file (a pipe would be held open by what it leaves running: Ray's
    daemons outlive ``gym eval reverify`` by a moment)."""
    handle, log = tempfile.mkstemp(prefix="stored_rollout_tools.", suffix=".log")
    with os.fdopen(handle, "w") as output:  # the child keeps its own copy of the descriptor
        process = subprocess.Popen(
            [str(part) for part in command],
            cwd=cwd,
            env=environment(**env),
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            text=True,
        )
    process.log = Path(log)  # type: ignore[attr-defined]
    return process


def finish(process: subprocess.Popen, stdin: str | None = None, ok: bool = True) -> str:
    """Wait for a command started by :func:`start`; its output (asserting exit 0 unless ``ok`` is false)."""
    if stdin is not None:
        process.stdin.write(stdin)
        process.stdin.close()
    try:
        process.wait(timeout=600)
    finally:
        process.kill()
    output = process.log.read_text(errors="replace")
    process.log.unlink()
    if ok:
        assert process.returncode == 0, f"{process.args}:\n{output[-6000:]}"
    return output
