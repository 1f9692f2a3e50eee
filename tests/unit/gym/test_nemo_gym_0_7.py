"""The Gym side of nemo-tau2 on NeMo-Gym 0.7.0 (Python 3.13), the release NeMo-Gym's users have: the files below run
in the environment ``scripts/setup.sh gym07`` builds (``$NEMO_TAU2_GYM07_PYTHON`` where set; else found or built on
first use under ~/.cache/nemo-tau2, as vLLM's is), as one pytest process so they share their servers, against this
checkout. An environment that cannot be built fails the test, naming the command."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.env_python import environment_python

ROOT = Path(__file__).resolve().parents[3]
ON_NEMO_GYM_0_7 = [
    "tests/unit/gym/agent/test_token_metadata.py",  # the 422 on the second policy turn
    "tests/unit/gym/model_server/test_conversion_parity.py",  # vllm_model 0.7.0's mapping, item for item
    "tests/unit/gym/model_server/test_fast_vllm_model.py",  # episodes item for item, routes, 400/502
    "tests/unit/gym/test_resources_server_session_routes.py",  # /close_session, /reverify_mode
    # servers log their INFO lines; episodes through the launcher (its Ctrl-C and kill -9 tests are our processes'
    # teardown, whatever NeMo-Gym's release: the main run has them)
    "tests/unit/gym/test_launcher.py::test_every_server_is_its_own_process_answers_and_logs_its_requests",
    "tests/unit/gym/test_launcher.py::test_a_killed_server_is_reported_its_episodes_fail_as_infrastructure_and_stop_leaves_nothing",
    "tests/unit/tau2_release/test_resources_server_v1.py",  # judge_failsafe never turns a judge fault into a score
    "tests/unit/gym/agent/test_agent_episodes.py",  # whole episodes through the agent, every termination
    # eval end to end: examples/run_eval.py with its Gym stack, pass@1 and pass^4 of the oracle in every domain
    "tests/unit/evals/test_eval_end_to_end.py::test_oracle_policy_scores_pass_at_1_and_pass_hat_4_of_one_in_every_domain",
]
# The oracle on every base task checks tau2's scoring of each task through our servers, which no NeMo-Gym release
# touches: the main run has it; here the eval above plays the oracle in every domain (CI time: ~45 s).
NOT_ON_NEMO_GYM_0_7 = [
    "tests/unit/gym/agent/test_agent_episodes.py::test_oracle_policy_and_scripted_user_score_one_on_every_base_task",
]

# ng_run and gym env start from a clean copy, 0.7.0's CLI building each server's venv (160-267 s). In the same
# process as the rest (one interpreter's start, its fork and tau2 templates, its collection): two processes had been
# the extended tier's split, retired since.
CLI_ON_NEMO_GYM_0_7 = ["tests/unit/gym/test_gym_cli.py"]


# the subprocess's own timeout (1500 s) is the bound, past the suite's 20-minute hang guard
@pytest.mark.timeout(1800)
def test_the_gym_side_and_its_cli_pass_on_nemo_gym_0_7(tmp_path):
    _run_on_nemo_gym_0_7(ON_NEMO_GYM_0_7 + CLI_ON_NEMO_GYM_0_7, tmp_path)


def _run_on_nemo_gym_0_7(files: list[str], tmp_path) -> None:
    python = environment_python("NEMO_TAU2_GYM07_PYTHON", "gym07", "NeMo-Gym 0.7.0 (Python 3.13)")
    env = os.environ | {"PYTHONPATH": str(ROOT), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    # addopts emptied: one process (this environment has no pytest-xdist)
    deselected = [
        option for test in NOT_ON_NEMO_GYM_0_7 if test.split("::")[0] in files for option in ("--deselect", test)
    ]
    command = [python, "-m", "pytest", *files, *deselected, "-q", "-p", "no:cacheprovider", "-rfEs"]
    command += ["-o", "addopts="]
    # its modules' times are inside this test's, which the main run holds to its budget
    command += ["--no-module-budgets", "--module-times", str(tmp_path / "module_times.json")]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    sys.stdout.write(result.stdout[-3000:])  # its per-file summary, in this test's captured output
    assert result.returncode == 0, f"on NeMo-Gym 0.7.0:\n{result.stdout[-8000:]}\n{result.stderr[-2000:]}"
