"""The CPU pipeline (oracle data -> SFT -> RFT -> GRPO) runs end to end from its config, each stage reading the
previous one's model by path; a rerun skips finished stages and the interrupted one resumes from its checkpoint.

The chaining is the mechanism here, not the training (``test_sft_rft.py`` and ``test_grpo_loop.py`` check that each
stage learns): the shipped config runs with its stages' steps, epochs and samples at their smallest (two GRPO steps
stay, for the resume).
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

EXAMPLES = Path(__file__).parents[3] / "examples"
PIPELINE = EXAMPLES / "configs" / "pipeline_tau2_cpu_smoke.yaml"
SMALLEST = {
    "sft.max_num_steps": "2",
    "sft.val_num_generations_per_prompt": "1",
    "rft.num_generations_per_prompt": "2",
    "rft.num_epochs_per_round": "1",
    "rft.val_num_generations_per_prompt": "1",
    "grpo.val_num_generations_per_prompt": "1",
}


def _smallest_pipeline(folder: Path) -> Path:
    """The shipped pipeline with each stage's ``key=value`` of SMALLEST set to its value (every one must be there:
    a renamed key fails here rather than running the stage at its shipped size)."""
    config = yaml.safe_load(PIPELINE.read_text())
    found = set()
    for stage in config["stages"]:
        for index, arg in enumerate(stage["args"]):
            key = arg.split("=", 1)[0]
            if key in SMALLEST:
                stage["args"][index] = f"{key}={SMALLEST[key]}"
                found.add(key)
    assert found == set(SMALLEST), set(SMALLEST) - found
    path = folder / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _run(pipeline: Path, output_dir: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, str(EXAMPLES / "run_pipeline.py"), "--config", str(pipeline)]
    command.append(f"output_dir={output_dir}")
    return subprocess.run(command, capture_output=True, text=True, timeout=1500, cwd=EXAMPLES.parent)


def test_the_cpu_pipeline_runs_end_to_end_and_a_rerun_resumes(tmp_path):
    pipeline = _smallest_pipeline(tmp_path)
    tmp_path = tmp_path / "run"
    first = _run(pipeline, tmp_path)
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
    rerun = _run(pipeline, tmp_path)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    statuses = {s["stage"]: s["status"] for s in json.loads((tmp_path / "pipeline.json").read_text())["stages"]}
    assert statuses == {"oracle": "done already", "sft_data": "done already", "sft": "done already",
                        "rft": "done already", "grpo": "ok"}  # fmt: skip
    assert "resuming: 1 of 2 steps already done" in rerun.stderr
    assert (tmp_path / "grpo" / "checkpoints" / "step_2").is_dir()
