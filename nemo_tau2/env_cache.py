"""Where the set-up's own environments live, so that a run finds them with nothing exported.

``scripts/setup.sh`` builds the environments that cannot share the project's pins (vLLM's, tau2 v1.0.1's, NeMo-Gym
0.7.0's) with ``scripts/build_*_env.sh``, each in a folder under ``${XDG_CACHE_HOME:-~/.cache}/nemo-tau2`` (or the
folder its ``NEMO_TAU2_*_ENV`` variable names), and writes ``.nemo_tau2_stamp`` into it last (the rule the three
share, ``scripts/env_cache.sh``): a folder with the stamp is a finished build, one without it is half built and not
used. The folder names are each build script's (the module that looks for one says which).
"""

import os
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
