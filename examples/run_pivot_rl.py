"""Turn-level GRPO on tau2 (PivotRL): GRPO on pivots, single assistant turns rewarded by what they do.

    uv run examples/run_pivot_rl.py --config examples/configs/pivot_rl_tau2_cpu_smoke.yaml
    uv run examples/run_pivot_rl.py --config examples/configs/pivot_rl_tau2_qwen3_4b.yaml --plan

The trainer, the loop, the checkpoints, resume, W&B and the report are ``run_grpo.py``'s; what differs is the data.
Each row is a pivot (``prepare_pivots.py``, then ``profile_pivots.py`` keeps PivotRL's): the agent plays one policy
turn at the pivot's prompt, token-faithfully (the prompt is the pivot's conversation as the chat template renders it,
the response the sampled turn), and the resources server scores it by running it in a fork of the pivot's state
(``/verify_pivot``). At the end: accuracy on the validation pivots at the first and last validated step, per domain
and per demonstrated tool, held-out pivots apart, and the pivots that flipped (also in ``report.html`` and
``<logger.log_dir>/pivots.json``). A config whose rows are not pivots is refused (exit 2). See docs/pivot-rl.md.
"""

import json
import runpy
import sys
from pathlib import Path

import nemo_tau2  # noqa: F401  (offline settings before tau2 loads litellm)
from nemo_tau2.algorithms import training_cli
from nemo_tau2.algorithms.training_cli import Stop

RUN_GRPO = Path(__file__).resolve().with_name("run_grpo.py")


def _check_pivot_rows() -> tuple[str, bool]:
    """The run's ``logger.log_dir`` and whether it validates; exit 2 when a training row is not a pivot."""
    from nemo_tau2.algorithms import grpo
    from nemo_tau2.algorithms.grpo_config import GRPOMasterConfig

    _, _, cfg = training_cli.read_config(sys.argv[1:], GRPOMasterConfig)
    try:
        train_rows, val_rows = grpo.load_rows(cfg)
    except ValueError as e:
        raise Stop(2, f"error: {e}") from None
    for what, rows in (("data.train_data_path", train_rows), ("data.val_data_path", val_rows)):
        if (row := next((row for row in rows if "expected_action" not in row), None)) is not None:
            raise Stop(2, f"error: {what}: row {row.get('domain')}/{row.get('task_id')} is not a pivot (no "
                          "expected_action): write the rows with examples/prepare_pivots.py")  # fmt: skip
    return cfg.logger.log_dir, bool(val_rows)


def _report_pivots(log_dir: str) -> None:
    from nemo_tau2.report.pivots import has_pivots, pivot_summary, pivot_table_text
    from nemo_tau2.report.sources import ReportInputError, load_results

    try:
        run = load_results(log_dir)
    except ReportInputError:
        return
    steps = sorted(getattr(run, "validations", {}) or {})
    if not steps or not has_pivots(run.validations[steps[-1]]):
        return
    summary = pivot_summary(run.validations[steps[0]], run.validations[steps[-1]], steps[0], steps[-1])
    print(pivot_table_text(summary))
    (Path(log_dir) / "pivots.json").write_text(json.dumps(summary, indent=2) + "\n")
    accuracy = {"pivot_accuracy_first": summary["overall_first"], "pivot_accuracy_last": summary["overall_last"]}
    print(json.dumps(accuracy | {"first_step": steps[0], "last_step": steps[-1], "flipped": len(summary["flipped"])}))


def _main() -> int:
    if "--plan" in sys.argv:  # the memory plan needs no rows (run_grpo.py prints it and exits)
        return runpy.run_path(str(RUN_GRPO))["main"]()
    log_dir, validates = _check_pivot_rows()
    status = runpy.run_path(str(RUN_GRPO))["main"]()  # run_grpo.py's own command, on these rows
    if status == 0 and validates:
        _report_pivots(log_dir)
    return status


if __name__ == "__main__":
    sys.exit(training_cli.run(_main))
