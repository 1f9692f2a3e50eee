"""The report tests' evaluations: real ones on the fake generation backend (real Gym servers, real tau2), an oracle
and a policy that gets a write action's argument wrong in every other sample."""

import json
from pathlib import Path

from nemo_tau2.config import apply_overrides, load_config
from nemo_tau2.evals.eval import run_eval, setup_eval
from nemo_tau2.tau2_env.gym_rows import task_row

ROOT = Path(__file__).resolve().parents[3]
FAKE = ROOT / "examples" / "configs" / "evals" / "tau2_fake.yaml"
# airline/2 and retail/5 fail when their write action gets a wrong argument; airline/6 has no write action to get
# wrong (the fake's answer is an error: an infrastructure error), retail/12 succeeds all the same.
TASKS = [("airline", "2"), ("airline", "6"), ("retail", "5"), ("retail", "12")]
WRONG_EVERY_OTHER = "{tau2: {policy: {variant: wrong_argument, variant_every: 2}}}"


def records(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "rollouts.jsonl").read_text().splitlines() if line.strip()]


def run_eval_pair(root: Path) -> tuple[Path, Path]:
    """Run both evaluations under ``root``; returns their folders (oracle, wrong every other)."""
    rows = root / "rows.jsonl"
    rows.write_text("".join(json.dumps(task_row(domain, task_id)) + "\n" for domain, task_id in TASKS))

    def evaluate(name: str, fake_cfg: str) -> Path:
        raw = apply_overrides(
            load_config(FAKE),
            [
                f"eval.save_path={root / name}",
                f"data.data_path={rows}",
                "eval.num_tests_per_prompt=2",
                "eval.k_values=[1,2]",
                "eval.bootstrap_samples=50",
                f"policy.generation.fake_cfg={fake_cfg}",
            ],
        )
        run_eval(setup_eval(raw), raw)
        return root / name

    return evaluate("oracle", "{}"), evaluate("wrong_every_other", WRONG_EVERY_OTHER)
