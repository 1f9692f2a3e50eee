"""Cut pivot candidates (one per assistant turn) out of stored trajectories, in NeMo-Gym's pivot row contract.

    # our evaluations' or GRPO's rollouts (eval.keep_transcripts: each line keeps its tau2_messages)
    uv run examples/prepare_pivots.py --rollouts results/qwen3_4b_train --output data/pivots.jsonl
    # tau2's own results files (tau2 run), of the release named
    uv run examples/prepare_pivots.py --tau2-results results.json --output data/pivots.jsonl tau2.version=v1.0.1
    # SFT conversations ({"messages", "tools", "domain", "task_id"}, OpenAI chat format)
    uv run examples/prepare_pivots.py --conversations teacher.jsonl --output data/pivots.jsonl

Sources may be repeated and mixed. Each row holds the prompt before the turn, the demonstrated action
(``expected_action``), what rebuilds its state (release, domain, retrieval variant, task id, the trajectory before
the turn) and its tau2 split (``test`` rows are held out). Then ``profile_pivots.py`` keeps the turns a frozen policy
sometimes gets right (docs/pivot-rl.md). Errors: one line, exit 2.
"""

import argparse
import json
import sys
from pathlib import Path

import nemo_tau2  # noqa: F401  (offline settings before tau2 loads litellm)
from nemo_tau2.pivots.prepare import prepare_pivots
from nemo_tau2.pivots.sources import SourceError, from_conversations, from_rollouts, from_tau2_results
from nemo_tau2.tau2_release.client import Tau2WorkerError
from nemo_tau2.tau2_release.config import release_from_overrides


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--rollouts", type=Path, action="append", default=[], help="rollouts.jsonl or its folder")
    parser.add_argument("--tau2-results", type=Path, action="append", default=[], help="tau2's results.json")
    parser.add_argument("--conversations", type=Path, action="append", default=[], help="SFT conversations JSONL")
    parser.add_argument("--output", type=Path, required=True, help="pivot candidates JSONL to write")
    parser.add_argument("--compact-rows", action="store_true", help="short system prompt, only gold tools (toys)")
    parser.add_argument(
        "--agent-name", default=None, help="agent_ref.name written into every row (default tau2_agent)"
    )
    parser.add_argument("tau2", nargs="*", metavar="tau2.KEY=VALUE", help="the tau2 release (default v0.2.1)")
    args = parser.parse_args(argv)
    if not (args.rollouts or args.tau2_results or args.conversations):
        parser.error("name at least one source: --rollouts, --tau2-results or --conversations")
    for path in [*args.rollouts, *args.tau2_results, *args.conversations]:
        if not path.exists():
            parser.error(f"{path}: no such file or folder")
    try:
        args.tau2 = release_from_overrides(args.tau2)
    except ValueError as e:
        parser.error(str(e))
    return args


def main(argv: list[str]) -> int:
    args = parse(argv)
    variant = args.tau2.retrieval_variant
    trajectories, skipped = [], {}
    try:
        for reader, paths in ((from_rollouts, args.rollouts), (from_tau2_results, args.tau2_results),
                              (from_conversations, args.conversations)):  # fmt: skip
            for path in paths:
                found, left = reader(path) if reader is from_rollouts else reader(path, args.tau2.version, variant)
                trajectories += found
                for reason, count in left.items():
                    skipped[reason] = skipped.get(reason, 0) + count
        report = prepare_pivots(trajectories, args.tau2, args.output, args.compact_rows, args.agent_name)
    except (SourceError, OSError, ValueError, Tau2WorkerError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    report.skipped.update(skipped)
    summary = report.summary()
    print(f"read {summary['trajectories']} trajectories; wrote {summary['pivots']} pivot candidates")
    print(f"{'domain':<18} {'pivots':>7} {'held out':>9} {'calls':>6} {'batches':>8} {'texts':>6}")
    for domain, entry in summary["by_domain"].items():
        print(f"{domain:<18} {entry['pivots']:>7} {entry['held_out']:>9} {entry.get('function_call', 0):>6} "
              f"{entry.get('function_call_batch', 0):>8} {entry.get('message', 0):>6}")  # fmt: skip
    for reason, count in sorted(report.skipped.items()):
        print(f"  skipped {count}: {reason}")
    print(f"output: {args.output}")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
