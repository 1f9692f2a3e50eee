"""Start a scripted fake OpenAI-compatible server: on the caller's loop, in a background thread, or as a subprocess.

Examples:
    >>> with start_fake_server() as fake:  # background thread, free port on 127.0.0.1
    ...     client = openai.OpenAI(base_url=fake.base_url, api_key="unused")
    ...     fake.inject_fault("http_500", count=2)

    $ python -m nemo_tau2.testing.fake_server --port 8123 --config fake.yaml
"""

import argparse
import asyncio
import atexit
import contextlib
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from aiohttp import web

from nemo_tau2.gym.fork_protocol import call_in_template
from nemo_tau2.gym.fork_template import fork_template_path
from nemo_tau2.processes import child_environment, die_with_parent
from nemo_tau2.testing.config import FakeServerConfig
from nemo_tau2.testing.engine import FakeEngine
from nemo_tau2.testing.handles import FakeServerHandle, LoopHandle, RemoteHandle, ThreadHandle
from nemo_tau2.testing.scripts import Script, ScriptProvider
from nemo_tau2.testing.server import FakeHTTPServer

logger = logging.getLogger(__name__)

READY_LINE_PREFIX = "FAKE_SERVER_LISTENING "
SHUTDOWN_TIMEOUT_S = 2.0


def _new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop when installed (it comes with uvicorn[standard]): the server's own loop does less work per request."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def _resolve_config(config: FakeServerConfig | None, fields: dict[str, Any]) -> FakeServerConfig:
    if config is not None and fields:
        raise ValueError(f"pass either config or config fields, not both (got fields {sorted(fields)})")
    return config if config is not None else FakeServerConfig(**fields)


def _engine(
    config: FakeServerConfig, providers: Sequence[ScriptProvider], scripts: Mapping[str, Script] | None
) -> FakeEngine:
    engine = FakeEngine(config, providers)
    for key, script in (scripts or {}).items():
        engine.registered.register(key, script)
    return engine


class _Running:
    """An engine served by aiohttp on the current loop."""

    def __init__(self, engine: FakeEngine) -> None:
        self.http = FakeHTTPServer(engine)
        self.runner = web.AppRunner(
            self.http.build_app(), access_log=None, handle_signals=False, shutdown_timeout=SHUTDOWN_TIMEOUT_S
        )
        self.root_url = ""
        self._stopped = False

    async def start(self, config: FakeServerConfig) -> None:
        await self.runner.setup()
        site = web.TCPSite(self.runner, config.host, config.port, backlog=config.backlog, reuse_address=True)
        await site.start()
        host, port = site._server.sockets[0].getsockname()[:2]  # the real port when config.port is 0
        self.root_url = f"http://{host}:{port}"

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self.http.begin_close()
        await self.runner.cleanup()


@contextlib.asynccontextmanager
async def serve_fake_server(
    config: FakeServerConfig | None = None,
    *,
    providers: Sequence[ScriptProvider] = (),
    scripts: Mapping[str, Script] | None = None,
    **config_fields: Any,
) -> AsyncIterator[LoopHandle]:
    """Serve a fake on the running event loop for the duration of an ``async with`` block.

    Args:
        config: the server config; or pass its fields as keyword arguments instead.
        providers: extra script providers, asked after registered scripts and before the tau2 provider.
        scripts: scripts to register by exact key (any :class:`Script`, not only turn lists).
    """
    config = _resolve_config(config, config_fields)
    running = _Running(_engine(config, providers, scripts))
    await running.start(config)
    stopping: list[asyncio.Task] = []  # holds the task close() schedules, so it is not garbage-collected

    def close() -> None:
        stopping.append(asyncio.ensure_future(running.stop()))

    handle = LoopHandle(running.root_url, running.http.engine, close)
    try:
        yield handle
    finally:
        await asyncio.gather(*stopping)
        await running.stop()


def start_fake_server(
    config: FakeServerConfig | None = None,
    *,
    providers: Sequence[ScriptProvider] = (),
    scripts: Mapping[str, Script] | None = None,
    mode: Literal["thread", "subprocess"] = "thread",
    startup_timeout_s: float = 120.0,
    log_file: Path | None = None,
    **config_fields: Any,
) -> FakeServerHandle:
    """Start a fake server and return its handle (a context manager; ``close()`` stops the server).

    Args:
        config: the server config; or pass its fields as keyword arguments instead.
        providers: extra script providers (thread mode only: code cannot cross into a subprocess).
        scripts: scripts to register by exact key (thread mode: any Script; subprocess: use ``config.scripts``).
        mode: ``thread`` runs the server on its own event loop in a daemon thread of this process; ``subprocess``
            runs ``python -m nemo_tau2.testing.fake_server`` (its own GIL: use it for benchmarks).
        startup_timeout_s: how long to wait for the server to listen (loading tau2 domains takes seconds).
        log_file: subprocess only: where its stderr (its log) is appended; None: ours.
    """
    config = _resolve_config(config, config_fields)
    if mode == "subprocess":
        if providers or scripts:
            raise ValueError("providers and scripts objects cannot cross into a subprocess; use config.scripts")
        return _start_subprocess(config, startup_timeout_s, log_file)
    if mode != "thread":
        raise ValueError(f"mode {mode!r} must be 'thread' or 'subprocess'")
    return _start_thread(_engine(config, providers, scripts), config, startup_timeout_s)


def _start_thread(engine: FakeEngine, config: FakeServerConfig, startup_timeout_s: float) -> ThreadHandle:
    loop = _new_event_loop()
    running = _Running(engine)
    started: queue.Queue[BaseException | None] = queue.Queue()

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(running.start(config))
        except BaseException as e:  # reported to the starting thread, which raises it
            started.put(e)
            loop.close()
            return
        started.put(None)
        loop.run_forever()
        loop.run_until_complete(running.stop())
        loop.close()

    thread = threading.Thread(target=run, name="nemo-tau2-fake-server", daemon=True)
    thread.start()
    try:
        error = started.get(timeout=startup_timeout_s)
    except queue.Empty:
        raise TimeoutError(f"the fake server did not start within {startup_timeout_s} s") from None
    if error is not None:
        thread.join()
        raise RuntimeError(f"the fake server failed to start: {error}") from error

    def stop() -> None:
        if thread.is_alive():
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=SHUTDOWN_TIMEOUT_S + 10)

    return ThreadHandle(running.root_url, engine, loop, stop)


_MODULE = "nemo_tau2.testing.fake_server"  # this module's name also where it runs as ``__main__``


def _start_subprocess(config: FakeServerConfig, startup_timeout_s: float, log_file: Path | None) -> RemoteHandle:
    """``python -m nemo_tau2.testing.fake_server``, or, where a fork template serves this process (a test session's,
    ``nemo_tau2/gym/fork_template.py``), the same ``main`` called in a fork of it: its imports done (~1 CPU-s a start,
    ~120 starts a CI run), the same server, stdout and log. Either way without the secrets' variables: it calls no
    endpoint."""
    argv, env = ["--config-json", config.model_dump_json()], child_environment(drop_secret_names=True)
    template = fork_template_path()
    process = call_in_template(template, f"{_MODULE}:main", argv, env, log_file) if template else None
    if process is None:
        with open(log_file, "ab") if log_file is not None else contextlib.nullcontext() as stderr:
            process = subprocess.Popen(
                [sys.executable, "-m", _MODULE, *argv], stdout=subprocess.PIPE, stderr=stderr, text=True, env=env,
                preexec_fn=die_with_parent,
            )  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()
    # "" at the end of its stdout: a server that ended before its ready line is reported at once, not at the timeout
    reader = threading.Thread(target=lambda: [*map(lines.put, process.stdout), lines.put("")], daemon=True)
    reader.start()

    def stop() -> None:
        atexit.unregister(stop)
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=SHUTDOWN_TIMEOUT_S + 10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    atexit.register(stop)  # a test run that forgets close() must not leave the server behind
    try:
        line = lines.get(timeout=startup_timeout_s)
    except queue.Empty:
        stop()
        raise TimeoutError(f"the fake server subprocess did not start within {startup_timeout_s} s") from None
    if not line.startswith(READY_LINE_PREFIX):
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=SHUTDOWN_TIMEOUT_S)  # ending on its own: its exit code, not our signal's
        stop()
        said = f"it printed {line!r}" if line else "it printed nothing"
        log = f"; its log: {log_file}" if log_file is not None else ""
        raise RuntimeError(f"the fake server subprocess failed to start (exit code {process.returncode}): {said}{log}")
    return RemoteHandle(line.removeprefix(READY_LINE_PREFIX).strip().removesuffix("/v1"), stop, process.pid)


def connect_fake_server(url: str) -> RemoteHandle:
    """A handle on a fake server started elsewhere (``url`` with or without ``/v1``); ``close()`` does nothing."""
    return RemoteHandle(url.rstrip("/").removesuffix("/v1"))


# ========================================================================================================= CLI


async def _serve_forever(config: FakeServerConfig) -> None:
    running = _Running(FakeEngine(config))
    await running.start(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    print(f"{READY_LINE_PREFIX}{running.root_url}/v1", flush=True)
    print(f"fake server (pid {os.getpid()}) serving at {running.root_url}/v1", file=sys.stderr, flush=True)
    await stop.wait()
    await running.stop()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Scripted fake OpenAI-compatible (vLLM-shaped) server for tests.")
    parser.add_argument("--config", type=Path, help="YAML file with FakeServerConfig fields")
    parser.add_argument("--config-json", help="FakeServerConfig as a JSON string")
    parser.add_argument("--host", help="overrides the config's host")
    parser.add_argument("--port", type=int, help="overrides the config's port (0: a free port)")
    args = parser.parse_args(argv)
    if args.config and args.config_json:
        parser.error("pass at most one of --config and --config-json")
    if args.config:
        fields = yaml.safe_load(args.config.read_text()) or {}
        config = FakeServerConfig.model_validate(fields)
    elif args.config_json:
        config = FakeServerConfig.model_validate_json(args.config_json)
    else:
        config = FakeServerConfig()
    overrides = {name: value for name, value in (("host", args.host), ("port", args.port)) if value is not None}
    config = FakeServerConfig.model_validate(config.model_dump() | overrides)
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(_serve_forever(config), loop_factory=_new_event_loop)


if __name__ == "__main__":
    main()
