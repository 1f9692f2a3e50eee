"""Checks a generation config against the constraints of NeMo-Gym rollouts, listing every violation at once.

NeMo-RL enforces these with asserts scattered over ``run_async_nemo_gym_rollout``, ``setup_nemo_gym_config`` and
its vLLM server (see /work/shared/reference/nemo_rl.md §5): the first one hit stops the run. Evaluation and GRPO
call :func:`validate_gym_generation_config` before starting anything, so a user fixes a config in one go.
"""

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from nemo_tau2.generation.config import GenerationConfig
from nemo_tau2.generation.errors import GenerationConfigError


def _is_set(value: Any) -> bool:
    return value is not None and value != [] and value != ""


def gym_rule_violations(raw: Mapping[str, Any], *, greedy: bool = False, key: str) -> list[str]:
    """The gym-rollout rules broken by ``raw`` (a `policy.generation` mapping), each as ``<key path>: <problem>``."""
    found: list[str] = []
    if raw.get("top_k") is not None:
        found.append(
            f"{key}.top_k: must be null for gym rollouts (OpenAI-compatible endpoints have no top_k), "
            f"got {raw['top_k']!r}"
        )
    for name in ("stop_strings", "stop_token_ids"):
        if _is_set(raw.get(name)):
            found.append(
                f"{key}.{name}: must be null for gym rollouts (the endpoint stops at end of turn; stop sequences "
                f"would cut tool calls and break token bookkeeping), got {raw[name]!r}"
            )
    for name in ("temperature", "top_p"):
        if raw.get(name) is None:
            found.append(
                f"{key}.{name}: must be given explicitly for gym rollouts (every request sends it; a server default "
                f"would make sampling differ between backends)"
            )
    if greedy:
        found.append(
            f"{key}: greedy decoding is not allowed with gym rollouts; set temperature (e.g. 0.0) and top_p instead"
        )
    if raw.get("backend") == "vllm":
        vllm_cfg = raw.get("vllm_cfg") or {}
        if isinstance(vllm_cfg, Mapping):
            for name in ("async_engine", "expose_http_server"):
                if vllm_cfg.get(name, True) is not True:
                    found.append(
                        f"{key}.vllm_cfg.{name}: must be true for gym rollouts (agents call the policy over HTTP), "
                        f"got {vllm_cfg[name]!r}"
                    )
    return found


def _format_pydantic_errors(error: ValidationError, key: str) -> list[str]:
    lines = []
    for item in error.errors():
        path = ".".join(str(part) for part in (key, *item["loc"]))
        lines.append(f"{path}: {item['msg']} (got {item.get('input')!r})")
    return lines


def validate_gym_generation_config(
    cfg: GenerationConfig | Mapping[str, Any], *, greedy: bool = False, key: str = "policy.generation"
) -> GenerationConfig:
    """Parse ``cfg`` and check it can drive NeMo-Gym rollouts; report every problem in one error.

    Args:
        cfg: The `policy.generation` block, parsed or as read from YAML.
        greedy: The rollout's ``greedy`` flag (NeMo-RL asserts it is false on the gym path).
        key: Where the block sits in the user's config, used in messages (e.g. ``generation`` for evaluation).

    Returns:
        The parsed config.

    Raises:
        GenerationConfigError: Listing every structural error and every broken gym rule, one per line.
    """
    parsed: GenerationConfig | None = None
    violations: list[str] = []
    if isinstance(cfg, GenerationConfig):
        parsed = cfg
        raw: Mapping[str, Any] = cfg.model_dump()
    else:
        raw = cfg
        try:
            parsed = GenerationConfig.model_validate(dict(cfg))
        except ValidationError as e:
            violations.extend(_format_pydantic_errors(e, key))
    violations.extend(gym_rule_violations(raw, greedy=greedy, key=key))
    if violations:
        raise GenerationConfigError(violations)
    assert parsed is not None
    return parsed
