"""YAML configs with ``defaults:`` inheritance and strict command-line overrides (NeMo-RL's conventions).

A config file may name parent files under ``defaults:`` (a path or a list of paths, relative to the file).
Parents load depth-first; later entries win over earlier ones and the file itself wins over all its parents.

Overrides use Hydra's grammar, checked against the loaded config:

- ``a.b=value``: ``a.b`` must already exist; a typo is an error naming the closest existing keys.
- ``+a.b=value``: adds a new key; an error if ``a.b`` already exists.
- ``++a.b=value``: sets ``a.b`` whether or not it exists.

Values parse as YAML (``x=[1,2,4]``, ``x=null``, ``x=true``, ``x=1e-6``, ``x=${other.key}``). Interpolations stay
lazy until the config is resolved (``validate_config`` or ``OmegaConf.to_container(cfg, resolve=True)``), with
the resolvers ``mul``, ``add``, ``div`` and ``max`` registered as in NeMo-RL (the front doors add ``local_model``:
``nemo_tau2/generation/local_models.py``).
"""

import argparse
import difflib
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from pydantic import BaseModel, ValidationError

from nemo_tau2.keyed_problems import KEYED_PROBLEMS_ERROR, keyed_problem_lines
from nemo_tau2.processes import is_secret_key

REDACTED = "***REDACTED***"

_OVERRIDE_RE = re.compile(r"^(?P<prefix>\+{0,2})(?P<key>[A-Za-z_][\w-]*(?:\.[\w-]+)*)=(?P<value>.*)$", re.DOTALL)
# YAML 1.1 (PyYAML) reads "1e-6" as a string; OmegaConf's own loader and users expect a float.
_FLOAT_RE = re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+$")


class ConfigError(ValueError):
    """A config file, override or value is invalid; the message names the key and the value.

    ``problems`` holds one line per problem (a validation can find several), each naming a key and its fix.
    """

    def __init__(self, message: str, problems: Sequence[str] | None = None):
        super().__init__(message)
        self.problems = list(problems) if problems else message.splitlines()


class ConfigFileNotFoundError(ConfigError, FileNotFoundError):
    """A config file or a ``defaults:`` parent does not exist (both a ConfigError and a FileNotFoundError)."""


# ======================================================================================================
# Resolvers
# ======================================================================================================


def _div(numerator: float, denominator: float) -> float:
    if denominator == 0:
        raise ConfigError(f"${{div:{numerator},{denominator}}} divides by zero")
    return numerator / denominator


def register_omegaconf_resolvers() -> None:
    """Register ``${mul:a,b,...}``, ``${add:a,b,...}``, ``${div:a,b}``, ``${max:a,b,...}`` (NeMo-RL's; idempotent).

    ``${local_model:name}`` is the generation package's (``generation/local_models.py``): the front doors that load
    configs with a generation block register it, so that this loader imports no generation code."""
    resolvers = {
        "mul": lambda *xs: math.prod(xs),
        "add": lambda *xs: sum(xs),
        "div": _div,
        "max": max,
    }
    for name, fn in resolvers.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)


register_omegaconf_resolvers()


# ======================================================================================================
# Loading with `defaults:` inheritance
# ======================================================================================================


def _read_yaml(path: Path) -> DictConfig:
    if not path.is_file():
        raise ConfigFileNotFoundError(
            f"config file not found: {path}; pass --config with an existing YAML file (examples/configs/ has them)"
        )
    try:
        cfg = OmegaConf.load(path)
    except (yaml.YAMLError, OmegaConfBaseException) as e:
        raise ConfigError(f"cannot parse config file {path}: {e}") from e
    if not isinstance(cfg, DictConfig):
        raise ConfigError(f"config file {path} must hold a mapping at the top level, got a {type(cfg).__name__}")
    return cfg


def _parent_paths(cfg: DictConfig, path: Path) -> list[Path]:
    defaults = cfg.pop("defaults", None)
    if defaults is None:
        return []
    entries = [defaults] if isinstance(defaults, str) else defaults
    if not isinstance(entries, list | ListConfig) or not all(isinstance(e, str) for e in entries):
        raise ConfigError(f"'defaults' in {path} must be a path or a list of paths, got {defaults!r}")
    parents = [(path.parent / entry).resolve() for entry in entries]
    for entry, parent in zip(entries, parents, strict=True):
        if not parent.is_file():
            raise ConfigFileNotFoundError(
                f"'defaults' entry {entry!r} in {path} not found: {parent}; fix the path (relative to {path.name})"
            )
    return parents


def _load_with_defaults(path: Path, chain: tuple[Path, ...]) -> DictConfig:
    if path in chain:
        cycle = " -> ".join(str(p) for p in (*chain[chain.index(path) :], path))
        raise ConfigError(f"cycle in config 'defaults': {cycle}")
    cfg = _read_yaml(path)
    merged = OmegaConf.create({})
    for parent in _parent_paths(cfg, path):
        merged = _merge(merged, _load_with_defaults(parent, (*chain, path)), parent)
    return _merge(merged, cfg, path)


def _merge(base: DictConfig, update: DictConfig, source: Path) -> DictConfig:
    try:
        return OmegaConf.merge(base, update)
    except OmegaConfBaseException as e:
        raise ConfigError(f"cannot merge {source} over its defaults: {e}") from e


def load_config(path: str | Path) -> DictConfig:
    """Load a YAML config and everything it inherits through ``defaults:``.

    Args:
        path: The config file. ``defaults:`` entries in it (and in its parents) are relative to the file
            that names them.

    Returns:
        The merged config; ``${...}`` interpolations are kept unresolved.

    Raises:
        ConfigFileNotFoundError: The file or a parent does not exist (a ConfigError and a FileNotFoundError).
        ConfigError: Unparsable YAML, a non-mapping top level, a malformed ``defaults:`` or a cycle.
    """
    return _load_with_defaults(Path(path).resolve(), ())


# ======================================================================================================
# Overrides
# ======================================================================================================


def parse_override_value(text: str) -> Any:
    """Parse an override's value like a YAML scalar, list or mapping (``''`` stays an empty string)."""
    if text == "":
        return ""
    if _FLOAT_RE.match(text):
        return float(text)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"cannot parse override value {text!r} as YAML: {e}") from e


def _child_keys(node: Any) -> list[str]:
    if isinstance(node, DictConfig):
        return [str(k) for k in node]
    if isinstance(node, ListConfig):
        return [str(i) for i in range(len(node))]
    return []


def _child(node: Any, key: str) -> Any:
    """The child node under ``key`` without resolving interpolations or tripping on ``???`` values."""
    if isinstance(node, ListConfig):
        return node._get_node(int(key))
    return node._get_node(key)


def _key_exists(cfg: DictConfig, dotted: str) -> bool:
    """Whether ``dotted`` names an existing node; raises if a parent on the way is a scalar value."""
    node: Any = cfg
    parts = dotted.split(".")
    for depth, part in enumerate(parts):
        if not isinstance(node, DictConfig | ListConfig):
            parent = ".".join(parts[:depth])
            raise ConfigError(f"cannot set '{dotted}': '{parent}' holds a value ({node!r}), not a mapping")
        if part not in _child_keys(node):
            return False
        node = _child(node, part)
    return True


def _all_paths(node: Any, prefix: str = "") -> list[str]:
    paths = []
    for key in _child_keys(node):
        path = f"{prefix}{key}"
        paths.append(path)
        paths.extend(_all_paths(_child(node, key), f"{path}."))
    return paths


def _unknown_key_message(cfg: DictConfig, dotted: str) -> str:
    close = difflib.get_close_matches(dotted, _all_paths(cfg), n=3, cutoff=0.6)
    hint = f"closest existing key(s): {', '.join(close)}" if close else "no similar key exists"
    return f"unknown config key '{dotted}' ({hint}); use '+{dotted}=...' to add a new key"


def apply_overrides(cfg: DictConfig, overrides: Sequence[str]) -> DictConfig:
    """Apply ``key=value`` / ``+key=value`` / ``++key=value`` overrides, in order, to a copy of ``cfg``.

    Raises:
        ConfigError: A malformed override, ``key=`` on a key that does not exist (the message names the
            closest existing keys), ``+key=`` on a key that exists, or a key under a scalar value.
    """
    cfg = cfg.copy()
    for override in overrides:
        match = _OVERRIDE_RE.match(override)
        if match is None:
            raise ConfigError(f"malformed override {override!r}: expected key=value, +key=value or ++key=value")
        prefix, key = match["prefix"], match["key"]
        exists = _key_exists(cfg, key)
        if prefix == "" and not exists:
            raise ConfigError(_unknown_key_message(cfg, key))
        if prefix == "+" and exists:
            raise ConfigError(f"cannot add config key '{key}': it already exists; use '{key}=...' to change it")
        try:
            OmegaConf.update(cfg, key, parse_override_value(match["value"]), merge=False, force_add=True)
        except (OmegaConfBaseException, ValueError, IndexError) as e:
            raise ConfigError(f"cannot apply override {override!r}: {e}") from e
    return cfg


# ======================================================================================================
# Command line
# ======================================================================================================


@dataclass
class CliArgs:
    """What an entry point's command line holds: a config file and overrides."""

    config: Path
    overrides: list[str]
    switches: set[str] = field(default_factory=set)
    """The entry point's own ``--flags`` that were given (see ``parse_args(switches=...)``)."""


def parse_args(
    argv: Sequence[str] | None = None,
    *,
    default_config: str | Path | None = None,
    switches: dict[str, str] | None = None,
) -> CliArgs:
    """Parse ``[--config PATH] [--switch ...] [overrides...]``; anything else (an unknown flag, a bare word) is
    rejected. ``switches`` maps an entry point's own boolean flags (``--plan``) to their help text.

    Exits through argparse (status 2, message on stderr) on bad arguments, as command lines do.
    """
    parser = argparse.ArgumentParser(
        allow_abbrev=False,
        epilog="Overrides: key=value changes an existing key, +key=value adds one, ++key=value sets either way.",
    )
    parser.add_argument(
        "--config", type=Path, default=default_config, required=default_config is None, help="YAML config file"
    )
    for flag, help_text in (switches or {}).items():
        parser.add_argument(flag, action="store_true", help=help_text)
    args, rest = parser.parse_known_args(argv)
    for arg in rest:
        if not _OVERRIDE_RE.match(arg):
            parser.error(f"unrecognized argument {arg!r}: expected --config PATH or key=value / +key=value overrides")
    given = {flag for flag in switches or {} if getattr(args, flag.lstrip("-").replace("-", "_"))}
    return CliArgs(config=Path(args.config), overrides=list(rest), switches=given)


def load_config_from_cli(argv: Sequence[str] | None = None, *, default_config: str | Path | None = None) -> DictConfig:
    """``parse_args`` + ``load_config`` + ``apply_overrides``: what an entry point calls first."""
    args = parse_args(argv, default_config=default_config)
    return apply_overrides(load_config(args.config), args.overrides)


# ======================================================================================================
# Validation into pydantic models
# ======================================================================================================


def _dotted(loc: Sequence[str | int]) -> str:
    return ".".join(str(part) for part in loc) or "<root>"


def _model_at(model: type[BaseModel], loc: Sequence[str | int]) -> type[BaseModel] | None:
    """The pydantic model holding the field at ``loc`` (plain nesting only), to suggest field names."""
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        annotation = field.annotation if field else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return None
        model = annotation
    return model


def _short_repr(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _describe_error(model: type[BaseModel], error: dict[str, Any]) -> str:
    loc = error["loc"]
    key = _dotted(loc)
    if error["type"] == "extra_forbidden":
        parent = _model_at(model, loc)
        known = list(parent.model_fields) if parent else []
        close = difflib.get_close_matches(str(loc[-1]), known, n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        return f"{key}: unknown key{hint}"
    if error["type"] == "missing":
        return f"{key}: required key is missing"
    if error["type"] == KEYED_PROBLEMS_ERROR:
        return "\n  ".join(keyed_problem_lines(error, key))
    if error["type"] == "value_error" and isinstance(error.get("input"), dict):
        # A cross-field check of a whole block: its message names the keys and the fix; the block is noise.
        return f"{key}: {error['msg'].removeprefix('Value error, ')}"
    value = REDACTED if loc and is_secret_key(str(loc[-1])) else _short_repr(error.get("input"))
    return f"{key}: {error['msg']} (got {value})"


def validate_config[M: BaseModel](cfg: DictConfig | dict[str, Any], model: type[M]) -> M:
    """Resolve interpolations and validate ``cfg`` into ``model``.

    Raises:
        ConfigError: One line per problem, each naming the dotted key path and the bad value (secrets
            redacted), or the interpolation that failed to resolve.
    """
    if isinstance(cfg, DictConfig):
        try:
            data = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
        except OmegaConfBaseException as e:
            raise ConfigError(f"cannot resolve config: {e}") from e
    else:
        data = cfg
    try:
        return model.model_validate(data)
    except ValidationError as e:
        lines = [_describe_error(model, err) for err in e.errors()]
        raise ConfigError(f"invalid {model.__name__} config:\n  " + "\n  ".join(lines), problems=lines) from e


# ======================================================================================================
# Saving configs without secrets
# ======================================================================================================


def _redact(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: REDACTED if is_secret_key(str(k)) and v is not None else _redact(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_redact(v) for v in node]
    return node


def redact_secrets(cfg: DictConfig | dict[str, Any], *, resolve: bool = True) -> dict[str, Any]:
    """A plain dict of ``cfg`` for saving, with the value of every secret-looking key replaced by ``REDACTED``.

    See ``is_secret_key`` for what counts as a secret key. ``None`` values stay ``None`` (nothing to hide).
    """
    if not isinstance(cfg, DictConfig):
        return _redact(cfg)
    try:
        return _redact(OmegaConf.to_container(cfg, resolve=resolve))
    except OmegaConfBaseException as e:
        raise ConfigError(f"cannot resolve config: {e}") from e
