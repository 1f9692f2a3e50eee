"""NeMo-Gym entry point of the tau2 resources server: ``ng_run`` / ``gym env start`` run ``python app.py`` in this
folder, in a virtualenv built from ``requirements.txt`` (this project, installed from two levels up). The server
itself is :mod:`nemo_tau2.gym.resources_server.app`; see ``README.md``."""

from nemo_tau2.gym.gym_cli_entry import run_webserver
from nemo_tau2.gym.resources_server.app import Tau2ResourcesServer

if __name__ == "__main__":
    run_webserver(Tau2ResourcesServer)
