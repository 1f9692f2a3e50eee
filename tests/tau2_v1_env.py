"""Where the tests find tau2 v1.0.1: the interpreter of the environment ``scripts/setup.sh tau2-v1`` builds."""

from nemo_tau2.tau2_release.client import TAU2_V1_PYTHON_ENV
from tests.env_python import environment_python


def tau2_v1_python() -> str:
    """``$NEMO_TAU2_TAU2_V1_PYTHON``, else tau2 v1.0.1's environment under ~/.cache/nemo-tau2 (built on first use)."""
    return environment_python(TAU2_V1_PYTHON_ENV, "tau2-v1", "tau2 v1.0.1")
