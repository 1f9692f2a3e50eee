"""The set-up: `scripts/setup.sh` builds what the suite needs, and the tests find it with nothing exported; a missing
environment is a failure naming the command that builds it, never a skip."""

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nemo_tau2.env_cache import STAMP_FILE, CacheUnusable, build_once, built_python
from tests import env_python
from tests.unit.gym.cli_shell import real_uv


def test_an_environment_variable_naming_nothing_fails_the_test_naming_the_command(monkeypatch):
    monkeypatch.setenv("NEMO_TAU2_PROBE_PYTHON", "/nowhere/bin/python")
    with pytest.raises(pytest.fail.Exception, match=r"does not exist: unset it .*`scripts/setup.sh vllm`"):
        env_python.environment_python("NEMO_TAU2_PROBE_PYTHON", "vllm", "vLLM")


def test_a_part_that_cannot_be_built_fails_the_test_naming_the_command(monkeypatch):
    monkeypatch.delenv("NEMO_TAU2_PROBE_PYTHON", raising=False)
    with pytest.raises(pytest.fail.Exception, match=r"no probe environment: `scripts/setup.sh no-such-part` failed"):
        env_python.environment_python("NEMO_TAU2_PROBE_PYTHON", "no-such-part", "probe")


@pytest.mark.parametrize("arguments", [["no-such-part"], ["vllm", "smollm2"]])
def test_setup_refuses_bad_arguments_in_one_line(arguments):
    run = subprocess.run([str(env_python.SETUP), *arguments], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.count("\n") == 1 and "project chromium sandbox vllm smollm2 tau2-v1 gym07" in run.stderr


CI_RUN = env_python.ROOT / ".ci" / "run"
# The README's test command, interrupted (SIGINT, so pytest still prints its summary) at 85 minutes from the start.
README_TEST_COMMAND = "uv run pytest tests/unit"
CI_TEST_COMMAND = f'timeout --signal=INT --kill-after=120 "$((5100 - SECONDS))" {README_TEST_COMMAND} || status=$?'
CI_PRINTS_TIMES = "uv run python -m tests.module_times || true"


def test_ci_runs_exactly_the_set_up_and_the_test_command():
    """The README's set-up and test command, then the module times (tests/module_times.py), whatever pytest said."""
    commands = [line for line in CI_RUN.read_text().splitlines() if line and line[0] != "#"]
    assert commands == [
        "set -euo pipefail", 'cd "$(dirname "$0")/.."', "pip install uv", "scripts/setup.sh",
        "status=0", CI_TEST_COMMAND, CI_PRINTS_TIMES, 'exit "$status"',
    ]  # fmt: skip


@pytest.mark.parametrize("pytest_status", [0, 1, 5])
def test_ci_exits_with_pytests_status_after_printing_the_times(tmp_path, pytest_status):
    """Its tail with pytest's exit stood in for (5: no test ran, which must not pass as green)."""
    tail = CI_RUN.read_text().split("scripts/setup.sh\n", 1)[1]
    tail = tail.replace(CI_TEST_COMMAND, f"(exit {pytest_status}) || status=$?").replace(CI_PRINTS_TIMES, "echo times")
    result = subprocess.run(["bash", "-c", f"set -euo pipefail\n{tail}"], capture_output=True, text=True)
    assert (result.returncode, result.stdout) == (pytest_status, "times\n")


def test_ci_interrupts_a_run_near_its_limit_and_still_prints_the_times():
    """A run reaching 85 minutes gets SIGINT (pytest's own Ctrl-C: it prints its summary), the module times print, and
    CI exits 124 (timeout's: ran out of time), never green. The clock starts near the
    limit; a stand-in waits for SIGINT."""
    tail = CI_RUN.read_text().split("scripts/setup.sh\n", 1)[1]
    assert README_TEST_COMMAND in tail
    stand_in = "bash -c 'trap \"echo interrupted; exit 2\" INT; sleep 60 >/dev/null 2>&1 & wait'"
    tail = tail.replace(README_TEST_COMMAND, stand_in).replace(CI_PRINTS_TIMES, "echo times")
    started = time.monotonic()
    result = subprocess.run(["bash", "-c", f"set -euo pipefail\nSECONDS=5099\n{tail}"], capture_output=True,
                            text=True, timeout=60)  # fmt: skip
    assert (result.returncode, result.stdout) == (124, "interrupted\ntimes\n")
    assert time.monotonic() - started < 30


ENV_CACHE = env_python.ROOT / "scripts" / "env_cache.sh"
# A build script in miniature, on the rule the real ones source: its "environment" is a folder whose interpreter is
# this one (linked), and it "does not import" when asked to break.
MINIATURE_BUILD = """set -euo pipefail
source "$1"
ENV_DIR="$2"; STAMP="$3"
log() { echo "[probe] $*" >&2; }
imports_ok() { [ -x "$ENV_DIR/bin/python" ] && [ ! -e "$ENV_DIR/broken" ]; }
env_cache_reuse_or_lock
log "building $ENV_DIR ($STAMP)"
rm -rf "$ENV_DIR"
mkdir -p "$ENV_DIR/bin"
ln -s "$4" "$ENV_DIR/bin/python"
if [ -n "${BREAK:-}" ]; then touch "$ENV_DIR/broken"; fi
env_cache_stamp "the probe" "$ENV_DIR/bin/python" -c "import no_such_module"
"""


def test_the_build_scripts_rule_reuses_a_stamped_environment_rebuilds_any_other_and_holds_a_lock(tmp_path):
    """scripts/env_cache.sh, which the three build scripts source: a finished build (stamp written last, imports)
    is reused; a changed stamp or a build that did not finish is built again; a build that does not import exits 1
    with the probe's last line and no stamp; a second run waits for the first's lock. nemo_tau2.env_cache reads the
    stamp the same way (the vLLM launcher finds a finished build with it)."""
    folder = tmp_path / "env"

    def build(stamp: str, **env: str) -> subprocess.CompletedProcess:
        command = ["bash", "-c", MINIATURE_BUILD, "build", str(ENV_CACHE), str(folder), stamp, sys.executable]
        return subprocess.run(command, capture_output=True, text=True, timeout=60, env=os.environ | env)

    first, again = build("probe 1"), build("probe 1")
    assert first.returncode == again.returncode == 0, first.stderr
    assert first.stdout == again.stdout == f"{folder}/bin/python\n"
    assert first.stderr == f"[probe] building {folder} (probe 1)\n[probe] ready: {folder}\n"
    assert again.stderr == f"[probe] reusing {folder} (probe 1)\n"
    assert (folder / STAMP_FILE).read_text() == "probe 1\n" and built_python(folder) == folder / "bin" / "python"
    assert "building" in build("probe 2").stderr  # what it installs changed: rebuilt

    broken = build("probe 3", BREAK="1")
    assert broken.returncode == 1 and broken.stdout == ""
    assert broken.stderr.splitlines()[-1] == (
        f"[probe] error: the probe does not import in {folder}: ModuleNotFoundError: No module named 'no_such_module'"
    )
    assert not (folder / STAMP_FILE).exists() and built_python(folder) is None  # half built: not used
    assert "building" in build("probe 3").stderr  # and started again from nothing

    with open(f"{folder}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a build under way
        with pytest.raises(subprocess.TimeoutExpired):
            subprocess.run(["bash", "-c", MINIATURE_BUILD, "build", str(ENV_CACHE), str(folder), "probe 3",
                            sys.executable], capture_output=True, timeout=3)  # fmt: skip
    assert "reusing" in build("probe 3").stderr


def test_a_build_runs_uv_outside_the_checkout_so_our_uv_settings_reach_no_other_projects_environment(tmp_path):
    """uv reads the [tool.uv] settings of the project it runs in, `uv pip install` too: a build started from a
    checkout whose pyproject constrained filelock<3.30 got the constraint, which NeMo-RL's and vLLM's pinned sets
    contradict (CI's set-up failed on it). The rule points uv at the build's cache folder before it installs anything.
    A miniature checkout carries that constraint; the probe asks uv, offline and without installing, for the
    filelock that NeMo-RL's lock pins, from a build started there and, as the control, from the checkout itself."""
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / "pyproject.toml").write_text(
        '[project]\nname = "probe"\nversion = "0"\n\n[tool.uv]\nconstraint-dependencies = ["filelock<3.30"]\n'
    )
    pin = env_python.ROOT / ".python-version"  # pyenv's uv shim finds its interpreter by the folder
    if pin.exists():
        (checkout / pin.name).write_text(pin.read_text())
    probe = f"uv pip install --dry-run --offline --no-deps --python {sys.executable} filelock==3.31.2 2>&1 || true"
    script = MINIATURE_BUILD.replace('log "building', f'{probe}; exit 0; log "building')
    command = ["bash", "-c", script, "build", str(ENV_CACHE), str(tmp_path / "env"), "probe 1", sys.executable]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=checkout)
    assert result.returncode == 0, result.stderr
    unruled = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=60, cwd=checkout)
    assert "filelock<3.30" in unruled.stdout, unruled.stdout  # the probe sees the checkout's settings there
    assert "filelock<3.30" not in result.stdout, result.stdout


def test_a_build_with_a_reuse_check_reuses_on_it_alone_and_rebuilds_when_it_fails(tmp_path):
    """A build script that defines reuse_ok (NeMo-RL's: its full import takes ~26 s): a stamped folder is reused on
    that check alone, without the full one; when it fails (a module gone), the folder is built again."""
    folder = tmp_path / "env"
    # the full check is slow here: it counts its runs; the reuse check looks for a marker file
    script = MINIATURE_BUILD.replace(
        "imports_ok() {",
        'reuse_ok() { [ -x "$ENV_DIR/bin/python" ] && [ ! -e "$ENV_DIR/module_gone" ]; }\n'
        'imports_ok() { echo x >> "$ENV_DIR.full_checks";',
    )

    def build() -> subprocess.CompletedProcess:
        command = ["bash", "-c", script, "build", str(ENV_CACHE), str(folder), "probe 1", sys.executable]
        return subprocess.run(command, capture_output=True, text=True, timeout=60)

    first = build()
    assert first.returncode == 0 and "ready" in first.stderr, first.stderr
    checks = tmp_path / "env.full_checks"
    assert checks.read_text() == "x\n"  # the full check before the stamp
    again = build()
    assert again.returncode == 0 and again.stderr == f"[probe] reusing {folder} (probe 1)\n"
    assert checks.read_text() == "x\n"  # reused on the cheap check alone
    (folder / "module_gone").touch()
    rebuilt = build()
    assert rebuilt.returncode == 0 and "building" in rebuilt.stderr and not (folder / "module_gone").exists()


def test_a_build_compiles_its_packages_once_and_an_older_build_is_compiled_on_reuse_where_asked(tmp_path):
    """Where PYTHONDONTWRITEBYTECODE is set (CI), an environment without .pyc compiles every import in every process
    it starts. A build compiles its site-packages before its stamp; a folder built before that rule is compiled when
    it is next reused if its script sets BYTECODE_ON_REUSE=1 (tau2's), and left as it is otherwise."""
    folder = tmp_path / "env"
    script = MINIATURE_BUILD.replace(
        'mkdir -p "$ENV_DIR/bin"\nln -s "$4" "$ENV_DIR/bin/python"',
        '"$4" -m venv --without-pip "$ENV_DIR"\n'
        'site="$("$ENV_DIR/bin/python" -c \'import sysconfig; print(sysconfig.get_paths()["purelib"])\')"\n'
        'echo "ANSWER = 42" > "$site/probe_module.py"',
    )
    assert script != MINIATURE_BUILD

    def build(**env: str) -> subprocess.CompletedProcess:
        command = ["bash", "-c", script, "build", str(ENV_CACHE), str(folder), "probe 1", sys.executable]
        run = subprocess.run(command, capture_output=True, text=True, timeout=120,
                             env=os.environ | {"PYTHONDONTWRITEBYTECODE": "1"} | env)  # fmt: skip
        assert run.returncode == 0, run.stderr
        return run

    def compiled() -> list:
        return list(folder.glob("lib/python*/site-packages/__pycache__/probe_module.*.pyc"))

    assert "compiling" in build().stderr and compiled() and (folder / ".nemo_tau2_bytecode").exists()
    for pyc in compiled():  # as a build made before the rule left it
        pyc.unlink()
    (folder / ".nemo_tau2_bytecode").unlink()
    assert build().stderr == f"[probe] reusing {folder} (probe 1)\n" and not compiled()
    assert "compiling" in build(BYTECODE_ON_REUSE="1").stderr and compiled()
    assert build(BYTECODE_ON_REUSE="1").stderr == f"[probe] reusing {folder} (probe 1)\n"  # once


def test_an_environment_keeping_its_bytecode_under_itself_gets_the_standard_library_compiled_there(tmp_path):
    """tau2's and NeMo-RL's environments read sources that must stay unwritten (../shared/vendor), so their bytecode
    goes under the environment (sys.pycache_prefix, set by a .pth). Python then reads no other .pyc, the standard
    library's included: the build compiles what the environment's processes import from there too, else each of them
    compiled json, asyncio, ... from source again where PYTHONDONTWRITEBYTECODE is set."""
    folder = tmp_path / "env"
    script = MINIATURE_BUILD.replace(
        'mkdir -p "$ENV_DIR/bin"\nln -s "$4" "$ENV_DIR/bin/python"',
        '"$4" -m venv --without-pip "$ENV_DIR"\n'
        'site="$("$ENV_DIR/bin/python" -c \'import sysconfig; print(sysconfig.get_paths()["purelib"])\')"\n'
        'echo "ANSWER = 42" > "$site/probe_module.py"\n'
        'echo "import sys; sys.pycache_prefix = \'$ENV_DIR/pycache\'" > "$site/prefix.pth"',
    )
    command = ["bash", "-c", script, "build", str(ENV_CACHE), str(folder), "probe 1", sys.executable]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300,
                         env=os.environ | {"PYTHONDONTWRITEBYTECODE": "1"})  # fmt: skip
    assert run.returncode == 0, run.stderr
    modules = "json, asyncio, probe_module"
    where = f"import importlib.util as u, {modules}; print(*(u.cache_from_source(m.__file__) for m in ({modules})))"
    found = subprocess.run([str(folder / "bin" / "python"), "-c", where], capture_output=True, text=True, check=True,
                           env=os.environ | {"PYTHONDONTWRITEBYTECODE": "1"})  # fmt: skip
    pycs = [Path(name) for name in found.stdout.split()]
    assert len(pycs) == 3 and all(pyc.is_relative_to(folder / "pycache") and pyc.is_file() for pyc in pycs), pycs
    assert not list((folder / "pycache").rglob("test_*.pyc"))  # the standard library's own tests left out


def test_tau2_v1s_environment_never_writes_the_releases_sources_and_keeps_their_bytecode_under_itself():
    """The vendored release is read-only (../shared/vendor/README.md), and a user's checkout is theirs: importing tau2,
    with bytecode written as the suite now writes it, leaves no __pycache__ beside its sources; the bytecode is under
    the environment, tau2's own compiled by the build."""
    python = env_python.environment_python("NEMO_TAU2_TAU2_V1_PYTHON", "tau2-v1", "tau2 v1.0.1")
    probe = "import sys, tau2.registry; print(sys.pycache_prefix, sys.modules['tau2.registry'].__file__)"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"} | {
        "LITELLM_LOCAL_MODEL_COST_MAP": "True"
    }
    found = subprocess.run([python, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    assert found.returncode == 0, found.stderr[-2000:]
    prefix, source = found.stdout.split()
    assert Path(prefix) == Path(python).parents[1] / "pycache", prefix
    assert not list(Path(source).parents[1].rglob("__pycache__")), "tau2's sources were written"
    assert list(Path(prefix).rglob("tau2/registry.*.pyc")) and list(Path(prefix).rglob("tau2/domains/*/*.pyc"))


def test_a_process_the_tests_start_writes_its_bytecode_where_the_box_says_not_to(tmp_path):
    """tests/conftest.py: the virtualenvs NeMo-Gym builds for the servers the tests start have no .pyc, and where
    PYTHONDONTWRITEBYTECODE is set (this project's machines, CI's) each server compiled NeMo-Gym, tau2 and litellm from
    source again; the suite writes bytecode as Python does by default, once for every later process of the run."""
    (tmp_path / "probe_module.py").write_text("ANSWER = 42\n")
    # -S: no site, so not the project environment's own rule below (its .pth); a NeMo-Gym-built venv has none
    subprocess.run([sys.executable, "-S", "-c", "import probe_module"], cwd=tmp_path, check=True, timeout=60,
                   env=os.environ | {"PYTHONPATH": str(tmp_path)})  # fmt: skip
    assert list((tmp_path / "__pycache__").glob("probe_module.*.pyc"))


def test_the_project_environment_writes_each_modules_bytecode_on_first_import_under_itself_and_nowhere_else(tmp_path):
    """scripts/setup.sh compiles nothing at set-up (`--compile-bytecode` compiled all 30,722 files of .venv, 79 CPU-s,
    most never imported); the environment's .pth has each module's .pyc written on its first import, where the box
    sets PYTHONDONTWRITEBYTECODE too, under .venv/pycache: the next process reads it, and the source tree beside the
    module (a checkout, ../shared/vendor) gets nothing."""
    (tmp_path / "probe_module.py").write_text("ANSWER = 42\n")
    env = os.environ | {"PYTHONPATH": str(tmp_path), "PYTHONDONTWRITEBYTECODE": "1"}
    probe = "import sys, importlib.util as u, probe_module; print(u.cache_from_source(probe_module.__file__))"
    runs = [subprocess.run([sys.executable, "-v", "-c", probe], cwd=tmp_path, capture_output=True, text=True,
                           env=env, timeout=60, check=True) for _ in range(2)]  # fmt: skip
    pyc = Path(runs[0].stdout.strip())
    assert pyc.is_file() and pyc.is_relative_to(Path(sys.prefix) / "pycache"), pyc
    assert not (tmp_path / "__pycache__").exists()
    assert f"created '{pyc}'" in runs[0].stderr  # the first writes it, the second reads it:
    assert f"code object from '{pyc}'" in runs[1].stderr


BUILD_ONCE = """
import sys, time
from pathlib import Path
from nemo_tau2.env_cache import build_once

def build(into):
    with open(Path(sys.argv[1]).parent.parent / "builds.log", "a") as log:
        log.write(sys.argv[2] + "\\n")
    into.mkdir()
    (into / "started").write_text("")
    time.sleep(float(sys.argv[3]))
    (into / "weights").write_text(sys.argv[2])

print(build_once(Path(sys.argv[1]), build), flush=True)
"""


def test_build_once_builds_a_folder_once_for_every_process_asking_and_never_hands_out_a_torn_one(tmp_path):
    """What Python builds in the cache (the SmolLM2 folder, the tiny policies): two processes asking at once get one
    build (the second waits on the lock, then uses the first's); a build killed midway leaves only `.partial`,
    which the next asker replaces; a cache that cannot be created is CacheUnusable, for the caller to build without."""
    folder = tmp_path / "cache" / "model"

    def ask(content: str, seconds: float) -> subprocess.Popen:
        command = [sys.executable, "-c", BUILD_ONCE, str(folder), content, str(seconds)]
        return subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=env_python.ROOT)

    killed = ask("torn", 60)
    while not (folder.parent / "model.partial" / "started").exists():
        assert killed.poll() is None
        time.sleep(0.05)
    killed.kill()
    killed.wait()
    assert not folder.exists()
    first, second = ask("first", 1.0), ask("second", 0.0)
    assert first.communicate(timeout=60)[0].strip() == second.communicate(timeout=60)[0].strip() == str(folder)
    built = (folder / "weights").read_text()
    assert (tmp_path / "builds.log").read_text().split() == ["torn", built]  # whoever took the lock first, alone
    assert sorted(p.name for p in folder.parent.iterdir()) == ["model", "model.lock"]

    blocked = tmp_path / "file"
    blocked.write_text("")  # a file where the cache folder's parent should be: mkdir fails as in a read-only home
    with pytest.raises(CacheUnusable, match="unusable"):
        build_once(blocked / "cache" / "model", lambda into: None)


def test_the_servers_venvs_resolve_from_the_set_ups_cache_and_no_test_reaches_a_package_index(tmp_path):
    """What NeMo-Gym runs to build a server's venv (``uv pip install -r requirements.txt`` in the server's folder, a
    fresh venv) resolves, from a test, out of the cache the set-up filled: ~200 packages, without a request to an index
    (tests/conftest.py sets UV_OFFLINE; online, uv revalidated each package's index page: 7.3 s a venv where the index
    is unreachable). The control: a package asked for with no cache is refused as offline, not looked up."""
    uv = str(real_uv())
    venv = tmp_path / "venv"
    subprocess.run([uv, "venv", "-q", "--python", sys._base_executable, str(venv)], check=True, timeout=60)
    server = env_python.ROOT / "resources_servers" / "tau2"
    resolve = [uv, "pip", "install", "--dry-run", "-r", "requirements.txt", "--python", str(venv / "bin" / "python")]
    resolved = subprocess.run(resolve, cwd=server, capture_output=True, text=True, timeout=120)
    assert resolved.returncode == 0, resolved.stderr[-2000:]
    assert int(resolved.stderr.split("Would install ")[1].split()[0]) > 150, resolved.stderr[-2000:]
    uncached = [uv, "pip", "install", "--dry-run", "--no-cache", "--python", str(venv / "bin" / "python"), "filelock"]
    refused = subprocess.run(uncached, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "network was disabled" in refused.stderr, refused.stderr[-2000:]
