"""The report in a real browser (headless Chromium from the OS, driven by Playwright): two real evaluations on the
fake generation backend (real Gym servers, real tau2), one oracle and one whose policy gets an argument wrong in
every other sample, reported alone and compared."""

from pathlib import Path

import pytest

from nemo_tau2.evals.failure_kinds import KINDS
from nemo_tau2.evals.results import latest_records
from nemo_tau2.report.build import build_report
from nemo_tau2.tau2_env.gym_rows import task_row
from tests.browser import RENDERED_FIGURES, chromium, click_cell, open_report
from tests.unit.report.eval_pair import TASKS, records

EXPECTED_FIGURES = [
    *(f"{scope}: pass^k and pass@k" for scope in ("overall", "airline", "retail")),
    "outcome of every episode (click a cell to read it)",
    "Outcomes: share of episodes",
    "Reward components: mean score",
    "Termination reasons: share of episodes",
    "Policy turns per episode",
    "Tokens per episode (whole sequence)",
    "Wall time per episode",
]


@pytest.fixture(scope="module")
def browser():
    with chromium() as browser:
        yield browser


@pytest.fixture(scope="module")
def single_report(evals, tmp_path_factory) -> Path:
    return build_report([evals[1]], tmp_path_factory.mktemp("single") / "report.html")


def test_the_eval_report_renders_every_chart_without_console_errors(single_report, browser):
    opened = open_report(browser, single_report)
    rendered = opened.page.evaluate(RENDERED_FIGURES)
    assert opened.console_errors == []
    assert len(rendered["figures"]) == len(EXPECTED_FIGURES)
    assert sorted(rendered["drawn"]) == sorted(rendered["figures"])  # every chart has a drawn canvas
    for title in EXPECTED_FIGURES:
        assert any(t.endswith(title) for t in rendered["drawn"]), title
    assert opened.network_requests == []


def test_the_grid_has_one_cell_per_episode(evals, single_report, browser):
    page = open_report(browser, single_report).page
    keys = page.evaluate('() => Bokeh.documents[0].get_model_by_name("grid_source_0").data.key')
    episodes = {(r["domain"], str(r["task_id"]), r["sample_index"]) for r in records(evals[1])}
    assert len(keys) == len(set(keys)) == len(episodes) == len(TASKS) * 2
    assert {tuple(key.split("|")[1:3]) + (int(key.split("|")[3]),) for key in keys} == episodes


def test_clicking_a_cell_opens_its_transcript_with_its_task_id_and_reward(evals, single_report, browser):
    page = open_report(browser, single_report).page
    episodes = records(evals[1])
    failed = next(r for r in episodes if r["status"] == "ok" and not r["success"])
    passed = next(r for r in episodes if r["status"] == "ok" and r["success"] and r["task_id"] != failed["task_id"])
    for record in (failed, passed):
        key = f"0|{record['domain']}|{record['task_id']}|{record['sample_index']}"
        click_cell(page, 0, key)
        page.wait_for_selector(f'#viewer-body[data-episode="{key}"]')
        assert page.is_visible("#viewer")
        assert page.inner_text("#viewer-title") == f"task {record['domain']}/{record['task_id']}"
        facts = page.inner_text("#viewer-body .facts")
        assert f"reward {record['reward']:.3f}" in facts
        assert ("success" in facts) == record["success"]
        calls = [item["name"] for item in record["transcript"] if item.get("type") == "function_call"]
        shown = page.locator("#viewer-body .turn.call").all_inner_texts()
        assert [text.split("\n", 1)[1].split("(", 1)[0] for text in shown] == calls
        system_prompt = task_row(record["domain"], record["task_id"])["responses_create_params"]["input"][0]
        assert page.locator("#viewer-body details.system pre").first.text_content() == system_prompt["content"]
        page.keyboard.press("Escape")
        assert not page.is_visible("#viewer")


def test_the_failure_kinds_table_shows_each_domains_share_of_every_ending(evals, single_report, browser):
    page = open_report(browser, single_report).page
    episodes = list(latest_records(records(evals[1])).values())
    assert len({r["tau2_failure_kind"] for r in episodes}) > 1  # shares other than 0 and 100 to tell apart
    scopes = page.eval_on_selector_all(
        "#failure-kinds-table tr:first-child th", "cells => cells.map(c => c.textContent)"
    )
    assert scopes == ["how it ended", "overall", "airline", "retail"]
    for kind in KINDS:
        cells = page.eval_on_selector_all(
            f'#failure-kinds-table tr[data-kind="{kind}"] td', "cells => cells.map(c => c.textContent)"
        )
        for scope, shown in zip(scopes[1:], cells[1:], strict=True):
            scoped = [r for r in episodes if scope == "overall" or r["domain"] == scope]
            share = sum(r["tau2_failure_kind"] == kind for r in scoped) / len(scoped)
            assert shown == f"{100 * share:.1f}", (kind, scope)
    transfer = page.eval_on_selector_all(
        '#failure-kinds-table tr[data-kind="trajectory_transfer_to_human_agents"] td',
        "cells => cells.map(c => c.textContent)",
    )
    played = [r for r in episodes if r["status"] == "ok"]
    share = sum(r["agent_tool_calls"]["transfer_to_human_agents"] for r in played) / len(played)
    assert transfer[1] == f"{100 * share:.1f}"  # NeMo-Gym's share, on its name's row (overall)


def _pass_rates(folder: Path) -> dict[str, float]:
    counts: dict[str, list[int]] = {}
    for record in records(folder):
        if record["status"] == "ok":
            tally = counts.setdefault(f"{record['domain']}/{record['task_id']}", [0, 0])
            tally[0] += record["success"]
            tally[1] += 1
    return {task: s / n for task, (s, n) in counts.items()}


def test_the_comparison_lists_exactly_the_tasks_that_flipped(evals, browser, tmp_path):
    before, after = _pass_rates(evals[0]), _pass_rates(evals[1])
    flipped = {t for t in before.keys() & after.keys() if (before[t] > 0.5) != (after[t] > 0.5)}
    assert flipped and flipped != set(before)  # some tasks flip, some do not: the check can tell them apart
    report = build_report(list(evals), tmp_path / "compare.html")
    opened = open_report(browser, report)
    page = opened.page
    listed = page.eval_on_selector_all("#flipped-table tr.flipped", "rows => rows.map(r => r.dataset.task)")
    assert sorted(listed) == sorted(flipped)
    for task in flipped:
        row = page.locator(f'#flipped-table tr.flipped[data-task="{task}"]').inner_text()
        assert f"{100 * before[task]:.0f}%" in row and f"{100 * after[task]:.0f}%" in row
        assert "passed -> failed" in row
    grids = page.evaluate("() => [0, 1].map(i => !!Bokeh.documents[0].get_model_by_name('grid_source_' + i))")
    assert grids == [True, True] and opened.console_errors == []


def test_a_report_opened_without_network_loads_its_scripts_from_the_file(single_report, browser):
    html = single_report.read_text()
    assert "<script src" not in html and "<link" not in html
    opened = open_report(browser, single_report, offline=True)
    rendered = opened.page.evaluate(RENDERED_FIGURES)
    assert len(rendered["drawn"]) == len(EXPECTED_FIGURES)
    assert opened.network_requests == [] and opened.console_errors == []
