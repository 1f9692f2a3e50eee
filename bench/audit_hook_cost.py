"""What a Python audit hook costs tau2's state copies: why pyproject.toml keeps filelock below 3.30.

filelock >= 3.30 installs a Python audit hook at import, and Ray imports filelock in every Gym server and trainer.
CPython calls each hook on every audited event, and ``id()`` is one: ``copy.deepcopy`` calls it for every object it
visits. This measures, in fresh interpreters, each copy our servers make of tau2 state without a hook (as installed)
and with one that does what filelock's does (two membership tests on the event name):

- ``db_deepcopy``: tau2's airline database, deep-copied whole (what tau2's own evaluator does per replay);
- ``fork``: ``Episode.fork(1)`` of an airline and a retail episode (every entry it owns copied);
- ``branch``: ``Episode.branch()`` of a telecom episode (a pivot verdict's fork: telecom's DB is lists, copied whole).

CPU time, best of ``--repeats`` rounds; the interpreters alternate. The last line is JSON with each copy's ratio.

    uv run bench/audit_hook_cost.py [--repeats 5]
"""

import argparse
import json
import subprocess
import sys

MEASURE = """
import copy, json, sys, time
if sys.argv[1] == "hooked":
    FORK_EVENTS = frozenset({"os.fork", "os.forkpty"})
    def hook(event, args):  # what filelock >= 3.30's _audit_fork_safety does for an event that is not a fork
        if event in FORK_EVENTS:
            pass
        elif event == "_posixsubprocess.fork_exec":
            pass
    sys.addaudithook(hook)
import nemo_tau2
from tau2.domains.airline.environment import get_environment
from nemo_tau2.tau2_env import domains
from nemo_tau2.tau2_env.episode import Episode

def best(work, times):
    found = float("inf")
    for _ in range(3):
        started = time.process_time()
        for _ in range(times):
            work()
        found = min(found, (time.process_time() - started) / times)
    return 1000 * found

db = get_environment().tools.db
episodes = {d: Episode.start(d, domains.task_splits(d)["base"][0]) for d in ("airline", "retail", "telecom")}
episodes["airline"].call_tool("get_reservation_details", {"reservation_id": "4WQ150"})
episodes["retail"].call_tool("get_order_details", {"order_id": "#W2378156"})
print(json.dumps({
    "db_deepcopy": best(lambda: copy.deepcopy(db), 2),
    "fork": best(lambda: [episodes[d].fork(1) for d in ("airline", "retail")], 50),
    "branch": best(lambda: episodes["telecom"].branch(), 100),
}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    runs: dict[str, list[dict]] = {"plain": [], "hooked": []}
    for round_ in range(args.repeats):
        for kind in runs:
            done = subprocess.run([sys.executable, "-c", MEASURE, kind], capture_output=True, text=True, check=True)
            runs[kind].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"round {round_ + 1} {kind}: {runs[kind][-1]}", flush=True)
    best = {kind: {key: min(run[key] for run in found) for key in found[0]} for kind, found in runs.items()}
    print(f"\n{'copy':<12} {'no hook ms':>10} {'hook ms':>10} {'ratio':>6}")
    for key in best["plain"]:
        print(f"{key:<12} {best['plain'][key]:>10.3f} {best['hooked'][key]:>10.3f} "
              f"{best['hooked'][key] / best['plain'][key]:>6.2f}")  # fmt: skip
    ratios = {key: round(best["hooked"][key] / best["plain"][key], 2) for key in best["plain"]}
    print(json.dumps({"bench": "audit_hook_cost", "ms_no_hook": best["plain"], "ms_hooked": best["hooked"],
                      "hooked_over_plain": ratios}))  # fmt: skip


if __name__ == "__main__":
    main()
