"""tau2 v1.0.1's banking_knowledge (tau-Knowledge) through our servers: the oracle (each task's gold actions, the
user's through the scripted user) plays all 97 tasks on the offline default variant, bm25_grep, through the Gym
servers of an eval, and every reward is tau2 v1.0.1's own, the environments built with the arguments tau2's runner
passes (its own ``_build_env_kwargs``: the variant, the task, the read-log allowlist); task_102 (DB x NL_ASSERTION)
through the scripted judge. The rows come from the release with the variant's prompt and tools. Two episodes of one
task, interleaved, each score as alone (test_parity_v1.py compares the domain with tau2's own run, perturbations
included). A variant the release
lacks, one that calls a service not connected, and the domain under v0.2.1 are each refused before anything starts,
in one line."""

import json
import re
import subprocess

import pytest

from nemo_tau2.config import ConfigError
from nemo_tau2.evals.eval import build_eval_rows, run_eval, setup_eval
from nemo_tau2.tau2_release.client import Tau2Worker, Tau2WorkerError
from nemo_tau2.tau2_release.config import Tau2ReleaseConfig
from tests.tau2_v1_env import tau2_v1_python
from tests.unit.tau2_release.banking_eval import banking_eval_config
from tests.unit.tau2_release.episode_scripts import episode_scripts
from tests.unit.tau2_release.worker_episodes import play, play_interleaved, summary

DOMAIN = "banking_knowledge"


def test_the_oracle_scores_one_on_every_banking_task_with_bm25_grep(judge, release_tasks, tmp_path):
    raw = banking_eval_config(tmp_path, judge, release_tasks)
    summary, _ = run_eval(setup_eval(raw), raw)
    records = [json.loads(line) for line in (tmp_path / "rollouts.jsonl").read_text().splitlines() if line.strip()]
    assert len(records) == 97 and summary["tau2_version"] == "v1.0.1"
    failed = [(r["task_id"], r["status"], r.get("reward"), r.get("error")) for r in records if r.get("reward") != 1.0]
    assert failed == []
    # the oracle unlocks every gold tool and searches nothing: in each record and in the summary
    unlocks = [r["retrieval"]["unlock_recall"] for r in records]
    assert set(unlocks) == {1.0, None} and all(r["retrieval"]["searches"] == [] for r in records)
    assert summary["metrics"]["eval/banking_knowledge/mean_unlock_recall"] == 1.0
    assert summary["metrics"]["eval/banking_knowledge/mean_document_recall"] == 0.0
    prompts = json.loads((tmp_path / "system_prompts.json").read_text())
    assert len(prompts["prompts"]) == 1 and len(prompts["tasks"]) == 97  # one prompt: bm25_grep's is the task's own
    assert "KB_search" in prompts["prompts"][0] and "grep" in prompts["prompts"][0]


def test_a_variant_the_release_lacks_or_one_needing_a_service_is_refused_at_start(judge, monkeypatch):
    with pytest.raises(Tau2WorkerError, match=r"^tau2.retrieval_variant / tau2.retrieval_kwargs: .*'no_such'"):
        Tau2Worker(Tau2ReleaseConfig(version="v1.0.1", python=tau2_v1_python(), retrieval_variant="no_such"))
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(Tau2WorkerError) as refused:  # its reranker is OpenAI's by default, and no key is set
        Tau2Worker(
            Tau2ReleaseConfig(version="v1.0.1", python=tau2_v1_python(), retrieval_variant="bm25_reranker_grep")
        )
    assert str(refused.value) == (
        "tau2.retrieval_variant 'bm25_reranker_grep' calls openai's API for its reranker and it needs "
        "$OPENAI_API_KEY, which is not set: export it, or set tau2.reranker.base_url to an OpenAI-compatible "
        "endpoint (vLLM, llama.cpp; docs/banking-knowledge.md)"
    )


def test_banking_knowledge_under_v021_is_refused_in_one_line_naming_v101(tmp_path, judge, release_tasks):
    raw = banking_eval_config(tmp_path, judge, release_tasks, "++tau2.version=v0.2.1")
    with pytest.raises(ConfigError) as refused:
        setup_eval(raw)
    message = str(refused.value)
    assert "domain 'banking_knowledge' is tau2 v1.0.1's (not in v0.2.1): set tau2.version=v1.0.1" in message
    assert "\n" not in message


def test_two_interleaved_episodes_of_one_task_each_score_as_if_alone(worker):
    """Each episode its own DB, unlocked tools and discoverable-tool log: the oracle and a call-without-unlock of the
    same task, step by step in turn, score and answer exactly as each does alone."""
    greeting = worker.request("greeting")
    task = next(
        task
        for task in worker.request("tasks", domain=DOMAIN, split="base")
        if {"call_without_unlock", "no_verification"} <= set(episode_scripts(task, greeting))
    )
    scripts = episode_scripts(task, greeting)
    pair = [scripts["oracle"], scripts["call_without_unlock"]]
    alone = [summary(play(worker, DOMAIN, task["id"], script)) for script in pair]
    together = [summary(played) for played in play_interleaved(worker, DOMAIN, task["id"], pair)]
    assert together == alone and [episode["reward"] for episode in alone] == [1.0, 0.0]


def test_rows_of_another_retrieval_variant_are_refused_before_anything_starts(tmp_path, judge, release_tasks):
    rows = tmp_path / "rows.jsonl"
    row = {
        "domain": DOMAIN,
        "task_id": "task_001",
        "tau2_version": "v1.0.1",
        "retrieval_variant": "golden_retrieval",
        "responses_create_params": {"input": []},
        "agent_ref": {"type": "responses_api_agents", "name": "tau2_agent"},
    }
    rows.write_text(json.dumps(row) + "\n")
    raw = banking_eval_config(tmp_path / "out", judge, release_tasks, f"data.data_path={rows}")
    with pytest.raises(ConfigError, match=r"written for retrieval variant \['golden_retrieval'\], not tau2.retriev"):
        build_eval_rows(setup_eval(raw))  # what run_eval does first, before any server starts


def _document_titles(doc_ids: list[str]) -> dict[str, str]:
    """The release's own titles of ``doc_ids`` (its knowledge base, read in its environment)."""
    code = (
        "import json, sys; from tau2.domains.banking_knowledge.environment import get_knowledge_base; "
        "kb = get_knowledge_base(); print(json.dumps({d: kb.get_document(d).title for d in sys.argv[1:]}))"
    )
    run = subprocess.run([tau2_v1_python(), "-c", code, *doc_ids], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.splitlines()[-1])


def test_a_verdict_says_which_required_documents_were_found_and_which_gold_tools_unlocked(worker):
    """The verdict's ``retrieval``: each search with the documents its answer listed (tau2's ``ID:`` lines), the
    task's required documents found among them, and the discoverable tools unlocked against the gold unlocks."""
    greeting = worker.request("greeting")
    task = next(
        task
        for task in worker.request("tasks", domain=DOMAIN, split="base")
        if len(task.get("required_documents") or []) >= 2 and "call_without_unlock" in episode_scripts(task, greeting)
    )
    required = task["required_documents"]
    title = _document_titles(required[:1])[required[0]]
    reads = [
        {"name": "KB_search", "arguments": {"query": title}, "requestor": "assistant"},
        {"name": "grep", "arguments": {"pattern": "zq-no-document-says-this-qz"}, "requestor": "assistant"},
    ]
    scripts = episode_scripts(task, greeting, reads)
    played = play(worker, DOMAIN, task["id"], scripts["extra_reads"])
    retrieval, listed = played["retrieval"], re.findall(r"^\s*ID: (\S+)$", played["tool_answers"][0]["content"], re.M)
    assert played["reward"] == 1.0 and required[0] in listed
    assert retrieval["searches"] == [
        {"tool": "KB_search", "arguments": {"query": title}, "documents": listed},
        {"tool": "grep", "arguments": {"pattern": "zq-no-document-says-this-qz"}, "documents": []},
    ]
    assert retrieval["documents_found"] == listed and retrieval["required_documents"] == required
    assert retrieval["document_recall"] == round(len(set(listed) & set(required)) / len(set(required)), 6) > 0
    gold = [a["arguments"]["agent_tool_name"] for a in task["evaluation_criteria"]["actions"]
            if a["name"] == "unlock_discoverable_agent_tool"]  # fmt: skip
    assert retrieval["tools_unlocked"] == retrieval["gold_unlocks"] == list(dict.fromkeys(gold))
    assert retrieval["unlock_recall"] == 1.0 and retrieval["extra_unlocks"] == []
    assert set(retrieval["agent_tools_called"]) == set(retrieval["gold_agent_tool_calls"]) != set()

    skipped = play(worker, DOMAIN, task["id"], scripts["call_without_unlock"])["retrieval"]
    assert skipped["searches"] == [] and skipped["document_recall"] == 0.0
    unlocks = [step[3]["agent_tool_name"] for step in scripts["call_without_unlock"]["steps"]
               if step[0] == "call" and step[2] == "unlock_discoverable_agent_tool"]  # fmt: skip
    assert skipped["tools_unlocked"] == list(dict.fromkeys(unlocks)) and skipped["unlock_recall"] < 1.0
