"""Chain training stages from one config: SFT -> RFT -> GRPO (slime's tau2 pipeline), each a script of its own.

    uv run examples/run_pipeline.py --config examples/configs/pipeline_tau2_cpu_smoke.yaml
    uv run examples/run_pipeline.py --config examples/configs/pipeline_tau2_cpu_smoke.yaml output_dir=results/p2

Each stage is one of the example scripts with its arguments (``script``, ``args``), so a stage runs exactly as the
same command typed by hand; stages read each other's outputs by path (``${output_dir}/sft/checkpoints/final_hf`` is
the next stage's ``policy.model_name``). A stage whose ``creates`` path exists is done and skipped; the others run,
and the training scripts resume from their own checkpoints, so a rerun after a crash or Ctrl-C continues where the
pipeline stopped. Progress is printed per stage; ``<output_dir>/pipeline.json`` records each stage's outcome.
"""

import subprocess
import sys
import time
from pathlib import Path

from omegaconf import OmegaConf
from pydantic import BaseModel, ConfigDict, Field

import nemo_tau2  # noqa: F401  (offline settings before tau2 loads litellm)
from nemo_tau2.config import ConfigError, apply_overrides, load_config, parse_args, validate_config
from nemo_tau2.utils.jsonl_log import write_json_atomic

EXAMPLES = Path(__file__).parent


class Stage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    script: str = Field(description="An example script (file name in examples/).")
    args: list[str] = Field(default_factory=list)
    creates: str | None = Field(default=None, description="The stage is done when this path exists.")


class PipelineConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    output_dir: str
    stages: list[Stage] = Field(min_length=1)


def main() -> int:
    args = parse_args(sys.argv[1:])
    try:
        raw = apply_overrides(load_config(args.config), args.overrides)
        cfg = validate_config(raw, PipelineConfig)
        resolved = OmegaConf.to_container(raw, resolve=True)
        cfg = PipelineConfig.model_validate(resolved)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for stage in cfg.stages:
        if not (EXAMPLES / stage.script).is_file():
            print(f"error: stage {stage.name}: no script examples/{stage.script}", file=sys.stderr)
            return 2
    Path(cfg.output_dir).mkdir(parents=True, exist_ok=True)
    outcomes = []
    for index, stage in enumerate(cfg.stages, 1):
        title = f"[{index}/{len(cfg.stages)}] {stage.name}"
        if stage.creates and Path(stage.creates).exists():
            print(f"{title}: done already ({stage.creates})", flush=True)
            outcomes.append({"stage": stage.name, "status": "done already"})
            continue
        print(f"{title}: {stage.script} {' '.join(stage.args)}", flush=True)
        start = time.monotonic()
        returncode = subprocess.run([sys.executable, str(EXAMPLES / stage.script), *stage.args]).returncode
        seconds = round(time.monotonic() - start, 1)
        outcomes.append({"stage": stage.name, "status": "ok" if returncode == 0 else "failed",
                         "returncode": returncode, "seconds": seconds})  # fmt: skip
        write_json_atomic(Path(cfg.output_dir) / "pipeline.json", {"stages": outcomes})
        if returncode != 0:
            print(f"error: stage {stage.name} exited {returncode}; fix it and rerun to continue", file=sys.stderr)
            return returncode if returncode in (2, 3, 130) else 1
        print(f"{title}: ok in {seconds} s", flush=True)
    write_json_atomic(Path(cfg.output_dir) / "pipeline.json", {"stages": outcomes})
    print("\n" + "\n".join(f"{o['stage']:>12}  {o['status']}  {o.get('seconds', '')}" for o in outcomes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
