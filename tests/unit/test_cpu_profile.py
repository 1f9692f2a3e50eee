"""scripts/cpu_profile.py: a command's CPU by kind of process, sampled from /proc while it runs, and the box's idle
share while each test module ran; bad arguments are one line and exit 2."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "cpu_profile.py"
_spec = importlib.util.spec_from_file_location("cpu_profile", SCRIPT)  # a script, not a package
cpu_profile = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cpu_profile)

# a process that burns 1.5 CPU-s, named as an entry point of examples/ on its command line, then exits 3
BUSY = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.5: pass\nraise SystemExit(3)"


def _profile(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *arguments], capture_output=True, text=True, timeout=120)


def test_a_commands_cpu_is_counted_by_kind_and_its_exit_status_kept(tmp_path):
    out = tmp_path / "cpu.json"
    probe = f"examples/probe_{tmp_path.name}.py"  # its own name: the box's other processes count too
    run = _profile("--out", str(out), "--every", "0.2", "--", sys.executable, "-c", BUSY, probe)
    assert run.returncode == 3, run.stderr
    figures = json.loads(run.stdout.splitlines()[-1])
    assert figures["by_kind_cpu_s"]["training and eval entry points (examples/)"] >= 1, figures
    assert "CPU by kind of process" in run.stdout and 0 <= figures["idle_share"] <= 1
    samples = json.loads(out.read_text())
    (busy,) = [p for p in samples["processes"].values() if probe in p["command"] and SCRIPT.name not in p["command"]]
    assert 1 <= busy["cpu_s"] <= 2, busy  # its 1.5 CPU-s
    assert cpu_profile.kind_of(busy["command"]) == "training and eval entry points (examples/)"

    # the same samples, reported with module times: the idle share while a module ran
    end = samples["idle"][-1][0]
    times = {"started": samples["started"], "finished": None,
             "modules": [{"module": "test_x.py", "seconds": 30.0, "started_s": 0.0, "ended_s": end}]}  # fmt: skip
    (tmp_path / "times.json").write_text(json.dumps(times))
    report = _profile("--report", str(out), "--module-times", str(tmp_path / "times.json"))
    assert report.returncode == 0, report.stderr
    shares = json.loads(report.stdout.splitlines()[-1])["module_idle_share"]
    assert list(shares) == ["test_x.py"] and 0 <= shares["test_x.py"] <= 1


def test_bad_arguments_are_one_line_and_exit_2(tmp_path):
    for arguments in (["--report", str(tmp_path / "none.json")], [], ["--", "true"]):
        run = _profile(*arguments)
        assert run.returncode == 2 and run.stdout == "" and run.stderr.count("\n") == 1, (arguments, run.stderr)


def test_a_process_that_execs_another_program_is_counted_as_that_program(tmp_path):
    """``bash -c 'cd x && python app.py'`` (how NeMo-Gym starts a server) is first seen as bash, then runs the server
    under the same pid: its CPU is the server's, not the shell's (it had been counted as the shell's command)."""
    out = tmp_path / "cpu.json"
    probe = f"examples/probe_{tmp_path.name}.py"
    busy = f"{sys.executable} -c '{BUSY}' {probe}"
    shell = f"sleep 0.6; cd {tmp_path} && exec {busy}"  # seen as bash for a few samples first
    run = _profile("--out", str(out), "--every", "0.2", "--", "bash", "-c", shell)
    assert run.returncode == 3, run.stderr
    processes = json.loads(out.read_text())["processes"].values()
    (process,) = [p for p in processes if probe in p["command"] and SCRIPT.name not in p["command"]]
    assert process["command"].startswith(sys.executable), process  # the program it ran last
    assert 1 <= process["cpu_s"] <= 2, process
    assert cpu_profile.kind_of(process["command"]) == "training and eval entry points (examples/)"
