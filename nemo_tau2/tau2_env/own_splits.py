"""Train/test splits of this project's own, for a domain tau2 gives none (banking_knowledge: 97 tasks, ``base`` only).

tau2 v1.0.1 publishes no train/test split for banking_knowledge, so training on it must not pretend to use one of
tau2's. ``ours_seed<N>_train`` / ``ours_seed<N>_test`` name a split of ours: the domain's tasks ranked by a hash of
(seed, domain, task id), the first fifth (rounded up) the test part, the rest the train part. The name says whose
it is and how it was drawn, it is recorded in every row (``split``) and so in every result, and the same name gives
the same tasks on any machine and any release that has them. The two parts are disjoint and cover the domain.
"""

import hashlib
import math
import re

_OWN_SPLIT = re.compile(r"^ours_seed(\d+)_(train|test)$")
#: The share of a domain's tasks in the test part.
TEST_FRACTION = 0.2


def is_own_split(name: str | None) -> bool:
    return name is not None and _OWN_SPLIT.match(name) is not None


def own_split_ids(domain: str, task_ids: list[str], name: str) -> list[str]:
    """The ids of ``task_ids`` (all the domain's tasks, in the release's order) in the split ``name``, in that
    order. Raises ``ValueError`` for a name that is not one of ours."""
    match = _OWN_SPLIT.match(name)
    if match is None:
        raise ValueError(f"{name!r} is not a split of ours (ours_seed<N>_train or ours_seed<N>_test)")
    seed, part = match.groups()

    def rank(task_id: str) -> str:
        return hashlib.sha256(f"{seed}\0{domain}\0{task_id}".encode()).hexdigest()

    test = set(sorted(task_ids, key=rank)[: math.ceil(TEST_FRACTION * len(task_ids))])
    return [task_id for task_id in task_ids if (task_id in test) == (part == "test")]
