"""What a real small model's pivot set looks like: SmolLM2-135M-Instruct (vLLM's CPU build) profiles the pivots of
tau2's gold demonstrations, no training.

Candidates: every demonstrated call of the first ``--tasks`` base tasks of airline and retail (v0.2.1), after a user
opening, as compact rows (the short system prompt, the task's tools: SmolLM2's 8k context holds them). Each is sampled
``--samples`` times at temperature 1.0 by SmolLM2 behind vLLM's OpenAI server (hermes tool parser), each sample scored
by ``/verify_pivot`` (``profile_pivots.py``'s code). Printed: the categories of all samples, the share of candidates
PivotRL keeps (rewards vary), all-0 and all-1, and the last line JSON.

    uv run bench/pivots_smollm2.py [--tasks 6] [--samples 8]
"""

import argparse
import asyncio
import json
import tempfile
import time
from collections import Counter
from pathlib import Path

import nemo_tau2  # noqa: F401  (offline settings first)
from nemo_tau2.generation import GenerationConfig, start_generation
from nemo_tau2.generation.smollm2 import smollm2_hf_dir
from nemo_tau2.gym.launch import GymServers
from nemo_tau2.gym.stack import RESOURCES_SERVER, resources_server_spec
from nemo_tau2.pivots.candidates import pivot_rows
from nemo_tau2.pivots.gold import gold_trajectory
from nemo_tau2.pivots.profile import Endpoint, Profiler, ProfileSettings, profile_pivots
from nemo_tau2.tau2_env import domains
from nemo_tau2.tau2_env.gym_rows import compact_rows

OPENING = {"airline": "Hi, I need help with my reservation.", "retail": "Hi, I need help with an order."}


def candidates(tasks: int) -> list[dict]:
    found = []
    for domain, opening in OPENING.items():
        for task_id in domains.task_splits(domain)["base"][:tasks]:
            rows, _ = pivot_rows(gold_trajectory(domain, task_id, opening=opening), compact_rows(domain, [task_id])[0])
            found += [row for row in rows if row["expected_action"]["type"] != "message"]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=6, help="base tasks per domain")
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()
    pivots = candidates(args.tasks)
    work = Path(tempfile.mkdtemp(prefix="pivots_smollm2_"))
    vllm_cfg = {"device": "cpu", "precision": "float32", "max_model_len": 8192, "cpu_kvcache_space_gb": 2,
                "http_server_serving_chat_kwargs": {"enable_auto_tools": True, "tool_parser": "hermes"}}  # fmt: skip
    cfg = GenerationConfig(backend="vllm", model_name=str(smollm2_hf_dir()), temperature=1.0, top_p=1.0,
                           vllm_cfg=vllm_cfg)  # fmt: skip
    started = time.perf_counter()
    with start_generation(cfg) as generation, GymServers([resources_server_spec(list(OPENING))]) as servers:
        startup = time.perf_counter() - started
        endpoint = Endpoint(generation.base_urls[0], generation.model_name, max_tokens=args.max_tokens)
        profiler = Profiler(endpoint, servers.url(RESOURCES_SERVER), ProfileSettings(samples=args.samples,
                                                                                      concurrency=8))  # fmt: skip
        began = time.perf_counter()
        report = asyncio.run(profile_pivots(pivots, profiler, work / "profile.jsonl", work / "kept.jsonl"))
        work_s = time.perf_counter() - began
    lines = [json.loads(line) for line in (work / "profile.jsonl").read_text().splitlines()]
    settled = [line for line in lines if line["status"] == "ok"]
    categories = Counter(category for line in settled for category in line["categories"])
    shapes = Counter("kept" if line["kept"] else "all 1" if line["mean"] == 1 else "all 0" for line in settled)
    print(f"{len(pivots)} candidates x {args.samples} samples; start-up {startup:.0f} s, profiling {work_s:.0f} s")
    for category, count in categories.most_common():
        print(f"  {category:<18} {count:>5}  ({count / sum(categories.values()):.1%})")
    print(f"  candidates: {dict(shapes)}; refused or errors: {len(lines) - len(settled)}")
    print(json.dumps({"candidates": len(pivots), "samples": args.samples, "profiled": len(settled),
                      "categories": dict(categories), "shapes": dict(shapes), "startup_s": startup,
                      "profiling_s": work_s, "samples_per_s": report.samples_run / work_s}))  # fmt: skip


if __name__ == "__main__":
    main()
