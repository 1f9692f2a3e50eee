"""Strict server configs that still accept the keys NeMo-Gym itself puts in every instance block."""

import difflib
from typing import Any

from pydantic import BaseModel, model_validator

#: Keys NeMo-Gym's own tooling reads from an instance block (dataset lists, catalogue metadata).
GYM_INSTANCE_KEYS = frozenset({"datasets", "verified", "description", "value", "license", "domain"})


class GymInstanceConfigMixin(BaseModel):
    """Mix into a NeMo-Gym server config with ``extra="allow"``: any other unknown key is an error naming it.

    (Gym's base configs ignore unknown keys, so a typo such as ``max_step`` would silently keep the default.)
    """

    @model_validator(mode="after")
    def _reject_unknown_keys(self) -> Any:
        unknown = sorted(set(self.model_extra or {}) - GYM_INSTANCE_KEYS)
        if unknown:
            known = sorted(set(type(self).model_fields) | GYM_INSTANCE_KEYS)
            hints = []
            for key in unknown:
                close = difflib.get_close_matches(key, known, n=1)
                hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
            raise ValueError(f"unknown config key(s) for {type(self).__name__}: {', '.join(hints)}")
        return self
