"""tau2 v1.0.1's leaderboard tools on our ``tau2_results`` of an eval of every base task of the four domains (375
episodes on the fake servers: the scripted oracle, user and judge): ``tau2 submit prepare``, its verification on, and
``tau2 submit validate`` pass, the tasks' definitions included (each compared with the release's own by hash). A
smaller eval's export goes through the same commands beside NeMo-Gym 0.7.0's tools in test_stored_rollout_tools.py."""

import pytest

from tests.unit.tau2_release.stored_eval import finish, run_stored_eval, start, tau2_cli


@pytest.mark.timeout(1800)
def test_tau2_submit_prepare_and_validate_accept_an_eval_of_every_base_task(judge, release_tasks, tmp_path):
    """The whole base split of the four domains (375 episodes, ~330 s on 2 cores): tau2's leaderboard checks pass,
    the tasks' definitions included (each compared with the release's own by hash)."""
    run_stored_eval(tmp_path / "eval", judge, release_tasks, task_ids=None, faulty_judge=False)
    answers = "\n".join(["", "", "", "", "me@example.com", *[""] * 16]) + "\n"
    prepare = [tau2_cli(), "submit", "prepare", tmp_path / "eval" / "tau2_results", "-o", tmp_path / "submission"]
    prepared = finish(start(prepare, cwd=tmp_path, stdin=answers), stdin=answers)
    assert "All trajectories passed verification" in prepared and "Submission prepared successfully" in prepared
    (submission,) = (tmp_path / "submission").iterdir()
    validated = finish(start([tau2_cli(), "submit", "validate", submission], cwd=tmp_path))
    assert validated.count("✅ Tasks validation") == 4 and "❌" not in validated
    assert "Submission validation successful" in validated and "Submission metrics validation successful" in validated
