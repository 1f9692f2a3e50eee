"""Where the tests find tau2 v1.0.1: the interpreter of the environment scripts/build_tau2_env.sh builds."""

from nemo_tau2.tau2_release.client import TAU2_V1_PYTHON_ENV
from tests.env_python import environment_python


def tau2_v1_python() -> str:
    """The configured tau2 v1.0.1 interpreter, or skip (fail under NEMO_TAU2_REQUIRE_TAU2_V1=1) when there is none."""
    return environment_python(
        TAU2_V1_PYTHON_ENV,
        "NEMO_TAU2_REQUIRE_TAU2_V1",
        "tau2 v1.0.1",
        "scripts/build_tau2_env.sh --version v1.0.1 --source ../shared/vendor/tau2-bench-1.0.1",
    )
