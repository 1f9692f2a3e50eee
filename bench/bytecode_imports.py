"""What bytecode saves a server's start: the CPU one interpreter takes to import NeMo-Gym's server code and tau2's
registry from source (no ``.pyc`` to read: the venvs NeMo-Gym builds had none where ``PYTHONDONTWRITEBYTECODE`` is
set) against the same import reading ``.pyc`` (reference: the source's), measured in the same run, in turn.

    uv run bench/bytecode_imports.py [--python PATH] [--repeats 5]

Each side is a fresh interpreter (``--python``, default this one) whose bytecode lives under a folder of its own
(``-X pycache_prefix``): empty and unwritable for the source side, filled once beforehand for the other. Prints each
side's CPU seconds (user + system, median of the repeats), then a last line of JSON with both and the ratio (source /
bytecode).
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

IMPORTS = "import nemo_gym.server_utils, tau2.registry"


def _import_cpu_s(python: str, prefix: Path, write: bool) -> float:
    """CPU seconds of one interpreter importing :data:`IMPORTS` with its bytecode under ``prefix``."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # offline, as our servers import tau2
    if not write:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([python, "-X", f"pycache_prefix={prefix}", "-c", IMPORTS], env=env, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable, help="an interpreter with nemo-gym and tau2 installed")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        empty, compiled = Path(folder, "empty"), Path(folder, "compiled")
        _import_cpu_s(args.python, compiled, write=True)  # fills the bytecode side once
        source_s, bytecode_s = [], []
        for _ in range(args.repeats):  # in turn, so that a change in the box's load falls on both
            source_s.append(_import_cpu_s(args.python, empty, write=False))
            bytecode_s.append(_import_cpu_s(args.python, compiled, write=False))
        assert not empty.exists() or not any(empty.rglob("*.pyc")), "the source side wrote bytecode"
    source, bytecode = statistics.median(source_s), statistics.median(bytecode_s)
    print(f"{IMPORTS}: from source {source:.2f} CPU-s, reading .pyc {bytecode:.2f} CPU-s (median of {args.repeats})")
    print(json.dumps({"imports": IMPORTS, "python": args.python, "source_cpu_s": round(source, 2),
                      "bytecode_cpu_s": round(bytecode, 2), "ratio_source_over_bytecode": round(source / bytecode, 2),
                      "repeats": args.repeats}))  # fmt: skip


if __name__ == "__main__":
    main()
