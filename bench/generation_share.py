"""How much of a tau2 episode's wall time is the policy engine generating, and how much is our stack?

Whole tau2 episodes, one at a time, with the policy on vLLM (its CPU build, SmolLM2-135M-Instruct) behind our Gym
stack (agent server, ``fast_vllm_model``, resources server) and the scripted fake user (answers in about a
millisecond, so "everything else" is our stack). Per episode: wall time, and the time vLLM itself spent on the
episode's requests (its ``vllm:e2e_request_latency_seconds`` metric, read from ``/metrics`` before and after).
Our stack's share = 1 - vLLM time / episode wall time, after one warm-up episode per domain; target <= 5%.

The reference, in the same run: every policy turn's request sent straight to vLLM's chat endpoint, with no Gym in
between (the same messages and tools, converted from the episode's own transcript exactly as the model server
converts them, and the same number of generated tokens), timed the same way. Its share is what any client pays
(HTTP, JSON, vLLM's own request handling outside the engine).

    NEMO_TAU2_VLLM_PYTHON=... uv run python bench/generation_share.py [--domains mock,airline --tasks 2]
"""

import argparse
import json
import os
import statistics
import time
import urllib.request

import nemo_tau2  # noqa: F401  (offline settings first)
from nemo_tau2.experience.rollouts import SamplingParams, run_nemo_gym_rollout_sync
from nemo_tau2.generation import GenerationConfig, start_generation
from nemo_tau2.generation.smollm2 import smollm2_hf_dir
from nemo_tau2.gym.environment import Tau2Environment, Tau2EnvironmentSpec
from nemo_tau2.gym.episode_config import NemoGymEnvConfig
from nemo_tau2.gym.model_server import conversion
from nemo_tau2.tau2_env import domains
from nemo_tau2.tau2_env.gym_rows import task_row

E2E = "vllm:e2e_request_latency_seconds_sum"
POLICY_ITEM_TYPES = ("message", "function_call")


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=60) as response:
        return response.read().decode()


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())


def vllm_seconds(root: str) -> float:
    """vLLM's own total time on finished requests so far (sum of its end-to-end request latencies)."""
    total = 0.0
    for line in _get(f"{root}/metrics").splitlines():
        if line.startswith(E2E):
            total += float(line.rsplit(" ", 1)[1])
    return total


def policy_turns(row: dict, output: list[dict]) -> list[tuple[list[dict], dict]]:
    """(Responses input the policy saw, the turn's last item with its token ids) for each policy turn."""
    turns, start = [], 0
    for index, item in enumerate(output):
        is_policy = item.get("type") in POLICY_ITEM_TYPES and item.get("role", "assistant") == "assistant"
        if not is_policy:
            start = index + 1
        elif item.get("generation_token_ids"):
            turns.append((row["responses_create_params"]["input"] + output[:start], item))
            start = index + 1
    return turns


def direct_request(row: dict, model: str, history: list[dict], generated: int) -> dict:
    """The chat request the model server sent for this turn, forced to generate the same number of tokens."""
    params = row["responses_create_params"]
    body = {"input": history, "tools": params.get("tools") or [], "temperature": 0.0, "top_p": 1.0}
    request = conversion.chat_request(body, with_token_ids=False)
    return request | {
        "model": model,
        "max_tokens": generated,
        "min_tokens": generated,
        "ignore_eos": True,
        "return_token_ids": True,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--domains", default="mock,airline")
    parser.add_argument("--tasks", type=int, default=2, help="tasks per domain (the first of its split)")
    parser.add_argument("--max-steps", type=int, default=12)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="unmeasured episodes per domain first (first-request costs: domain "
        "data loaded by the resources server, connections opened), reported apart as cold_start_s",
    )
    args = parser.parse_args()
    policy_cfg = GenerationConfig(
        backend="vllm",
        model_name=str(smollm2_hf_dir()),
        temperature=0.0,
        top_p=1.0,
        vllm_cfg={"device": "cpu", "precision": "bfloat16", "max_model_len": 8192, "cpu_kvcache_space_gb": 2},
    )
    rows = []
    for domain in args.domains.split(","):
        split = "base" if domain == "mock" else "test"
        rows += [task_row(domain, task.id, split=split) for task in domains.get_tasks(domain, split)[: args.tasks]]
    episodes = []
    with start_generation(policy_cfg) as policy:
        root = policy.base_urls[0].removesuffix("/v1")
        spec = Tau2EnvironmentSpec(
            policy=policy,
            user=GenerationConfig(backend="fake", fake_cfg={}, temperature=0.0, top_p=1.0),
            domains=sorted({row["domain"] for row in rows}),
            gym=NemoGymEnvConfig(max_steps=args.max_steps, return_token_ids=True),
        )
        sampling = SamplingParams(temperature=0.0, top_p=1.0, max_new_tokens=args.max_new_tokens)
        cold_start = {}
        with Tau2Environment(spec) as environment:
            for domain in args.domains.split(","):
                warmup_rows = [row for row in rows if row["domain"] == domain][: args.warmup]
                start = time.perf_counter()
                if warmup_rows:
                    run_nemo_gym_rollout_sync(warmup_rows, environment.agent_urls, sampling, 1)
                cold_start[domain] = time.perf_counter() - start
            for row in rows:
                before = vllm_seconds(root)
                start = time.perf_counter()
                (result,) = run_nemo_gym_rollout_sync(
                    [row], environment.agent_urls, sampling, 1, keep_full_result=True
                )
                wall = time.perf_counter() - start
                engine = vllm_seconds(root) - before
                assert result.ok, result.error
                turns = policy_turns(row, result.full_result["response"]["output"])
                before = vllm_seconds(root)
                direct_wall, same_prompt = 0.0, 0
                for history, item in turns:
                    body = direct_request(row, policy.model_name, history, len(item["generation_token_ids"]))
                    start = time.perf_counter()
                    answer = _post(f"{policy.base_urls[0]}/chat/completions", body)
                    direct_wall += time.perf_counter() - start
                    same_prompt += answer["prompt_token_ids"] == item["prompt_token_ids"]
                direct_engine = vllm_seconds(root) - before
                episode = {
                    "domain": row["domain"],
                    "task_id": row["task_id"],
                    "policy_turns": len(turns),
                    "prompt_tokens_last_turn": len(turns[-1][1]["prompt_token_ids"]) if turns else 0,
                    "wall_s": wall,
                    "engine_s": engine,
                    "our_share": 1 - engine / wall,
                    "direct_wall_s": direct_wall,
                    "direct_engine_s": direct_engine,
                    "direct_share": 1 - direct_engine / direct_wall if direct_wall else None,
                    "same_prompt_ids": f"{same_prompt}/{len(turns)}",
                }
                episodes.append(episode)
                print(
                    f"{row['domain']:8s} {row['task_id']:>28s}  turns {len(turns):2d}  wall {wall:6.1f} s  "
                    f"vLLM {engine:6.1f} s  ours {episode['our_share']:6.1%}  |  direct wall {direct_wall:6.1f} s  "
                    f"vLLM {direct_engine:6.1f} s  share {episode['direct_share']:6.1%}  same prompts {same_prompt}/"
                    f"{len(turns)}",
                    flush=True,
                )
    total_wall = sum(e["wall_s"] for e in episodes)
    total_engine = sum(e["engine_s"] for e in episodes)
    direct_wall = sum(e["direct_wall_s"] for e in episodes)
    direct_engine = sum(e["direct_engine_s"] for e in episodes)
    turns = sum(e["policy_turns"] for e in episodes)
    summary = {
        "benchmark": "generation_share",
        "cpus": os.cpu_count(),
        "episodes": len(episodes),
        "policy_turns": turns,
        "warmup_episodes_per_domain": args.warmup,
        "cold_start_s": cold_start,
        "our_share": 1 - total_engine / total_wall,
        "our_share_median_episode": statistics.median(e["our_share"] for e in episodes),
        "direct_share": 1 - direct_engine / direct_wall,
        "our_overhead_ms_per_turn": 1000 * (total_wall - total_engine) / turns,
        "direct_overhead_ms_per_turn": 1000 * (direct_wall - direct_engine) / turns,
        "target_share": 0.05,
        "episodes_detail": episodes,
    }
    summary["target_met"] = summary["our_share"] <= summary["target_share"]
    print(
        f"\nour stack: {summary['our_share']:.1%} of episode wall time ({summary['our_overhead_ms_per_turn']:.0f} ms "
        f"per policy turn); straight to vLLM: {summary['direct_share']:.1%} "
        f"({summary['direct_overhead_ms_per_turn']:.0f} ms per call); target <= 5%: "
        f"{'met' if summary['target_met'] else 'NOT met'}"
    )
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
