"""NeMo-Gym entry point of the tau2 pivot environment (PivotRL): the tau2 resources server, whose ``/verify_pivot``
scores one sampled turn by running it in a fork of the pivot's state. ``ng_run`` / ``gym env start`` run
``python app.py`` in this folder, in a virtualenv built from ``requirements.txt``; see ``README.md`` and
docs/pivot-rl.md. The server is :mod:`nemo_tau2.gym.resources_server.app`, the same as ``resources_servers/tau2``'s."""

from nemo_tau2.gym.gym_cli_entry import run_webserver
from nemo_tau2.gym.resources_server.app import Tau2ResourcesServer

if __name__ == "__main__":
    run_webserver(Tau2ResourcesServer)
