"""Shared pytest setup: nemo_tau2 is imported first so tau2 stays offline and quiet in every test."""

import nemo_tau2  # noqa: F401
