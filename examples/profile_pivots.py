"""Profile pivot candidates with a frozen policy and keep PivotRL's pivots (reward varies, mean below a bound).

    uv run examples/profile_pivots.py --pivots data/pivots.jsonl --output data/pivots.kept.jsonl \\
        --policy-url http://127.0.0.1:8000/v1 --model Qwen/Qwen3-4B-Instruct-2507 --samples 8

Each candidate's prompt is sampled ``--samples`` times from the policy (any OpenAI-compatible endpoint; its key, if
it needs one, in the variable ``--api-key-env`` names, never on the command line), and each answer is scored by the
resources server's functional verdict (``/verify_pivot``): ``--resources-url`` of a running one, else one started
here for the release the ``tau2.*`` keys name. With ``--agent-url`` (a running tau2 agent server) each sample is the
agent's rollout of the row instead, as training plays it: its policy, and its ``pivot_text_reward`` (``continue``
plays a text pivot on with the simulated user and scores tau2's reward).

    uv run examples/profile_pivots.py --pivots data/pivots.jsonl --output data/pivots.kept.jsonl \\
        --agent-url http://127.0.0.1:9100 --samples 8

The profile is written beside the pivots as it goes (``<pivots>.profile.jsonl``); a rerun (after Ctrl-C, a crash, an
endpoint outage) profiles only what is left. Ends with a table per domain and a JSON line. Errors: one line, exit 2.
"""

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import orjson

import nemo_tau2  # noqa: F401  (offline settings before tau2 loads litellm)
from nemo_tau2.pivots.profile import (
    AgentProfiler,
    Endpoint,
    Profiler,
    ProfileReport,
    ProfileSettings,
    profile_pivots,
)
from nemo_tau2.tau2_release.config import release_from_overrides


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--pivots", type=Path, required=True, help="candidates from prepare_pivots.py")
    parser.add_argument("--output", type=Path, required=True, help="the kept pivots (JSONL) to write")
    parser.add_argument("--profile", type=Path, default=None, help="default: <pivots>.profile.jsonl")
    parser.add_argument("--policy-url", default=None, help="the frozen policy's OpenAI base URL (ends in /v1)")
    parser.add_argument("--model", default=None, help="the model name the endpoint serves")
    parser.add_argument("--agent-url", default=None, help="a running tau2 agent server: profile its rollouts instead")
    parser.add_argument("--api-key-env", default=None, help="the environment variable holding the endpoint's key")
    parser.add_argument("--samples", type=int, default=ProfileSettings.samples, help="samples per candidate (K)")
    parser.add_argument("--max-mean", type=float, default=ProfileSettings.max_mean, help="keep mean reward < this")
    parser.add_argument("--temperature", type=float, default=Endpoint.temperature)
    parser.add_argument("--max-tokens", type=int, default=Endpoint.max_tokens)
    parser.add_argument("--concurrency", type=int, default=ProfileSettings.concurrency, help="candidates in flight")
    parser.add_argument("--resources-url", default=None, help="a running tau2 resources server (else one is started)")
    parser.add_argument("tau2", nargs="*", metavar="tau2.KEY=VALUE", help="the tau2 release (default v0.2.1)")
    args = parser.parse_args(argv)
    if args.agent_url is not None and (args.policy_url or args.model or args.resources_url or args.api_key_env):
        parser.error("--agent-url profiles the agent's own policy and servers: give it without --policy-url, "
                     "--model, --api-key-env and --resources-url")  # fmt: skip
    if args.agent_url is None and not (args.policy_url and args.model):
        parser.error("give the frozen policy (--policy-url and --model), or a tau2 agent server (--agent-url)")
    if not args.pivots.is_file():
        parser.error(f"--pivots {args.pivots}: no such file")
    if args.samples < 2:
        parser.error("--samples must be at least 2 (a reward variance needs two samples)")
    if not 0 < args.max_mean <= 1:
        parser.error("--max-mean must be in (0, 1]")
    if args.concurrency < 1:
        parser.error("--concurrency must be at least 1")
    try:
        args.tau2 = release_from_overrides(args.tau2)
    except ValueError as e:
        parser.error(str(e))
    args.profile = args.profile or args.pivots.with_name(args.pivots.stem + ".profile.jsonl")
    return args


def read_pivots(path: Path) -> list[dict]:
    pivots = []
    for number, line in enumerate(path.read_bytes().splitlines(), 1):
        if line.strip():
            try:
                pivot = orjson.loads(line)
            except orjson.JSONDecodeError:
                raise ValueError(f"{path}:{number}: not JSON (write it again with prepare_pivots.py)") from None
            if not isinstance(pivot, dict) or "pivot_id" not in pivot or "expected_action" not in pivot:
                raise ValueError(
                    f"{path}:{number}: not a pivot row (pivot_id, expected_action): use prepare_pivots.py"
                )
            pivots.append(pivot)
    return pivots


def table(report: ProfileReport) -> str:
    lines = [f"{'domain':<18} {'profiled':>8} {'refused':>8} {'errors':>7} {'kept':>6} {'mean reward':>12}"]
    for domain, entry in report.as_dict()["by_domain"].items():
        mean = f"{entry['mean_reward']:.3f}" if entry["mean_reward"] is not None else "-"
        lines.append(f"{domain:<18} {entry['profiled']:>8} {entry['refused']:>8} {entry['errors']:>7} "
                     f"{entry['kept']:>6} {mean:>12}")  # fmt: skip
    return "\n".join(lines)


def run(args: argparse.Namespace, pivots: list[dict], url: str) -> ProfileReport:
    policy = (args.policy_url, args.model) if args.agent_url is None else (args.agent_url, "the agent's policy")
    endpoint = Endpoint(*policy, args.api_key_env, args.temperature, max_tokens=args.max_tokens)
    settings = ProfileSettings(args.samples, args.max_mean, args.concurrency)
    last = [0.0]

    def progress(report: ProfileReport, settled: int) -> None:
        if time.monotonic() - last[0] >= 5 or settled == len(pivots):
            last[0] = time.monotonic()
            print(f"profiled {settled}/{len(pivots)} candidates ({report.samples_run} samples this run)", flush=True)

    profiler = Profiler(endpoint, url, settings) if args.agent_url is None else AgentProfiler(endpoint, settings)
    return asyncio.run(profile_pivots(pivots, profiler, args.profile, args.output, progress))


def main(argv: list[str]) -> int:
    args = parse(argv)
    try:
        pivots = read_pivots(args.pivots)
        if args.resources_url or args.agent_url:
            report = run(args, pivots, args.resources_url or args.agent_url)
        else:
            from nemo_tau2.gym.launch import GymServers
            from nemo_tau2.gym.stack import RESOURCES_SERVER, resources_server_spec

            domains = sorted({pivot["domain"] for pivot in pivots}) or ["airline"]
            spec = resources_server_spec(domains, {"tau2": args.tau2.model_dump(mode="json")})
            with GymServers([spec], log_dir=args.profile.parent / "server_logs" / "profile") as servers:
                report = run(args, pivots, servers.url(RESOURCES_SERVER))
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(table(report))
    summary = report.as_dict()
    print(f"profile: {args.profile}; kept pivots: {args.output} ({sum(report.kept.values())})")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
