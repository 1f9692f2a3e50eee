"""Write tau2 tasks as NeMo-Gym JSONL rows.

uv run examples/prepare_data.py --domains airline,retail,telecom --split train
uv run examples/prepare_data.py --domains airline,retail,telecom --split test --output data/tau2_test.jsonl
"""

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

import nemo_tau2  # noqa: F401  (offline settings before tau2 loads)
from nemo_tau2.tau2_env import domains
from nemo_tau2.tau2_env.gym_rows import DEFAULT_AGENT_NAME, split_rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--domains", default="airline,retail,telecom", help="comma-separated tau2 domains")
    parser.add_argument("--split", default="train", help="train | test | base (telecom also: full, small)")
    parser.add_argument("--output", help="JSONL path (default: data/tau2_<split>.jsonl)")
    parser.add_argument("--agent-name", default=DEFAULT_AGENT_NAME, help="agent_ref.name written into every row")
    args = parser.parse_args()

    try:
        domain_names = [name.strip() for name in args.domains.split(",") if name.strip()]
        skipped: list[tuple[str, str, str]] = []
        rows = split_rows(domain_names, args.split, args.agent_name, skipped=skipped)
    except (domains.UnknownDomainError, domains.UnknownTaskError, ValueError) as e:
        sys.exit(f"error: {e}")
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
