"""Partial-credit reward shaping for training, after the slime tau2 pipeline (Tau2-RL-Pipeline).

    shaped = success + alpha * domain_scale[domain] * partial
    partial = sum_c w_c x_c / sum_c w_c     over the components c present for the task

where the components are tau2's ``action_match_fraction`` (share of gold actions matched),
``env_assertion_fraction`` and ``communicate_fraction`` (see ``nemo_tau2.tau2_env.reward.EpisodeReward``), and a
component is absent (None) when the task has no such checks. Defaults are slime's: alpha 0.25; weights
0.5 / 0.35 / 0.15 (telecom 0.35 / 0.35 / 0.30); domain scales airline 1.0, retail 0.8, telecom 1.6.

Shaped rewards are for training only: evaluation (pass@k, pass^k) always counts tau2's binary ``success``.
"""

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field, model_validator

COMPONENT_KEYS = ("action_match_fraction", "env_assertion_fraction", "communicate_fraction")


class ComponentWeights(BaseModel):
    """Relative weights of the partial-credit components (renormalised over those present)."""

    model_config = ConfigDict(extra="forbid")

    action: float = Field(ge=0.0, description="Weight of action_match_fraction.")
    env_assertion: float = Field(ge=0.0, description="Weight of env_assertion_fraction.")
    communicate: float = Field(ge=0.0, description="Weight of communicate_fraction.")

    def by_component(self) -> dict[str, float]:
        return dict(zip(COMPONENT_KEYS, (self.action, self.env_assertion, self.communicate), strict=True))


class RewardShapingConfig(BaseModel):
    """Partial-credit shaping of the training reward; ``enabled: false`` trains on binary success alone."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    alpha: float = Field(default=0.25, ge=0.0, description="Scale of the partial credit added to success.")
    domain_scale: dict[str, float] = Field(
        default={"airline": 1.0, "retail": 0.8, "telecom": 1.6},
        description="Per-domain multiplier of alpha; every trained domain must be listed.",
    )
    component_weights: ComponentWeights = ComponentWeights(action=0.5, env_assertion=0.35, communicate=0.15)
    domain_component_weights: dict[str, ComponentWeights] = Field(
        default={"telecom": ComponentWeights(action=0.35, env_assertion=0.35, communicate=0.30)},
        description="Per-domain replacements of component_weights.",
    )

    @model_validator(mode="after")
    def _scales_non_negative(self) -> "RewardShapingConfig":
        negative = {domain: scale for domain, scale in self.domain_scale.items() if scale < 0}
        if negative:
            raise ValueError(f"domain_scale values must be >= 0, got {negative}")
        return self

    def weights_for(self, domain: str) -> ComponentWeights:
        """The component weights of ``domain``: its own entry if any, else ``component_weights``."""
        return self.domain_component_weights.get(domain, self.component_weights)


def partial_credit(components: Mapping[str, float | None], weights: ComponentWeights) -> float:
    """Weighted mean of the components present (not None), renormalised over them; 0.0 if none is present.

    Raises:
        ValueError: A component is missing from ``components`` or lies outside [0, 1].
    """
    missing = [key for key in COMPONENT_KEYS if key not in components]
    if missing:
        raise ValueError(f"reward components {missing} are missing (pass None for a component the task lacks)")
    total, weight_sum = 0.0, 0.0
    for key, weight in weights.by_component().items():
        value = components[key]
        if value is None:
            continue
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"reward component {key}={value!r} must lie in [0, 1]")
        total += weight * value
        weight_sum += weight
    return total / weight_sum if weight_sum > 0 else 0.0


def shape_reward(
    success: bool, components: Mapping[str, float | None], domain: str, cfg: RewardShapingConfig
) -> float:
    """Training reward of one episode: ``success + alpha * domain_scale[domain] * partial`` (or ``success``).

    Raises:
        TypeError: ``success`` is not a bool (the binary tau2 verdict, not a reward).
        ValueError: ``domain`` has no ``domain_scale`` entry, or a component is missing or out of range.
    """
    if not isinstance(success, bool):
        raise TypeError(f"success must be a bool (tau2's binary verdict), got {success!r}")
    if not cfg.enabled:
        return float(success)
    if domain not in cfg.domain_scale:
        raise ValueError(f"no reward_shaping.domain_scale for domain {domain!r}; known: {sorted(cfg.domain_scale)}")
    partial = partial_credit(components, cfg.weights_for(domain))
    return float(success) + cfg.alpha * cfg.domain_scale[domain] * partial
