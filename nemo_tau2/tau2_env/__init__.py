"""tau2 itself: domains, tasks and splits, tool schemas, prompts, per-episode environments, reward parity."""

#: The domains nemo-tau2 serves (``mock`` is tau2's small test domain). Importable without loading tau2.
DOMAINS = ("airline", "retail", "telecom", "mock")
