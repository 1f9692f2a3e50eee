"""Profiling pivot candidates with a frozen policy, and PivotRL's filter (``examples/profile_pivots.py``).

Each candidate's prompt goes to a policy on any OpenAI-compatible endpoint ``samples`` times (Chat Completions,
converted from the row's Responses request as our model server converts it). Each answer is scored by the resources
server's functional verdict (``/verify_pivot``: the action run in a fork of the pivot's state). A candidate is kept
when its rewards vary (some samples right, some wrong) and their mean is below ``max_mean``: PivotRL's filter (a turn
the policy always gets right, or never, teaches nothing to GRPO).

Through an agent server instead (:class:`AgentProfiler`), each sample is the pivot row's rollout as training plays
it: the agent's policy, and its ``pivot_text_reward`` (``continue``: a text pivot played on and scored by tau2's
reward, which a verdict alone cannot give).

The profile is one JSON line per candidate, written as each finishes (``<pivots>.profile.jsonl`` by default):
``status`` ``ok`` (rewards, categories, the sampled actions, mean, variance, ``kept``), ``refused`` (the server
could not rebuild its state: the reason; never retried) or ``error`` (the endpoint or the server failed:
infrastructure, never a score; retried on the next run). A rerun profiles only what has no ``ok`` or ``refused``
line yet. The kept candidates are then written, whole, to the output file.
"""

import asyncio
import os
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from nemo_tau2.gym.model_server.conversion import chat_request, output_items
from nemo_tau2.pivots.actions import action_of_output
from nemo_tau2.utils.jsonl_log import JsonlLog, replace_lines

OK, REFUSED, ERROR = "ok", "refused", "error"
RESPONSE_SHELL = {"id": "profile", "created_at": 0, "object": "response", "parallel_tool_calls": True,
                  "tool_choice": "auto", "tools": []}  # fmt: skip


@dataclass
class Endpoint:
    """The frozen policy: an OpenAI-compatible server (``base_url`` ends in ``/v1``) and the sampling."""

    base_url: str
    model: str
    api_key_env: str | None = None  # the variable holding its key (the key itself never in argv or files)
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 512
    timeout_s: float = 300.0
    attempts: int = 3


@dataclass
class ProfileSettings:
    samples: int = 8  # K: samples per candidate (NeMo-Gym's pivot guide: at least 8)
    max_mean: float = 1.0  # keep a candidate whose mean reward is below this (1.0: every mixed one)
    concurrency: int = 64  # candidates in flight


@dataclass
class ProfileReport:
    candidates: int = 0
    profiled: Counter = field(default_factory=Counter)  # (domain, status) -> candidates, this run and before
    kept: Counter = field(default_factory=Counter)  # domain -> kept candidates
    rewards: dict[str, list[float]] = field(default_factory=dict)  # domain -> every sample's reward
    samples_run: int = 0  # sampled in this run
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        domains = sorted({domain for domain, _ in self.profiled})
        return {
            "candidates": self.candidates, "samples_run": self.samples_run, "seconds": round(self.seconds, 2),
            "samples_per_s": round(self.samples_run / self.seconds, 2) if self.seconds else None,
            "by_domain": {domain: {
                "profiled": self.profiled[domain, OK], "refused": self.profiled[domain, REFUSED],
                "errors": self.profiled[domain, ERROR], "kept": self.kept[domain],
                "mean_reward": statistics.fmean(self.rewards[domain]) if self.rewards.get(domain) else None,
            } for domain in domains},
        }  # fmt: skip


def verdict_of(rewards: list[float], settings: ProfileSettings) -> dict[str, Any]:
    mean = statistics.fmean(rewards)
    variance = statistics.pvariance(rewards)
    return {"mean": mean, "variance": variance, "kept": variance > 0 and mean < settings.max_mean}


class Profiler:
    def __init__(self, endpoint: Endpoint, verify_url: str, settings: ProfileSettings):
        self.endpoint, self.verify_url, self.settings = endpoint, verify_url.rstrip("/"), settings
        key = os.environ.get(endpoint.api_key_env or "", "") if endpoint.api_key_env else ""
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}

    async def sample(self, http: aiohttp.ClientSession, pivot: dict[str, Any]) -> list[dict[str, Any]]:
        """One policy answer to the pivot's prompt, as Responses output items."""
        endpoint = self.endpoint
        request = chat_request(pivot["responses_create_params"], with_token_ids=False) | {
            "model": endpoint.model, "temperature": endpoint.temperature, "top_p": endpoint.top_p,
            "max_tokens": endpoint.max_tokens,
        }  # fmt: skip
        url = f"{endpoint.base_url.rstrip('/')}/chat/completions"
        async with http.post(url, json=request, headers=self.headers) as answer:
            if answer.status != 200:
                raise PolicyError(f"the policy endpoint answered {answer.status}: {(await answer.text())[:200]}")
            message = (await answer.json())["choices"][0]["message"]
        return output_items(message | {"role": "assistant"}, None)

    async def verify(self, http: aiohttp.ClientSession, pivot: dict[str, Any], output: list[dict]) -> dict:
        body = pivot | {"response": RESPONSE_SHELL | {"model": self.endpoint.model, "output": output}}
        return await post_pivot(http, f"{self.verify_url}/verify_pivot", body, "/verify_pivot")

    async def judged_sample(self, http: aiohttp.ClientSession, pivot: dict[str, Any], index: int) -> tuple[dict, list]:
        """One sample's verdict (``reward``, ``category``) and its output items."""
        output = await self.sample(http, pivot)
        return await self.verify(http, pivot, output), output

    async def one_sample(self, http: aiohttp.ClientSession, pivot: dict[str, Any], index: int) -> dict[str, Any]:
        for attempt in range(1, self.endpoint.attempts + 1):  # a retry is safe: sampling and verdicts are pure
            try:
                judged, output = await self.judged_sample(http, pivot, index)
                action = action_of_output(output)
                return {"reward": judged["reward"], "category": judged["category"],
                        "action": action.model_dump() if action is not None else None}  # fmt: skip
            except (TimeoutError, aiohttp.ClientError, PolicyError, KeyError, IndexError, TypeError) as e:
                if attempt == self.endpoint.attempts:
                    raise PolicyError(f"{type(e).__name__}: {e}") from e
                await asyncio.sleep(0.5 * attempt)
        raise AssertionError("unreachable")

    async def profile_one(self, http: aiohttp.ClientSession, pivot: dict[str, Any]) -> dict[str, Any]:
        line = {key: pivot.get(key) for key in ("pivot_id", "domain", "task_id", "turn", "split")}
        line["expected_type"] = pivot["expected_action"]["type"]
        try:
            samples = await asyncio.gather(*(self.one_sample(http, pivot, k) for k in range(self.settings.samples)))
        except PivotRefused as e:
            return line | {"status": REFUSED, "detail": str(e)}
        except PolicyError as e:
            return line | {"status": ERROR, "detail": str(e)}
        rewards = [sample["reward"] for sample in samples]
        categories, actions = [sample["category"] for sample in samples], [sample["action"] for sample in samples]
        settled = {"status": OK, "rewards": rewards, "categories": categories, "actions": actions}
        return line | settled | verdict_of(rewards, self.settings)


class AgentProfiler(Profiler):
    """Profiles through a tau2 agent server's ``/run``: each sample is the rollout training makes of the pivot row
    (the agent's policy model, and its ``pivot_text_reward``: a text pivot played on and scored by tau2's reward in
    mode ``continue``). ``endpoint.base_url`` is the agent's URL; its sampling settings go into the row."""

    def __init__(self, endpoint: Endpoint, settings: ProfileSettings):
        super().__init__(endpoint, endpoint.base_url, settings)

    async def judged_sample(self, http: aiohttp.ClientSession, pivot: dict[str, Any], index: int) -> tuple[dict, list]:
        endpoint = self.endpoint
        sampling = {"temperature": endpoint.temperature, "top_p": endpoint.top_p,
                    "max_output_tokens": endpoint.max_tokens}  # fmt: skip
        row = pivot | {"responses_create_params": pivot["responses_create_params"] | sampling, "sample_index": index}
        result = await post_pivot(http, f"{self.verify_url}/run", row, "the agent's /run")
        judged = {"reward": result["reward"], "category": result["reward_info"]["pivot"]["category"]}
        return judged, result["response"]["output"]


async def post_pivot(http: aiohttp.ClientSession, url: str, body: dict[str, Any], what: str) -> dict[str, Any]:
    """POST a pivot row (with a sample) to a tau2 server; its answer. A 4xx refuses the pivot (never retried), any
    other failure is infrastructure."""
    async with http.post(url, data=orjson.dumps(body), headers={"Content-Type": "application/json"}) as answer:
        if 400 <= answer.status < 500:
            raise PivotRefused((await answer.json()).get("detail", f"HTTP {answer.status}"))
        if answer.status != 200:
            raise PolicyError(f"{what} answered {answer.status}: {(await answer.text())[:200]}")
        return await answer.json()


class PolicyError(RuntimeError):
    """The endpoint or the server failed (infrastructure): the candidate is retried on the next run."""


class PivotRefused(ValueError):
    """The server refused the pivot (a state that does not rebuild, a row it cannot play): never retried."""


def _done(profile_path: Path) -> dict[str, dict[str, Any]]:
    """The profile's settled lines (ok or refused) by pivot id; a torn tail is set aside by the log on open."""
    done = {}
    if profile_path.exists():
        with JsonlLog(profile_path, "their candidates will be profiled again") as log:
            for line in log.records():
                if line.get("status") in (OK, REFUSED):
                    done[line["pivot_id"]] = line
    return done


async def profile_pivots(
    pivots: list[dict[str, Any]], profiler: Profiler, profile_path: Path, output: Path,
    on_progress: Callable[[ProfileReport, int], None] | None = None,
) -> ProfileReport:  # fmt: skip
    """Profile every candidate not yet settled in ``profile_path``; write the kept ones to ``output``."""
    started, report = time.perf_counter(), ProfileReport(candidates=len(pivots))
    done = _done(profile_path)
    todo = [pivot for pivot in pivots if pivot["pivot_id"] not in done]
    gate = asyncio.Semaphore(profiler.settings.concurrency)
    timeout = aiohttp.ClientTimeout(total=profiler.endpoint.timeout_s)
    connector = aiohttp.TCPConnector(limit=profiler.settings.concurrency * 2)
    with JsonlLog(profile_path, "their candidates will be profiled again") as log:
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:

            async def run(pivot: dict[str, Any]) -> None:
                async with gate:
                    line = await profiler.profile_one(http, pivot)
                log.append(line)
                done[line["pivot_id"]] = line
                report.samples_run += len(line.get("rewards") or [])
                if on_progress is not None:
                    on_progress(report, len(done))

            await asyncio.gather(*(run(pivot) for pivot in todo))
    for line in done.values():
        report.profiled[line["domain"], line["status"]] += 1
        if line["status"] == OK:
            report.rewards.setdefault(line["domain"], []).extend(line["rewards"])
            report.kept[line["domain"]] += bool(line["kept"])
    kept = [pivot for pivot in pivots if done.get(pivot["pivot_id"], {}).get("kept")]
    replace_lines(output, [orjson.dumps(pivot) + b"\n" for pivot in kept])
    report.seconds = time.perf_counter() - started
    return report
