"""Where the tests find tau2 v1.0.1: the interpreter of the environment scripts/build_tau2_env.sh builds.

``.ci/run`` builds it from the vendored release and exports ``NEMO_TAU2_TAU2_V1_PYTHON`` and
``NEMO_TAU2_REQUIRE_TAU2_V1=1``: there a missing environment fails the tests. Elsewhere they skip, naming the command.
"""

import os

import pytest

from nemo_tau2.tau2_release.client import TAU2_V1_PYTHON_ENV


def tau2_v1_python() -> str:
    """The configured tau2 v1.0.1 interpreter, or skip (fail under NEMO_TAU2_REQUIRE_TAU2_V1=1) when there is none."""
    python = os.environ.get(TAU2_V1_PYTHON_ENV)
    if python and os.path.isfile(python):
        return python
    reason = (
        f"no tau2 v1.0.1 environment (${TAU2_V1_PYTHON_ENV} is {python!r}): run `scripts/build_tau2_env.sh "
        "--version v1.0.1 --source ../shared/vendor/tau2-bench-1.0.1` and export "
        f"{TAU2_V1_PYTHON_ENV} as the interpreter it prints"
    )
    if os.environ.get("NEMO_TAU2_REQUIRE_TAU2_V1") == "1":
        pytest.fail(reason)
    pytest.skip(reason)
