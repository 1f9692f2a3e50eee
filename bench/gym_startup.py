"""Start-up of the four Gym servers of a tau2 run (resources, agent, policy and user model servers): forked from
one warm parent (the launcher's way) against one interpreter per server, each importing tau2, litellm, NeMo-Gym
and the rest for itself (the way before it, ``python -m nemo_tau2.gym.serving`` per server), and the fork server
itself forked from a fork template that imported the server classes once for every stack (the test session's way,
``nemo_tau2/gym/fork_template.py``; its one import is timed apart), in the same run.

Both are timed from nothing running to every server answering ``GET /``, against the fake model server, all three
domains. Rounds alternate which way goes first. Wall time depends on what else the machine runs (its load average
is printed); CPU seconds (every process of the way, start-up and shutdown, from ``getrusage``; for the template's
way, what the template's forks used, from the template's reaped children) do not.

    uv run bench/gym_startup.py [--rounds 2]
"""

import argparse
import contextlib
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil
from omegaconf import OmegaConf

import nemo_tau2  # noqa: F401  (offline settings before tau2 loads litellm)
from nemo_tau2.gym.fork_template import TEMPLATE_ENV, ForkTemplate
from nemo_tau2.gym.launch import GymServers, gym_global_config, split_secrets
from nemo_tau2.gym.serving import CONFIG_DICT_ENV, SECRETS_ENV
from nemo_tau2.gym.stack import ModelEndpoint, tau2_stack, tau2_stack_classes
from nemo_tau2.processes import child_environment
from nemo_tau2.testing import start_fake_server

TARGET_S = 8.0


def forked(specs) -> float:
    began = time.perf_counter()
    with GymServers(specs, log_dir=tempfile.mkdtemp(prefix="gym_startup_")):
        return time.perf_counter() - began


def _cpu_s(process: psutil.Process) -> float:
    """A process's CPU seconds and its reaped children's."""
    times = process.cpu_times()
    return times.user + times.system + times.children_user + times.children_system


def from_template(template: ForkTemplate):
    """The launcher's way with its fork server forked from ``template`` (as every stack of the test session)."""

    def way(specs) -> float:
        os.environ[TEMPLATE_ENV] = str(template.socket_path)
        try:
            return forked(specs)
        finally:
            del os.environ[TEMPLATE_ENV]

    return way


def one_interpreter_each(specs) -> float:
    """The previous launcher, reduced to its start-up: a ``nemo_tau2.gym.serving`` process per server."""
    with tempfile.TemporaryFile() as log:
        return _one_interpreter_each(specs, log)


def _one_interpreter_each(specs, log) -> float:
    config = gym_global_config(specs, "127.0.0.1")
    env = child_environment({CONFIG_DICT_ENV: OmegaConf.to_yaml(config)}, drop_secret_names=True)
    began = time.perf_counter()
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "nemo_tau2.gym.serving", spec.name, spec.server_class],
            env=env | {SECRETS_ENV: json.dumps(split_secrets(spec.config)[1])},
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        for spec in specs
    ]
    try:
        for spec in specs:
            (block,) = config[spec.name].values()
            (instance,) = block.values()
            while True:
                if any(p.poll() is not None for p in processes):
                    log.seek(0)
                    raise RuntimeError(f"a server exited during start-up:\n{log.read().decode()[-3000:]}")
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{instance.port}/", timeout=2).close()
                    break
                except OSError:
                    time.sleep(0.05)
        return time.perf_counter() - began
    finally:
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            process.wait()


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # every waited-for descendant (the forked servers too)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    times: dict[str, list[float]] = {"forked": [], "one_interpreter_each": [], "from_template": []}
    cpu: dict[str, list[float]] = {"forked": [], "one_interpreter_each": [], "from_template": []}
    folder = tempfile.mkdtemp(prefix="gym_startup_template_")
    classes = tau2_stack_classes("fast_vllm_model", "fast_vllm_model")
    began = time.perf_counter()
    template = ForkTemplate(os.path.join(folder, "t.sock"), classes, os.path.join(folder, "template.log"))
    template_process = psutil.Process(template.process.pid)
    with start_fake_server() as fake:
        try:
            while "imported" not in Path(folder, "template.log").read_text():  # its one import, timed apart
                time.sleep(0.05)
            template_import_s = time.perf_counter() - began
            template_import_cpu_s = _cpu_s(template_process)
            for round_index in range(args.rounds):
                ways = [("forked", forked), ("one_interpreter_each", one_interpreter_each),
                        ("from_template", from_template(template))]  # fmt: skip
                for name, way in ways if round_index % 2 == 0 else ways[::-1]:
                    specs = tau2_stack(
                        ModelEndpoint([fake.base_url], "fake-policy"),
                        ModelEndpoint([fake.base_url], "fake-user"),
                        domains=["airline", "retail", "telecom"],
                    )
                    cpu_before = _children_cpu_s() + _cpu_s(template_process)
                    times[name].append(way(specs))
                    time.sleep(0.5)  # the template reaps its ended fork (its CPU then counts among its children)
                    cpu[name].append(_children_cpu_s() + _cpu_s(template_process) - cpu_before)
                    print(
                        f"round {round_index + 1}: {name:<22} {times[name][-1]:6.1f} s wall, "
                        f"{cpu[name][-1]:6.1f} s CPU",
                        flush=True,
                    )
        finally:
            template.stop()
    startup, before = statistics.median(times["forked"]), statistics.median(times["one_interpreter_each"])
    print(
        json.dumps(
            {
                "benchmark": "gym_startup",
                "servers": 4,
                "rounds": args.rounds,
                "cpus": os.cpu_count(),
                "load_avg_1m": round(os.getloadavg()[0], 2),
                "startup_s": round(startup, 2),
                "startup_one_interpreter_each_s": round(before, 2),
                "ratio_to_one_interpreter_each": round(startup / before, 3),
                "cpu_s": round(statistics.median(cpu["forked"]), 2),
                "cpu_one_interpreter_each_s": round(statistics.median(cpu["one_interpreter_each"]), 2),
                "startup_from_template_s": round(statistics.median(times["from_template"]), 2),
                "cpu_from_template_s": round(statistics.median(cpu["from_template"]), 2),
                "template_import_once_s": round(template_import_s, 2),
                "template_import_once_cpu_s": round(template_import_cpu_s, 2),
                "ratio_from_template_to_forked": round(statistics.median(times["from_template"]) / startup, 3),
                "target_s": TARGET_S,
                "ratio_to_target": round(startup / TARGET_S, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
