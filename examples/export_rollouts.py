"""Export a finished evaluation for NeMo-Gym 0.7.0's stored-rollout tools and as ATIF v1.7 trajectories.

    uv run examples/export_rollouts.py results/qwen3_4b

writes, beside the eval's own files:

- ``results/qwen3_4b/nemo_gym/``: the eval in NeMo-Gym's run layout (``rollouts.jsonl`` with each episode's
  ``ng_trajectory``, ``rollouts_failures.jsonl``, ``rollouts_materialized_inputs.jsonl``), which ``gym eval
  health-check`` and ``gym eval reverify`` (NeMo-Gym 0.7.0) read;
- ``results/qwen3_4b/atif/``: one ATIF v1.7 trajectory per scored episode and ``manifest.jsonl``.

Each file is replaced whole. A line that cannot be exported is named on stderr with its reason. A folder that is not
an evaluation's results: one line on stderr, exit 2.
"""

import argparse
import sys
from importlib.metadata import version
from pathlib import Path

from nemo_tau2.evals.atif_export import export_atif
from nemo_tau2.evals.gym_export import describe, export_gym_run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, help="an evaluation's results folder (its eval.save_path)")
    parser.add_argument("--no-atif", action="store_true", help="write nemo_gym/ only")
    args = parser.parse_args()
    try:
        report = export_gym_run(args.results)
        print(describe(report))
        if not args.no_atif:
            folder, count = export_atif(args.results, agent_version=version("nemo-tau2"))
            if count:
                print(f"{folder}: {count} ATIF v1.7 trajector{'y' if count == 1 else 'ies'} and manifest.jsonl")
            else:
                print(f"{folder}: not written (no scored episode)")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
