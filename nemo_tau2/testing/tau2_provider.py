"""The tau2 script provider: serves the fake server's scripts for ``tau2|...`` keys (see ``tau2_scripts.py``): the
policy side per :class:`PolicyScriptConfig` (the oracle or a variant), the user side per :class:`UserScriptConfig`."""

import functools
from collections import OrderedDict

from nemo_tau2.testing.release_tasks import load_release_tasks
from nemo_tau2.testing.scripts import Script, ScriptError, TurnListScript
from nemo_tau2.testing.tau2_scripts import (
    PolicyScriptConfig,
    Role,
    ScriptedReviewer,
    ScriptedUser,
    Tau2Key,
    Tau2ScriptsConfig,
    UserScriptConfig,
    policy_turns,
    task_of,
)


class Tau2ScriptProvider:
    """Serves tau2 keys: the policy side per :class:`PolicyScriptConfig`, the user side per
    :class:`UserScriptConfig`."""

    def __init__(self, config: Tau2ScriptsConfig | None = None, max_reviewers: int = 100_000) -> None:
        self.config = config or Tau2ScriptsConfig()
        self._reviewers: OrderedDict[tuple[str, UserScriptConfig], ScriptedReviewer] = OrderedDict()
        self._max_reviewers = max_reviewers

    @property
    def config(self) -> Tau2ScriptsConfig:
        return self._config

    @config.setter
    def config(self, config: Tau2ScriptsConfig) -> None:
        # a later release's tasks: read before any script is built from them, and scripts of the tasks they replace
        if config.release_tasks is not None and load_release_tasks(config.release_tasks):
            policy_turns.cache_clear()
            _scripted_user.cache_clear()
        self._config = config

    def script_for(self, key: str) -> Script | None:
        parsed = Tau2Key.parse(key)
        if parsed is None:
            return None
        if parsed.role == "user":
            return _scripted_user(parsed.domain, parsed.task_id, self.config.user)
        if parsed.role in ("user_check", "user_reflect"):
            return self._reviewer(key, parsed.role)
        policy = self.config.policy
        variant = self._variant(parsed, policy)
        turns = policy_turns(parsed.domain, parsed.task_id, variant)
        return TurnListScript(turns, when_exhausted=policy.when_exhausted, token_consistent=policy.token_consistent)

    @staticmethod
    def _variant(key: Tau2Key, policy: PolicyScriptConfig) -> str:
        if policy.variant == "oracle" or policy.variant_every == 1:
            return policy.variant
        index = key.sample_index
        if index is None:
            raise ScriptError(
                f"policy variant_every={policy.variant_every} needs a sample index, but the episode id "
                f"{key.episode_id!r} of key {str(key)!r} does not end with an integer"
            )
        return policy.variant if index % policy.variant_every == policy.variant_every - 1 else "oracle"

    def _reviewer(self, key: str, role: Role) -> ScriptedReviewer:
        """One reviewer per episode key (it counts that episode's checks); the oldest are forgotten."""
        slot = (key, self.config.user)
        reviewer = self._reviewers.get(slot)
        if reviewer is None:
            reviewer = self._reviewers[slot] = ScriptedReviewer(role, self.config.user)
            if len(self._reviewers) > self._max_reviewers:
                self._reviewers.popitem(last=False)
        return reviewer

    def preload(self, domain_names: list[str]) -> None:
        """Import tau2 and load the domains' tasks now, not during the first request."""
        from nemo_tau2.tau2_env import domains

        for domain in domain_names:
            domains.get_tasks(domain, "base")
            domains.user_tool_names(domain)


@functools.lru_cache(maxsize=4096)
def _scripted_user(domain: str, task_id: str, config: UserScriptConfig) -> ScriptedUser:
    return ScriptedUser(domain, task_of(domain, task_id), config)
