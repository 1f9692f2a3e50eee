"""``eval.rollout_mode=single_turn``: one generation per prompt of a plain prompt/answer JSONL, scored by a verifier.

Kept for NeMo-RL's original eval use (math-style datasets): each row has a prompt (a string, or a list of chat
messages) and an answer; the policy endpoint answers each prompt ``num_tests_per_prompt`` times over its
OpenAI-compatible chat API, and ``exact_match`` (whitespace-trimmed, case-sensitive) or ``contains`` turns each
answer into a binary success. The same results files, resume rule and metrics as the multi-turn mode apply (the
"domain" of every row is the data file's name).
"""

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
from omegaconf import DictConfig
from tqdm import tqdm

from nemo_tau2.config import redact_secrets
from nemo_tau2.evals.config import EvalMasterConfig
from nemo_tau2.evals.metrics import EpisodeRecord, EpisodeStatus, compute_eval_metrics, format_summary_table
from nemo_tau2.evals.results import CONFIG_FILE, SUMMARY_FILE, RolloutLog, write_json_atomic
from nemo_tau2.generation.launch import start_generation


def verify(verifier: str, generated: str, answer: str) -> bool:
    if verifier == "exact_match":
        return generated.strip() == str(answer).strip()
    return str(answer).strip() in generated


def _messages(prompt: Any, index: int) -> list[dict]:
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m for m in prompt):
        return prompt
    raise ValueError(
        f"row {index}: the prompt must be a string or a list of chat messages, got {type(prompt).__name__}"
    )


async def _generate_all(cfg: EvalMasterConfig, base_url: str, model: str, api_key: str, jobs, log, progress) -> None:
    generation = cfg.policy.generation
    gate = asyncio.Semaphore(cfg.eval.max_concurrency)
    headers = {"Authorization": f"Bearer {api_key}"}
    timeout = aiohttp.ClientTimeout(total=cfg.eval.request_timeout_s)
    async with aiohttp.ClientSession(headers=headers, timeout=timeout) as http:

        async def one(domain: str, index: int, sample: int, messages: list[dict], answer: Any) -> None:
            body = {
                "model": model,
                "messages": messages,
                "temperature": generation.temperature,
                "top_p": generation.top_p,
                "max_tokens": generation.max_new_tokens,
                "user": f"single_turn|{domain}|{index}|{sample}",
            }
            record = {"domain": domain, "task_id": str(index), "sample_index": sample, "policy_model": model}
            record |= {"termination_reason": None, "num_turns": None, "total_tokens": None}  # one generation
            async with gate:
                try:
                    async with http.post(f"{base_url}/chat/completions", json=body) as response:
                        payload = await response.json(content_type=None)
                        response.raise_for_status()
                    text = payload["choices"][0]["message"].get("content") or ""
                    success = verify(cfg.eval.verifier, text, answer)
                    record |= {
                        "status": EpisodeStatus.OK,
                        "success": success,
                        "reward": float(success),
                        "generation": text,
                    }
                except (aiohttp.ClientError, TimeoutError, KeyError, ValueError) as e:
                    record |= {
                        "status": EpisodeStatus.INFRASTRUCTURE_ERROR,
                        "success": None,
                        "reward": None,
                        "error": repr(e),
                    }
            log.append(record)
            progress.update(1)

        await asyncio.gather(*(one(*job) for job in jobs))


def run_single_turn_eval(cfg: EvalMasterConfig, raw: DictConfig) -> tuple[dict[str, Any], str]:
    save_dir = Path(cfg.eval.save_path)
    save_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(save_dir / CONFIG_FILE, redact_secrets(raw))
    path = Path(cfg.data.data_path)
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    domain = path.stem
    for index, row in enumerate(rows):
        for key in (cfg.data.prompt_key, cfg.data.answer_key):
            if key not in row:
                raise ValueError(f"{path} row {index} has no {key!r} field (data.prompt_key / data.answer_key)")
    log = RolloutLog(save_dir)
    try:
        done = log.done()
        jobs = [
            (domain, i, s, _messages(row[cfg.data.prompt_key], i), row[cfg.data.answer_key])
            for i, row in enumerate(rows)
            for s in range(cfg.eval.num_tests_per_prompt)
            if (domain, str(i), s) not in done
        ]
        total = len(rows) * cfg.eval.num_tests_per_prompt
        if jobs:
            with (
                start_generation(cfg.policy.generation) as endpoint,
                tqdm(total=total, initial=total - len(jobs), desc="prompts", unit="gen") as progress,
            ):
                asyncio.run(
                    _generate_all(
                        cfg, endpoint.base_urls[0], endpoint.model_name, endpoint.api_key, jobs, log, progress
                    )
                )
        records = [EpisodeRecord.from_dict(record) for record in log]
    finally:
        log.close()
    metrics = compute_eval_metrics(
        records, ks=cfg.eval.k_values, num_bootstrap=cfg.eval.bootstrap_samples, seed=cfg.eval.seed
    )
    summary = {
        "num_tests_per_prompt": cfg.eval.num_tests_per_prompt,
        "k_values": cfg.eval.k_values,
        "metrics": metrics,
    }
    write_json_atomic(save_dir / SUMMARY_FILE, summary)
    return summary, format_summary_table(metrics, show_ci=cfg.eval.bootstrap_samples > 0)
