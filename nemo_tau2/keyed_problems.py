"""One pydantic error that carries several problems, each naming its key, so a config check can report them all.

A model validator that checks several rules (the gym rules on a generation block) raises :func:`keyed_problems`;
the config loader (``nemo_tau2.config``) and any other reader print one ``<path>.<key>: <problem>`` line per
problem with :func:`keyed_problem_lines`. It lives below both, so neither imports the other.
"""

from collections.abc import Mapping
from typing import Any

from pydantic_core import PydanticCustomError

KEYED_PROBLEMS_ERROR = "keyed_problems"


def keyed_problems(lines: list[str]) -> PydanticCustomError:
    """The error to raise from a model validator: ``lines`` are ``<key>: <problem>``, keys relative to the model."""
    return PydanticCustomError(KEYED_PROBLEMS_ERROR, "{problems}", {"problems": "\n".join(lines)})


def keyed_problem_lines(error: Mapping[str, Any], path: str) -> list[str]:
    """The lines of such an error found at ``path`` (a dotted key): ``<path>.<key>: <problem>`` per problem."""
    return [f"{path}.{line}" for line in error["ctx"]["problems"].splitlines()]
