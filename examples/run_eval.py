"""Evaluate a policy on tau2-bench: pass@k, pass^k and mean reward per domain, resumable.

    uv run examples/run_eval.py                      # the CPU demo (configs/evals/tau2_cpu_demo.yaml beside this file)
    uv run examples/run_eval.py --config examples/configs/evals/nemo_gym_eval.yaml   # NeMo-RL's Gym-eval layout
    uv run examples/run_eval.py --config examples/configs/evals/tau2_test.yaml eval.rollout_mode=nemo_gym \\
        policy.generation.model_name=Qwen/Qwen3-4B-Instruct-2507 eval.save_path=results/qwen3_4b

    uv run examples/run_eval.py --rescore results/qwen3_4b   # re-score a finished eval in place (no episode replayed)

``--rescore <results dir>`` re-scores the stored episodes with the release of the run's ``config.json`` (overrides:
``tau2.*`` keys, such as a judge's new ``tau2.judge.base_url``): each line gets the new verdict and keeps the old one
beside it, an episode whose judge failed gets its first, every episode whose reward changed is named, and a line that
cannot be re-scored is refused with its reason and counted (``summary.json``'s ``rescore``).

Overrides: ``a.b=value`` changes an existing key (unknown keys are an error naming the closest one), ``+a.b=value``
adds one. Rerunning with the same ``eval.save_path`` resumes where the last run stopped. A config in NeMo-RL's
Gym-eval layout (top-level ``generation``, ``tokenizer``, ``cluster``) loads as well as ours. Bad input is one line on
stderr naming the key and the fix, exit 2, nothing written.
"""

import logging
import sys
from pathlib import Path

import nemo_tau2  # noqa: F401  (offline settings before tau2 loads litellm)
from nemo_tau2.config import ConfigError, apply_overrides, load_config, parse_args
from nemo_tau2.evals.eval import run_eval, setup_eval
from nemo_tau2.evals.metrics import format_summary_table
from nemo_tau2.evals.progress_display import log_plainly
from nemo_tau2.evals.rescore import describe, rescore_eval
from nemo_tau2.generation.errors import GenerationStartupError
from nemo_tau2.gym.launch import ServerStartError

# Found beside this script, so the command works from any directory.
DEFAULT_CONFIG = Path(__file__).resolve().parent / "configs" / "evals" / "tau2_cpu_demo.yaml"


def rescore(argv: list[str]) -> int:
    """``--rescore <results dir> [tau2.* overrides]``: the finished eval re-scored in place."""
    at = argv.index("--rescore")
    if at + 1 >= len(argv) or argv[at + 1].startswith("-") or "--config" in argv:
        print("error: --rescore takes a results folder (and tau2.* overrides), not --config", file=sys.stderr)
        return 2
    folder, overrides = Path(argv[at + 1]), parse_args(argv[:at] + argv[at + 2 :], default_config=DEFAULT_CONFIG)
    try:
        summary, report = rescore_eval(folder, overrides.overrides)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except ServerStartError as e:
        print(f"error: could not start the resources server: {e}", file=sys.stderr)
        return 3
    print(describe(report))
    print(f"\n{format_summary_table(summary['metrics'])}\n\nresults: {folder}/summary.json, {folder}/rollouts.jsonl")
    from nemo_tau2.report.build import write_run_report

    if (page := write_run_report(folder)) is not None:
        print(f"report: {page}")
    return 0


def main() -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    log_plainly("nemo_tau2")  # the run's lines, plain: a line per server as it starts, resuming, progress
    if "--rescore" in sys.argv[1:]:
        return rescore(sys.argv[1:])
    args = parse_args(sys.argv[1:], default_config=DEFAULT_CONFIG)
    cfg = None
    try:
        raw = apply_overrides(load_config(args.config), args.overrides)
        print(f"config: {args.config.resolve()}", file=sys.stderr)
        cfg = setup_eval(raw, config_name=args.config.stem)
        print(f"results: {Path(cfg.eval.save_path).resolve()}", file=sys.stderr)
        summary, table = run_eval(cfg, raw)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (GenerationStartupError, ServerStartError) as e:
        print(f"error: could not start the environment: {e}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        if cfg is not None:
            print(
                f"\ninterrupted: finished episodes are saved in {cfg.eval.save_path}/rollouts.jsonl; rerun the same "
                "command to resume",
                file=sys.stderr,
            )
        return 130
    metrics = summary["metrics"]
    print()
    print(table)
    infra = int(metrics.get("eval/overall/num_infra_errors", 0))
    if infra:
        print(f"\n{infra} episode(s) failed for infrastructure reasons (not scored; rerun to retry them)")
    print(f"\nresults: {cfg.eval.save_path}/summary.json, {cfg.eval.save_path}/rollouts.jsonl")
    if cfg.logger.report:  # logger.report=false turns it off
        from nemo_tau2.report.build import write_run_report

        if (report := write_run_report(cfg.eval.save_path)) is not None:
            print(f"report: {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
