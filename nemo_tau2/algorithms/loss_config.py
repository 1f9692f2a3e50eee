"""The settings of GRPO's advantages and loss (NeMo-RL's ``grpo.*`` advantage keys and ``loss_fn``), apart from the
torch code that applies them (:mod:`nemo_tau2.algorithms.advantages`, :mod:`nemo_tau2.algorithms.loss`): a run's
config is read and refused before torch is imported.
"""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from nemo_tau2.keyed_problems import keyed_problems

TruncatedImportanceSamplingType = Literal["tis", "icepop", "seq-mask-tis"]


class AdvantageConfig(BaseModel):
    """How rewards become advantages (NeMo-RL ``grpo.*`` keys)."""

    model_config = ConfigDict(extra="forbid")

    use_leave_one_out_baseline: bool = Field(
        default=True, description="Baseline = mean reward of the other episodes of the group (RLOO)."
    )
    normalize_rewards: bool = Field(default=True, description="Divide advantages by the group's reward std.")
    advantage_clip_low: float | None = Field(default=None, description="Lower bound on advantages; None = none.")
    advantage_clip_high: float | None = Field(default=None, description="Upper bound on advantages; None = none.")

    @model_validator(mode="after")
    def _clip_bounds_ordered(self) -> "AdvantageConfig":
        low, high = self.advantage_clip_low, self.advantage_clip_high
        if low is not None and high is not None and low >= high:
            raise ValueError(f"advantage_clip_low ({low}) must be below advantage_clip_high ({high})")
        return self


KLType = Literal["k1", "k2", "k3"]


class ClippedPGLossConfig(BaseModel):
    """NeMo-RL ``loss_fn`` keys for the clipped policy-gradient loss (same defaults)."""

    model_config = ConfigDict(extra="forbid")

    ratio_clip_min: float = Field(default=0.2, ge=0.0, lt=1.0, description="Ratio clipped below at 1 - this.")
    ratio_clip_max: float = Field(default=0.2, ge=0.0, description="Ratio clipped above at 1 + this.")
    ratio_clip_c: float | None = Field(
        default=None, gt=1.0, description="Dual-clip bound c > 1 on the loss of negative-advantage tokens; None = off."
    )
    reference_policy_kl_penalty: float = Field(default=0.01, ge=0.0, description="beta; 0 disables the KL term.")
    reference_policy_kl_type: KLType = "k3"
    kl_input_clamp_value: float | None = Field(default=20.0, gt=0.0, description="Clamp on log(pi_ref / pi_theta).")
    kl_output_clamp_value: float | None = Field(default=10.0, gt=0.0, description="Clamp on the per-token KL.")
    token_level_loss: bool = Field(
        default=True, description="Mean over all valid tokens of the batch; False = mean of per-sequence means."
    )
    use_importance_sampling_correction: bool = Field(
        default=False, description="Weight tokens by pi_old / pi_gen (trainer vs generator logprobs)."
    )
    truncated_importance_sampling_ratio: float | None = Field(
        default=None, gt=0.0, description="Upper bound of the importance weight (truncated IS); null = no truncation."
    )
    truncated_importance_sampling_ratio_min: float | None = Field(
        default=None, ge=0.0, description="Lower bound (required for icepop and seq-mask-tis; null = 0 for tis)."
    )
    truncated_importance_sampling_type: TruncatedImportanceSamplingType | None = Field(
        default=None,
        description="tis: clip each token's weight to [min, ratio]; icepop: zero tokens whose weight is outside; "
        "seq-mask-tis: zero whole sequences whose geometric-mean weight is outside. null: tis when the ratio is set.",
    )

    @model_validator(mode="after")
    def _truncation_is_consistent(self) -> "ClippedPGLossConfig":
        upper, lower, kind = (
            self.truncated_importance_sampling_ratio,
            self.truncated_importance_sampling_ratio_min,
            self.truncated_importance_sampling_type,
        )
        problems = []
        if upper is None and (kind is not None or lower is not None):
            what = (
                f"truncated_importance_sampling_type is {kind!r}"
                if kind
                else f"truncated_importance_sampling_ratio_min is {lower}"
            )
            problems.append(f"truncated_importance_sampling_ratio: required (the upper bound) when {what}; set it")
        if upper is not None and not self.use_importance_sampling_correction:
            problems.append(
                "use_importance_sampling_correction: must be true when truncated_importance_sampling_ratio is set "
                "(truncation bounds the importance weight)"
            )
        if upper is not None and lower is not None and lower > upper:
            problems.append(f"truncated_importance_sampling_ratio_min: {lower} is above the ratio {upper}; lower it")
        if upper is not None and lower is None and kind in ("icepop", "seq-mask-tis"):
            problems.append(f"truncated_importance_sampling_ratio_min: required for type {kind!r} (the lower bound)")
        if problems:
            raise keyed_problems(problems)
        return self

    @property
    def truncation_type(self) -> TruncatedImportanceSamplingType | None:
        """The truncation applied: None when off, ``tis`` when only the ratio is given."""
        if self.truncated_importance_sampling_ratio is None:
            return None
        return self.truncated_importance_sampling_type or "tis"
