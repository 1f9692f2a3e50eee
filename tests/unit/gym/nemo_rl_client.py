"""Running NeMo-RL's own Gym path (nemo_rl_driver.py) against our servers, as a NeMo-RL user does: the shipped
configs of examples/configs/nemo_rl/, rows written by examples/prepare_data.py, a clean copy of this repository as
the user's checkout, and NeMo-RL's environment (scripts/build_nemo_rl_env.sh) with the NeMo-Gym under test. Shared by
test_nemo_rl_client.py (the NeMo-Gym commit NeMo-RL pins) and test_nemo_rl_client_gym04.py (NeMo-Gym 0.4.0)."""

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tests.unit.gym.cli_shell import ROOT, shell_path

DRIVER = Path(__file__).with_name("nemo_rl_driver.py")
CONFIGS = ROOT / "examples" / "configs" / "nemo_rl"
TIMEOUT_S = 1500


@dataclass
class Run:
    """One shipped config played by NeMo-RL: its name in the summary, the config, the policy's URL, overrides."""

    name: str
    config: str
    policy_base_url: str
    overrides: list[str] = field(default_factory=list)


def prepare_rows(workdir: Path, output: str, *arguments: str) -> None:
    """examples/prepare_data.py as docs/nemo-rl.md types it: the project's interpreter, from the NeMo-RL side's
    working directory (not the project root), writing where the shipped configs read."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "prepare_data.py"), "--output", output, *arguments],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (workdir / output).is_file()


def machine_overrides(tokenizer_dir: Path, uv_cache: str) -> list[str]:
    """What every run sets beyond the shipped config, each for the test's machine only: an offline tokenizer (NeMo-RL
    loads policy.tokenizer.name; the policy is the scripted server or SmolLM2, whose ids both fit SmolLM2's
    vocabulary), and uv's cache, which the set-up filled (NeMo-Gym's default cache would download every server's
    packages again)."""
    return [f"policy.model_name={tokenizer_dir}", f"++env.nemo_gym.uv_cache_dir={uv_cache}"]


def run_nemo_rl(
    python: str, runs: list[Run], workdir: Path, out: Path, env: dict[str, str], config_keys: list[str] = ()
) -> dict:
    """The driver in NeMo-RL's environment, from ``workdir``; its summary per run (or the failure's output), and the
    keys of NeMo-RL's own GRPO config that each of ``config_keys`` lacks (``_missing_keys``)."""
    plan = out.with_suffix(".plan.json")
    plan.write_text(json.dumps([run.__dict__ for run in runs]))
    log = out.with_suffix(".log")
    with log.open("w") as sink:
        done = subprocess.run(
            [python, str(DRIVER), "--plan", str(plan), "--out", str(out), "--config-keys", *config_keys],
            cwd=workdir,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            timeout=TIMEOUT_S,
        )
    text = log.read_text(errors="replace")
    assert done.returncode == 0, f"NeMo-RL's Gym path failed (exit {done.returncode}):\n{text[-12000:]}"
    return json.loads(out.read_text()) | {"_log": text}


def nemo_rl_environment(python: str, **extra: str) -> dict[str, str]:
    """The user's shell for NeMo-RL: its environment's interpreter first on PATH, the real uv (NeMo-Gym builds each
    server's venv with it), a Ray of its own, and nothing of this test session's."""
    ours = ("NEMO_GYM_", "VIRTUAL_ENV", "UV_RUN_RECURSION_DEPTH", "RAY_ENABLE_UV_RUN_RUNTIME_ENV", "PYTEST_", "COV_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(ours) and k not in ("UV", "PYTHONPATH")}
    env |= {"PATH": shell_path(Path(python).parent, python=python), "RAY_ADDRESS": "local", "PYTHONUNBUFFERED": "1"}
    older_313 = subprocess.run(
        [python, "-c", "import sys; print(sys.version_info[:2] == (3, 13) and sys.version_info < (3, 13, 14))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if older_313 == "True":  # pyenv's 3.13.0 here: uv installs for the 3.13.14 NeMo-RL and its Gym declare
        env["UV_CONFIG_FILE"] = str(ROOT / "scripts" / "uv_python_3.13.14.toml")
    return env | extra


def oracle_batch(run: dict, *, collection: bool, rows: int, episodes: int) -> dict:
    """The one batch of an oracle's run (``collection``: trajectory collection, else GRPO's validation; ``rows``
    played), checked by :func:`check_oracle_batch` and :func:`check_metric_keys`."""
    assert run["is_trajectory_collection"] is collection and run["validation_rows"] == rows, run
    (batch,) = run["batches"]
    check_oracle_batch(batch, episodes)
    check_metric_keys(batch)
    return batch


def check_oracle_batch(batch: dict, episodes: int) -> None:
    """What GRPO gets from the oracle's episodes: reward 1 everywhere, a batch of the right shape whose loss mask
    covers exactly the generated tokens (with their logprobs, none elsewhere), nothing masked out or truncated."""
    assert batch["batch_size"] == episodes and batch["rewards"] == [1.0] * episodes, batch["rewards"]
    assert batch["baseline"] == [1.0] * episodes and batch["std"] == [0.0] * episodes
    rows, width = batch["input_ids_shape"]
    assert rows == episodes and width == max(batch["input_lengths"])
    assert batch["generation_logprobs_shape"] == [rows, width]
    assert batch["loss_mask_tokens"] == batch["generated_tokens"] and all(n > 0 for n in batch["generated_tokens"])
    assert batch["logprobs_outside_mask"] == 0.0
    assert batch["sample_mask"] == [1.0] * episodes and batch["num_mask_sample_filtered"] == 0
    assert batch["truncated"] == [False] * episodes
    assert batch["reward_columns"] == []  # tau2's reward is a product: no reward_components for GDPO to sum
    assert all(episode["turns"] >= 2 for episode in batch["episodes"])  # multi-turn, every turn trainable


# Every number a NeMo-RL run logs from our answers (docs/nemo-rl.md): tau2's reward and components, the ending, the
# infrastructure flag, the episode's sizes. Nothing else numeric: no row index, no sample index.
METRIC_KEYS = {
    "reward", "success", "db_match", "action_match_fraction", "write_action_match_fraction",
    "env_assertion_fraction", "communicate_fraction", "infrastructure_error",
    "termination_user_stop", "termination_agent_stop", "termination_max_steps", "termination_too_many_errors",
    "termination_agent_error", "termination_user_error",
    "num_turns", "num_user_turns", "num_steps", "num_tool_calls", "num_tool_errors", "num_truncated_generations",
    "prompt_tokens", "generation_tokens", "total_tokens",
    "mask_sample",  # NeMo-Gym >= 0.7's own verify field (false: the reward is a valid measurement)
}  # fmt: skip


def check_metric_keys(batch: dict) -> None:
    for episode in batch["episodes"]:
        numeric = set(episode["numeric_keys"])
        assert numeric <= METRIC_KEYS, f"noise among NeMo-RL's metrics: {sorted(numeric - METRIC_KEYS)}"
        always = METRIC_KEYS - {"db_match", "env_assertion_fraction", "communicate_fraction",
                                "action_match_fraction", "write_action_match_fraction", "mask_sample"}  # fmt: skip
        assert always <= numeric, f"missing from NeMo-RL's metrics: {sorted(always - numeric)}"
    names = set(batch["rollout_metric_names"])
    logged = {f"tau2_agent/{key}/mean" for key in ("reward", "termination_user_stop", "infrastructure_error")}
    assert logged <= names, sorted(logged - names)
    assert not any(name.startswith(("tau2_agent/_", "tau2_agent/sample_index")) for name in names), sorted(names)
