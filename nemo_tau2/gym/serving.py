"""Run NeMo-Gym servers from a NeMo-Gym global config, in this project's environment, without Ray.

``gym env start`` (and NeMo-RL's Gym actor) start each server as ``python app.py`` in a per-server virtualenv and
call ``SimpleServer.run_webserver()``, which also joins or starts a Ray cluster. Our servers keep working that way
(each ``app.py`` ends with ``run_webserver()``); this module is the lighter path nemo-tau2's own launcher uses:
the same global config dict (instances keyed by name, ``<server_type>: <impl>: {host, port, ...}``), the same
server classes and FastAPI apps, served by uvicorn in a subprocess of the project's environment.

Run one instance: ``NEMO_GYM_CONFIG_DICT=<yaml> python -m nemo_tau2.gym.serving <instance_name> <module:Class>``.
The launcher runs the same :func:`main` in a process forked from a warm parent (:mod:`nemo_tau2.gym.fork_server`).
Each server logs at INFO: a line per request (uvicorn's access log) and every error with its traceback.
"""

import argparse
import importlib
import json
import logging
import os
import sys
from typing import Any

from omegaconf import DictConfig, OmegaConf
from pydantic import ValidationError

logger = logging.getLogger(__name__)

CONFIG_DICT_ENV = "NEMO_GYM_CONFIG_DICT"  # nemo_gym.global_config.NEMO_GYM_CONFIG_DICT_ENV_VAR_NAME
CONFIG_PATH_ENV = "NEMO_GYM_CONFIG_PATH"
SECRETS_ENV = "NEMO_TAU2_INSTANCE_SECRETS"
"""This instance's secret config keys (JSON, nested like the config), set by the launcher for this process only."""


def _merged(config: dict[str, Any], secrets: dict[str, Any]) -> dict[str, Any]:
    merged = dict(config)
    for key, value in secrets.items():
        merged[key] = _merged(merged.get(key) or {}, value) if isinstance(value, dict) else value
    return merged


def instance_config(global_config: DictConfig, instance_name: str) -> dict[str, Any]:
    """The flat config of one instance (the dict under ``<name>.<server_type>.<impl>``), plus its name."""
    if instance_name not in global_config:
        raise KeyError(f"no server instance {instance_name!r} in the config; instances: {list(global_config)}")
    (server_type_block,) = global_config[instance_name].values()
    (impl_block,) = server_type_block.values()
    return OmegaConf.to_container(impl_block, resolve=True) | {"name": instance_name}


def build_server(server_class: type, instance_name: str, global_config: DictConfig, secrets: dict[str, Any]):
    """Construct a NeMo-Gym server object the way ``run_webserver`` does, minus Ray."""
    from nemo_gym.config_types import BaseServerConfig
    from nemo_gym.server_utils import ServerClient

    config_class = server_class.model_fields["config"].annotation
    config = config_class.model_validate(_merged(instance_config(global_config, instance_name), secrets))
    head = global_config.get("head_server") or {"host": "127.0.0.1", "port": 0}
    client = ServerClient(
        head_server_config=BaseServerConfig(host=head["host"], port=head["port"]), global_config_dict=global_config
    )
    return server_class(config=config, server_client=client)


def build_app(server):
    """The server's FastAPI app with the liveness route and NeMo-Gym's exception middleware."""
    app = server.setup_webserver()
    server.setup_liveness(app)
    server.setup_exception_middleware(app)
    return app


def describe_validation_error(error: ValidationError) -> str:
    """One line per problem: the dotted key and pydantic's message (no traceback, no input dump)."""
    problems = []
    for item in error.errors():
        location = ".".join(str(part) for part in item["loc"] if part not in ("config",))
        message = item["msg"].removeprefix("Value error, ")
        problems.append(f"{location}: {message}" if location else message)
    return "; ".join(problems)


def disable_ray_uv_runtime_env() -> None:
    """Let ``run_webserver`` join NeMo-Gym's Ray cluster when ``gym env start`` itself was run with ``uv run``.

    Ray then insists on shipping the uv project to its workers and refuses a working directory (the server folder)
    without the project's pyproject.toml. Gym servers send no code to Ray workers, so the hook is switched off.
    Ray reads ``RAY_ENABLE_UV_RUN_RUNTIME_ENV`` once at import (NeMo-Gym imports Ray before our code runs), hence
    the module attribute.
    """
    from ray._private import ray_constants

    ray_constants.RAY_ENABLE_UV_RUN_RUNTIME_ENV = False


def load_class(path: str) -> type:
    module_name, _, class_name = path.partition(":")
    return getattr(importlib.import_module(module_name), class_name)


def preload_class(path: str) -> type:
    """Import a server class and let it load what every instance will need (its ``preload()`` classmethod, if
    any), so that the servers a fork server forks share it."""
    server_class = load_class(path)
    preload = getattr(server_class, "preload", None)
    if callable(preload):
        preload()
    return server_class


def preload_serving() -> None:
    """Import what :func:`main` needs besides the server classes (for a fork server to share)."""
    import fastapi  # noqa: F401
    import uvicorn.lifespan.on  # noqa: F401
    import uvicorn.logging  # noqa: F401
    import uvicorn.loops.auto  # noqa: F401
    import uvicorn.protocols.http.auto  # noqa: F401
    import uvicorn.protocols.websockets.auto  # noqa: F401


def main(argv: list[str] | None = None, secrets: dict[str, Any] | None = None) -> None:
    """Serve one instance until SIGTERM/SIGINT. ``secrets``: its secret config keys (default: :data:`SECRETS_ENV`,
    popped so that nothing this server starts inherits it)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("instance_name")
    parser.add_argument("server_class", help="module:Class of a NeMo-Gym SimpleServer subclass")
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    if CONFIG_DICT_ENV not in os.environ:
        sys.exit(f"{CONFIG_DICT_ENV} is not set: this module is started by nemo_tau2.gym.launch with the config")
    if secrets is None:
        secrets = json.loads(os.environ.pop(SECRETS_ENV, "{}"))
    from nemo_tau2.gym.nemo_gym_compat import configure_server_logging

    configure_server_logging(args.log_level)
    os.environ[CONFIG_PATH_ENV] = args.instance_name
    global_config = OmegaConf.create(os.environ[CONFIG_DICT_ENV])
    try:
        server = build_server(load_class(args.server_class), args.instance_name, global_config, secrets)
    except ValidationError as e:
        sys.exit(f"config error in server {args.instance_name!r}: {describe_validation_error(e)}")
    except (KeyError, ValueError) as e:
        sys.exit(f"config error in server {args.instance_name!r}: {e}")
    app = build_app(server)
    import uvicorn

    config = instance_config(global_config, args.instance_name)
    logger.info("%s (%s) listening on %s:%s", args.instance_name, args.server_class, config["host"], config["port"])
    uvicorn.run(
        app,
        host=config["host"],
        port=config["port"],
        log_level=args.log_level,
        timeout_graceful_shutdown=1,
        timeout_keep_alive=30,
    )


if __name__ == "__main__":
    main()
