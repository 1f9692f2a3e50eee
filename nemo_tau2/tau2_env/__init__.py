"""tau2 itself: domains, tasks and splits, tool schemas, prompts, per-episode environments, reward parity."""

#: The domains nemo-tau2 serves (``mock`` is tau2's small test domain). Importable without loading tau2.
DOMAINS = ("airline", "retail", "telecom", "mock")
#: Domains only a later tau2 release has, served through that release's worker, and the release that has them.
RELEASE_ONLY_DOMAINS = {"banking_knowledge": "v1.0.1", "telecom-workflow": "v1.0.1"}
#: Every domain some release serves.
ALL_DOMAINS = DOMAINS + tuple(RELEASE_ONLY_DOMAINS)


def domain_problem(domain: str, version: str) -> str | None:
    """Why ``domain`` cannot be played on tau2 ``version`` (one line naming the fix), or None when it can."""
    release = RELEASE_ONLY_DOMAINS.get(domain)
    if release is not None and version != release:
        return f"domain {domain!r} is tau2 {release}'s (not in {version}): set tau2.version={release}"
    if domain not in ALL_DOMAINS:
        return f"unknown domain {domain!r}; tau2 domains are: {', '.join(ALL_DOMAINS)}"
    return None


def training_domain_problem(domain: str) -> str | None:
    """Why GRPO, SFT or RFT cannot train on ``domain`` (one line), or None: a later release's domains are evaluated
    and served, not trained on yet."""
    if domain in RELEASE_ONLY_DOMAINS:
        return f"domain {domain!r} is evaluated, not trained on yet (docs/banking-knowledge.md, 'Not yet')"
    if domain not in DOMAINS:
        return f"unknown domain {domain!r}; tau2 domains are: {', '.join(DOMAINS)}"
    return None
