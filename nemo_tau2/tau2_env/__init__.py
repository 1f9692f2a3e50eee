"""tau2 itself: domains, tasks and splits, tool schemas, prompts, per-episode environments, reward parity."""

from nemo_tau2.tau2_env.own_splits import is_own_split

#: The domains nemo-tau2 serves (``mock`` is tau2's small test domain). Importable without loading tau2.
DOMAINS = ("airline", "retail", "telecom", "mock")
#: Domains only a later tau2 release has, served through that release's worker, and the release that has them.
RELEASE_ONLY_DOMAINS = {"banking_knowledge": "v1.0.1", "telecom-workflow": "v1.0.1"}
#: Domains whose only tau2 split is ``base`` (every task): training names its tasks or a split of ours.
UNSPLIT_DOMAINS = ("banking_knowledge",)
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


def training_domain_problem(
    domain: str, version: str, split: str | None, task_ids: list | None = None, key: str = "data.train_split"
) -> str | None:
    """Why GRPO, SFT or RFT cannot train (or validate, ``key``) on ``split`` of ``domain`` (one line), or None. A
    domain tau2 gives no train/test split (banking_knowledge) takes a split of ours (``ours_seed<N>_train``/
    ``_test``: :mod:`nemo_tau2.tau2_env.own_splits`) or an explicit list (``base`` with ``data.task_ids``)."""
    problem = domain_problem(domain, version)
    if problem is not None or domain not in UNSPLIT_DOMAINS or split is None or is_own_split(split):
        return problem
    if split == "base" and task_ids:
        return None
    return (
        f"{key}: domain {domain!r} has no train/test split in tau2 (only 'base', all its tasks); use a split of "
        "ours (data.train_split=ours_seed0_train, data.val_split=ours_seed0_test) or an explicit list "
        "(data.train_split=base with data.task_ids)"
    )
