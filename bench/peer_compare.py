"""The phases of ``bench/peer_nemo_gym_tau2.py``, each played the same way on both agents: throughput, rewards
against tau2's own scoring, training data per policy turn, and a failing policy endpoint."""

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from statistics import mean
from typing import Any

from peer_measure import CpuMeter, Posted, kill_side, our_turns, post_all, their_turns, training_data

from nemo_tau2.testing import PolicyScriptConfig
from nemo_tau2.testing.config import ControlRequest
from nemo_tau2.testing.faults import FaultSpec

#: Ours at a user's settings for a policy that may hang: 15 s per attempt (--quick: 4 s), 2 attempts (the default is
#: 600 s x 4); and token ids per turn (training's setting; their side runs vllm_model_for_training).
OUR_GYM = {"policy_retry": {"timeout_s": 15.0, "max_attempts": 2}, "return_token_ids": True}
#: Tokens per model call: in effect none, as their agent sends none (our default, 1,024, also caps the user, which
#: plays on the policy's endpoint: banking task_078's scripted opening quotes its whole scenario, ###STOP### at the
#: end, and the cap cut it off, so ours played on where tau2 stopped).
MAX_NEW_TOKENS = 16384
QUICK_POLICY_TIMEOUT_S = 4.0
IDLE_S = 3.0
POLICY_KEYS = r"\|policy$"
SMOLLM2_TASK = "0"  # airline: what a small real model is asked to do, on both sides


class OurServers:
    """:mod:`peer_ours` in the 0.7.0 environment, in a session of its own."""

    def __init__(self, side: "Side") -> None:
        self.side = side
        self.process: subprocess.Popen | None = None
        self.agent_url, self.startup_s = "", 0.0

    @property
    def root(self) -> int:
        return self.process.pid

    def __enter__(self) -> "OurServers":
        env = os.environ | {"PYTHONPATH": str(self.side.root), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
        env.pop("VIRTUAL_ENV", None)
        log = (self.side.work / "ours.log").open("w")
        self.process = subprocess.Popen([str(self.side.gym07), str(Path(__file__).with_name("peer_ours.py"))],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
                                        env=env, start_new_session=True)  # fmt: skip
        request = {"base_url": self.side.base_url, "domains": list(self.side.domains),
                   "tau2_python": str(self.side.tau2), "retrieval_variant": self.side.retrieval_variant,
                   "max_new_tokens": self.side.max_new_tokens,
                   "log_dir": str(self.side.work / "our_servers"), "gym": OUR_GYM}  # fmt: skip
        if self.side.quick:
            request["gym"] = OUR_GYM | {"policy_retry": {"timeout_s": QUICK_POLICY_TIMEOUT_S, "max_attempts": 2}}
        if self.side.max_steps:
            request["gym"] = request["gym"] | {"max_steps": self.side.max_steps}
        if self.side.policy_timeout_s:
            request["gym"] = request["gym"] | {"policy_retry": {"timeout_s": self.side.policy_timeout_s}}
        request["model"] = self.side.model
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            self.__exit__()
            raise RuntimeError(f"our servers did not start: see {self.side.work / 'ours.log'}")
        answer = json.loads(line)
        self.agent_url, self.startup_s = answer["agent_url"], answer["startup_s"]
        return self

    def __exit__(self, *exc: Any) -> None:
        self.process.stdin.close()
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            kill_side(self.process.pid)
            self.process.wait()


@dataclass
class Side:
    name: str  # ours | theirs
    root: Path
    gym07: Path
    tau2: Path
    base_url: str
    work: Path
    workers: int | None  # theirs: num_workers
    their: Any = None
    domains: tuple[str, ...] = ("airline", "retail", "telecom", "banking_knowledge")
    retrieval_variant: str = "bm25_grep"
    quick: bool = False
    model: str = "fake-model"
    max_steps: int | None = None  # tau2's max_steps on both (None: each side's default, 200 on both)
    policy_timeout_s: float | None = None  # ours, per policy call (None: OUR_GYM's); theirs has no such setting
    max_new_tokens: int = MAX_NEW_TOKENS  # per model call, policy and user, on both sides

    @property
    def label(self) -> str:
        return self.name if self.workers is None else f"{self.name} (num_workers={self.workers})"

    @contextmanager
    def start(self, their_servers: Callable):
        if self.name == "ours":
            with OurServers(self) as running:
                running.label, running.side = self.label, self
                yield running
            return
        run_dir = self.work / f"theirs_w{self.workers}_{self.model}"
        with their_servers(
            self.their, self.base_url, self.workers, run_dir, self.model, self.max_steps, self.max_new_tokens
        ) as running:
            running.label, running.side, running.root = self.label, self, running.session
            yield running


def outcome(posted: Posted) -> dict:
    """What one ``/run`` came back with: ok (a scored episode), its reward, and otherwise what was said."""
    body = posted.body if isinstance(posted.body, dict) else {}
    failure = body.get("_ng_failure_class")
    ok = posted.status == 200 and failure is None and "reward" in body
    said = posted.error or (str(body.get("error") or body.get("detail") or body.get("cause") or "")
                            if not ok else "")  # fmt: skip
    return {"ok": ok, "status": posted.status, "reward": body.get("reward"), "failure_class": failure,
            "said": said[:300], "seconds": round(posted.seconds, 2)}  # fmt: skip


def trajectory(side: str, body: dict) -> tuple[list[dict], str] | None:
    """tau2's messages and termination reason as the side played them (None: its answer holds no trajectory)."""
    if side == "theirs":
        result = body.get("result") or {}
        return (result.get("messages"), result.get("termination_reason")) if result.get("messages") else None
    messages = body.get("tau2_messages")
    return (messages, body.get("termination_reason")) if messages else None


def _reset(fake, **policy: Any) -> None:
    fake.control(ControlRequest(clear_faults=True, tau2={"policy": PolicyScriptConfig(**policy).model_dump()}))


def throughput(running, fake, levels, episodes, rows_for, quick: bool) -> list[dict]:
    side = running.side
    _reset(fake)
    first_of_each = list({domain: (domain, task) for domain, task in reversed(episodes.tasks)}.values())
    warm = episodes(2 * len(first_of_each), of=first_of_each)  # warm-up: every domain loaded on each side
    post_all(running.agent_url, rows_for(side.name, warm), len(warm))
    idle = CpuMeter(running.root)  # what the side's processes burn doing nothing (Ray's daemons, pollers)
    idle.start()
    time.sleep(IDLE_S)
    idle_cpu_per_s = idle.stop() / IDLE_S
    rows = []
    for level in levels:
        count = max(level, len(episodes.tasks))  # every task at least once
        made = rows_for(side.name, episodes(count))
        ours, engine = CpuMeter(running.root), CpuMeter(fake.pid)
        ours.start()
        engine.start()
        posted, wall = post_all(running.agent_url, made, level)
        cpu, engine_cpu = ours.stop(), engine.stop()
        outcomes = [outcome(p) for p in posted]
        good = [o for o in outcomes if o["ok"]]
        rows.append({
            "side": running.label, "concurrency": level, "episodes": count, "ok": len(good),
            "mean_reward": round(mean(o["reward"] for o in good), 3) if good else None,
            "wall_s": round(wall, 2), "episodes_per_s": round(count / wall, 2),
            "cpu_s_per_episode": round(cpu / count, 3), "engine_cpu_s_per_episode": round(engine_cpu / count, 3),
            "idle_cpu_s_per_s": round(idle_cpu_per_s, 3),
            "cpu_s_per_episode_less_idle": round(max(cpu - idle_cpu_per_s * wall, 0.0) / count, 3),
            "failures": sorted({o["said"] for o in outcomes if not o["ok"]})[:3],
        })  # fmt: skip
        print(f"  {running.label:<26} c={level:<3} {count:4d} episodes {rows[-1]['episodes_per_s']:7.2f}/s "
              f"{rows[-1]['cpu_s_per_episode']:.3f} CPU-s each, ok {len(good)}", flush=True)  # fmt: skip
    return rows


def rescore(tau2_python: Path, episodes: list[dict]) -> list[dict]:
    out = subprocess.run([str(tau2_python), str(Path(__file__).with_name("peer_rescore.py"))],
                         input=json.dumps(episodes), capture_output=True, text=True)  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"tau2's rescoring failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout)


def compare_rewards(running, fake, episodes, rows_for, tau2_python: Path, mistakes: dict, variant: str) -> dict:
    """Every task once with the oracle and once with its domain's mistaken policy; each reward against tau2
    v1.0.1's own scoring of the trajectory the side played."""
    side = running.side
    records = []
    phases = [("oracle", episodes.tasks)] + [
        (mistake, [task for task in episodes.tasks if mistakes[task[0]] == mistake])
        for mistake in sorted(set(mistakes.values()))
    ]
    for policy, tasks in phases:
        _reset(fake, variant=policy)
        pool = episodes(len(tasks), of=tasks)  # each task once
        posted, _ = post_all(running.agent_url, rows_for(side.name, pool), 8)
        for (domain, task_id, _seed), p in zip(pool, posted, strict=True):
            body = p.body if isinstance(p.body, dict) else {}
            records.append({"variant": policy, "domain": domain, "task_id": task_id, **outcome(p),
                            "trajectory": trajectory(side.name, body)})  # fmt: skip
    _reset(fake)
    scored = [r for r in records if r["ok"] and r["trajectory"]]
    references = rescore(tau2_python, [
        {"domain": r["domain"], "task_id": r["task_id"], "messages": r["trajectory"][0],
         "termination_reason": r["trajectory"][1],
         "retrieval_config": variant if r["domain"] == "banking_knowledge" else None} for r in scored
    ])  # fmt: skip
    differ = []
    for record, reference in zip(scored, references, strict=True):
        record["tau2_reward"] = reference.get("reward")
        if reference.get("reward") != record["reward"]:
            differ.append({k: record[k] for k in ("variant", "domain", "task_id", "reward")} | reference)
    return {
        "episodes": len(records),
        "scored": len(scored),
        "no_trajectory": sum(1 for r in records if r["ok"] and not r["trajectory"]),
        "failed": [{k: r[k] for k in ("variant", "domain", "task_id", "said")} for r in records if not r["ok"]],
        "identical_to_tau2": len(scored) - len(differ),
        "differ": differ,
        "mean_reward": {v: round(mean(r["reward"] for r in records if r["variant"] == v and r["ok"]), 3)
                        for v in {r["variant"] for r in records if r["ok"]}},
    }  # fmt: skip


def training_probe(running, fake, episodes, rows_for) -> dict:
    """One episode of the first task with tool calls, the policy's generations token-inconsistent (what a template
    that rewrites history does to a re-rendered prompt): what each policy turn carries for training."""
    side = running.side
    _reset(fake, token_consistent=False)
    made = episodes(1, of=[episodes.longest])
    before = fake.stats().requests_by_key
    (posted,), _ = post_all(running.agent_url, rows_for(side.name, made), 1)
    _reset(fake)
    after = fake.stats().requests_by_key
    policy_calls = sum(after[k] - before.get(k, 0) for k in after if k.endswith("|policy"))
    body = posted.body if isinstance(posted.body, dict) else {}
    if side.name == "ours":
        turns, on_items = our_turns(body), True
    else:
        turns, on_items = their_turns(body)
    return {"task": list(made[0][:2]), **outcome(posted)} | training_data(turns, policy_calls, on_items)


def failure_probe(running, fake, episodes, rows_for, quick: bool) -> dict:
    """The policy endpoint answering 500 to every request, then hanging (never answering): what each side says."""
    side = running.side
    probes = {}
    for kind, bound_s in (("http_500", 120.0), ("timeout", 12.0 if quick else 45.0)):
        _reset(fake)
        fake.control(ControlRequest(faults=[FaultSpec(kind=kind, key_pattern=POLICY_KEYS, count=None, hold_s=3600)]))
        before = fake.stats().faults_by_kind.get(kind, 0)
        (posted,), _ = post_all(running.agent_url, rows_for(side.name, episodes(1)), 1, timeout_s=bound_s)
        result = outcome(posted)
        result["policy_requests_failed"] = fake.stats().faults_by_kind.get(kind, 0) - before
        result["scored_as"] = ("a reward of 0 (failure scored)" if posted.status == 200 and result["reward"] == 0
                               else "no reward (infrastructure failure)" if posted.status else
                               f"no answer within {bound_s:.0f} s")  # fmt: skip
        probes["policy_500s" if kind == "http_500" else "policy_hangs"] = result
    _reset(fake)
    print(f"  {running.label}: failures {json.dumps(probes)[:400]}", file=sys.stderr, flush=True)
    time.sleep(0.5)
    return probes


def smollm2_probe(running, rows, tau2_python: Path, count: int) -> dict:
    """A real model (SmolLM2-135M on llama.cpp) as policy and user: ``count`` episodes of one task, each reward
    against tau2's own scoring of the trajectory played."""
    side = running.side
    posted, wall = post_all(running.agent_url, rows, count, timeout_s=600.0)
    records = []
    for p in posted:
        body = p.body if isinstance(p.body, dict) else {}
        records.append({**outcome(p), "trajectory": trajectory(side.name, body)})
    scored = [r for r in records if r["ok"] and r["trajectory"]]
    references = rescore(tau2_python, [
        {"domain": "airline", "task_id": SMOLLM2_TASK, "messages": r["trajectory"][0],
         "termination_reason": r["trajectory"][1]} for r in scored
    ])  # fmt: skip
    for record, reference in zip(scored, references, strict=True):
        record["tau2_reward"] = reference.get("reward", reference.get("error"))
    for record in records:
        turns = record.pop("trajectory") or ([], None)
        record["messages"], record["termination_reason"] = len(turns[0]), turns[1]
    print(f"  {running.label}: SmolLM2 {json.dumps(records)[:300]}", file=sys.stderr, flush=True)
    identical = sum(r.get("tau2_reward") == r["reward"] for r in scored)
    return {"episodes": count, "wall_s": round(wall, 1), "scored": len(scored), "identical_to_tau2": identical,
            "records": records}  # fmt: skip


def table(results: dict, levels: list[int], workers: list[int]) -> dict:
    """The readable table (printed) and the summary figures: ours against their best setting at each level."""
    rows = results["throughput"]
    print(f"\n{'side':<26} {'c':>3} {'episodes/s':>11} {'CPU-s/episode':>14} {'ok':>8}")
    for row in rows:
        print(f"{row['side']:<26} {row['concurrency']:>3} {row['episodes_per_s']:>11.2f} "
              f"{row['cpu_s_per_episode']:>14.3f} {row['ok']:>4}/{row['episodes']:<3}")  # fmt: skip
    summary: dict[str, Any] = {}
    for level in levels:
        ours = next(r for r in rows if r["side"] == "ours" and r["concurrency"] == level)
        theirs = [r for r in rows if r["side"] != "ours" and r["concurrency"] == level]
        best = max(theirs, key=lambda r: r["episodes_per_s"])
        summary[f"c{level}"] = {
            "ours_episodes_per_s": ours["episodes_per_s"], "theirs_episodes_per_s": best["episodes_per_s"],
            "theirs_best_setting": best["side"], "ratio_episodes_per_s": round(ours["episodes_per_s"] /
                                                                                best["episodes_per_s"], 2),
            "ours_cpu_s_per_episode": ours["cpu_s_per_episode"],
            "theirs_cpu_s_per_episode": best["cpu_s_per_episode"],
            "ratio_cpu_s_per_episode": round(ours["cpu_s_per_episode"] / max(best["cpu_s_per_episode"], 1e-9), 3),
        }  # fmt: skip
    for name, found in results["rewards"].items():
        summary[f"{name}_rewards_identical_to_tau2"] = f"{found['identical_to_tau2']}/{found['episodes']}"
    summary["training"] = {name: {k: v for k, v in found.items() if k in ("policy_turns", "turns_with_token_ids",
                           "token_ids_on_output_items", "contiguous_turns", "breaks")}
                           for name, found in results["training"].items()}  # fmt: skip
    summary["failures"] = {name: {probe: found[probe]["scored_as"] for probe in found}
                           for name, found in results["failures"].items()}  # fmt: skip
    return summary
