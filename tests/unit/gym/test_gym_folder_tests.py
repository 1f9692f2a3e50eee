"""Run the resources server folder's own NeMo-Gym-style tests as part of the project's suite."""

from nemo_tau2.gym.resources_server.tests.test_app import TestApp  # noqa: F401
