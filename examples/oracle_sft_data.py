"""An oracle teacher without an LLM: the scripted fake's oracle policy plays tau2 tasks; its successful episodes
become OpenAI conversations (messages + tools) for ``prepare_sft_data.py --conversations ... --tokenizer POLICY``.

    uv run examples/oracle_sft_data.py --domains mock --split base --compact-rows --output data/oracle.jsonl
    uv run examples/oracle_sft_data.py --domains banking_knowledge --split ours_seed0_train --compact-rows \
        --output data/banking_oracle.jsonl tau2.version=v1.0.1 tau2.retrieval_variant=bm25_grep

The release is chosen by the same ``tau2`` keys as a run's config (``tau2.version``, ``tau2.python``,
``tau2.retrieval_variant``): a later release's rows and gold come from that release through its worker, and the
written conversations say the release and variant they were played on.

The episodes are real: the Gym agent and tau2 resources servers, tau2's scoring, the fake's scripted user; only the
policy is the fake's oracle (each gold action in order, then the closing question), served as the ``fake``
generation backend. A real pipeline would use a stronger model's episodes (``run_eval.py`` with that model, then
``prepare_sft_data.py --rollouts``, or its conversations). The written conversations carry the rows' own system
prompt and tools (``--compact-rows`` for toy models), so the SFT data matches what the policy sees in RFT and GRPO.
"""

import argparse
import json
import sys
from contextlib import ExitStack
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

import nemo_tau2  # noqa: F401  (offline settings before tau2 loads litellm)
from nemo_tau2.tau2_env import ALL_DOMAINS, domain_problem

if TYPE_CHECKING:
    from nemo_tau2.experience.rollouts import RolloutResult

FAKE = {"backend": "fake", "temperature": 1.0, "top_p": 1.0, "max_new_tokens": 1024, "fake_cfg": {}}


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--domains", nargs="+", choices=ALL_DOMAINS, required=True)
    parser.add_argument("--split", default="train", help="tau2 split of each domain (default: train)")
    parser.add_argument("--task-ids", nargs="+", default=None, help="only these tasks of the split")
    parser.add_argument("--compact-rows", action="store_true", help="short system prompt, only gold tools (toys)")
    parser.add_argument("--samples-per-task", type=int, default=1, help="episodes per task (user seeds differ)")
    parser.add_argument("--output", type=Path, required=True, help="conversations JSONL to write")
    parser.add_argument("--log-dir", type=Path, default=None, help="Gym server logs (default: beside --output)")
    parser.add_argument("tau2", nargs="*", metavar="tau2.KEY=VALUE", help="the tau2 release (default v0.2.1)")
    args = parser.parse_args(argv)
    if args.samples_per_task < 1:
        parser.error("--samples-per-task must be at least 1")
    return args


def main(argv: list[str]) -> int:
    args = parse(argv)
    from nemo_tau2.algorithms.grpo_config import GRPOEnvConfig
    from nemo_tau2.algorithms.sft_data import conversation_from_episode
    from nemo_tau2.algorithms.training_setup import start_rollout_stack
    from nemo_tau2.cluster import ClusterConfig
    from nemo_tau2.evals.config import UserSimulatorConfig
    from nemo_tau2.experience.rollouts import SamplingParams, run_nemo_gym_rollout_sync
    from nemo_tau2.generation.config import GenerationConfig
    from nemo_tau2.tau2_env.gym_rows import load_rows
    from nemo_tau2.tau2_release.client import Tau2WorkerError
    from nemo_tau2.tau2_release.config import release_from_overrides

    try:
        tau2 = release_from_overrides(args.tau2)
        for domain in args.domains:
            if (problem := domain_problem(domain, tau2.version)) is not None:
                raise ValueError(f"--domains: {problem}")
        if tau2.version == "v0.2.1":
            rows = load_rows(
                domains_=args.domains, split=args.split, task_ids=args.task_ids, compact=args.compact_rows,
                what="oracle_sft_data.py", split_key="split",
            )  # fmt: skip
            fake_cfg: dict = {}
        else:
            rows, fake_cfg = _release_rows_and_gold(tau2, args)
    except (ValueError, Tau2WorkerError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not rows:
        print(f"error: no task of split {args.split!r} in {args.domains} matches --task-ids", file=sys.stderr)
        return 2
    fake = FAKE | {"fake_cfg": fake_cfg}
    policy = GenerationConfig.model_validate(fake)
    cfg = SimpleNamespace(
        policy=SimpleNamespace(generation=policy),
        user=UserSimulatorConfig.model_validate({"generation": fake | {"temperature": 0.0}}),
        env=GRPOEnvConfig(),
        cluster=ClusterConfig(),  # this machine: the Gym servers forked here
        logger=SimpleNamespace(log_dir=str(args.log_dir or args.output.parent / "oracle_logs")),
        tau2=tau2,
    )
    n = args.samples_per_task
    repeated = [row for row in rows for _ in range(n)]
    with ExitStack() as resources:
        _, environment = start_rollout_stack(cfg, [row["domain"] for row in rows], resources)
        results = run_nemo_gym_rollout_sync(
            repeated, environment.agent_urls, SamplingParams.from_generation(policy), n, keep_full_result=True
        )
    conversations = []
    for row, result in zip(repeated, results, strict=True):
        if result.ok and result.success:
            conversation = conversation_from_episode(row, result.full_result["response"]["output"])
            played = {"tau2_version": tau2.version, "retrieval_variant": result.retrieval_variant}
            conversations.append(
                conversation | played | {"reward": result.reward, "sample_index": result.sample_index}
            )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.output.with_name(args.output.name + ".tmp")
    tmp.write_text("".join(json.dumps(c) + "\n" for c in conversations))
    tmp.replace(args.output)
    infra = sum(not result.ok for result in results)
    failed = len(results) - len(conversations)
    print(f"oracle: {len(conversations)} successful episodes of {len(results)} ({failed} not kept, {infra} of them "
          f"infrastructure errors) -> {args.output}")  # fmt: skip
    for result in results:
        if not (result.ok and result.success):
            where = f"{result.domain}/{result.task_id} sample {result.sample_index}"
            print(f"  not kept: {where}: {not_kept_reason(result)}")
    print(json.dumps({"episodes": len(results), "written": len(conversations), "infrastructure_errors": infra}))
    return 0 if conversations else 1


def not_kept_reason(result: "RolloutResult") -> str:
    """Why an episode taught nothing: its server's failure (never scored), else how tau2 scored it and what ended it.
    The oracle plays the gold actions, so either one is worth reading: an outage, or a task the oracle cannot pass."""
    if not result.ok:
        return f"infrastructure error: {result.error}"
    checks = ", ".join(f"{name} {value}" for name, value in sorted(result.reward_components.items()))
    return f"reward {result.reward} ({checks or 'no checks recorded'}); ended {result.tau2_failure_kind}"


def _release_rows_and_gold(tau2, args: argparse.Namespace) -> tuple[list[dict], dict]:
    """A later release's rows (its prompts, tools and splits, from its worker) and the fake's ``fake_cfg`` that makes
    its oracle play that release's gold and its user that release's scenarios (their tasks, written beside
    ``--output``): a release may change a task's gold, and its own domains have none in v0.2.1."""
    from nemo_tau2.tau2_release.client import Tau2Worker
    from nemo_tau2.tau2_release.rows import release_rows
    from nemo_tau2.testing.release_tasks import write_release_tasks

    with Tau2Worker(tau2) as worker:
        rows = release_rows(tau2, args.domains, args.split, args.task_ids, what="oracle_sft_data.py",
                            compact=args.compact_rows, worker=worker)  # fmt: skip
        tasks = {domain: worker.request("tasks", domain=domain, split=None) for domain in args.domains}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    gold = write_release_tasks(args.output.with_name(args.output.stem + ".release_tasks.json"), tasks)
    return rows, {"tau2": {"release_tasks": str(gold)}}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
