"""The front door the training scripts share (``run_grpo.py``, ``run_sft.py``, ``run_rft.py``), so they behave alike.

A bad config or a run whose memory plan cannot fit: one line on stderr, exit 2, nothing started or written. A start
that fails (generation backend, Gym servers): one line, exit 3. Ctrl-C: exit 130 with the line that says how to
resume. A script's body raises :class:`Stop` through these helpers and :func:`run` turns it into the exit status.
"""

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from nemo_tau2.config import (
    CliArgs,
    ConfigError,
    apply_overrides,
    load_config,
    parse_args,
    redact_secrets,
    validate_config,
)
from nemo_tau2.generation.local_models import register_local_model_resolver
from nemo_tau2.utils.jsonl_log import write_json_atomic

PLAN_SWITCH = {"--plan": "print the memory plan (per trainer rank, per vLLM GPU) and the Gym capacity plan, exit"}


class Stop(Exception):
    """Stop the script with exit status ``code``, after ``message`` (one line) on stderr when there is one."""

    def __init__(self, code: int, message: str | None = None):
        super().__init__(message)
        self.code, self.message = code, message


def run(body: Callable[[], int]) -> int:
    """Run a script's body; a :class:`Stop` becomes its line and exit status."""
    try:
        return body()
    except Stop as stop:
        if stop.message:
            print(stop.message, file=sys.stderr)
        return stop.code


def read_config[Config: BaseModel](argv: list[str], schema: type[Config]) -> tuple[CliArgs, Any, Config]:
    """``--config FILE [--plan] key=value ...``: the arguments, the raw config with the overrides, and the config
    checked against ``schema`` (every problem named, exit 2)."""
    args = parse_args(argv, switches=PLAN_SWITCH)
    register_local_model_resolver()
    try:
        raw = apply_overrides(load_config(args.config), args.overrides)
        return args, raw, validate_config(raw, schema)
    except ConfigError as e:
        raise Stop(2, f"error: {e}") from None


def check_memory_plan(plan_memory: Callable[[Any], Any], cfg: BaseModel, args: CliArgs) -> None:
    """``--plan``: print the plan and stop (0 if it fits, else 2), then the Gym capacity plan when generation is vLLM
    on GPUs (its warnings do not change the exit status: too few replicas slow a run, they do not break it).
    Otherwise a run that cannot fit stops with exit 2 before anything starts, the plan on stderr and the problems
    (each names the key to change) in one line."""
    from nemo_tau2.gym.capacity import format_gym_capacity, gym_capacity_of
    from nemo_tau2.models.plan_table import format_plan

    try:
        plan = plan_memory(cfg)
    except ValueError as e:  # the model's config.json cannot be found or read
        raise Stop(2, f"error: {e}") from None
    if "--plan" in args.switches:
        print(format_plan(plan))
        if (capacity := gym_capacity_of(cfg)) is not None:
            print(f"\n{format_gym_capacity(capacity)}")
        raise Stop(0 if plan.fits else 2)
    if not plan.fits:
        print(format_plan(plan), file=sys.stderr)
        raise Stop(2, f"error: the run cannot fit: {'; '.join(plan.problems)}")


def write_run_config(log_dir: str | Path, raw: Any) -> None:
    """``<log_dir>/config.json``: the config as run, secrets redacted."""
    Path(log_dir).mkdir(parents=True, exist_ok=True)
    write_json_atomic(Path(log_dir) / "config.json", redact_secrets(raw))


@contextmanager
def starting() -> Iterator[None]:
    """Around a run's setup: a generation backend or Gym server that cannot start is one line and exit 3; a
    checkpoint in ``checkpointing.checkpoint_dir`` of the other training backend or Megatron layout, or rows whose
    prompts cannot fit ``policy.max_total_sequence_length``, exit 2."""
    from nemo_tau2.algorithms.prompt_fit import PromptsTooLongError
    from nemo_tau2.generation.errors import GenerationStartupError
    from nemo_tau2.gym.launch import ServerStartError
    from nemo_tau2.models.policy.checkpoint import CheckpointMismatchError

    try:
        yield
    except (GenerationStartupError, ServerStartError) as e:
        raise Stop(3, f"error: could not start: {e}") from None
    except (CheckpointMismatchError, PromptsTooLongError) as e:
        raise Stop(2, f"error: {e}") from None


def print_report(logger_cfg: Any) -> None:
    """At the end of a run, ``<logger.log_dir>/report.html`` and its path (``logger.report=false``: neither)."""
    if not logger_cfg.report:
        return
    from nemo_tau2.report.build import write_run_report

    if (report := write_run_report(logger_cfg.log_dir)) is not None:
        print(f"report: {report}")


def interrupted(checkpoint_dir: str | Path) -> Stop:
    """Ctrl-C: exit 130, saying that the same command resumes from the run's checkpoints."""
    return Stop(130, f"\ninterrupted: rerun the same command to resume from the latest checkpoint in {checkpoint_dir}")
