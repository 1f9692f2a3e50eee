"""banking_knowledge's retrieval in the records and the report: two real evals of the same tasks through the Gym
servers, one per retrieval variant (bm25_grep, grep_only), the scripted policy searching the knowledge base for each
task's first required document by the words of its id (``KB_search``, which grep_only lacks) before the gold
actions. Every record says what
its search showed; the comparison report, in headless Chromium, draws the retrieval section with each run named by
its variant and one table row per episode."""

import json
from pathlib import Path

import pytest

from nemo_tau2.evals.eval import run_eval, setup_eval
from nemo_tau2.report.build import build_report
from tests.browser import RENDERED_FIGURES, chromium, open_report
from tests.unit.tau2_release.banking_eval import banking_eval_config

NUM_TASKS = 4
VARIANTS = ("bm25_grep", "grep_only")


@pytest.fixture(scope="module")
def evals(judge, release_tasks, tmp_path_factory) -> dict[str, Path]:
    folders = {}
    for variant in VARIANTS:
        folder = tmp_path_factory.mktemp(variant)
        raw = banking_eval_config(
            folder, judge, release_tasks, f"++tau2.retrieval_variant={variant}", f"data.num_tasks={NUM_TASKS}",
            "++policy.generation.fake_cfg.tau2.policy.variant=search_first",
        )  # fmt: skip
        run_eval(setup_eval(raw), raw)
        folders[variant] = folder
    return folders


def _records(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "rollouts.jsonl").read_text().splitlines() if line.strip()]


def test_each_record_says_what_its_search_showed_and_which_gold_tools_it_unlocked(evals):
    found, missing = _records(evals["bm25_grep"]), _records(evals["grep_only"])
    assert len(found) == len(missing) == NUM_TASKS
    for record in found:
        (search,) = record["retrieval"]["searches"]
        assert search["tool"] == "KB_search" and len(search["documents"]) == 10  # BM25's top 10, by id
        assert record["retrieval"]["documents_found"] == search["documents"]
        required = set(record["retrieval"]["required_documents"])  # BM25 on a document id's words rarely finds it
        assert record["retrieval"]["document_recall"] == round(
            len(required & set(search["documents"])) / len(required), 6
        )
    for record in missing:  # grep_only has no KB_search: tau2 answers with an error, which shows no document
        assert record["retrieval"]["searches"] == [
            {"tool": "KB_search", "arguments": search_arguments(record, found), "documents": []}
        ]
        assert record["retrieval"]["document_recall"] in (0.0, None)
    for record in found + missing:
        assert record["reward"] == 1.0 and record["retrieval"]["unlock_recall"] in (1.0, None)


def search_arguments(record: dict, found: list[dict]) -> dict:
    return next(r for r in found if r["task_id"] == record["task_id"])["retrieval"]["searches"][0]["arguments"]


def test_the_compared_report_draws_retrieval_by_variant(evals, tmp_path):
    report = build_report([evals[variant] for variant in VARIANTS], tmp_path / "report.html")
    with chromium() as browser:
        opened = open_report(browser, report)
        page = opened.page
        rendered = page.evaluate(RENDERED_FIGURES)
        assert opened.console_errors == [] and opened.network_requests == []
        for title in ("Success rate by required documents found", "Retrieval: mean recall"):
            assert title in rendered["drawn"], rendered["drawn"]
        rows = page.locator("#retrieval-table tr.retrieval-row").all_inner_texts()
        assert len(rows) == 2 * NUM_TASKS
        legend = page.evaluate(  # the series of the mean-recall chart, one per run, as its legend names them
            "() => [...Bokeh.documents[0].all_models].filter((m) => m.data && m.data.series && m.data.x"
            ' && [...m.data.x].includes("gold tools unlocked")).map((m) => m.data.series[0])'
        )
        assert [label.rsplit(" [", 1)[1] for label in legend] == [f"{variant}]" for variant in VARIANTS]
        first = _records(evals["bm25_grep"])[0]
        required = first["retrieval"]["required_documents"]
        hits = len(set(first["retrieval"]["documents_found"]) & set(required))
        assert any(row.startswith(f"banking_knowledge/{first['task_id']} #0") and f"\t{hits}/{len(required)}\t" in row
                   for row in rows), rows  # fmt: skip
