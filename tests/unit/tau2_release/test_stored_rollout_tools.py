"""The stored-rollout tools of NeMo-Gym 0.7.0 (its real CLI, in its own environment) and of tau2 v1.0.1 (its real
``tau2`` CLI) on one eval of ours over all four domains (stored_eval: the scripted oracle, user and judge; the judge
fails on one retail NL task), after ``examples/export_rollouts.py``, each typed as docs/eval.md types it:

- ``gym eval health-check``: clean on the eval; on a copy with faults (a line written twice, a torn line, a line
  without its transcript) it names exactly those episodes; on a copy without token ids, nothing unhealthy;
- ``gym eval reverify`` of the exported rollouts, against the eval's own resources server (its release, its judge),
  gives every episode the reward the eval gave it; the ATIF v1.7 files are valid for 0.7.0's own ATIF model and its
  manifest loader (its reverify from ATIF refuses any conversation with a later user turn: docs/eval.md);
- ``gym eval reverify --judge-failed-only`` (a second Ray and server start) gives the judge-failed episode tau2
  v1.0.1's own verdict;
- ``tau2 evaluate-trajs`` re-scores the eval's ``tau2_results`` to the same rewards, and ``tau2 submit prepare`` /
  ``submit validate`` accept their format and trial counts (a leaderboard submission needs every base task: they
  then name exactly the tasks this eval left out).

The NeMo-Gym CLI starts our resources server from a prepared virtualenv (its own ``uv_venv_dir`` and
``skip_venv_if_present`` settings, pointed at the 0.7.0 environment) instead of building one (~10 minutes).
"""

import ast
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_tau2.testing import start_fake_server
from tests.unit.tau2_release.stored_eval import FAULTY_NL_TASK, finish, gym07, run_stored_eval, start, tau2_cli

ROOT = Path(__file__).resolve().parents[3]
TORN = b'{"domain": "airline", "task_id": "5", "sam'


def _export(folder: Path) -> str:
    return finish(start([sys.executable, "examples/export_rollouts.py", folder]))


def _lines(path: Path) -> list[dict]:
    """A JSONL file's records (a line that is not one, such as the torn line the tests write, is left out)."""
    records = []
    for line in path.read_bytes().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


@pytest.fixture(scope="module")
def stored(judge, release_tasks, tmp_path_factory) -> Path:
    save = tmp_path_factory.mktemp("stored") / "eval"
    run_stored_eval(save, judge, release_tasks)
    _export(save)
    return save


def _ours(save: Path) -> dict[tuple[int, int], dict]:
    """Our episodes by NeMo-Gym's identity (``_ng_task_index``, ``_ng_rollout_index``) as the export gave it."""
    rows = _lines(save / "nemo_gym" / "rollouts.jsonl") + _lines(save / "nemo_gym" / "rollouts_failures.jsonl")
    key = ("domain", "task_id", "sample_index")
    records = {tuple(r[k] for k in key): r for r in _lines(save / "rollouts.jsonl")}
    return {(row["_ng_task_index"], row["_ng_rollout_index"]): records[tuple(row[k] for k in key)] for row in rows}


def _health_check(folder: Path) -> subprocess.Popen:
    return start([gym07().parent / "gym", "eval", "health-check", folder / "nemo_gym", "--workers", "1", "--json"])


def test_gym_health_check_is_clean_on_our_eval_and_names_each_broken_episode(stored, tmp_path):
    bad = shutil.copytree(stored, tmp_path / "bad", ignore=shutil.ignore_patterns("nemo_gym", "atif"))
    lines = (bad / "rollouts.jsonl").read_bytes().splitlines(keepends=True)
    records = [json.loads(line) for line in lines]
    scored = [i for i, r in enumerate(records) if r["status"] == "ok"]
    twice, stripped = records[scored[0]], records[scored[1]]
    lines[scored[1]] = (json.dumps({k: v for k, v in stripped.items() if k != "transcript"}) + "\n").encode()
    (bad / "rollouts.jsonl").write_bytes(b"".join(lines) + lines[scored[0]] + TORN + b"\n")
    assert "1 line(s) not JSON copied as they are" in _export(bad)
    # an eval run without token ids (the eval's default): no call's token counts, which 0.7.0 must not call unhealthy
    idless = shutil.copytree(stored, tmp_path / "idless", ignore=shutil.ignore_patterns("nemo_gym", "atif"))
    unmarked = [{k: v for k, v in r.items() if k != "transcript"} | {"transcript": [
        {k: v for k, v in item.items() if k not in ("prompt_token_ids", "generation_token_ids")}
        for item in r.get("transcript") or []
    ]} for r in records]  # fmt: skip
    (idless / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in unmarked))
    _export(idless)
    clean, faulty, unknown = _health_check(stored), _health_check(bad), _health_check(idless)  # at once (CI time)
    summary = json.loads(finish(clean).strip().splitlines()[-1])
    assert summary["run"]["verdicts"] == {"healthy": len(scored), "unhealthy": 0, "unobserved": 0}
    assert not any(summary["run"]["issues"].values()) and summary["run"]["artifacts"]["captures"] == len(scored)
    summary = json.loads(finish(unknown).strip().splitlines()[-1])
    assert summary["run"]["verdicts"] == {"healthy": 0, "unhealthy": 0, "unobserved": len(scored)}
    assert not any(summary["run"]["issues"].values())
    finish(faulty)
    ours = _ours(bad)
    findings: dict[str, set] = {}
    for verdict in _lines(bad / "nemo_gym" / "rollout_verdicts.jsonl"):
        key = (verdict["_ng_task_index"], verdict["_ng_rollout_index"])
        name = f"{ours[key]['domain']}/{ours[key]['task_id']}" if key in ours else "torn"
        for finding in verdict["findings"]:
            findings.setdefault(finding["check"], set()).add(name)
        assert (verdict["verdict"] == "healthy") == (not verdict["findings"]), verdict
    assert findings == {
        "rollout_duplicate_identity": {f"{twice['domain']}/{twice['task_id']}"},
        "rollout_missing_agent_turns": {f"{stripped['domain']}/{stripped['task_id']}"},
        "record_unreadable": {"torn"},
    }


def test_gym_eval_reverify_gives_every_episode_its_reward_and_the_atif_is_valid(stored, tmp_path):
    gym = stored / "nemo_gym"
    reverify = start(_reverify(gym, tmp_path, gym / "reverified.jsonl"))
    atif = start([gym07(), "-c", ATIF_CHECK, stored / "atif"])  # 0.7.0's ATIF model and manifest loader
    checked = json.loads(finish(atif).strip().splitlines()[-1])
    ours = _ours(stored)
    scored = {key: r for key, r in ours.items() if r["status"] == "ok"}
    assert checked["trajectories"] == len(scored)
    assert checked["domains"] == ["airline", "banking_knowledge", "retail", "telecom"]
    assert checked["banking_retrieval"] == ["bm25_grep"] and checked["multi_turn_refused"] == len(scored)
    finish(reverify)
    again = {(r["_ng_task_index"], r["_ng_rollout_index"]): r for r in _lines(gym / "reverified.jsonl")}
    assert {key: r["reward"] for key, r in again.items()} == {key: r["reward"] for key, r in scored.items()}
    assert {key: (r["domain"], r["task_id"]) for key, r in again.items()} == {
        key: (r["domain"], r["task_id"]) for key, r in scored.items()
    }


def test_tau2_evaluate_trajs_and_submit_accept_our_tau2_results(stored, judge, worker, tmp_path):
    files = {path.stem: path for path in (stored / "tau2_results").glob("*.json")}
    assert sorted(files) == ["airline", "banking_knowledge", "retail", "telecom"]
    # a leaderboard submission of them, prepared (tau2's prompts answered: its defaults, and an email) while they
    # are re-scored; tau2 writes its caches into the working folder, so each runs in this test's
    answers = "\n".join(["", "", "", "", "me@example.com", *[""] * 16]) + "\n"
    prepare = [tau2_cli(), "submit", "prepare", stored / "tau2_results", "-o", tmp_path / "submission", "--no-verify"]
    prepared = start(prepare, cwd=tmp_path, stdin=answers)
    # tau2's NL judge (its default model, through litellm) and banking_knowledge's environment (tau2 builds its
    # default variant, alltools, whatever the run's: the 698 documents embedded) reach OPENAI_BASE_URL: the scripted
    # judge, and the fake server's embeddings
    with start_fake_server() as embedder:
        evaluate = [tau2_cli(), "evaluate-trajs"]
        judged = start(
            [*evaluate, *(files[d] for d in ("airline", "retail", "telecom")), "-o", tmp_path / "updated"],
            cwd=tmp_path, OPENAI_BASE_URL=judge.base_url, OPENAI_API_KEY="scripted",
        )  # fmt: skip
        embedded = start(
            [*evaluate, files["banking_knowledge"], "-o", tmp_path / "updated"],
            cwd=tmp_path, OPENAI_BASE_URL=embedder.base_url, OPENAI_API_KEY="scripted",
        )  # fmt: skip
        finish(prepared, stdin=answers)
        (submission,) = (tmp_path / "submission").iterdir()
        validate = start([tau2_cli(), "submit", "validate", submission], cwd=tmp_path, COLUMNS="100000")
        for process in (judged, embedded):
            assert "All files processed successfully" in finish(process)
    ours = {(r["domain"], r["task_id"]): r for r in _lines(stored / "rollouts.jsonl") if r["status"] == "ok"}
    rescored = {}
    for path in (tmp_path / "updated").glob("updated_*.json"):
        results = json.loads(path.read_text())
        domain = results["info"]["environment_info"]["domain_name"]
        rescored |= {(domain, s["task_id"]): s["reward_info"]["reward"] for s in results["simulations"]}
    assert rescored == {key: r["reward"] for key, r in ours.items()}
    output = finish(validate, ok=False)  # COLUMNS: no wrapped lines
    assert "Submission data loaded successfully" in output and output.count("✅ Format validation") == 4
    assert output.count("✅ Trial count validation") == 4 and "Extra tasks" not in output and "mismatch" not in output
    # what it refuses: a submission needs every base task, and it names exactly those this eval did not run
    missing = [ast.literal_eval(found) for found in re.findall(r"Missing tasks: (\{.*?\})", output)]
    expected = []
    for domain in sorted(files):
        base = {task["id"] for task in worker.request("tasks", domain=domain, split="base")}
        left_out = base - {task_id for d, task_id in ours if d == domain}
        # rich, which prints tau2's lines, takes a telecom id's leading "[mms_issue]" for markup and drops it
        expected.append({re.sub(r"^\[\w+\]", "", task_id) for task_id in left_out})
    assert sorted(missing, key=len) == sorted(expected, key=len) and validate.returncode == 1


def test_gym_eval_reverify_judge_failed_only_recovers_the_judge_failed_episode(stored, worker, tmp_path):
    gym = stored / "nemo_gym"
    failed = [(key, r) for key, r in _ours(stored).items() if r["status"] != "ok"]
    assert [r["task_id"] for _, r in failed] == [FAULTY_NL_TASK]
    finish(start(_reverify(gym, tmp_path, gym / "recovered.jsonl", "--judge-failed-only")))
    recovered = {(r["_ng_task_index"], r["_ng_rollout_index"]): r for r in _lines(gym / "recovered.jsonl")}
    key, record = failed[0]
    played = record["unscored_episode"]
    reference = worker.request(
        "evaluate", domain="retail", task_id=FAULTY_NL_TASK, messages=played["tau2_messages"],
        termination_reason=played["termination_reason"],
    )  # fmt: skip
    assert recovered[key]["reward"] == reference["reward"] and recovered[key]["reward_info"]["nl_assertions"]
    assert len(recovered) == len(_ours(stored))  # the scored episodes carried through, the failed one recovered


def _reverify(gym: Path, tmp_path: Path, output: Path, *flags: str) -> list:
    venvs = tmp_path / "venvs" / "resources_servers" / "tau2"
    venvs.mkdir(parents=True, exist_ok=True)
    if not (venvs / ".venv").exists():
        (venvs / ".venv").symlink_to(gym07().parent.parent)
    return [
        gym07().parent / "gym", "eval", "reverify", *flags, "--config", gym / "resources_server.yaml",
        "--inputs", gym / "rollouts_materialized_inputs.jsonl", "--rollouts", gym / "rollouts.jsonl",
        "--output", output, "--disable-aggregation",
        f"+uv_venv_dir={tmp_path / 'venvs'}", "+skip_venv_if_present=true",
        f"hydra.run.dir={tmp_path / 'hydra'}",  # its log, not outputs/ in the checkout (its cwd: the servers' paths)
    ]  # fmt: skip


ATIF_CHECK = """
import json, sys
from pathlib import Path
from nemo_gym.atif_json import strict_json_loads
from nemo_gym.atif_reverification import AtifProjectionError, load_atif_manifest, load_atif_trajectory
from nemo_gym.atif_v1_7 import AtifTrajectoryV1_7
folder = Path(sys.argv[1])
domains, retrieval, refused = set(), set(), 0
for entry in load_atif_manifest(folder / "manifest.jsonl"):
    payload = (folder / entry.trajectory_path).read_bytes()
    trajectory = AtifTrajectoryV1_7.model_validate(strict_json_loads(payload))
    ours = trajectory.extra["nemo_tau2"]
    domains.add(ours["domain"])
    if ours["domain"] == "banking_knowledge":
        retrieval.add(ours["retrieval_variant"]) if ours["retrieval"] is not None else None
    try:
        load_atif_trajectory(folder / entry.trajectory_path)
    except AtifProjectionError as e:
        refused += "after agent output" in str(e)
print(json.dumps({"trajectories": len(load_atif_manifest(folder / "manifest.jsonl")), "domains": sorted(domains),
                  "banking_retrieval": sorted(retrieval), "multi_turn_refused": refused}))
"""
