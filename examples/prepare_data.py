"""Write tau2 tasks as NeMo-Gym JSONL rows.

uv run examples/prepare_data.py --domains airline,retail,telecom --split train
uv run examples/prepare_data.py --domains airline,retail,telecom --split test --output data/tau2_test.jsonl
uv run examples/prepare_data.py --split train tau2.version=v1.0.1     # the leaderboard's release (its worker)
uv run examples/prepare_data.py --split test --num-tasks 2 --output data/tau2/smoke.jsonl   # the first 2 per domain
uv run examples/prepare_data.py --domains banking_knowledge --split base tau2.version=v1.0.1 # its 97 tasks (bm25_grep)

The release is chosen by the same ``tau2`` keys as a run's config (``tau2.version``, ``tau2.python``); rows of
v1.0.1 come from that release through its worker and carry ``tau2_version``.
"""

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

import nemo_tau2  # noqa: F401  (offline settings before tau2 loads)
from nemo_tau2.tau2_env import domain_problem, domains
from nemo_tau2.tau2_env.gym_rows import DEFAULT_AGENT_NAME, split_rows
from nemo_tau2.tau2_release.client import Tau2WorkerError
from nemo_tau2.tau2_release.config import release_from_overrides
from nemo_tau2.tau2_release.rows import release_rows


def select_rows(rows: list[dict], task_ids: list[str] | None, num_tasks: int | None) -> list[dict]:
    """``task_ids`` only (each must be there), then the first ``num_tasks`` of each domain."""
    if task_ids is not None:
        missing = set(task_ids) - {str(row["task_id"]) for row in rows}
        if missing:
            raise ValueError(f"--task-ids: not in the split: {sorted(missing)}")
        rows = [row for row in rows if str(row["task_id"]) in task_ids]
    if num_tasks is not None:
        taken: Counter[str] = Counter()
        kept = []
        for row in rows:
            taken[row["domain"]] += 1
            if taken[row["domain"]] <= num_tasks:
                kept.append(row)
        rows = kept
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--domains", default="airline,retail,telecom", help="comma-separated tau2 domains")
    parser.add_argument("--split", default="train", help="train | test | base (telecom also: full, small)")
    parser.add_argument("--output", help="JSONL path (default: data/tau2_<split>.jsonl)")
    parser.add_argument("--task-ids", help="comma-separated task ids: only these (each must be in the split)")
    parser.add_argument("--num-tasks", type=int, help="the first N tasks of each domain (after --task-ids)")
    parser.add_argument("--agent-name", default=DEFAULT_AGENT_NAME, help="agent_ref.name written into every row")
    parser.add_argument("tau2", nargs="*", metavar="tau2.KEY=VALUE", help="the tau2 release (default v0.2.1)")
    args = parser.parse_args()

    try:
        tau2 = release_from_overrides(args.tau2)
        domain_names = [name.strip() for name in args.domains.split(",") if name.strip()]
        for domain in domain_names:
            if (problem := domain_problem(domain, tau2.version)) is not None:
                raise ValueError(f"--domains: {problem}")
        skipped: list[tuple[str, str, str]] = []
        task_ids = [task_id.strip() for task_id in args.task_ids.split(",")] if args.task_ids else None
        if args.num_tasks is not None and args.num_tasks < 1:
            raise ValueError(f"--num-tasks must be at least 1, got {args.num_tasks}")
        if tau2.version == "v0.2.1":
            rows = select_rows(
                split_rows(domain_names, args.split, args.agent_name, skipped=skipped), task_ids, args.num_tasks
            )
        else:
            rows = release_rows(tau2, domain_names, args.split, task_ids, args.num_tasks, args.agent_name, "--split")
    except (domains.UnknownDomainError, domains.UnknownTaskError, ValueError, Tau2WorkerError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    for domain, task_id, reason in skipped:
        print(f"skipped {domain} task {task_id!r}: it {reason}", file=sys.stderr)
    if not rows:
        sys.exit(f"error: no task of split {args.split!r} in {args.domains} can be written as a row")
    output = Path(args.output or f"data/tau2_{args.split}.jsonl")
    output.parent.mkdir(parents=True, exist_ok=True)
    with output.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    counts = ", ".join(f"{domain} {n}" for domain, n in Counter(row["domain"] for row in rows).items())
    left_out = f"; {len(skipped)} skipped (above)" if skipped else ""
    print(f"wrote {len(rows)} rows ({counts}) to {output}{left_out}")


if __name__ == "__main__":
    main()
