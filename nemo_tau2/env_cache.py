"""Where the set-up's own environments live, so that a run finds them with nothing exported.

``scripts/setup.sh`` builds the environments that cannot share the project's pins (vLLM's, tau2 v1.0.1's, NeMo-Gym
0.7.0's) with ``scripts/build_*_env.sh``, each in a folder under ``${XDG_CACHE_HOME:-~/.cache}/nemo-tau2`` (or the
folder its ``NEMO_TAU2_*_ENV`` variable names), and writes ``.nemo_tau2_stamp`` into it last (the rule the three
share, ``scripts/env_cache.sh``): a folder with the stamp is a finished build, one without it is half built and not
used. The folder names are each build script's (the module that looks for one says which).

What Python builds there itself (the SmolLM2 folder, the tiny policies' warm starts) goes through :func:`build_once`.
"""

import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path

STAMP_FILE = ".nemo_tau2_stamp"


def cache_root() -> Path:
    """``${XDG_CACHE_HOME:-$HOME/.cache}/nemo-tau2``, as the build scripts compute it."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "nemo-tau2"


def environment_folder(variable: str, default_name: str) -> Path:
    """A build script's folder: ``$variable`` when set, else ``<cache_root>/<default_name>``."""
    return Path(os.environ.get(variable) or cache_root() / default_name)


def built_python(folder: Path) -> Path | None:
    """The interpreter of a finished build in ``folder`` (stamped, with ``bin/python``), else None."""
    python = folder / "bin" / "python"
    return python if (folder / STAMP_FILE).is_file() and python.is_file() else None


class CacheUnusable(OSError):
    """The cache folder cannot be created or locked (a read-only home): the caller builds without it."""


def build_once(folder: Path, build: Callable[[Path], None]) -> Path:
    """``folder``, made by ``build(into)`` the first time anyone asks for it: under a file lock beside it (one build
    however many processes ask at once; the others wait, then use it), into ``<name>.partial``, renamed when whole (a
    build killed midway never leaves a folder by that name; the next asker starts it again)."""
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        lock = (folder.parent / f"{folder.name}.lock").open("w")
    except OSError as error:
        raise CacheUnusable(f"cache {folder.parent} unusable ({error})") from error
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not folder.is_dir():
            partial = folder.parent / f"{folder.name}.partial"
            shutil.rmtree(partial, ignore_errors=True)
            build(partial)
            os.rename(partial, folder)
    return folder
