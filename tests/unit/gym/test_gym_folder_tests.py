"""Run the resources server folder's own NeMo-Gym-style tests (resources_servers/tau2/tests, which `gym env test`
runs in the folder's own virtualenv) as part of the project's suite."""

import importlib.util
from pathlib import Path

_PATH = Path(__file__).resolve().parents[3] / "resources_servers" / "tau2" / "tests" / "test_app.py"
_SPEC = importlib.util.spec_from_file_location("tau2_resources_server_folder_tests", _PATH)
_MODULE = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(_MODULE)
TestApp = _MODULE.TestApp
