"""The stored-rollout tools' eval: tau2 v1.0.1 over all four domains on the fake servers (the scripted oracle plays
each task's gold actions, the scripted user its scenario, the scripted judge grades), one episode per task, and a
judge that gives no verdict on one retail NL task (that episode an infrastructure error, its trajectory kept)."""

from pathlib import Path

from omegaconf import OmegaConf

from nemo_tau2.config import apply_overrides, load_config
from nemo_tau2.evals.eval import run_eval, setup_eval
from tests.tau2_v1_env import tau2_v1_python
from tests.unit.tau2_release.worker_episodes import JUDGE_ATTEMPTS

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
