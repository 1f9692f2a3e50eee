"""One pair of real evaluations, shared by every report test of the session (see ``eval_pair``)."""

import pytest

from tests.unit.report.eval_pair import run_eval_pair


@pytest.fixture(scope="session")
def evals(tmp_path_factory):
    return run_eval_pair(tmp_path_factory.mktemp("evals"))
