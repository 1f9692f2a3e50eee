"""Where the tests find an interpreter of another environment (vLLM's, tau2 v1.0.1's), built by one of scripts/.

``.ci/run`` builds each and exports its variable and a ``NEMO_TAU2_REQUIRE_*=1``: there a missing environment fails
the tests (CI must exercise it). Elsewhere those tests skip, naming the command that builds it.
"""

import os

import pytest


def environment_python(variable: str, require_variable: str, what: str, build_command: str) -> str:
    """The interpreter ``$variable`` names, or skip (fail when ``$require_variable`` is 1) when there is none."""
    python = os.environ.get(variable)
    if python and os.path.isfile(python):
        return python
    reason = (
        f"no {what} environment (${variable} is {python!r}): run `{build_command}` and export {variable} as the "
        "interpreter it prints"
    )
    if os.environ.get(require_variable) == "1":
        pytest.fail(reason)
    pytest.skip(reason)
