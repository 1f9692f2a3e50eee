"""The NeMo-Gym config that serves an evaluation's own resources server alone, for ``gym eval reverify``.

``examples/export_rollouts.py`` writes it as ``<results dir>/nemo_gym/resources_server.yaml``: the resources server of
``resources_servers/tau2/configs/tau2.yaml`` with the eval's domains and its ``tau2`` block from ``config.json`` (the
release, its interpreter, the NL judge's endpoint, the retrieval variant), so that the stored episodes are re-scored
by the release and judge that scored them. No agent and no model server: 0.7.0's reverify posts each stored rollout to
``/verify`` of the one resources server its config has, which our server answers with no session.
"""

import json
from pathlib import Path
from typing import Any

import yaml

from nemo_tau2.evals.results import CONFIG_FILE
from nemo_tau2.gym.stack import RESOURCES_SERVER

CONFIG_NAME = "resources_server.yaml"


def resources_server_config(save_dir: Path, domains: list[str]) -> dict[str, Any]:
    """The config (a dict, as YAML would load it) of the eval's resources server alone."""
    try:
        saved = json.loads((save_dir / CONFIG_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        saved = {}
    server: dict[str, Any] = {
        "entrypoint": "app.py",
        "domain": "agent",
        "verified": False,
        "description": "tau2-bench with tau2's own reward: an evaluation's stored episodes re-scored",
        "value": "Re-scoring stored tau2 episodes without playing them again",
        "domains": domains,
    }
    if isinstance(saved, dict) and isinstance(saved.get("tau2"), dict):
        server["tau2"] = saved["tau2"]
    return {"uv_pip_set_python": True, RESOURCES_SERVER: {"resources_servers": {"tau2": server}}}


def write_resources_server_config(save_dir: Path, folder: Path, domains: list[str]) -> Path:
    """Write :data:`CONFIG_NAME` into ``folder``; returns its path."""
    path = folder / CONFIG_NAME
    path.write_text(yaml.safe_dump(resources_server_config(save_dir, domains), sort_keys=False))
    return path
