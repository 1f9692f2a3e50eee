"""Errors raised by the generation package, one type per kind of failure the caller may handle differently."""


class GenerationConfigError(ValueError):
    """A generation config that cannot work; ``violations`` holds one ``<key path>: <problem>`` line per issue."""

    def __init__(self, violations: list[str]) -> None:
        self.violations = list(violations)
        count = len(self.violations)
        header = f"{count} problem{'s' if count != 1 else ''} in the generation config:"
        super().__init__("\n".join([header, *(f"  - {line}" for line in self.violations)]))


class GenerationStartupError(RuntimeError):
    """A generation backend could not be started (missing dependency or file, busy port, server that died)."""


class WeightUpdateError(RuntimeError):
    """New weights could not be served; the message says whether the old ones still serve or the servers stopped."""


class BadRequestError(ValueError):
    """A request the vLLM surface rejects with HTTP 400 (or ``status``); the message names the field and value."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class EngineError(RuntimeError):
    """The model backend failed while serving a valid request (HTTP 500): an infrastructure failure."""
