"""The workers of banking_knowledge's shell variants, started as a server that trains on a cluster node is: keys in
its environment (every ``api_key_env`` a user fills: policy, user, judge, embeddings, W&B) and secrets in files of
the machine (its home, the temporary folder). A model-run command must see none of them."""

import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from nemo_tau2.tau2_release.client import Tau2Worker
from nemo_tau2.tau2_release.config import NLJudgeConfig, ShellConfig, Tau2ReleaseConfig
from tests.tau2_v1_env import tau2_v1_python
from tests.unit.tau2_release.test_parity_v1 import reference_results

TIMEOUT_S = 5

#: What srt (tau2's shell sandbox, 0.0.23) answers when its two socat bridges are not listening ~0.6 s after it started
#: them: its own start-up losing a race on a loaded box (a fresh-clone run, three test workers on two cores), which
#: tau2 hands the agent as the command's answer. Our sandbox starts no bridge (bubblewrap, no network).
SRT_START_FAILURE = "Failed to create bridge sockets"
KEY_VARIABLES = ("OPENAI_API_KEY", "NEMO_TAU2_USER_KEY", "NEMO_TAU2_JUDGE_KEY", "NEMO_TAU2_EMBEDDINGS_KEY",
                 "WANDB_API_KEY")  # fmt: skip


@dataclass(frozen=True)
class Planted:
    keys: dict[str, str]  # variable -> value, in the workers' environment
    home_file: Path  # in the workers' home
    tmp_file: Path  # in the machine's temporary folder, beside the sandboxes

    @property
    def values(self) -> list[str]:
        return [*self.keys.values(), self.home_file.read_text().strip(), self.tmp_file.read_text().strip()]


@contextmanager
def plant_secrets(home: Path) -> Iterator[Planted]:
    keys = {variable: f"sk-planted-{variable.lower()}-{os.urandom(8).hex()}" for variable in KEY_VARIABLES}
    home_file = home / ".netrc"
    home_file.write_text(f"secret-in-home-{os.urandom(8).hex()}\n")
    handle, tmp_name = tempfile.mkstemp(prefix="nemo_tau2_planted_", suffix=".txt")
    os.close(handle)
    tmp_file = Path(tmp_name)
    tmp_file.write_text(f"secret-in-tmp-{os.urandom(8).hex()}\n")
    try:
        yield Planted(keys, home_file, tmp_file)
    finally:
        tmp_file.unlink(missing_ok=True)


def shell_config(judge, variant: str) -> Tau2ReleaseConfig:
    return Tau2ReleaseConfig(
        version="v1.0.1",
        python=tau2_v1_python(),
        judge=NLJudgeConfig(model="scripted-judge", base_url=judge.base_url, max_attempts=1),
        retrieval_variant=variant,
        shell=ShellConfig(timeout_s=TIMEOUT_S, max_processes=64),
    )


@contextmanager
def shell_worker(judge, variant: str, planted: Planted) -> Iterator[Tau2Worker]:
    """A worker of ``variant`` whose environment holds ``planted``'s keys and whose home holds its file."""
    config = shell_config(judge, variant)
    with pytest.MonkeyPatch.context() as patch:
        for variable, value in planted.keys.items():
            patch.setenv(variable, value)
        patch.setenv("HOME", str(planted.home_file.parent))
        worker = Tau2Worker(config)
    with worker:
        yield worker


def srt_reference_results(references: list, start: Callable[[], list], runs: int = 3) -> dict:
    """What tau2's own runs in its shell sandbox scored (:func:`reference_results`), run again with ``start`` where one
    of their commands met srt's start-up failure (:data:`SRT_START_FAILURE`), at most ``runs`` runs in all: that answer
    is the sandbox failing to start, not tau2's answer to the command, and comparing it failed the test on the box's
    load, not on a difference."""
    for run in range(runs):
        theirs = reference_results(references if run == 0 else start())
        failed = sorted(key for key, episode in theirs.items() if _srt_failed(episode["tool_answers"]))
        if not failed:
            return theirs
    raise AssertionError(f"tau2's own sandbox (srt) failed to start a command in each of {runs} runs: {failed}")


def _srt_failed(answers: list[dict]) -> bool:
    return any(SRT_START_FAILURE in str(answer.get("content")) for answer in answers)
