"""Write docs/reference/configuration.md: every config key of every entry point, from the pydantic schemas.

The schemas are the one definition of each setting (its type, default and description live on the field), so the
reference is rendered from them, never written by hand: `uv run python docs/gen_config_reference.py` rewrites the
page, `--check` exits 1 when the committed page differs from what the schemas give (tests/unit/test_docs.py runs
it), and both print the keys that still lack a description.

Each schema class gets one section (a class used at several keys, such as the generation block, is listed once,
with every key it sits at); a key whose value is itself a block links to that block's section.
"""

import argparse
import enum
import importlib.util
import json
import os
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

import annotated_types
from markdown.extensions.toc import slugify
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / "docs" / "reference" / "configuration.md"
MAX_DEFAULT_CHARS = 80


def _pipeline_config() -> type[BaseModel]:
    """``examples/run_pipeline.py`` is a script, not a module: load its schema from the file."""
    spec = importlib.util.spec_from_file_location("_run_pipeline", REPO / "examples" / "run_pipeline.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.PipelineConfig


def entry_points() -> list[tuple[str, str, type[BaseModel]]]:
    """(what, where it is read, root schema) for every config a user writes."""
    from nemo_tau2.algorithms.grpo_config import GRPOMasterConfig
    from nemo_tau2.algorithms.rft_config import RFTMasterConfig
    from nemo_tau2.algorithms.sft_config import SFTMasterConfig
    from nemo_tau2.env_api.config import Tau2EnvConfig
    from nemo_tau2.evals.config import EvalMasterConfig
    from nemo_tau2.gym.agent.app import Tau2AgentConfig
    from nemo_tau2.gym.model_server.app import FastVLLMModelConfig
    from nemo_tau2.gym.resources_server.app import Tau2ResourcesServerConfig

    return [
        ("Evaluation", "`examples/run_eval.py --config examples/configs/evals/*.yaml`", EvalMasterConfig),
        ("GRPO", "`examples/run_grpo.py --config examples/configs/grpo_*.yaml`", GRPOMasterConfig),
        ("SFT", "`examples/run_sft.py --config examples/configs/sft_*.yaml`", SFTMasterConfig),
        ("RFT", "`examples/run_rft.py --config examples/configs/rft_*.yaml`", RFTMasterConfig),
        ("Pipeline", "`examples/run_pipeline.py --config examples/configs/pipeline_*.yaml`", _pipeline_config()),
        ("Tau2Env", "`Tau2Env(domain, **settings)` / `AsyncTau2Env` keyword arguments", Tau2EnvConfig),
        (
            "Agent server",
            "`tau2_agent.responses_api_agents.tau2_agent` in `resources_servers/tau2/configs/tau2.yaml`",
            Tau2AgentConfig,
        ),
        (
            "Resources server",
            "`tau2_resources_server.resources_servers.tau2` in `resources_servers/tau2/configs/tau2.yaml`",
            Tau2ResourcesServerConfig,
        ),
        (
            "fast_vllm_model",
            "the Gym model servers, with `env.nemo_gym.policy_model_server: fast_vllm_model` (the default)",
            FastVLLMModelConfig,
        ),
    ]


@dataclass
class Section:
    """One schema class: its fields once, and every key path (per entry point) where it sits."""

    model: type[BaseModel]
    title: str
    anchor: str  # the heading's id as the site's toc (and GitHub) derive it
    used_at: dict[str, list[str]] = field(default_factory=dict)


def _models_in(annotation: typing.Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for arg in typing.get_args(annotation) for model in _models_in(arg)]


def _child_path(path: str, annotation: typing.Any) -> str:
    """The key path of a block nested in ``annotation`` (``stages[]`` for a list, ``x.<name>`` for a dict)."""
    origin = typing.get_origin(annotation)
    if origin in (list, tuple, set, frozenset):
        return f"{path}[]"
    if origin is dict:
        return f"{path}.<name>"
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            if _models_in(arg):
                return _child_path(path, arg)
    return path


def collect(roots: list[tuple[str, str, type[BaseModel]]]) -> list[Section]:
    """Every schema class reachable from the roots, breadth first, each once."""
    sections: dict[type[BaseModel], Section] = {}
    names: dict[str, int] = {}
    queue: list[tuple[type[BaseModel], str, str]] = [(root, what, "") for what, _, root in roots]
    while queue:
        model, what, path = queue.pop(0)
        if model not in sections:
            names[model.__name__] = names.get(model.__name__, 0) + 1
            title = model.__name__ if names[model.__name__] == 1 else f"{model.__name__} ({model.__module__})"
            sections[model] = Section(model, title, slugify(title, "-"))
            for name, info in model.model_fields.items():
                key = f"{path}.{name}" if path else name
                for child in _models_in(info.annotation):
                    queue.append((child, what, _child_path(key, info.annotation)))
        paths = sections[model].used_at.setdefault(what, [])
        if path and path not in paths:
            paths.append(path)
    return list(sections.values())


def _type_text(annotation: typing.Any, anchors: dict[type, str]) -> str:
    if annotation is type(None):
        return "null"
    if annotation is typing.Any:
        return "any"
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_text(args[0], anchors)
    if origin is typing.Literal:
        return " \\| ".join(json.dumps(a.value if isinstance(a, enum.Enum) else a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_text(a, anchors) for a in args)
    if origin is not None:
        inner = ", ".join(_type_text(a, anchors) for a in args)
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]" if inner else origin.__name__
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"[{annotation.__name__}](#{anchors[annotation]})"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " \\| ".join(json.dumps(m.value) for m in annotation)
    return getattr(annotation, "__name__", str(annotation)).replace("|", "\\|")


def _constraints(info: FieldInfo) -> str:
    symbols = {
        annotated_types.Ge: ("ge", ">="),
        annotated_types.Gt: ("gt", ">"),
        annotated_types.Le: ("le", "<="),
        annotated_types.Lt: ("lt", "<"),
        annotated_types.MinLen: ("min_length", "length >="),
        annotated_types.MaxLen: ("max_length", "length <="),
    }
    parts = []
    for item in info.metadata:
        for kind, (attr, symbol) in symbols.items():
            if isinstance(item, kind):
                parts.append(f"{symbol} {getattr(item, attr)}")
    return ", ".join(parts)


def _default_text(info: FieldInfo) -> str:
    if info.default is PydanticUndefined and info.default_factory is None:
        return "required"
    value = info.default if info.default_factory is None else info.default_factory()
    if isinstance(value, BaseModel):
        return "(the block's defaults)"
    if isinstance(value, enum.Enum):
        value = value.value
    text = json.dumps(value, default=str)
    if len(text) > MAX_DEFAULT_CHARS:
        text = text[: MAX_DEFAULT_CHARS - 1] + "…"
    return "`" + text.replace("|", "\\|").replace("`", "'") + "`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _owner(model: type[BaseModel], name: str) -> type:
    """The class that declares ``name`` (a NeMo-Gym base class for the servers' inherited keys)."""
    for cls in model.__mro__:
        if name in vars(cls).get("__annotations__", {}):
            return cls
    return model


def _doc(model: type[BaseModel]) -> str:
    doc = vars(model).get("__doc__") or ""
    return " ".join(doc.strip().split("\n\n")[0].split())


def render(roots: list[tuple[str, str, type[BaseModel]]]) -> tuple[str, list[str]]:
    """The page's markdown and the keys (``Class.key``) that have no description."""
    sections = collect(roots)
    anchors = {s.model: s.anchor for s in sections}
    missing: list[str] = []
    out = [
        "# Configuration reference",
        "",
        "<!-- Generated by docs/gen_config_reference.py from the pydantic schemas: do not edit by hand. -->",
        "",
        "Every key of every config, rendered from the schemas that validate it (`uv run python "
        "docs/gen_config_reference.py` regenerates this page; `tests/unit/test_docs.py` fails when it is stale). "
        "A config file sets any of these keys; the command line overrides them with `a.b=value` (the key must "
        "exist), `+a.b=value` (adds one) or `++a.b=value` (either). A key whose value is a block links to the "
        "block's own table.",
        "",
        "| Config | Read by | Schema |",
        "|---|---|---|",
    ]
    out += [f"| {what} | {where} | [{root.__name__}](#{anchors[root]}) |" for what, where, root in roots]
    for section in sections:
        model = section.model
        out += ["", f"## {section.title}", "", f"`{model.__module__}.{model.__qualname__}`"]
        if doc := _doc(model):
            out += ["", doc]
        used = [f"{what}: " + ", ".join(f"`{p}`" for p in paths) for what, paths in section.used_at.items() if paths]
        if used:
            out += ["", "At: " + "; ".join(used) + "."]
        if not model.model_fields:
            out += ["", "No keys."]
            continue
        out += ["", "| Key | Type | Default | Description |", "|---|---|---|---|"]
        for name, info in model.model_fields.items():
            type_text = _type_text(info.annotation, anchors)
            if limits := _constraints(info):
                type_text += f" ({limits})"
            owner = _owner(model, name)
            # a block without a description of its own is described by its class's docstring
            blocks_doc = next((_doc(block) for block in _models_in(info.annotation) if _doc(block)), "")
            description = _cell(info.description or blocks_doc)
            if not owner.__module__.startswith(("nemo_tau2", "_run_pipeline")):
                description = (description + " " if description else "") + f"(NeMo-Gym's `{owner.__name__}`)"
            elif not description:
                missing.append(f"{owner.__module__}.{owner.__qualname__}.{name}")
            out.append(f"| `{name}` | {type_text} | {_default_text(info)} | {description} |")
    distinct_missing = sorted(set(missing))
    out += [
        "",
        "## Keys without a description",
        "",
        f"{len(distinct_missing)} of our keys have no description in their schema yet (a `description=` on the "
        "field fills its cell here; `--list-missing` names them).",
        "",
    ]
    return "\n".join(out) + "\n", distinct_missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed page is stale")
    parser.add_argument("--list-missing", action="store_true", help="print every key without a description")
    args = parser.parse_args(argv)
    text, missing = render(entry_points())
    if args.list_missing:
        print("\n".join(missing))
    if args.check:
        if not PAGE.is_file() or PAGE.read_text() != text:
            print(f"error: {PAGE.relative_to(REPO)} is stale; run: uv run python docs/gen_config_reference.py")
            return 1
        print(f"{PAGE.relative_to(REPO)} is up to date ({len(missing)} keys without a description)")
        return 0
    PAGE.write_text(text)
    print(f"wrote {PAGE.relative_to(REPO)} ({len(missing)} keys without a description)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
