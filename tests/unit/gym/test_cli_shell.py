"""The ``uv`` NeMo-Gym's launchers get (tests/unit/gym/cli_shell.py): the binary, which runs from any folder, where
``uv`` on PATH may be pyenv's shim, which does not (the README installs uv with ``pip install uv`` into one pyenv
version; NeMo-Gym runs uv from server folders that have no ``.python-version``)."""

import os
import shutil
import subprocess

from tests.unit.gym.cli_shell import is_pyenv_shim, real_uv


def test_the_uv_found_runs_from_a_folder_with_no_python_version(tmp_path, monkeypatch):
    monkeypatch.delenv("UV", raising=False)  # as in a shell, not under `uv run`
    uv = real_uv()
    assert not is_pyenv_shim(uv)
    done = subprocess.run([str(uv), "--version"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.startswith("uv "), done.stderr
    on_path = shutil.which("uv")
    if on_path and is_pyenv_shim(on_path):  # what the tests took before: the shim, which fails there
        bare = {key: value for key, value in os.environ.items() if key != "PYENV_VERSION"}
        shim = subprocess.run([on_path, "--version"], cwd=tmp_path, capture_output=True, text=True, env=bare)
        assert shim.returncode != 0 or not shim.stdout.startswith("uv ")
