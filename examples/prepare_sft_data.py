"""Turn episodes into SFT rows for ``run_sft.py`` / ``run_rft.py`` (one JSON line per episode).

    # rejection sampling from an evaluation (token ids kept exactly as the generator saw and produced them)
    uv run examples/prepare_sft_data.py --rollouts results/qwen3_4b_train/rollouts.jsonl --min-reward 1.0 \\
        --max-per-task 4 --output data/sft_train.jsonl
    # OpenAI-format conversations ({"messages": [...], "tools": [...]}) from elsewhere, tokenized with the policy's
    # chat template (refused if the template does not reproduce the training format)
    uv run examples/prepare_sft_data.py --conversations teacher.jsonl --tokenizer Qwen/Qwen3-4B-Instruct-2507 \\
        --output data/sft_train.jsonl

Filters, in order: ``--domains``, the refusal of tau2 test-split tasks (``--allow-test-split`` to override),
``--min-reward``, dedup of identical trajectories (``--keep-duplicates`` to keep them), ``--max-per-task``. The
tau2 release is chosen by the same ``tau2`` keys as a run's config (``tau2.version=v1.0.1``, ``tau2.python=...``):
every episode must be of that release (rows record it in ``tau2_version``), and its test split is the one refused. The
output is written to a temporary file and renamed, so it is whole or absent. Errors: one line, exit 2.
"""

import argparse
import json
import sys
from pathlib import Path

import nemo_tau2  # noqa: F401  (offline settings before tau2 loads litellm)
from nemo_tau2.algorithms.sft_data import (
    ConversionReport,
    SFTDataError,
    row_from_conversation,
    rows_from_rollout_records,
    select_rows,
)
from nemo_tau2.tau2_env import DOMAINS
from nemo_tau2.tau2_release.client import Tau2WorkerError
from nemo_tau2.tau2_release.config import release_from_overrides


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--rollouts", type=Path, help="rollouts.jsonl (or its folder) of run_eval.py / GRPO")
    source.add_argument("--conversations", type=Path, help="JSONL of OpenAI conversations: messages + tools")
    parser.add_argument(
        "--tokenizer",
        help="model name or folder whose chat template tokenizes --conversations; 'tiny': the tiny test policy's",
    )
    parser.add_argument("--output", type=Path, required=True, help="SFT rows JSONL to write")
    parser.add_argument("--min-reward", type=float, default=None, help="keep episodes with reward >= this (1.0: RFT)")
    parser.add_argument("--max-per-task", type=int, default=None, help="keep at most this many episodes per task")
    parser.add_argument("--domains", nargs="+", choices=DOMAINS, default=None, help="keep only these domains")
    parser.add_argument("--allow-test-split", action="store_true", help="allow tau2 test-split tasks (leaks test)")
    parser.add_argument("--keep-duplicates", action="store_true", help="keep identical trajectories")
    parser.add_argument("tau2", nargs="*", metavar="tau2.KEY=VALUE", help="the tau2 release (default v0.2.1)")
    args = parser.parse_args(argv)
    try:
        args.tau2 = release_from_overrides(args.tau2)
    except ValueError as e:
        parser.error(str(e))
    if args.conversations is not None and not args.tokenizer:
        parser.error("--conversations needs --tokenizer (the policy whose chat template tokenizes them)")
    if args.rollouts is not None and args.tokenizer:
        parser.error("--tokenizer is only for --conversations: rollouts keep their own token ids")
    if args.max_per_task is not None and args.max_per_task < 1:
        parser.error("--max-per-task must be at least 1")
    return args


def read_rollouts(path: Path) -> list[dict]:
    """The newest record per episode, through the evaluator's own reader (one place knows the file's format)."""
    from nemo_tau2.evals.results import ROLLOUTS_FILE, RolloutLog

    if path.is_dir():
        path = path / ROLLOUTS_FILE
    if path.name != ROLLOUTS_FILE:
        raise SFTDataError(f"{path}: expected a {ROLLOUTS_FILE} file (or its folder) from run_eval.py")
    if not path.is_file():
        raise SFTDataError(f"{path}: no such file")
    log = RolloutLog(path.parent)
    try:
        return list(log)
    finally:
        log.close()


def read_conversations(path: Path, tokenizer_name: str, report: ConversionReport) -> list[dict]:
    from transformers import AutoTokenizer

    if not path.is_file():
        raise SFTDataError(f"{path}: no such file")
    try:
        if tokenizer_name == "tiny":  # deterministic: the same as every tiny policy's saved tokenizer
            from nemo_tau2.generation.tiny_model import build_tiny_tokenizer

            tokenizer = build_tiny_tokenizer()
        else:
            tokenizer = AutoTokenizer.from_pretrained(tokenizer_name)
    except (OSError, ValueError) as e:
        raise SFTDataError(f"--tokenizer {tokenizer_name}: cannot load it ({str(e).splitlines()[0]})") from None
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        report.read += 1
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise SFTDataError(f"{path}:{number}: not JSON ({e.msg})") from None
        if not isinstance(record, dict):
            raise SFTDataError(f"{path}:{number}: expected an object with messages and tools")
        try:
            rows.append(row_from_conversation(record, tokenizer))
        except SFTDataError as e:
            raise SFTDataError(f"{path}:{number}: {e}") from None
    return rows


def main(argv: list[str]) -> int:
    args = parse(argv)
    report = ConversionReport()
    try:
        if args.rollouts is not None:
            rows = rows_from_rollout_records(read_rollouts(args.rollouts), report)
        else:
            rows = [row | {"tau2_version": args.tau2.version} for row in read_conversations(
                args.conversations, args.tokenizer, report)]  # fmt: skip
        kept = select_rows(
            rows, report, min_reward=args.min_reward, max_per_task=args.max_per_task, domain_filter=args.domains,
            allow_test_split=args.allow_test_split, dedup=not args.keep_duplicates, tau2=args.tau2,
        )  # fmt: skip
    except (SFTDataError, Tau2WorkerError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    args.output.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.output.with_name(args.output.name + ".tmp")
    tmp.write_text("".join(json.dumps(row) + "\n" for row in kept))
    tmp.replace(args.output)
    tasks = {(row["domain"], row["task_id"]) for row in kept}
    tokens = sum(len(m["token_ids"]) for row in kept for m in row["message_log"] if m["role"] == "assistant")
    print(f"read {report.read} episodes; wrote {len(kept)} rows ({len(tasks)} tasks, {tokens} assistant tokens)")
    for reason, count in sorted(report.skipped.items()):
        print(f"  skipped {count}: {reason}")
    print(f"output: {args.output}")
    print(json.dumps({"read": report.read, "written": len(kept), "tasks": len(tasks), "skipped": report.skipped}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
