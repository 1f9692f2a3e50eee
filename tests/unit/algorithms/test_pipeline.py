"""The CPU pipeline (oracle data -> SFT -> RFT -> GRPO) runs end to end from its config, each stage reading the
previous one's model by path; a rerun skips finished stages and the interrupted one resumes from its checkpoint."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).parents[3] / "examples"
PIPELINE = EXAMPLES / "configs" / "pipeline_tau2_cpu_smoke.yaml"


def _run(output_dir: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, str(EXAMPLES / "run_pipeline.py"), "--config", str(PIPELINE)]
    command.append(f"output_dir={output_dir}")
    return subprocess.run(command, capture_output=True, text=True, timeout=1500, cwd=EXAMPLES.parent)


def test_the_cpu_pipeline_runs_end_to_end_and_a_rerun_resumes(tmp_path):
    first = _run(tmp_path)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    stages = json.loads((tmp_path / "pipeline.json").read_text())["stages"]
    assert [s["stage"] for s in stages] == ["oracle", "sft_data", "sft", "rft", "grpo"]
    assert all(s["status"] == "ok" for s in stages), stages
    for stage in ("sft", "rft"):
        assert (tmp_path / stage / "checkpoints" / "final_hf" / "config.json").is_file()
    rft_config = json.loads((tmp_path / "rft" / "logs" / "config.json").read_text())
    assert rft_config["policy"]["model_name"] == f"{tmp_path}/sft/checkpoints/final_hf"
    grpo_config = json.loads((tmp_path / "grpo" / "logs" / "config.json").read_text())
    assert grpo_config["policy"]["model_name"] == f"{tmp_path}/rft/checkpoints/final_hf"

    # as if GRPO had been killed after its first step: the rerun skips the finished stages and resumes GRPO
    shutil.rmtree(tmp_path / "grpo" / "checkpoints" / "step_2")
    rerun = _run(tmp_path)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    statuses = {s["stage"]: s["status"] for s in json.loads((tmp_path / "pipeline.json").read_text())["stages"]}
    assert statuses == {"oracle": "done already", "sft_data": "done already", "sft": "done already",
                        "rft": "done already", "grpo": "ok"}  # fmt: skip
    assert "resuming: 1 of 2 steps already done" in rerun.stderr
    assert (tmp_path / "grpo" / "checkpoints" / "step_2").is_dir()
