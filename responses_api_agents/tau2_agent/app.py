"""NeMo-Gym entry point of the tau2 agent server: ``ng_run`` / ``gym env start`` run ``python app.py`` in this
folder, in a virtualenv built from ``requirements.txt`` (this project, installed from two levels up). The server
itself is :mod:`nemo_tau2.gym.agent.app`; see ``README.md``."""

from nemo_tau2.gym.agent.app import Tau2Agent
from nemo_tau2.gym.gym_cli_entry import run_webserver

if __name__ == "__main__":
    run_webserver(Tau2Agent)
