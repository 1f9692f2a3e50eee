"""Re-scoring stored airline episodes (``run_eval.py --rescore``'s code path) against replaying the evaluation that
produced them: episodes per second of each, and their ratio.

An evaluation with ``examples/configs/evals/tau2_fake.yaml`` (the scripted fake model server at 0 ms, the oracle
policy) plays ``--samples`` samples of tau2's 20 airline test tasks; its ``rollouts.jsonl`` is then copied until it
holds ``--episodes`` episodes (each copy a new sample index: re-scoring costs the same per line) and re-scored in place
by a fresh resources server (tau2 v0.2.1: each trajectory replayed in a fresh episode and scored). Start-up (servers)
and the work are timed apart; every re-scored reward must equal the stored one. The last line printed is JSON.

    uv run bench/rescore.py [--episodes 1000] [--samples 4] [--concurrency 8]
"""

import argparse
import json
import tempfile
import time
from pathlib import Path

import nemo_tau2  # noqa: F401  (offline settings before tau2 loads litellm)
from nemo_tau2.config import apply_overrides, load_config
from nemo_tau2.evals import eval as evaluation
from nemo_tau2.evals import rescore
from nemo_tau2.gym.environment import Tau2Environment
from nemo_tau2.gym.launch import GymServers

TARGET_S = 60.0  # 1,000 stored airline episodes on 2 cores (issue 57)


def timed(cls, method: str, into: dict) -> None:
    """Time every call of ``cls.method`` (server start-up) into ``into[method]``."""
    original = getattr(cls, method)

    def wrapper(self, *args, **kwargs):
        began = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            into[method] = into.get(method, 0.0) + time.perf_counter() - began

    setattr(cls, method, wrapper)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=8, help="re-scoring requests in flight")
    args = parser.parse_args()
    save = Path(tempfile.mkdtemp(prefix="rescore_bench_"))
    raw = apply_overrides(
        load_config("examples/configs/evals/tau2_fake.yaml"),
        [
            f"eval.save_path={save}",
            f"eval.num_tests_per_prompt={args.samples}",
            "eval.k_values=[1]",
            "eval.bootstrap_samples=0",
            "env.nemo_gym.return_token_ids=false",
            "logger.report=false",
        ],
    )
    raw.data.domains = ["airline"]
    startup: dict = {}
    timed(Tau2Environment, "start", startup)
    began = time.perf_counter()
    evaluation.run_eval(evaluation.setup_eval(raw), raw)
    eval_wall = time.perf_counter() - began
    played = [json.loads(line) for line in (save / "rollouts.jsonl").read_text().splitlines()]
    eval_s = eval_wall - startup["start"]

    lines, copy = [], 0
    while len(lines) < args.episodes:
        for record in played[: args.episodes - len(lines)]:
            lines.append(json.dumps(record | {"sample_index": record["sample_index"] + copy * args.samples}) + "\n")
        copy += 1
    (save / "rollouts.jsonl").write_text("".join(lines))
    served: dict = {}
    timed(GymServers, "start", served)
    timed(rescore, "rescore_file", served)
    began = time.perf_counter()
    summary, report = rescore.rescore_eval(save, [])
    rescore_wall = time.perf_counter() - began
    after = [json.loads(line) for line in (save / "rollouts.jsonl").read_text().splitlines()]
    assert report.rescored == args.episodes and not report.refused and not report.changed, report.as_dict()
    assert [r["reward"] for r in after] == [json.loads(line)["reward"] for line in lines]
    rescore_s = served["rescore_file"]
    result = {
        "episodes": args.episodes,
        "eval_episodes": len(played),
        "eval_s": round(eval_s, 2),
        "eval_startup_s": round(startup["start"], 2),
        "eval_episodes_per_s": round(len(played) / eval_s, 1),
        "rescore_s": round(rescore_s, 2),
        "rescore_startup_s": round(served["start"], 2),
        "rescore_wall_s": round(rescore_wall, 2),
        "rescore_episodes_per_s": round(args.episodes / rescore_s, 1),
        "ratio_vs_replaying_the_eval": round((args.episodes / rescore_s) / (len(played) / eval_s), 1),
        "target_s": TARGET_S,
        "within_target": rescore_wall <= TARGET_S,
        "mean_reward": summary["metrics"]["eval/overall/mean_reward"],
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
