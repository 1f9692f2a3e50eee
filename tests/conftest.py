"""Shared pytest setup: nemo_tau2 is imported first so tau2 stays offline and quiet in every test.

The ``slow`` marker: ``uv run pytest -m "not slow" tests/unit`` is the developers' fast loop (minutes, every package
still covered); the full suite, CI's, is ``uv run pytest tests/unit``. A test is slow when it starts an expensive real
component (a vLLM server, a Ray cluster, Megatron process groups, tau2 v1.0.1's worker, NeMo-Gym's CLI) or trains a
demo for many steps. Whole modules are marked here, by path, rather than by a decorator in each file: the list below is
where the suite's time goes, read from pytest's ``--durations`` (printed in every run); single slow tests of otherwise
fast modules carry ``@pytest.mark.slow`` themselves.
"""

import importlib.util
import os
import sys
from pathlib import Path

import pytest

import nemo_tau2  # noqa: F401
from nemo_tau2.gym.fork_template import TEMPLATE_ENV, ForkTemplate
from nemo_tau2.gym.stack import tau2_stack_classes
from tests import env_python

UNIT = Path(__file__).resolve().parent / "unit"

# each module's wall time, recorded and held to its budget in tests/module_budgets.toml
pytest_plugins = ["tests.module_times"]

# OpenMP threads (torch's, vLLM CPU's) that finish a parallel region sleep at once instead of spinning for the next:
# the suite runs three workers, each with training, engine and server processes, on a box of two cores, where a
# spinning thread only takes the core from a process that has work. Measured on the GRPO loop and SFT/RFT modules
# (two workers): 437 s against 487 s, 13% less user CPU. Inherited by every process the tests start.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# Bytecode is written where Python may write it, its default, also where the box sets PYTHONDONTWRITEBYTECODE (this
# project's machines and CI's do). The virtualenvs NeMo-Gym builds for the servers the tests start (ng_run's, NeMo-RL's
# NemoGym actor's, the peer bench's agent) get no .pyc from uv, so each server compiled NeMo-Gym, tau2 and litellm
# from source again: 7.3 CPU-s against 2.9 to import NeMo-Gym's server code and tau2's registry in the peer agent's
# venv. Now the first process of a run writes it and the next ones read it: the NeMo-RL client, NeMo-Gym 0.4.0 client,
# peer bench and gym CLI modules, two workers, 449 -> 387 s. The project's environment writes its own under
# .venv/pycache whatever the box says (scripts/setup.sh); the others are compiled when built (scripts/env_cache.sh);
# sources that are only read (../shared/vendor) have their bytecode under their environment.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

# uv never reaches a package index from a test: the virtualenvs NeMo-Gym builds for the servers the tests start
# (ng_run's, NeMo-RL's NemoGym actor's, the peer bench's agent) resolve ~200 packages from the cache the set-up filled.
# Online, uv sent a revalidation request for each package's index page and rebuilt an sdist (antlr4) every time: 7.3 s
# to resolve one server's venv on this project's boxes, 0.24 s offline; 10.8 s against 2.2 s for the whole build. A
# run is hermetic with it: what the set-up did not install, no test downloads. UV_OFFLINE=0 restores it.
os.environ.setdefault("UV_OFFLINE", "1")

# Modules, relative to tests/unit, whose every test is slow.
SLOW_MODULES = frozenset(
    {
        # training demos and the loops that drive them
        "algorithms/test_async_collector.py",
        "algorithms/test_grpo_loop.py",
        "algorithms/test_grpo_vllm.py",
        "algorithms/test_in_flight_weight_update.py",
        "algorithms/test_pipeline.py",
        "algorithms/test_sft_rft.py",
        "algorithms/test_pivot_rl.py",
        # whole evaluations through examples/run_eval.py (a process each, with its Gym stack)
        "evals/test_eval_end_to_end.py",
        "evals/test_nemo_rl_layout.py",
        "evals/test_progress_display.py",
        "test_torn_files.py",
        # Gym stacks for many episodes or many requests (the fast loop keeps one of each: test_episode_record,
        # gym/agent, test_resources_server_*)
        "experience/test_rollouts.py",
        "gym/test_idempotent_retries.py",
        "gym/test_secrets_and_sessions.py",
        # one GRPO step and a tau2 v1.0.1 eval with planted keys, every file they write searched
        "test_secret_hygiene.py",
        "test_fuzz_servers.py",
        # llama.cpp's SmolLM2 generating, and servers stopped mid-generation
        "env_api/test_user_strategies_llamacpp.py",
        "generation/test_endpoint_stop.py",
        "generation/test_llamacpp_backend.py",
        "gym/test_sigterm.py",
        # NeMo-Gym 0.7.0's own tau2 agent beside ours (bench/peer_nemo_gym_tau2.py --quick: two ng_run stacks)
        "test_peer_bench.py",
        # the GPU kit's dry run (a process importing the whole torch stack)
        "test_gpu_kit.py",
        # the real vLLM engine (CPU build)
        "evals/test_eval_vllm.py",
        "generation/test_vllm_live.py",
        # Ray clusters
        "generation/test_ray_generation.py",
        "gym/test_ray_placement.py",
        "models/policy/test_data_parallel.py",
        "models/policy/test_sharded.py",
        # NeMo-Gym's CLI (ng_run builds each server's environment)
        "gym/test_gym_cli.py",
        # the Gym side on NeMo-Gym 0.7.0: a pytest process of its own in the Python 3.13 environment
        "gym/test_nemo_gym_0_7.py",
        # NeMo-RL's own Gym path in its environment, starting our servers through NeMo-Gym (each builds their venvs)
        "gym/test_nemo_rl_client.py",
        "gym/test_nemo_rl_client_gym04.py",
        # Megatron process groups
        "models/megatron/test_conversion.py",
        "models/megatron/test_cpu_mode.py",
        "models/megatron/test_packed_attention.py",
        "models/megatron/test_policy.py",
        "models/megatron/test_training.py",
        # tau2 v1.0.1 in its own environment, through its worker
        "tau2_release/test_data_tools_v1.py",
        "tau2_release/test_env_api_v1.py",
        "tau2_release/test_export_v1.py",
        "tau2_release/test_gym_eval_v1.py",
        "tau2_release/test_stored_rollout_tools.py",  # NeMo-Gym 0.7.0's and tau2's CLIs on an eval (Ray, a server)
        "tau2_release/test_tau2_submit_full.py",  # tau2's leaderboard tools on an eval of every base task
        "tau2_release/test_parity_v1.py",
        "tau2_release/test_banking_knowledge.py",
        "tau2_release/test_banking_dense.py",
        "tau2_release/test_banking_shell.py",
        "tau2_release/test_banking_shell_confinement.py",
        "tau2_release/test_forks_v1.py",
        "tau2_release/test_banking_training.py",
        "tau2_release/test_banking_variants.py",  # every offline retrieval variant scored beside tau2's own
        "tau2_release/test_banking_report.py",  # the report built from banking_knowledge evaluations
        "tau2_release/test_resources_server_v1.py",
        "tau2_release/test_worker_snapshots.py",
    }
)


# Modules that start the real vLLM engine: run one after another on one xdist worker, never two engines at once on
# the suite's 2 cores (each would take both, and their start-up waits would double).
VLLM_MODULES = frozenset({"generation/test_vllm_live.py", "evals/test_eval_vllm.py", "algorithms/test_grpo_vllm.py"})


# Packages whose conftest starts something expensive once for all their modules (package- or session-scoped): one
# xdist group each, so it starts once, not once per worker; and its modules never run beside each other (the shell
# tests count every sandbox process on the machine: run on both workers at once, each saw the other's). tau2_release
# is split in two groups (TAU2_RELEASE_SCORING below), the longest of the suite; the longest-first order sends them
# out first.
SHARED_FIXTURE_PACKAGES = (
    "tau2_release/",  # tau2 v1.0.1's worker, the scripted judge and the two shell workers (~35 s to start)
    "models/megatron/",  # the spawned one- and two-process Megatron runs
    "report/",  # a pair of evaluations through examples/run_eval.py
    "env_api/",  # the Gym stack and user strategies behind the env API
    "gym/agent/",  # the agent's Gym stack
)

# tau2_release's modules that never start its shell workers (the package's `writable` and `read_only`): a second
# group, so that the package (~70 worker-min on a loaded 2-core box, 2026-12-02) no longer holds one worker for the
# whole run while the other waits. Its worker and judge start once more, on the other xdist worker (~35 s). The shell
# modules stay together in the first: their checks count every sandbox process on the machine.
TAU2_RELEASE_SCORING = frozenset(
    {
        "tau2_release/test_parity_v1.py",
        "tau2_release/test_stored_rollout_tools.py",
        "tau2_release/test_tau2_submit_full.py",
        "tau2_release/test_gym_eval_v1.py",
        "tau2_release/test_env_api_v1.py",
        "tau2_release/test_data_tools_v1.py",
        "tau2_release/test_export_v1.py",
        "tau2_release/test_resources_server_v1.py",
        "tau2_release/test_worker_snapshots.py",
        "tau2_release/test_release_config.py",
        "tau2_release/test_judge_faults.py",
    }
)

# The extras `scripts/setup.sh` installs, which some tests need: missing, the session stops at once naming the fix
# (no test skips for a missing environment; see tests/env_python.py for the environments outside .venv). On Python
# 3.13 the environment is NeMo-Gym 0.7.0's (scripts/build_gym07_env.sh): the Gym side without the trainer's extras,
# by design; tests/unit/gym/test_nemo_gym_0_7.py runs only Gym tests there.
REQUIRED_EXTRAS = {"xllamacpp": "llamacpp", "megatron": "megatron", "transformers": "training"}
GYM_SIDE_ONLY = sys.version_info >= (3, 13)


def pytest_addoption(parser):
    parser.addoption(
        "--all-base-tasks",
        action="store_true",
        help="tau2_release/test_parity_v1.py: compare every base task with tau2 v1.0.1 (834 episodes), not a third",
    )


def pytest_configure(config):
    env_python._pytest_config = config
    missing = sorted({extra for module, extra in REQUIRED_EXTRAS.items() if importlib.util.find_spec(module) is None})
    if missing and not GYM_SIDE_ONLY:
        raise pytest.UsageError(f"the project's environment lacks the extras {missing}: run scripts/setup.sh project")
    # a renamed module would otherwise drop out of the list silently, and into the fast loop
    missing = sorted(
        module for module in SLOW_MODULES | VLLM_MODULES | TAU2_RELEASE_SCORING if not (UNIT / module).is_file()
    )
    if missing:
        raise pytest.UsageError(f"tests/conftest.py's module lists name modules that do not exist: {missing}")


def pytest_collection_modifyitems(config, items):
    """Marks slow modules, and orders the groups longest first by their budgets (tests/module_budgets.toml, summed
    over a group's modules): pytest-xdist hands the groups out in collection order (see
    :func:`pytest_xdist_make_scheduler`), so the longest start first and the workers finish together (longest
    processing time first) rather than one running a long group collected late while the other waits. Slow modules
    first, the order before, had sent the tau2 v1.0.1 package (~40 min of one worker) out at about half-time."""
    for item in items:
        if _unit_module(item) in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
    from tests.module_times import Budgets, module_of  # here: imported at the top, the plugin misses assert rewriting

    budgets = Budgets.load(Path(config.getoption("--module-budgets")))
    groups = [xdist_group(item.nodeid.split("::", 1)[0]) for item in items]
    estimate_s: dict[str, float] = {}
    for group, module in {(g, module_of(item.nodeid)) for g, item in zip(groups, items, strict=True)}:
        estimate_s[group] = estimate_s.get(group, 0.0) + budgets.budget(module)
    first_seen = {group: index for index, group in reversed(list(enumerate(groups)))}
    order = {id(item): (-estimate_s[group], first_seen[group]) for group, item in zip(groups, items, strict=True)}
    items.sort(key=lambda item: order[id(item)])  # stable: a group's tests stay together, in file order


@pytest.fixture(scope="session", autouse=True)
def fork_template(tmp_path_factory):
    """One fork template per test process (nemo_tau2/gym/fork_template.py): every Gym stack this process or the
    launchers it starts (run_eval.py, run_grpo.py, ...) start forks its fork server from it, imports done, instead of
    importing the server classes again (6-9 s of CPU each, ~70 stacks a CI run). Set ``NEMO_TAU2_FORK_TEMPLATE=''``
    to run every stack as a user's run does (gym/test_fork_template.py checks that path and this one alike)."""
    if TEMPLATE_ENV in os.environ:
        yield None
        return
    folder = tmp_path_factory.mktemp("fork_template")
    classes = sorted(
        {*tau2_stack_classes("vllm_model", "fast_vllm_model"), *tau2_stack_classes("openai_model", "openai_model")}
    )
    template = ForkTemplate(folder / "template.sock", classes, folder / "template.log")
    os.environ[TEMPLATE_ENV] = str(folder / "template.sock")
    try:
        yield template
    finally:
        os.environ.pop(TEMPLATE_ENV, None)
        template.stop()


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's, which NeMo-Gym 0.7.0's environment has not
def pytest_xdist_make_scheduler(config, log):
    """The suite's layout on pytest-xdist's workers (``-n 3 --dist loadgroup`` in pyproject.toml): each module is
    one group, run whole on one worker, so its module fixtures (a Gym stack, a Ray cluster, a vLLM server) start
    once; the vLLM modules share a group; a package in ``SHARED_FIXTURE_PACKAGES`` is one group.

    A scheduler of our own rather than ``xdist_group`` marks: pytest-xdist 3.8 applies those by rewriting
    ``item._nodeid``, which pytest 9.2 no longer reads, so every test was scheduled on its own."""
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group(nodeid.split("::", 1)[0])

    return ModuleGroups(config, log)


def xdist_group(path: str) -> str:
    """The group of a test file (its path as in the test's id, relative to the rootdir)."""
    module = path.removeprefix("tests/unit/")
    if module in VLLM_MODULES:
        return "vllm"
    if module in TAU2_RELEASE_SCORING:
        return "tau2_release/scoring"
    return next((package for package in SHARED_FIXTURE_PACKAGES if module.startswith(package)), module)


def _unit_module(item) -> str | None:
    path = Path(str(item.path))
    return path.relative_to(UNIT).as_posix() if path.is_relative_to(UNIT) else None
