"""``run_eval.py --rescore`` on a finished evaluation (this package's real one: fake policy and user, real Gym
servers, real tau2 v0.2.1): every stored episode re-scored to its live verdict, a wrong stored verdict corrected and
named, the old verdict kept beside the new; lines that cannot be re-scored refused, each with its reason, counted,
and left byte for byte. Reuses the package's evaluations (a copy: re-scoring writes in place)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

from tests.unit.report.eval_pair import records

ROOT = Path(__file__).resolve().parents[3]
TORN = b'{"domain": "airline", "task_id": "2", "sam'


def _run(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, str(ROOT / "examples" / "run_eval.py"), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT)


def test_rescore_restores_every_live_verdict_and_refuses_what_it_cannot_rescore(evals, tmp_path):
    folder = shutil.copytree(evals[1], tmp_path / "eval")
    original = records(folder)
    scored = [i for i, r in enumerate(original) if r["status"] == "ok"]
    wrong, bare, other = scored[0], scored[1], scored[2]
    assert original[wrong]["reward"] == 1.0
    lines = (folder / "rollouts.jsonl").read_bytes().splitlines(keepends=True)
    edits = {
        wrong: {"reward": 0.0, "success": False},  # a stored verdict that is wrong: re-scoring corrects it
        bare: {"tau2_messages": None},  # no trajectory
        other: {"tau2_version": "v1.0.1"},  # another release's episode
    }
    for index, fields in edits.items():
        lines[index] = (json.dumps(original[index] | fields) + "\n").encode()
    (folder / "rollouts.jsonl").write_bytes(b"".join(lines) + TORN)

    done = _run("--rescore", str(folder))
    assert done.returncode == 0, done.stderr[-2000:]
    name = f"{original[wrong]['domain']}/{original[wrong]['task_id']}#{original[wrong]['sample_index']}"
    assert f"changed {name}: 0.0 -> 1.0" in done.stdout
    summary = json.loads((folder / "summary.json").read_text())
    infra = sum(r["status"] != "ok" for r in original)
    assert (
        infra
        and summary["rescore"]["rescored"] == len(scored) - 2
        and summary["rescore"]["reward_changed"] == [f"{name}: 0.0 -> 1.0"]
    )
    assert summary["rescore"]["refused"] == {
        "no trajectory (tau2_messages not stored)": 1,
        "another release's episode (tau2 v1.0.1; this run's server: v0.2.1)": 1,
        "not played to its end (an infrastructure failure before /verify): rerun the eval to retry it": infra,
        "torn line (not a JSON object)": 1,
    }
    after = (folder / "rollouts.jsonl").read_bytes().splitlines(keepends=True)
    assert after[-1] == TORN and [after[i] for i in (bare, other)] == [lines[i] for i in (bare, other)]
    for index in set(scored) - {bare, other}:
        line = json.loads(after[index])
        assert (line["reward"], line["reward_info"]) == (original[index]["reward"], original[index]["reward_info"])
        previous = line["rescored"]["previous"]
        assert previous["reward"] == (0.0 if index == wrong else original[index]["reward"])
    # the summary is the original's again: the corrected verdict restored, the refused lines as they were
    before = json.loads((evals[1] / "summary.json").read_text())["metrics"]
    assert {k: v for k, v in summary["metrics"].items() if "pass" in k} == {
        k: v for k, v in before.items() if "pass" in k
    }


def test_rescore_of_a_folder_that_is_not_an_eval_is_one_line_and_exit_2(tmp_path):
    refused = _run("--rescore", str(tmp_path))
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        f"error: {tmp_path}: no rollouts.jsonl; --rescore takes an evaluation's results folder"
    ]
