"""Secret hygiene across the project: with a planted key in every ``api_key_env`` a run reads (policy, user
simulator, NL judge, embeddings) and in W&B's (offline), and a planted secret file in the home, a GRPO step and an
evaluation on tau2 v1.0.1 (a retail task, and a banking_knowledge task on ``alltools`` whose scripted policy is
hostile: shell commands that print the environment, ``/proc``'s and the home's file, their paths written so that
tau2's text check does not see them) write no planted value, raw, base64 or inside the report's gzipped data, in any
file: results, ``rollouts.jsonl``, summaries, ``report.html``, server logs, checkpoints and their configs, W&B's
offline run folder. Servers are real, over HTTP on 127.0.0.1; only the LLMs' behaviour is scripted (the fake server,
the scripted judge)."""

import base64
import gzip
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from nemo_tau2.algorithms import grpo
from nemo_tau2.algorithms.grpo_config import GRPOMasterConfig
from nemo_tau2.config import apply_overrides, load_config, validate_config
from nemo_tau2.evals.eval import run_eval, setup_eval
from nemo_tau2.report.build import write_run_report
from nemo_tau2.testing import Tau2Key, Turn, TurnListScript, start_fake_server
from nemo_tau2.testing.scripted_judge import ScriptedJudge
from nemo_tau2.testing.warm_start import build_tiny_policy
from tests.tau2_v1_env import tau2_v1_python
from tests.unit.recording_proxy import RecordingProxy

#: api_key_env of each endpoint a run calls -> its role; W&B reads WANDB_API_KEY itself.
KEY_VARIABLES = {
    "OPENAI_API_KEY": "policy",  # the name tau2_openai.yaml gives it
    "USER_SIM_API_KEY": "user",  # tau2_test.yaml's
    "NEMO_TAU2_JUDGE_KEY": "judge",  # names that do not look secret: a process may well inherit them
    "NEMO_TAU2_EMBEDDINGS_KEY": "embeddings",
    "WANDB_API_KEY": "wandb",
}


def _octal(path: str) -> str:
    return "".join(f"\\{ord(char):03o}" for char in path)


@dataclass(frozen=True)
class Planted:
    keys: dict[str, str]  # variable -> value, in this process's environment while the module runs
    home_file: Path  # in the home of every process the runs start
    root: Path  # every run writes under it, W&B's folders included

    @property
    def values(self) -> list[str]:
        return [*self.keys.values(), self.home_file.read_text().strip()]


def encodings(value: str) -> list[bytes]:
    """``value`` as it would appear in a file: raw, and the part of its base64 that does not depend on where it
    starts in an encoded stream (each of the three alignments; standard and URL-safe alphabets)."""
    forms = [value.encode()]
    for shift in range(3):
        encoded = base64.b64encode(b"\0" * shift + value.encode())
        core = encoded[4 if shift else 0 : -4]  # the first and last groups mix in bytes that are not the value's
        forms += [core, core.replace(b"+", b"-").replace(b"/", b"_")]
    return forms


_BASE64_RUN = re.compile(rb"[A-Za-z0-9+/]{64,}={0,2}")
_GZIP = b"\x1f\x8b"


def readable(data: bytes) -> Iterator[bytes]:
    """``data`` and what it carries packed: a gzip file's content, and each gzip+base64 blob in it (report.html
    embeds its episodes and prompts so)."""
    yield data
    if data.startswith(_GZIP):
        yield gzip.decompress(data)
    for run in _BASE64_RUN.findall(data):
        if run.startswith(b"H4sI"):  # base64 of gzip's magic
            yield gzip.decompress(base64.b64decode(run))


def files_holding(root: Path, values: list[str]) -> list[str]:
    """``relative path: value`` for each file under ``root`` holding one of ``values`` in one of its encodings."""
    value_of = {form: value for value in values for form in encodings(value)}
    pattern = re.compile(b"|".join(re.escape(form) for form in sorted(value_of, key=len, reverse=True)))
    found = []
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
        held = {value_of[match] for data in readable(path.read_bytes()) for match in pattern.findall(data)}
        found += [f"{path.relative_to(root)}: {value}" for value in sorted(held)]
    return found


def hostile_commands(home_file: Path) -> list[str]:
    """What a policy hunting for credentials runs: paths written with ``printf`` escapes, globs and interpreters."""
    return [
        "env",
        "printenv",
        f"cat $(printf '{_octal('/proc/self/environ')}')",
        f"cat $(printf '{_octal(str(home_file))}')",
        "cat $(printf '\\057proc\\057')*$(printf '\\057environ') | tr '\\0' '\\n'",  # every process it can see
        'python3 -c "import os; print(dict(os.environ))"',
    ]


class HostileBankingPolicy:
    """Scripts banking_knowledge's conversations: the policy runs :func:`hostile_commands` with ``shell`` and a dense
    search (the embedding endpoint, its key), then closes; the user asks for help once, then stops."""

    def __init__(self, commands: list[str]):
        calls = [Turn.call("shell", {"command": command}) for command in commands]
        search = Turn.call("KB_search_dense", {"query": "wire transfer limits"})
        self.policy = TurnListScript([*calls, search, Turn.say("Is there anything else I can help you with?")])
        self.user = TurnListScript([Turn.say("Hi, I need help with a wire transfer.")], closing_text="###STOP###")

    def script_for(self, key: str) -> TurnListScript | None:
        parsed = Tau2Key.parse(key)
        if parsed is None or parsed.domain != "banking_knowledge":
            return None  # other domains: the fake's own tau2 scripts (oracle policy, scripted user)
        return self.policy if parsed.role == "policy" else self.user


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> Iterator[Planted]:
    root = tmp_path_factory.mktemp("hygiene")
    keys = {variable: f"planted-{role}-key-{os.urandom(12).hex()}" for variable, role in KEY_VARIABLES.items()}
    home_file = Path.home() / f".nemo_tau2_planted_{os.urandom(6).hex()}"
    home_file.write_text(f"secret-in-home-{os.urandom(12).hex()}\n")
    wandb = {"WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    wandb |= {name: str(root / "wandb_home" / name.lower()) for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR",
                                                                            "WANDB_DATA_DIR")}  # fmt: skip
    try:
        with pytest.MonkeyPatch.context() as patch:
            for variable, value in (keys | wandb).items():
                patch.setenv(variable, value)
            yield Planted(keys, home_file, root)
    finally:
        home_file.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def endpoint(planted) -> Iterator[str]:
    """The fake (chat and embeddings) behind a proxy that records each request's Authorization header."""
    with start_fake_server(providers=[HostileBankingPolicy(hostile_commands(planted.home_file))]) as fake:
        proxy = RecordingProxy.start(fake.root_url)
        try:
            yield proxy.base_url
        finally:
            proxy.stop()


def _openai(endpoint: str, variable: str) -> str:
    return f"{{base_url: '{endpoint}', model: fake-model, api_key_env: {variable}}}"


def _eval_config(endpoint: str, save: Path, *overrides: str):
    """``tau2_fake.yaml`` with policy and user on the OpenAI-compatible ``endpoint``, each with its planted key."""
    raw = load_config("examples/configs/evals/tau2_fake.yaml")
    raw.policy.generation.fake_cfg = raw.user.generation.fake_cfg = None
    return apply_overrides(raw, [
        f"eval.save_path={save}", "eval.num_tests_per_prompt=1", "eval.k_values=[1]", "eval.bootstrap_samples=0",
        "policy.generation.backend=openai", "user.generation.backend=openai",
        f"+policy.generation.openai_cfg={_openai(endpoint, 'OPENAI_API_KEY')}",
        f"+user.generation.openai_cfg={_openai(endpoint, 'USER_SIM_API_KEY')}",
        *overrides,
    ])  # fmt: skip


def _evaluate(raw) -> Path:
    """An evaluation as examples/run_eval.py runs it: the run, then its report."""
    run_eval(setup_eval(raw), raw)
    assert write_run_report(raw.eval.save_path) is not None
    return Path(raw.eval.save_path)


def _records(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "rollouts.jsonl").read_text().splitlines() if line.strip()]


def _assert_wrote_nothing_secret(folder: Path, planted: Planted, *expected: str) -> None:
    """Every file under ``folder`` is free of the planted values; ``expected`` (globs) were written, so the walk saw
    what matters."""
    for pattern in expected:
        assert any(folder.glob(pattern)), f"nothing matches {pattern} under {folder}"
    assert files_holding(folder, planted.values) == []


def _keys_sent(role_variables: list[str], planted: Planted) -> set[str]:
    """Which of ``role_variables``' keys reached the endpoint since the test began (each test clears the record)."""
    sent = {auth for _, auth, _ in RecordingProxy.seen}
    return {variable for variable in role_variables if f"Bearer {planted.keys[variable]}" in sent}


# ---------------------------------------------------------------- the runs


@pytest.fixture(scope="module")
def tiny_policy(tmp_path_factory) -> Path:
    """The smoke config's warm-started tiny policy (cached: the GRPO loop's tests ask for the same one)."""
    smoke = validate_config(load_config("examples/configs/grpo_tau2_cpu_smoke.yaml"), GRPOMasterConfig)
    return build_tiny_policy(smoke.tiny_policy, grpo.load_rows(smoke)[0], tmp_path_factory.mktemp("tiny") / "policy")


def test_a_grpo_step_writes_no_key_in_its_logs_checkpoint_or_wandb_run(planted, endpoint, tiny_policy):
    RecordingProxy.seen.clear()
    run = planted.root / "grpo"
    raw = load_config("examples/configs/grpo_tau2_cpu_smoke.yaml")
    raw.user.generation.fake_cfg = None
    raw = apply_overrides(raw, [
        f"policy.model_name={tiny_policy}", f"logger.log_dir={run / 'logs'}", "logger.tensorboard_enabled=false",
        "logger.wandb_enabled=true", f"checkpointing.checkpoint_dir={run / 'checkpoints'}",
        "checkpointing.save_period=1", "grpo.max_num_steps=1", "grpo.num_prompts_per_step=1",
        "grpo.num_generations_per_prompt=2", "grpo.val_period=0", "grpo.val_at_end=false",
        "policy.train_global_batch_size=2", "policy.train_micro_batch_size=2", "user.generation.backend=openai",
        f"+user.generation.openai_cfg={_openai(endpoint, 'USER_SIM_API_KEY')}", "+logger.save_rollouts=all",
    ])  # fmt: skip
    cfg = validate_config(raw, GRPOMasterConfig)
    s = grpo.setup(cfg, *grpo.load_rows(cfg))
    try:
        (step,) = grpo.grpo_train(s)
    finally:
        s.close()
    assert step["train/rollout/num_episodes"] == 2 and step["train/rollout/num_infrastructure_errors"] == 0, step
    assert write_run_report(cfg.logger.log_dir) is not None
    assert _keys_sent(["USER_SIM_API_KEY"], planted) == {"USER_SIM_API_KEY"}
    written = ["logs/train/step_1/rollouts.jsonl", "logs/metrics.jsonl", "logs/report.html", "logs/server_logs/*.log",
               "checkpoints/step_1/trainer_state.json", "checkpoints/step_1/hf_config/config.json",
               "logs/wandb/offline-run-*/*.wandb", "logs/wandb/offline-run-*/logs/debug*.log"]  # fmt: skip
    _assert_wrote_nothing_secret(run, planted, *written)


def _shell_answers(record: dict) -> dict[str, str]:
    """The answer of each ``shell`` call of an episode, by command."""
    calls = {item["call_id"]: json.loads(item["arguments"])["command"] for item in record["transcript"]
             if item.get("type") == "function_call" and item["name"] == "shell"}  # fmt: skip
    return {calls[item["call_id"]]: item["output"] for item in record["transcript"]
            if item.get("type") == "function_call_output" and item["call_id"] in calls}  # fmt: skip


class _JudgeProxy(RecordingProxy):
    """The judge's recording proxy: a second upstream, recorded into the same list."""


def test_an_evaluation_with_a_hostile_policy_on_alltools_writes_no_secret(planted, endpoint):
    """One evaluation on tau2 v1.0.1, policy and user on an OpenAI-compatible endpoint: a retail task (the oracle;
    its NL assertions graded by the judge) and a banking_knowledge task on ``alltools`` (BM25, dense search on the
    embedding endpoint, the shell), where the policy runs :func:`hostile_commands`. Every key reaches its endpoint;
    no file of the run holds any planted value."""
    RecordingProxy.seen.clear()
    judge = ScriptedJudge()
    judge_proxy = _JudgeProxy.start(judge.base_url.removesuffix("/v1"))
    try:
        raw = _eval_config(endpoint, planted.root / "eval", "data.split=base",
                           "data.task_ids=['2',task_001]", "++tau2.version=v1.0.1",
                           f"++tau2.python={tau2_v1_python()}", "++tau2.judge.model=scripted-judge",
                           f"++tau2.judge.base_url={judge_proxy.base_url}",
                           "++tau2.judge.api_key_env=NEMO_TAU2_JUDGE_KEY", "++tau2.retrieval_variant=alltools",
                           f"++tau2.embeddings.base_url={endpoint}",
                           "++tau2.embeddings.api_key_env=NEMO_TAU2_EMBEDDINGS_KEY",
                           f"++tau2.embeddings.cache_dir={planted.root / 'embeddings'}")  # fmt: skip
        raw.data.domains = OmegaConf.create(["retail", "banking_knowledge"])
        folder = _evaluate(raw)
    finally:
        judge_proxy.stop()
        judge.close()
    records = {r["domain"]: r for r in _records(folder)}
    assert [(r["status"], r["termination_reason"]) for r in records.values()] == [("ok", "user_stop")] * 2, records
    answers = _shell_answers(records["banking_knowledge"])
    assert list(answers) == hostile_commands(planted.home_file)  # each one ran: none was refused before running
    assert not any("Command blocked" in answer for answer in answers.values()), answers
    assert "PATH=" in answers["env"]  # the command ran and printed its (confined) environment
    assert _keys_sent(list(KEY_VARIABLES), planted) == set(KEY_VARIABLES) - {"WANDB_API_KEY"}
    written = ["config.json", "rollouts.jsonl", "summary.json", "report.html", "tau2_results/*.json",
               "server_logs/*.log"]  # fmt: skip
    _assert_wrote_nothing_secret(folder, planted, *written)
    assert files_holding(planted.root, planted.values) == []  # the embeddings' cache, W&B's own folders
