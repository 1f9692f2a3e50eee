"""Injected failures: what the fake does instead of answering, for which requests, and how often.

A :class:`FaultSpec` matches requests by route and key and hits the next ``count`` of them (or every one, with
``count = None``), each with probability ``fraction`` (seeded, so a test is repeatable). The first active rule
that hits a request decides its fault; rules whose count is used up are dropped.
"""

import random
import re
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

FaultKind = Literal["http_500", "http_503", "http_429", "timeout", "garbage", "drop"]
FaultRoute = Literal["chat", "tokenize", "embeddings", "health", "any"]
HTTP_FAULT_STATUS = {"http_500": 500, "http_503": 503, "http_429": 429}


class FaultSpec(BaseModel):
    """One fault rule (also the body of ``faults`` in ``POST /fake/control``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: FaultKind = Field(
        description="http_500/http_503/http_429: that status with an error body; timeout: hold the request for "
        "hold_s, then answer normally; garbage: 200 whose body is not valid JSON; drop: close the connection "
        "without a response"
    )
    route: FaultRoute = Field(
        "chat",
        description="chat = /v1/chat/completions, tokenize = /tokenize, embeddings = /v1/embeddings, health = /health "
        "(only when named: a watcher's probe), any = all the others",
    )
    key: str | None = Field(None, description="only requests with exactly this conversation key")
    key_pattern: str | None = Field(None, description="only requests whose key matches this regex (re.search)")
    count: int | None = Field(1, ge=1, description="hit this many requests, then expire; null = never expire")
    fraction: float = Field(1.0, gt=0.0, le=1.0, description="probability that a matching request is hit")
    hold_s: float = Field(30.0, ge=0.0, description="timeout only: how long the request is held")
    seed: int = Field(0, description="seeds the fraction draws")

    @model_validator(mode="after")
    def _one_key_filter(self) -> "FaultSpec":
        if self.key is not None and self.key_pattern is not None:
            raise ValueError("set at most one of key and key_pattern")
        if self.key_pattern is not None:
            try:
                re.compile(self.key_pattern)
            except re.error as e:
                raise ValueError(f"key_pattern {self.key_pattern!r} is not a valid regex: {e}") from e
        return self


@dataclass
class _ActiveFault:
    spec: FaultSpec
    remaining: int | None
    rng: random.Random
    pattern: re.Pattern | None = field(default=None)

    def matches(self, route: str, key: str | None) -> bool:
        spec = self.spec
        if spec.route != route and (spec.route != "any" or route == "health"):
            return False
        if spec.key is not None and key != spec.key:
            return False
        return self.pattern is None or (key is not None and self.pattern.search(key) is not None)


class FaultInjector:
    """The active fault rules of one server; used only from the server's event loop."""

    def __init__(self) -> None:
        self._active: list[_ActiveFault] = []

    def add(self, spec: FaultSpec) -> None:
        pattern = re.compile(spec.key_pattern) if spec.key_pattern is not None else None
        self._active.append(_ActiveFault(spec, spec.count, random.Random(spec.seed), pattern))

    def clear(self) -> None:
        self._active.clear()

    def active(self) -> list[FaultSpec]:
        return [fault.spec for fault in self._active]

    def take(self, route: str, key: str | None) -> FaultSpec | None:
        """The fault for this request, if any; consumes one hit of the rule that fires."""
        if not self._active:
            return None
        for fault in self._active:
            if not fault.matches(route, key):
                continue
            if fault.spec.fraction < 1.0 and fault.rng.random() >= fault.spec.fraction:
                continue
            if fault.remaining is not None:
                fault.remaining -= 1
                if fault.remaining == 0:
                    self._active.remove(fault)
            return fault.spec
        return None
