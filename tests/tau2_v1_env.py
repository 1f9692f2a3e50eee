"""Where the tests find tau2 v1.0.1: the interpreter of the environment ``scripts/setup.sh tau2-v1`` builds.

The first lookup in a test process also starts that process's worker template (``nemo_tau2/tau2_release/template.py``):
every tau2 worker the process, or a server or script it starts, opens after it is a fork of the template, tau2
imported once (5-6 s of CPU each otherwise, ~100 workers a CI run). Set ``NEMO_TAU2_TAU2_TEMPLATE=''`` to start every
worker as a user's run does (``tau2_release/test_worker_template.py`` checks both paths).
"""

import atexit
import functools
import os
import shutil
import tempfile
from pathlib import Path

from nemo_tau2.processes import child_environment
from nemo_tau2.tau2_release.client import TAU2_V1_PYTHON_ENV, worker_environment
from nemo_tau2.tau2_release.template import TEMPLATE_ENV, Tau2WorkerTemplate
from tests.env_python import environment_python

TEMPLATE_ANSWER_WAIT_S = 300
"""How long a request waits for the template's first answer: it answers once it has imported tau2, seconds on a quiet
box, a minute or more on a loaded one."""


def tau2_v1_python() -> str:
    """``$NEMO_TAU2_TAU2_V1_PYTHON``, else tau2 v1.0.1's environment under ~/.cache/nemo-tau2 (built on first use)."""
    python = environment_python(TAU2_V1_PYTHON_ENV, "tau2-v1", "tau2 v1.0.1")
    _start_template(python)
    return python


@functools.cache
def _start_template(python: str) -> Tau2WorkerTemplate | None:
    """This process's worker template of ``python``, once; none where ``$NEMO_TAU2_TAU2_TEMPLATE`` is already set
    (another's, or '' for none). Its environment is a worker's without secret-named variables, which it never needs."""
    if TEMPLATE_ENV in os.environ:
        return None
    folder = Path(tempfile.mkdtemp(prefix="nemo-tau2-worker-template-"))
    env = child_environment(base=worker_environment(), drop_secret_names=True)
    template = Tau2WorkerTemplate(python, folder / "template.sock", env, folder / "template.log")
    os.environ[TEMPLATE_ENV] = str(template.socket_path)
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    atexit.register(template.stop)  # first of the two: the folder goes once the template has ended
    return template
