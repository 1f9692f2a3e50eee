"""A user's shell for the tests that run NeMo-Gym's own launchers (``ng_run``, ``gym env start``, NeMo-RL's
``NemoGym`` actor): a clean copy of the repository, and the ``uv`` those launchers call.

NeMo-Gym builds each server's virtualenv with ``uv``, run from the server's folder. Where ``uv`` came from ``pip
install uv`` into one pyenv version (the README's set-up), ``uv`` on PATH is pyenv's shim, which answers "uv: command
not found" in any folder whose ``.python-version`` names another version or none (a server folder, a NeMo-RL
checkout): every server then dies at start-up. :func:`real_uv` finds the binary itself, as docs/nemo-gym-cli.md tells
users to put it on PATH.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def clean_copy(destination: Path) -> Path:
    """The repository's files as a fresh clone has them (tracked and not ignored; links kept as links)."""
    listing = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    )
    for name in filter(None, listing.stdout.decode().split("\0")):
        source = ROOT / name
        if not source.exists() and not source.is_symlink():
            continue  # deleted in the working tree, not committed yet
        target = destination / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target, follow_symlinks=False)
    return destination


def is_pyenv_shim(path: str | Path) -> bool:
    return Path(path).parent.name == "shims"


def real_uv() -> Path:
    """The ``uv`` binary, never pyenv's shim: ``$UV`` (``uv run`` names itself there), else ``uv`` on PATH when it is
    not a shim, else the shim's own answer from this checkout (whose ``.python-version`` names the version uv was
    installed into), else the first pyenv version that has one. Raises ``FileNotFoundError`` naming the fix."""
    candidates = [os.environ.get("UV"), shutil.which("uv")]
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and not is_pyenv_shim(candidate):
            return Path(candidate)
    if shutil.which("pyenv"):
        found = subprocess.run(["pyenv", "which", "uv"], cwd=ROOT, capture_output=True, text=True)
        if found.returncode == 0 and Path(found.stdout.strip()).is_file():
            return Path(found.stdout.strip())
        root = subprocess.run(["pyenv", "root"], capture_output=True, text=True).stdout.strip()
        for binary in sorted(Path(root, "versions").glob("*/bin/uv")):
            return binary
    raise FileNotFoundError("uv not found: install it (pip install uv) and put its folder first on PATH")


def shell_path(*first: str | Path, python: str | Path | None = None) -> str:
    """PATH with ``first`` in front, then the real ``uv``'s folder, then the folder of the interpreter the user
    installed (``python``'s base, default this one's: NeMo-Gym asks uv for a venv of its own Python version, and uv
    never picks a venv's), then the rest."""
    base = sys._base_executable
    if python is not None:
        base = subprocess.run(
            [str(python), "-c", "import sys; print(sys._base_executable)"], capture_output=True, text=True, check=True
        ).stdout.strip()
    return os.pathsep.join([*map(str, first), str(real_uv().parent), str(Path(base).parent), os.environ["PATH"]])


def uv_cache_dir() -> str:
    """uv's cache, which the set-up filled: NeMo-Gym's venvs are linked from it instead of downloaded again."""
    return subprocess.run([str(real_uv()), "cache", "dir"], capture_output=True, text=True, check=True).stdout.strip()
