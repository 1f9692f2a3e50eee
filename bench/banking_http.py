"""banking_knowledge over HTTP: whole episodes through the Gym servers at concurrency 1 and 64, and ``KB_search`` as
the agent calls it (``POST /KB_search`` on the resources server) at concurrency 1 and 64.

The eval's own stack (``examples/configs/evals/tau2_fake.yaml`` with ``tau2.version=v1.0.1``, ``bm25_grep``): the
scripted policy plays each task's gold actions after one ``KB_search`` (``search_first``), the scripted user the
release's scenarios, the scripted judge grades task_102; every episode must end without an infrastructure error and
with reward 1.0. Then ``--sessions`` sessions are seeded on the resources server and each calls ``KB_search``
``--calls`` times, one session at a time and then all at once: the per-call latency over HTTP, p50 and p95.
The reference, measured in the same run, is concurrency 1 (the targets: ``KB_search`` p50 <= 10 ms, and no error
with 64 episodes in flight). Calls per second are measured too: with 64 callers that each call again as soon as
answered, the mean latency is 64 over the calls answered per second (Little's law), so at 64 it is bound by how many
searches the resources server's tau2 worker answers per second, one at a time (tau2's own ``KB_search`` is ~1.35 ms:
``bench/banking_speed.py``), whatever HTTP adds.

    uv run bench/banking_http.py [--samples 1] [--sessions 64] [--calls 10] [--resources-replicas 1]
    # tau2 v1.0.1's environment: scripts/setup.sh tau2-v1

Prints a table, then a last line of JSON with the figures and the ratios (64 against 1).
"""

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp
from banking_speed import tau2_v1_python  # this folder's: $NEMO_TAU2_TAU2_V1_PYTHON, else the set-up's

import nemo_tau2  # noqa: F401  (offline settings before tau2 loads litellm)
from nemo_tau2.config import apply_overrides, load_config
from nemo_tau2.evals.eval import build_eval_rows, environment_spec, setup_eval
from nemo_tau2.experience.rollouts import OK, SamplingParams, run_nemo_gym_rollout_sync
from nemo_tau2.gym.environment import Tau2Environment
from nemo_tau2.gym.stack import RESOURCES_SERVER
from nemo_tau2.tau2_release.client import Tau2Worker
from nemo_tau2.tau2_release.config import Tau2ReleaseConfig
from nemo_tau2.testing.release_tasks import write_release_tasks
from nemo_tau2.testing.scripted_judge import ScriptedJudge

DOMAIN = "banking_knowledge"
QUERIES = ["overdraft fee waiver", "credit card annual fee", "wire transfer limit", "close a savings account"]
KB_SEARCH_P50_TARGET_MS = 10.0


def _config(folder: Path, judge: ScriptedJudge, python: str, samples: int, resources_replicas: int):
    with Tau2Worker(Tau2ReleaseConfig(version="v1.0.1", python=python)) as worker:
        tasks = worker.request("tasks", domain=DOMAIN, split=None)
    release = str(write_release_tasks(folder / "tasks.json", {DOMAIN: tasks}))
    raw = apply_overrides(
        load_config("examples/configs/evals/tau2_fake.yaml"),
        [
            f"eval.save_path={folder / 'eval'}", f"eval.num_tests_per_prompt={samples}", "eval.k_values=[1]",
            "eval.bootstrap_samples=0", "data.split=base", "++tau2.version=v1.0.1", f"++tau2.python={python}",
            "++tau2.judge.model=scripted-judge", f"++tau2.judge.base_url={judge.base_url}",
            f"++policy.generation.fake_cfg.tau2.release_tasks={release}",
            f"++user.generation.fake_cfg.tau2.release_tasks={release}",
            "++policy.generation.fake_cfg.tau2.policy.variant=search_first", "env.nemo_gym.return_token_ids=false",
            f"env.nemo_gym.resources_replicas={resources_replicas}",
            *(["cluster.gym_placement=ray"] if resources_replicas > 1 else []),  # replicas are placed by Ray
        ],
    )  # fmt: skip
    raw.data.domains = [DOMAIN]
    return setup_eval(raw)


def episodes(env: Tau2Environment, rows: list[dict], sampling: SamplingParams, samples: int, concurrency: int) -> dict:
    batch = [row for row in rows for _ in range(samples)]
    started = time.perf_counter()
    results = run_nemo_gym_rollout_sync(batch, env.agent_urls, sampling, samples, max_concurrency=concurrency)
    wall = time.perf_counter() - started
    failed = [r for r in results if r.status != OK]
    return {
        "episodes": len(results),
        "infrastructure_errors": len(failed),
        "first_error": failed[0].error if failed else None,
        "reward_one": sum(r.reward == 1.0 for r in results if r.status == OK),
        "wall_s": round(wall, 2),
        "episodes_per_s": round(len(results) / wall, 2),
    }


async def _session_calls(url: str, row: dict, calls: int, seeded: asyncio.Event, start: asyncio.Event) -> list:
    jar = aiohttp.CookieJar(unsafe=True)
    async with aiohttp.ClientSession(cookie_jar=jar, timeout=aiohttp.ClientTimeout(total=600)) as own:
        async with own.post(f"{url}/seed_session", json=row) as response:
            assert response.status == 200, await response.text()
        seeded.set()
        await start.wait()
        latencies = []
        for index in range(calls):
            began = time.perf_counter()
            async with own.post(f"{url}/KB_search", json={"query": QUERIES[index % len(QUERIES)]}) as response:
                body = await response.read()
                assert response.status == 200 and b"ID: doc_" in body, body[:300]
            latencies.append(time.perf_counter() - began)
        async with own.post(f"{url}/end_session", json={}) as response:
            await response.read()
        return latencies


async def kb_search(urls: list[str], rows: list[dict], sessions: int, calls: int, concurrency: int) -> dict:
    """Per-call latency of ``KB_search`` over HTTP with ``concurrency`` sessions calling at once, the sessions dealt
    over the resources replicas ``urls`` in turn (as the agent spreads its sessions)."""
    latencies: list[float] = []
    calling_s = 0.0  # from the first call of each burst to its last answer
    for first in range(0, sessions, concurrency):
        start = asyncio.Event()
        seeded = [asyncio.Event() for _ in range(first, min(first + concurrency, sessions))]
        tasks = [
            asyncio.create_task(
                _session_calls(urls[(first + i) % len(urls)], rows[(first + i) % len(rows)], calls, event, start)
            )
            for i, event in enumerate(seeded)
        ]
        await asyncio.gather(*(event.wait() for event in seeded))  # every session seeded before any call
        began = time.perf_counter()
        start.set()
        for found in await asyncio.gather(*tasks):
            latencies += found
        calling_s += time.perf_counter() - began  # (each session's /end_session included: one call in 11)
    ordered = sorted(latencies)
    return {
        "calls": len(ordered),
        "p50_ms": round(statistics.median(ordered) * 1000, 2),
        "p95_ms": round(ordered[int(0.95 * (len(ordered) - 1))] * 1000, 2),
        "mean_ms": round(statistics.fmean(ordered) * 1000, 2),
        "calls_per_s": round(len(ordered) / calling_s, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=1, help="episodes per task (97 tasks)")
    parser.add_argument("--sessions", type=int, default=64, help="sessions calling KB_search")
    parser.add_argument("--calls", type=int, default=10, help="KB_search calls per session")
    parser.add_argument("--resources-replicas", type=int, default=1, help="resources servers, each with its workers")
    args = parser.parse_args()
    python = tau2_v1_python()
    folder = Path(tempfile.mkdtemp(prefix="banking_http_"))
    judge = ScriptedJudge()
    try:
        cfg = _config(folder, judge, python, args.samples, args.resources_replicas)
        rows = build_eval_rows(cfg)
        sampling = SamplingParams.from_generation(cfg.policy.generation)
        began = time.perf_counter()
        with Tau2Environment(environment_spec(cfg, rows, folder / "servers")) as env:
            startup_s = time.perf_counter() - began
            episodes(env, rows[:4], sampling, 1, 4)  # warm-up: the worker's first environments
            played = {c: episodes(env, rows, sampling, args.samples, c) for c in (1, 64)}
            urls = env.servers.replica_urls(RESOURCES_SERVER)
            searched = {c: asyncio.run(kb_search(urls, rows, args.sessions, args.calls, c)) for c in (1, 64)}
    finally:
        judge.close()
    head = ("concurrency", 13, "<"), ("episodes", 9, ">"), ("errors", 8, ">"), ("reward 1", 9, ">"), ("ep/s", 8, ">")
    kb_head = f"{'KB p50 ms':>11}{'KB p95 ms':>11}{'KB mean ms':>12}{'KB calls/s':>12}"
    print("".join(f"{name:{align}{width}}" for name, width, align in head) + kb_head)
    for c in (1, 64):
        e, k = played[c], searched[c]
        print(f"{c:<13}{e['episodes']:>9}{e['infrastructure_errors']:>8}{e['reward_one']:>9}"
              f"{e['episodes_per_s']:>8}{k['p50_ms']:>11}{k['p95_ms']:>11}{k['mean_ms']:>12}"
              f"{k['calls_per_s']:>12}")  # fmt: skip
    print(
        json.dumps(
            {
                "benchmark": "banking_http",
                "variant": "bm25_grep",
                "resources_replicas": args.resources_replicas,
                "startup_s": round(startup_s, 2),
                "episodes": {str(c): played[c] for c in played},
                "kb_search": {str(c): searched[c] for c in searched},
                "episodes_per_s_ratio_64_vs_1": round(played[64]["episodes_per_s"] / played[1]["episodes_per_s"], 2),
                "kb_search_p50_ms_ratio_64_vs_1": round(searched[64]["p50_ms"] / searched[1]["p50_ms"], 2),
                "kb_search_calls_per_s_ratio_64_vs_1": round(
                    searched[64]["calls_per_s"] / searched[1]["calls_per_s"], 2
                ),
                "kb_search_p50_target_ms": KB_SEARCH_P50_TARGET_MS,
                "no_error_at_64": played[64]["infrastructure_errors"] == 0,
            }
        )
    )


if __name__ == "__main__":
    main()
