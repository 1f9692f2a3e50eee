"""The gym rules of a generation block, as a validator on the config model: :class:`GymGenerationConfig`.

Every block that drives NeMo-Gym rollouts (the policy's and the user simulator's, in evaluation and GRPO alike) is a
``GymGenerationConfig``, so the rules run wherever such a config is built. NeMo-RL enforces the same rules with
asserts scattered over ``run_async_nemo_gym_rollout``, ``setup_nemo_gym_config`` and its vLLM server (see
/work/shared/reference/nemo_rl.md §5), the first one hit stopping the run; here every broken rule of a block is
reported at once, each naming its key.
"""

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError, model_validator

from nemo_tau2.generation.config import GenerationConfig
from nemo_tau2.generation.errors import GenerationConfigError
from nemo_tau2.keyed_problems import KEYED_PROBLEMS_ERROR, keyed_problem_lines, keyed_problems


def gym_rule_violations(cfg: GenerationConfig) -> list[str]:
    """The gym-rollout rules ``cfg`` breaks, each as ``<key>: <problem>`` (keys relative to the block)."""
    found: list[str] = []
    if cfg.top_k is not None:
        found.append(
            f"top_k: must be null for gym rollouts (OpenAI-compatible endpoints have no top_k), got {cfg.top_k!r}"
        )
    for name in ("stop_strings", "stop_token_ids"):
        if getattr(cfg, name):
            found.append(
                f"{name}: must be null for gym rollouts (the endpoint stops at end of turn; stop sequences "
                f"would cut tool calls and break token bookkeeping), got {getattr(cfg, name)!r}"
            )
    for name in ("temperature", "top_p"):
        if getattr(cfg, name) is None:
            found.append(
                f"{name}: must be given explicitly for gym rollouts (every request sends it; a server default "
                f"would make sampling differ between backends)"
            )
    if cfg.backend == "vllm":
        vllm_cfg = cfg.backend_block
        for name in ("async_engine", "expose_http_server"):
            if getattr(vllm_cfg, name) is not True:
                found.append(
                    f"vllm_cfg.{name}: must be true for gym rollouts (agents call the policy over HTTP), "
                    f"got {getattr(vllm_cfg, name)!r}"
                )
    return found


class GymGenerationConfig(GenerationConfig):
    """A generation block that drives NeMo-Gym rollouts: :func:`gym_rule_violations` is its validator."""

    @model_validator(mode="before")
    @classmethod
    def _from_a_plain_block(cls, data: Any) -> Any:
        """A plain :class:`GenerationConfig` built in code is checked as the block it was written as."""
        if isinstance(data, GenerationConfig) and not isinstance(data, cls):
            return data.model_dump(exclude_unset=True)
        return data

    @model_validator(mode="after")
    def _gym_rules(self) -> "GymGenerationConfig":
        problems = gym_rule_violations(self)
        if problems:  # one error per rule, each naming its key, in the message: "<key>: <problem>" per line
            raise keyed_problems(problems)
        return self


def _format_pydantic_errors(error: ValidationError, key: str) -> list[str]:
    lines = []
    for item in error.errors():
        path = ".".join(str(part) for part in (key, *item["loc"]))
        is_keyed = item["type"] == KEYED_PROBLEMS_ERROR
        lines += keyed_problem_lines(item, path) if is_keyed else [f"{path}: {item['msg']}"]
    return lines


def validate_gym_generation_config(
    cfg: GenerationConfig | Mapping[str, Any], *, greedy: bool = False, key: str = "policy.generation"
) -> GymGenerationConfig:
    """Parse ``cfg`` and check it can drive NeMo-Gym rollouts; report every problem in one error.

    Args:
        cfg: The `policy.generation` block, parsed or as read from YAML.
        greedy: The rollout's ``greedy`` flag (NeMo-RL asserts it is false on the gym path).
        key: Where the block sits in the user's config, used in messages (e.g. ``generation`` for evaluation).

    Raises:
        GenerationConfigError: Listing every structural error and every broken gym rule, one per line.
    """
    raw = cfg.model_dump(exclude_unset=True) if isinstance(cfg, GenerationConfig) else dict(cfg)
    violations: list[str] = []
    parsed = None
    try:
        parsed = GymGenerationConfig.model_validate(raw)
    except ValidationError as e:
        violations += _format_pydantic_errors(e, key)
    if greedy:
        violations.append(f"{key}: {GREEDY_NOT_ALLOWED}")
    if violations:
        raise GenerationConfigError(violations)
    return parsed


GREEDY_NOT_ALLOWED = "greedy decoding is not allowed with gym rollouts; set temperature (e.g. 0.0) and top_p instead"
