"""Handles on a running fake server: its URLs, the Python control API, and ``close()``.

Every control method builds one :class:`ControlRequest` and hands it to :meth:`FakeServerHandle.control`, which
each kind of handle delivers its own way: straight to the engine (server on the caller's loop), onto the server's
loop thread (background thread), or as ``POST /fake/control`` (subprocess, or any fake reachable by URL).
"""

import asyncio
import json
import urllib.error
import urllib.request
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from nemo_tau2.testing.config import ControlRequest, ScriptSpec, TurnSpec
from nemo_tau2.testing.engine import FakeEngine, FakeStats
from nemo_tau2.testing.faults import FaultKind, FaultSpec
from nemo_tau2.testing.scripts import Script, Turn, TurnListScript
from nemo_tau2.testing.tau2_scripts import PolicyScriptConfig, Tau2ScriptsConfig, UserScriptConfig

T = TypeVar("T")
CONTROL_TIMEOUT_S = 30.0


class FakeServerHandle(ABC):
    """A running fake server. ``base_url`` ends in ``/v1`` (what OpenAI clients and NeMo-Gym's ``vllm_model`` take);
    ``root_url`` has no path (``/tokenize``, ``/health``, ``/fake/...`` live there)."""

    def __init__(self, root_url: str) -> None:
        self.root_url = root_url.rstrip("/")
        self.base_url = f"{self.root_url}/v1"
        self.port = int(self.root_url.rsplit(":", 1)[1])

    @abstractmethod
    def control(self, request: ControlRequest) -> None:
        """Apply a control request (the body of ``POST /fake/control``)."""

    @abstractmethod
    def stats(self) -> FakeStats:
        """A snapshot of the request counts."""

    @abstractmethod
    def close(self) -> None:
        """Stop the server (idempotent)."""

    def __enter__(self) -> "FakeServerHandle":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------ control API

    def inject_fault(self, kind: FaultKind, **options: Any) -> None:
        """Add a fault rule; ``options`` are the other :class:`FaultSpec` fields (count, key, route, ...)."""
        self.control(ControlRequest(faults=[FaultSpec(kind=kind, **options)]))

    def clear_faults(self) -> None:
        self.control(ControlRequest(clear_faults=True))

    def set_latency(self, latency_ms: float) -> None:
        self.control(ControlRequest(latency_ms=latency_ms))

    def set_weight_version(self, version: int) -> None:
        """Completions from now on report ``weight_version`` = ``version`` (a stand-in for a weight update)."""
        self.control(ControlRequest(weight_version=version))

    def set_prefix_correction(self, enabled: bool) -> None:
        """Honour (True) or ignore (False) token ids carried on assistant messages, as NeMo-RL's vLLM / stock vLLM."""
        self.control(ControlRequest(prefix_correction=enabled))

    def register_script(self, key: str, script: Script | ScriptSpec | Sequence[Turn]) -> None:
        """Answer conversation ``key`` with ``script`` (a list of turns is a :class:`TurnListScript`)."""
        self.control(ControlRequest(scripts={key: script_spec(script)}))

    def set_tau2_scripts(
        self,
        config: Tau2ScriptsConfig | None = None,
        *,
        policy: PolicyScriptConfig | None = None,
        user: UserScriptConfig | None = None,
    ) -> None:
        """Change how tau2 keys are played: a whole config, or just its policy or user part."""
        if config is None:
            config = Tau2ScriptsConfig(policy=policy or PolicyScriptConfig(), user=user or UserScriptConfig())
        elif policy is not None or user is not None:
            raise ValueError("pass either config or policy/user, not both")
        self.control(ControlRequest(tau2=config))

    def reset(self) -> None:
        """Clear faults, registered scripts, stats and conversation turn bases; latency back to 0, splice back on."""
        self.control(
            ControlRequest(
                clear_faults=True,
                clear_scripts=True,
                reset_stats=True,
                reset_conversations=True,
                latency_ms=0.0,
                prefix_correction=True,
            )
        )


def script_spec(script: Script | ScriptSpec | Sequence[Turn]) -> ScriptSpec:
    """A script in serialisable form; only turn lists can be sent to another process."""
    if isinstance(script, ScriptSpec):
        return script
    if isinstance(script, TurnListScript):
        return ScriptSpec(
            turns=[_turn_spec(turn) for turn in script.turns],
            when_exhausted=script.when_exhausted,
            closing_text=script.closing_text,
            token_consistent=script.token_consistent,
        )
    if isinstance(script, Sequence) and all(isinstance(turn, Turn) for turn in script):
        return ScriptSpec(turns=[_turn_spec(turn) for turn in script])
    raise TypeError(
        f"cannot serialise {type(script).__name__}; register custom Script objects with a handle's "
        "register_script_object (in-process servers only) or pass providers= to start_fake_server"
    )


def _turn_spec(turn: Turn) -> TurnSpec:
    calls = [{"name": call.name, "arguments": dict(call.arguments)} for call in turn.tool_calls]
    return TurnSpec(text=turn.text, tool_calls=calls)


class _EngineHandle(FakeServerHandle):
    """A server in this process: control goes to its engine through ``_on_loop``."""

    def __init__(self, root_url: str, engine: FakeEngine) -> None:
        super().__init__(root_url)
        self._engine = engine

    @abstractmethod
    def _on_loop(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` where the server's loop runs it (the engine is not thread-safe)."""

    def control(self, request: ControlRequest) -> None:
        self._on_loop(lambda: self._engine.apply(request))

    def stats(self) -> FakeStats:
        return self._on_loop(self._engine.stats.copy)

    def register_script_object(self, key: str, script: Script) -> None:
        """Register any :class:`Script` (code, not data): in-process servers only."""
        self._on_loop(lambda: self._engine.registered.register(key, script))


class LoopHandle(_EngineHandle):
    """A server on the caller's own event loop (from :func:`serve_fake_server`); use it from that loop's thread."""

    def __init__(self, root_url: str, engine: FakeEngine, closer: Callable[[], None]) -> None:
        super().__init__(root_url, engine)
        self._closer = closer

    def _on_loop(self, fn: Callable[[], T]) -> T:
        return fn()

    def close(self) -> None:
        """Schedule the shutdown; leaving the ``async with`` block awaits it."""
        self._closer()


class ThreadHandle(_EngineHandle):
    """A server on its own event loop in a background thread."""

    def __init__(self, root_url: str, engine: FakeEngine, loop: asyncio.AbstractEventLoop, stop: Callable[[], None]):
        super().__init__(root_url, engine)
        self._loop = loop
        self._stop = stop

    def _on_loop(self, fn: Callable[[], T]) -> T:
        async def call() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(call(), self._loop).result(timeout=CONTROL_TIMEOUT_S)

    def close(self) -> None:
        self._stop()


class RemoteHandle(FakeServerHandle):
    """A fake server in another process, driven over HTTP (``/fake/control``, ``/fake/stats``)."""

    def __init__(self, root_url: str, closer: Callable[[], None] | None = None, pid: int | None = None) -> None:
        super().__init__(root_url)
        self._closer = closer
        self.pid = pid  # the server process, when this handle started it

    def _http(self, method: str, path: str, body: bytes | None = None) -> Any:
        request = urllib.request.Request(
            f"{self.root_url}{path}", data=body, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=CONTROL_TIMEOUT_S) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as e:
            raise ValueError(f"fake server at {self.root_url} refused {method} {path}: {e.read().decode()}") from e

    def control(self, request: ControlRequest) -> None:
        self._http("POST", "/fake/control", request.model_dump_json(exclude_defaults=True).encode())

    def stats(self) -> FakeStats:
        return FakeStats.from_json(self._http("GET", "/fake/stats"))

    def close(self) -> None:
        if self._closer is not None:
            self._closer()
