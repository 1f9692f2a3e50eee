"""The whole evaluation against the scripted fake model server answering at 0 ms: wall time, episodes/s, per-turn
overhead.

Runs ``examples/run_eval.py``'s code path (config validation, environment start-up, rollouts, resumable JSONL,
metrics) with ``examples/configs/evals/tau2_fake.yaml`` on tau2's test split (20 airline + 40 retail + 40 telecom
tasks) x 4 samples = 400 episodes. Start-up (servers) and the episodes are timed apart.

    uv run bench/eval_speed.py [--samples 4] [--concurrency 64]
"""

import argparse
import json
import tempfile
import time
from pathlib import Path

import nemo_tau2  # noqa: F401  (offline settings before tau2 loads litellm)
from nemo_tau2.config import apply_overrides, load_config
from nemo_tau2.evals import eval as evaluation
from nemo_tau2.gym.environment import Tau2Environment

TARGET_S = 60.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    save_path = tempfile.mkdtemp(prefix="eval_speed_")
    raw = apply_overrides(
        load_config("examples/configs/evals/tau2_fake.yaml"),
        [
            f"eval.save_path={save_path}",
            f"eval.num_tests_per_prompt={args.samples}",
            "eval.k_values=[1]",
            f"eval.max_concurrency={args.concurrency}",
            "eval.bootstrap_samples=0",
            "env.nemo_gym.return_token_ids=false",
        ],
    )
    cfg = evaluation.setup_eval(raw)

    startup = {}
    original_start = Tau2Environment.start

    def timed_start(self):
        began = time.perf_counter()
        try:
            return original_start(self)
        finally:
            startup["s"] = time.perf_counter() - began

    Tau2Environment.start = timed_start
    began = time.perf_counter()
    summary, table = evaluation.run_eval(cfg, raw)
    wall = time.perf_counter() - began
    print(table)
    metrics = summary["metrics"]
    episodes = int(metrics["eval/overall/num_episodes"])
    records = [json.loads(line) for line in Path(save_path, "rollouts.jsonl").read_text().splitlines()]
    model_calls = sum(r["num_turns"] + r["num_user_turns"] for r in records)
    episodes_s = wall - startup["s"]
    print(
        json.dumps(
            {
                "benchmark": "eval_speed",
                "episodes": episodes,
                "model_calls": model_calls,
                "wall_s": round(wall, 2),
                "startup_s": round(startup["s"], 2),
                "episodes_wall_s": round(episodes_s, 2),
                "episodes_per_s": round(episodes / episodes_s, 2),
                "wall_ms_per_model_call_at_concurrency": round(episodes_s / model_calls * 1000, 3),
                "pass@1": metrics["eval/overall/pass@1"],
                "target_s": TARGET_S,
                "ratio_to_target": round(wall / TARGET_S, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
