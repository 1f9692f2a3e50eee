"""The GPU kit (``bench/gpu_check.py``, ``scripts/gpu_kit.sh``): the check's dry run end to end on CPU, and its import
closure, which must run on a machine with only the torch stack and the kit's wheels.

One subprocess runs the dry run exactly as CI's machine would (``bench/gpu_check.py --dry-run``) and records every
module it loaded; the tests read its output, its calibration file and that module list. Another runs the kit's
commands as ``scripts/gpu_kit.sh`` documents them, in a virtual environment holding only a GPU machine's packages.
"""

import ast
import importlib.metadata
import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from packaging.requirements import Requirement

from tests.unit.test_layering import imported_modules

ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / "bench" / "gpu_check.py"
KIT_REQUIREMENTS = ROOT / "scripts" / "gpu_kit_requirements.txt"
FORBIDDEN = ("nemo_gym", "tau2", "ray", "vllm", "omegaconf", "litellm")
GPU_MACHINE = ("torch", "transformers", "safetensors", "triton", "numpy", "pyyaml", "pytest")
"""What a lent GPU machine has installed (with their dependencies), and nothing else."""
GPU_MACHINE_TRANSFORMERS = "5.17.0"
"""The lent machines' transformers (pyproject's lower bound)."""
KIT_SCRIPT = ROOT / "scripts" / "gpu_kit.sh"
LAZY_ELSEWHERE = {"ray": "nemo_tau2/models/policy/workers.py: only Policy(num_workers > 1) imports it"}
"""Imports inside functions of modules in the closure that the check never calls (the dry run proves it)."""

_RUN = """
import json, runpy, sys
sys.path.insert(0, {bench!r})
sys.argv = [{check!r}, "--dry-run", "--steps", "1", "--write-calibration", {calibration!r}]
try:
    runpy.run_path({check!r}, run_name="__main__")
    code = 0
except SystemExit as e:
    code = e.code
with open({modules!r}, "w") as f:
    json.dump(sorted(sys.modules), f)
sys.exit(code)
"""


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpu_check")
    paths = {"calibration": str(folder / "calibration.json"), "modules": str(folder / "modules.json")}
    code = _RUN.format(bench=str(CHECK.parent), check=str(CHECK), **paths)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return {
        "records": lines[:-1],
        "summary": lines[-1],
        "last_line": proc.stdout.splitlines()[-1],
        "calibration": json.loads(Path(paths["calibration"]).read_text()),
        "modules": json.loads(Path(paths["modules"]).read_text()),
        "stderr": proc.stderr,
    }


def test_dry_run_reports_one_line_per_shape_and_the_summary_last(dry_run):
    assert json.loads(dry_run["last_line"])["check"] == "gpu_check_summary"
    (record,) = dry_run["records"]
    assert record["check"] == "gpu_check" and record["shape"] == "tiny-qwen3" and "error" not in record
    assert record["layers"] == record["layers_full"] == 2
    assert [row["tokens"] for row in record["ladder"]] == [128, 256] and all(r["fits"] for r in record["ladder"])
    assert record["largest_micro_batch_tokens"] == 256
    for row in record["ladder"]:  # host RSS on CPU: positive and finite, not a GPU figure
        assert row["peak_bytes"] > 0 and row["estimated_bytes"] > 0 and 0 < row["ratio"] < math.inf
    assert record["timed_tokens"] == 128 and record["train_tokens_per_s"] > 0 and record["step_s"] > 0
    assert record["train_mfu"] is None  # no card, no peak to compare against
    assert set(record["generation_tokens_per_s"]) == {"1", "8", "32"}
    assert all(v > 0 for v in record["generation_tokens_per_s"].values())
    summary = dry_run["summary"]
    assert summary["dry_run"] is True and summary["failed"] == [] and "tiny-qwen3" in summary["shapes"]
    assert "largest mb" in dry_run["stderr"] and "meg tok/s" in dry_run["stderr"]  # the readable table


MEGATRON_AGREEMENT_FP32 = 1e-4
"""Max |logprob difference| of the Megatron backend against the torch path on the same weights and batch, fp32 on
CPU (measured: about 1e-6; a misplaced weight or mask moves logprobs by far more than this)."""


def test_dry_run_measures_the_megatron_backend_beside_the_torch_one(dry_run):
    (record,) = dry_run["records"]
    assert "megatron_error" not in record and "megatron_note" not in record
    assert record["megatron_timed_tokens"] == record["timed_tokens"] == 128  # the same packed micro-batch
    assert record["megatron_sequences"] == record["sequences"]
    assert record["megatron_train_tokens_per_s"] > 0 and record["megatron_step_s"] > record["megatron_train_s"] > 0
    assert record["megatron_peak_bytes"] > 0 and record["megatron_train_mfu"] is None
    assert record["megatron_params_dtype"] == "float32"
    assert 0 <= record["megatron_logprob_max_abs_diff"] < MEGATRON_AGREEMENT_FP32
    summary = dry_run["summary"]["shapes"]["tiny-qwen3"]
    assert summary["megatron_logprob_max_abs_diff"] == record["megatron_logprob_max_abs_diff"]


def test_dry_run_calibration_fits_its_own_measured_peaks(dry_run):
    plan = dry_run["calibration"]["memory_plan"]
    assert [m["tokens"] for m in plan["measurements"]] == [128, 256]
    assert plan["ratios"] == dry_run["summary"]["memory_plan"]["ratios"]
    assert plan["suggested"]["token_bytes_scale"] != plan["current"]["token_bytes_scale"]
    assert plan["ratios_with_suggested"] == pytest.approx([1.0, 1.0], abs=1e-3)  # two budgets: an exact line


def test_dry_run_loads_no_ray_gym_tau2_vllm_omegaconf_or_litellm(dry_run):
    loaded = {name.split(".")[0] for name in dry_run["modules"]}
    assert "nemo_tau2.models.policy.worker" in dry_run["modules"]  # the trainer did run
    assert {"nemo_tau2.models.megatron.worker", "megatron.core.pipeline_parallel"} <= set(dry_run["modules"])
    assert sorted(loaded & set(FORBIDDEN)) == []


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _with_dependencies(names) -> set[str]:
    found, todo = set(), [_normalise(n) for n in names]
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found.add(name)
        for line in importlib.metadata.distribution(name).requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(_normalise(requirement.name))
    return found


def _megatron_requirements(loaded: list[str]) -> set[str]:
    """Top-level packages that megatron-core's modules the dry run loaded import unconditionally (at module level,
    outside ``try``: its optional ones, Transformer Engine, Apex, wandb..., fall back when absent)."""
    found, root = set(), Path(importlib.util.find_spec("megatron").submodule_search_locations[0]).parent  # no import
    for name in (n for n in loaded if n.split(".")[0] == "megatron"):
        base = root / name.replace(".", "/")
        for path in (path for path in (base / "__init__.py", base.with_suffix(".py")) if path.is_file()):
            found |= _module_level_imports(path)
    return found


def _module_level_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_kit_wheels_cover_every_package_the_check_imports(dry_run):
    kit = {_normalise(Requirement(line).name): str(Requirement(line).specifier)
           for line in KIT_REQUIREMENTS.read_text().splitlines() if line and not line.startswith("#")}  # fmt: skip
    ours = [CHECK, *CHECK.parent.glob("gpu_check_*.py")]
    for name in (n for n in dry_run["modules"] if n.split(".")[0] == "nemo_tau2"):
        base = ROOT / name.replace(".", "/")
        ours += [path for path in (base / "__init__.py", base.with_suffix(".py")) if path.is_file()]  # none: namespace
    third_party = {m.split(".")[0] for path in ours for m in imported_modules(path, ROOT)}
    third_party |= _megatron_requirements(dry_run["modules"])
    third_party -= set(sys.stdlib_module_names) | {"nemo_tau2", "__future__"} | set(LAZY_ELSEWHERE)
    distributions = importlib.metadata.packages_distributions()
    available = _with_dependencies(GPU_MACHINE) | set(kit)
    missing = sorted(f"{name} ({distributions.get(name)})" for name in third_party if name in distributions
                     and not {_normalise(d) for d in distributions[name]} & available)  # fmt: skip
    assert {"megatron", "numpy", "packaging"} <= third_party  # megatron-core and what it needs: the same rule
    assert missing == [], f"neither on the GPU machine nor in {KIT_REQUIREMENTS.name}"
    lock = (ROOT / "uv.lock").read_text()
    for name, pin in kit.items():  # the kit installs what CI tests
        locked = re.search(rf'^name = "{name}"\nversion = "([^"]+)"', lock, re.MULTILINE)
        assert locked and pin == f"=={locked.group(1)}", f"{name}{pin} is not uv.lock's version"


@pytest.fixture(scope="module")
def gpu_check():
    sys.path.insert(0, str(CHECK.parent))  # as running the script does: its sibling modules
    try:
        return __import__("runpy").run_path(str(CHECK), run_name="gpu_check")
    finally:
        sys.path.remove(str(CHECK.parent))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--shapes", "0.6b,9b"], "--shapes: unknown shape '9b'; choose from 0.6b,1.7b,4b,8b"),
        (["--dry-run", "--shapes", "0.6b"], "--dry-run runs one tiny CPU shape: drop --shapes"),
        (["--steps", "0"], "--steps must be >= 1"),
        (["--dry-run", "--backends", "torch,jax"], "--backends: 'torch,jax': give torch, megatron or torch,megatron"),
    ],
)
def test_bad_arguments_exit_2_with_one_line_naming_the_fix(gpu_check, capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        gpu_check["parse_args"](argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and "\n" not in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU machine the check runs")
def test_without_a_gpu_the_check_asks_for_one_or_the_dry_run(gpu_check, capsys):
    with pytest.raises(SystemExit) as exit_info:
        gpu_check["parse_args"]([])
    assert exit_info.value.code == 2 and "--dry-run" in capsys.readouterr().err


def test_a_micro_batch_that_runs_out_of_memory_is_recorded_as_not_fitting(gpu_check):
    class OutOfMemoryPolicy:  # what a GPU does when the ladder reaches a micro-batch too large for it
        def get_logprobs(self, sequences):
            raise torch.OutOfMemoryError("CUDA out of memory")

    plan = type("Plan", (), {"total_bytes": 90e9})()
    sizes = gpu_check["DRY_RUN"]
    meter = gpu_check["PeakMemory"](torch.device("cpu"))
    sequences = gpu_check["episodes"](256, sizes["max_len"], 1024, seed=0)
    row = gpu_check["ladder_step"](OutOfMemoryPolicy(), plan, sequences, meter)
    assert row == {"tokens": 256, "fits": False, "estimated_bytes": 90e9}


def test_model_flops_count_matmuls_and_causal_attention_within_each_packed_sequence(gpu_check):
    # 2 N T + 2 L d sum(len^2): N=10 matmul weights, T=8 tokens in sequences of 3 and 5, L=2 layers, d=4
    assert gpu_check["forward_flops"](10, 2, 4, [3, 5]) == 2 * 10 * 8 + 2 * 2 * 4 * (9 + 25)


def test_without_megatron_core_the_check_notes_it_in_one_line_and_measures_torch_only(gpu_check, monkeypatch):
    monkeypatch.setitem(sys.modules, "megatron", None)  # what a machine without the kit's wheel sees
    monkeypatch.setitem(sys.modules, "megatron.core", None)
    args = gpu_check["parse_args"](["--dry-run"])
    assert args.backends == ["torch", "megatron"] and args.megatron is False
    assert "megatron-core is not importable" in args.megatron_note and "\n" not in args.megatron_note
    assert gpu_check["parse_args"](["--dry-run", "--backends", "torch"]).megatron_note is None


def test_the_megatron_measurement_runs_in_the_torch_paths_precision_and_packing(gpu_check):
    torch_cfg = gpu_check["PolicyConfig"](model_name="x", train_global_batch_size=8, train_micro_batch_size=1,
                                          max_total_sequence_length=256, precision="bfloat16",
                                          dtensor_cfg={"enabled": True},
                                          sequence_packing={"enabled": True, "train_mb_tokens": 256})  # fmt: skip
    cfg = __import__("gpu_check_megatron").megatron_config(torch_cfg, "/initial/weights")
    assert cfg.precision == "bfloat16" and cfg.megatron_cfg.enabled and not cfg.dtensor_cfg.enabled
    assert cfg.model_name == "/initial/weights" and cfg.sequence_packing == torch_cfg.sequence_packing


def _as_typed() -> list[str]:
    """The kit's commands as ``scripts/gpu_kit.sh`` documents them (its header's block after "The kit, as typed")."""
    header = KIT_SCRIPT.read_text().split("# The kit, as typed", 1)[1].split("\nset -", 1)[0]
    return [line.removeprefix("#   ") for line in header.splitlines() if line.startswith("#   ")]


def _git(*args: str, cwd: Path) -> str:
    command = ["git", "-c", "user.name=kit", "-c", "user.email=kit@localhost", "-c", "init.defaultBranch=main", *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=True, timeout=60).stdout.strip()


@pytest.fixture(scope="module")
def gpu_machine(tmp_path_factory) -> Path:
    """A virtual environment with a GPU machine's packages only: this checkout's torch (uv's shared cache holds it),
    the machines' transformers, safetensors, numpy, pyyaml, and pip."""
    uv = shutil.which("uv")
    assert uv, "uv is not on PATH: install uv (https://docs.astral.sh/uv/) to build the GPU machine's environment"
    venv = tmp_path_factory.mktemp("gpu_machine") / "venv"
    subprocess.run([uv, "venv", "--seed", "-q", "--python", sys.executable, str(venv)], check=True, timeout=300)
    pins = [f"{n}=={importlib.metadata.version(n)}" for n in ("torch", "safetensors", "numpy", "pyyaml")]
    pins.append(f"transformers=={GPU_MACHINE_TRANSFORMERS}")
    install = [uv, "pip", "install", "-q", "--python", str(venv / "bin" / "python"), *pins]
    subprocess.run(install, check=True, timeout=600, capture_output=True)
    return venv


def test_the_kit_as_typed_runs_its_dry_run_where_only_the_gpu_stack_is_installed(gpu_machine, tmp_path):
    """``scripts/gpu_kit.sh`` here, the checkout carried without ``.git``, then its pip line and the check (with
    ``--dry-run``) there: the commands exactly as documented, both backends measured, this checkout's commit in the
    record."""
    prepare, install, check = _as_typed()
    assert install.startswith("pip install --no-index --no-deps ") and check.startswith("PYTHONPATH=")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env |= {"PATH": f"{gpu_machine / 'bin'}{os.pathsep}/usr/bin{os.pathsep}/bin", "HF_HUB_OFFLINE": "1"}  # proxy: kept
    bare = subprocess.run(["python", "-c", "import megatron.core"], env=env, capture_output=True, timeout=120)
    assert bare.returncode != 0  # the machine lacks what the kit brings
    here = subprocess.run(["bash", "-c", prepare], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert here.returncode == 0, here.stderr[-2000:]
    carried = tmp_path / "carried"  # the working tree's files and the wheels, as a loan carries them: no .git
    files = _git("ls-files", "--cached", "--others", "--exclude-standard", cwd=ROOT).splitlines()
    for name in [*files, *(str(p.relative_to(ROOT)) for p in (ROOT / "gpu_kit_wheels").iterdir())]:
        if (ROOT / name).is_file():
            (carried / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, carried / name)
    target = tmp_path / "gpu_kit"
    for line in (install, f"{check} --dry-run --steps 1"):
        there = subprocess.run(["bash", "-c", line.replace("/tmp/gpu_kit", str(target))], cwd=carried, env=env,
                               capture_output=True, text=True, timeout=600)  # fmt: skip
        assert there.returncode == 0, f"{line}\n{there.stderr[-3000:]}"
    lines = [json.loads(line) for line in (carried / "gpu_check.jsonl").read_text().splitlines()]
    record, summary = lines
    assert record["shape"] == "tiny-qwen3" and "megatron_note" not in record and "megatron_error" not in record
    assert record["megatron_train_tokens_per_s"] > 0 and record["train_tokens_per_s"] > 0
    assert summary["failed"] == [] and summary["dry_run"] is True
    assert summary["commit"] == _git("rev-parse", "--short", "HEAD", cwd=ROOT)
    assert json.loads((carried / "calibration.json").read_text())["memory_plan"]["measurements"]


def test_the_record_names_this_projects_commit_never_an_enclosing_checkouts(gpu_check, tmp_path):
    """A copy of the project inside another git checkout (carried as a subfolder): git's commit there is the other
    checkout's, so the check takes the one ``scripts/gpu_kit.sh`` stamped, else says unknown; its own checkout's
    commit wins."""
    commit = gpu_check["project_commit"]
    outer = tmp_path / "outer"
    outer.mkdir()
    _git("init", "-q", cwd=outer)
    (outer / "file.txt").write_text("the enclosing project\n")
    _git("add", "file.txt", cwd=outer)
    _git("commit", "-q", "-m", "outer", cwd=outer)
    project = outer / "nemo-tau2"
    (project / "gpu_kit_wheels").mkdir(parents=True)
    assert commit(project) == "unknown"
    (project / "gpu_kit_wheels" / "COMMIT").write_text("abc1234\n")
    assert commit(project) == "abc1234"
    _git("init", "-q", cwd=project)
    (project / "README").write_text("this project\n")
    _git("add", "README", cwd=project)
    _git("commit", "-q", "-m", "inner", cwd=project)
    assert commit(project) == _git("rev-parse", "--short", "HEAD", cwd=project) != commit(outer)
    assert gpu_check["kit_commit"](project) == "abc1234"  # the stamp, which the summary records beside git's


def test_a_unit_the_time_budget_cannot_fit_is_skipped_and_named_in_the_record(gpu_check):
    """With 10 s of a 60 s budget left, the 4B's torch path (about 55 s on an H200) does not start: the shape's record
    says so instead of a ladder. No clock is measured: the budget starts 50 s in the past."""
    budget = gpu_check["Budget"](60.0, started=time.monotonic() - 50.0)
    args = gpu_check["parse_args"](["--dry-run", "--backends", "torch"])
    config = gpu_check["AutoConfig"].for_model(**gpu_check["TINY_QWEN3"])
    meter = gpu_check["PeakMemory"](torch.device("cpu"))
    record = gpu_check["check_shape"]("4b", "tiny-qwen3", config, torch.device("cpu"), gpu_check["DRY_RUN"], args,
                                      None, meter, budget)  # fmt: skip
    assert "ladder" not in record and len(record["skipped"]) == 1
    assert re.fullmatch(r"torch: 1\d s of the 60 s budget left, needs ~55 s", record["skipped"][0])


def test_the_budget_scales_its_h200_estimates_by_the_pace_of_the_finished_units(gpu_check):
    budget = gpu_check["Budget"](1000.0)
    assert budget.allows("torch", "8b") is None and budget.pace() == 1.0
    h200_s = sys.modules[gpu_check["Budget"].__module__].H200_S
    budget.finished("torch", "0.6b", 3 * h200_s["torch"]["0.6b"])  # a card 3x slower than the H200
    assert budget.pace() == 3.0
    budget.budget_s = budget.elapsed() + 100.0  # 100 s left: the 8B's torch path needs 3 x 50 s here
    assert budget.allows("torch", "8b").endswith("needs ~150 s") and budget.allows("generation", "0.6b") is None
    assert gpu_check["Budget"](None).allows("megatron", "8b") is None  # --budget-s 0: no limit
