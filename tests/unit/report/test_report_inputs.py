"""What the report refuses (one line, exit 2) and what it never shows (secrets), on real evaluation folders."""

import base64
import gzip
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_tau2.report.build import build_report
from nemo_tau2.report.sources import ReportInputError
from nemo_tau2.utils.metrics_logger import LoggerConfig, MetricsLogger
from tests.unit.report.eval_pair import records

ROOT = Path(__file__).resolve().parents[3]
REPORT = ROOT / "examples" / "report.py"


def _report_cli(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPORT), *map(str, args)], capture_output=True, text=True, timeout=300)


def _copy_with(source: Path, target: Path, keep=lambda record: True, summary_update: dict | None = None) -> Path:
    """A copy of an evaluation folder keeping only some episodes (or another summary): a run of other tasks."""
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("server_logs", "evaluation_data.json"))
    kept = [r for r in records(source) if keep(r)]
    (target / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    if summary_update is not None:
        summary = json.loads((target / "summary.json").read_text()) | summary_update
        (target / "summary.json").write_text(json.dumps(summary))
    return target


def test_a_folder_without_results_and_runs_of_another_domain_are_one_line_and_exit_2(evals, tmp_path):
    (tmp_path / "empty").mkdir()
    airline_only = _copy_with(evals[0], tmp_path / "airline_only", keep=lambda r: r["domain"] == "airline")
    for args, needle in (
        ([tmp_path / "empty"], "holds no results"),
        ([evals[0], airline_only], "compare runs over the same domains"),
    ):
        result = _report_cli(*args, "--out", tmp_path / "out.html")
        assert result.returncode == 2, result.stderr[-2000:]
        assert "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("error: "), result.stderr
        assert needle in result.stderr
    assert not (tmp_path / "out.html").exists()


def test_other_tasks_another_release_or_a_training_run_cannot_be_compared(evals, tmp_path):
    one_task_less = _copy_with(
        evals[0], tmp_path / "fewer", keep=lambda r: (r["domain"], r["task_id"]) != ("retail", "5")
    )
    other_release = _copy_with(evals[0], tmp_path / "v1", summary_update={"tau2_version": "v1.0.1"})
    with MetricsLogger(LoggerConfig(log_dir=str(tmp_path / "grpo" / "logs"))) as logger:
        logger.log(1, {"train/loss": 0.5})
    for other, needle in (
        (one_task_less, "their task sets differ (1 task(s) in only one)"),
        (other_release, "compare runs of the same tau2 release"),
        (tmp_path / "grpo", "compare evaluations with evaluations"),
    ):
        with pytest.raises(ReportInputError, match=re.escape(needle)):
            build_report([evals[0], other], tmp_path / "out.html")


def _embedded_text(html: str) -> str:
    """The page with every gzipped episode inflated: what a reader of the file could recover."""
    data = json.loads(re.search(r'<script type="application/json" id="report-data">(.*?)</script>', html, re.S)[1])
    episodes = [gzip.decompress(base64.b64decode(v)).decode() for v in data["episodes"].values()]
    return html + "\n".join(episodes)


def test_secrets_never_appear_in_the_report(evals, tmp_path, monkeypatch):
    env_secret = "s3cr3t-value-of-an-endpoint-key"
    openai_style = "sk-" + "A1b2C3d4" * 4
    monkeypatch.setenv("MY_ENDPOINT_API_KEY", env_secret)

    def leak(record: dict) -> bool:  # the user pastes both into the conversation, and a tool argument holds one
        if record.get("transcript"):
            record["transcript"].insert(1, {"type": "message", "role": "user",
                                            "content": f"my key is {env_secret}, or try {openai_style}"})  # fmt: skip
            record["transcript"].insert(2, {"type": "function_call", "name": "login",
                                            "arguments": json.dumps({"api_key": "plain-text-9f8e7d"})})  # fmt: skip
        return True

    folder = _copy_with(evals[1], tmp_path / "leaky", keep=leak)
    text = _embedded_text(build_report([folder], tmp_path / "report.html").read_text())
    assert "my key is ***REDACTED***" in text  # the message is shown, its secrets are not
    for secret in (env_secret, openai_style, "plain-text-9f8e7d"):
        assert secret not in text
