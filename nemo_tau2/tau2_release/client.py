"""Talk to a tau2 release that lives in its own environment, through the worker process of ours that runs there.

The worker (``worker/nemo_tau2_tau2_worker.py``) imports only tau2 and the standard library; this side starts it
with the release's interpreter (``tau2.python``, else ``$NEMO_TAU2_TAU2_V1_PYTHON``), as the vllm backend starts
vLLM's server, or forks it from a warm template where one runs (``template.py``: the test session's), and exchanges
one JSON line per request over pipes. Requests are answered in order, one at a time:
tau2's tools and evaluator are CPU-bound Python, as they are in process.

Failures keep their three channels: a request the release cannot honour raises :class:`Tau2RequestError` (a
``ValueError``: bad input), an NL-assertion judge that gives no usable verdict after ``judge.max_attempts`` raises
:class:`Tau2JudgeError` (an infrastructure error with its cause, never a score), and a worker that cannot start or
dies raises :class:`Tau2WorkerError`.
"""

import contextlib
import json
import logging
import os
import select
import subprocess
import sys
import threading
import time
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from nemo_tau2.env_cache import cache_root
from nemo_tau2.tau2_release.config import Tau2ReleaseConfig
from nemo_tau2.tau2_release.template import forked_worker

logger = logging.getLogger(__name__)

TAU2_V1_PYTHON_ENV = "NEMO_TAU2_TAU2_V1_PYTHON"
WORKER_DIR = Path(__file__).parent / "worker"
WORKER_FILE = WORKER_DIR / "nemo_tau2_tau2_worker.py"
BUILD_HINT = (
    "build it with `scripts/build_tau2_env.sh --version v1.0.1` (add `--source PATH` for a local checkout) and set "
    f"tau2.python to the interpreter it prints (or export {TAU2_V1_PYTHON_ENV})"
)
# Variables of the project's environment that must not reach an interpreter of another environment.
_FOREIGN_PYTHON_VARIABLES = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")


class Tau2WorkerError(RuntimeError):
    """The release's worker could not start, or stopped answering."""


class Tau2RequestError(ValueError):
    """The release cannot honour the request (unknown domain, task or episode; malformed message)."""


class Tau2JudgeError(RuntimeError):
    """The NL-assertion judge gave no usable verdict (HTTP error, invalid JSON, no results): infrastructure."""


class Tau2ServiceError(Tau2WorkerError):
    """An outside service of the run (banking_knowledge's embedding endpoint) failed while the worker answered:
    infrastructure, like a dead worker (nothing was recorded; a retry asks again), never a score."""


def release_python(config: Tau2ReleaseConfig) -> str:
    """The interpreter of the configured release's environment; one-line error naming the fix if there is none."""
    python = config.python or os.environ.get(TAU2_V1_PYTHON_ENV)
    if not python:
        raise Tau2WorkerError(f"tau2.version {config.version} runs in its own environment; {BUILD_HINT}")
    if not Path(python).is_file():
        raise Tau2WorkerError(f"tau2.python (or ${TAU2_V1_PYTHON_ENV}) {python!r} does not exist; {BUILD_HINT}")
    return python


def worker_environment() -> dict[str, str]:
    """A worker's environment: ours, without what points an interpreter at the project's environment."""
    env = {key: value for key, value in os.environ.items() if key not in _FOREIGN_PYTHON_VARIABLES}
    env["PYTHONPATH"] = str(WORKER_DIR)
    env.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    return env


#: What a retrieval variant may call that this project connects (``configure_retrieval``'s ``needs``), beyond the
#: release's own offline indexes (BM25, grep) and prompts: an embedding endpoint (``tau2.embeddings``) and tau2's
#: shell sandbox (``tau2.shell``).
EMBEDDING_NEEDS = {"openai_embeddings": "openai", "openrouter_embeddings": "openrouter"}
SERVED_RETRIEVAL_NEEDS: frozenset[str] = frozenset({*EMBEDDING_NEEDS, "shell", "reranker"})
#: tau2's own key variable per embedding provider, read when ``tau2.embeddings`` names no endpoint.
PROVIDER_KEY_VARIABLES = {"openai": "OPENAI_API_KEY", "openrouter": "OPENROUTER_API_KEY"}
#: The domains whose environments take a retrieval variant.
KNOWLEDGE_DOMAINS = ("banking_knowledge",)
#: tau2 v1.0.1's variants that call no outside service (and no shell sandbox).
OFFLINE_RETRIEVAL_VARIANTS = ("bm25_grep", "bm25", "grep_only", "no_knowledge", "full_kb", "golden_retrieval")


class Tau2Worker:
    """One worker process of the configured tau2 release. Use as a context manager, or call :meth:`close`."""

    def __init__(self, config: Tau2ReleaseConfig, stderr: Any = None):
        if config.version == "v0.2.1":
            raise ValueError("tau2.version v0.2.1 is the project's own environment; it needs no worker")
        self.config = config
        python, env = release_python(config), worker_environment()
        self._process = forked_worker(python, WORKER_FILE, env, stderr, config.start_timeout_s) or subprocess.Popen(
            [python, "-u", str(WORKER_FILE)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr if stderr is not None else sys.stderr,
            env=env,
            text=True,
            bufsize=1,
        )
        self._lock = threading.Lock()
        self._next_id = 0
        self._answers = self._process.stdout.fileno()  # read by os.read: select() sees what no buffer holds
        self._pending = bytearray()
        ready = self._read_line(config.start_timeout_s, "starting")
        expected = config.version.removeprefix("v")
        if ready.get("tau2_version") != expected:
            self.close()
            raise Tau2WorkerError(
                f"tau2.python has tau2 {ready.get('tau2_version')}, not {expected} as tau2.version says; {BUILD_HINT}"
            )
        self.tau2_version = config.version
        judge = config.judge
        self.request(
            "configure_judge",
            model=judge.model,
            base_url=judge.base_url,
            api_key_env=judge.api_key_env,
            num_retries=0,  # one call per attempt: the retries are ours (verify), each a whole, safe re-grade
            timeout=judge.timeout_s,
        )
        #: The retrieval variant as the release resolved it, and the outside services it calls.
        self.retrieval = self._configure_retrieval(config)

    def _configure_retrieval(self, config: Tau2ReleaseConfig) -> dict[str, Any]:
        """Hand the worker ``tau2.retrieval_variant``; a variant the release does not have, or one that calls a
        service this project does not connect yet, is refused here, before any episode (one line, naming the key)."""
        try:
            resolved = self.request(
                "configure_retrieval", variant=config.retrieval_variant, kwargs=config.retrieval_kwargs or None
            )
        except Tau2RequestError as e:
            self.close()
            raise Tau2WorkerError(f"tau2.retrieval_variant / tau2.retrieval_kwargs: {e}") from None
        unserved = [need for need in resolved["needs"] if need not in SERVED_RETRIEVAL_NEEDS]
        if unserved:
            self.close()
            raise Tau2WorkerError(
                f"tau2.retrieval_variant {config.retrieval_variant!r} calls {', '.join(unserved)}, which nemo-tau2 "
                f"does not connect yet; offline variants: {', '.join(OFFLINE_RETRIEVAL_VARIANTS)}"
            )
        providers = [EMBEDDING_NEEDS[need] for need in resolved["needs"] if need in EMBEDDING_NEEDS]
        if "shell" in resolved["needs"]:  # first: indexing the embeddings builds an environment, sandbox included
            shell = config.shell.model_dump()
            resolved["shell"] = self._connect("shell", "connect_shell", config.start_timeout_s, **shell)
        if "reranker" in resolved["needs"]:  # before the embeddings: their indexing builds an environment
            self._check_key(config, "reranker", "openai")
            resolved["reranker"] = self._connect("reranker", "connect_reranker", config.start_timeout_s,
                                                 **config.reranker.model_dump(exclude={"timeout_s"}),
                                                 request_timeout_s=config.reranker.timeout_s)  # fmt: skip
        if providers:
            resolved["embeddings"] = self._connect_embeddings(config, providers[0])
        return resolved

    def _check_key(self, config: Tau2ReleaseConfig, block: str, provider: str) -> None:
        """The service's key, where one is needed, must be in the environment (never in the config)."""
        service = getattr(config, block)
        variable = service.api_key_env or (None if service.base_url else PROVIDER_KEY_VARIABLES[provider])
        if variable and not os.environ.get(variable):
            self.close()
            named = f"tau2.{block}.api_key_env names" if service.api_key_env else "it needs"
            raise Tau2WorkerError(
                f"tau2.retrieval_variant {config.retrieval_variant!r} calls {provider}'s API for its {block} and "
                f"{named} ${variable}, which is not set: export it, or set tau2.{block}.base_url to an "
                "OpenAI-compatible endpoint (vLLM, llama.cpp; docs/banking-knowledge.md)"
            )

    def _connect(self, block: str, op: str, wait_s: float, **args: Any) -> dict[str, Any]:
        """``op`` in the worker; a refusal or a service that fails it closes the worker, naming ``tau2.<block>``."""
        try:
            return self.request(op, wait_s=wait_s, **args)
        except (Tau2RequestError, Tau2WorkerError) as e:
            self.close()
            raise Tau2WorkerError(f"tau2.{block}: {e}") from None

    def _connect_embeddings(self, config: Tau2ReleaseConfig, provider: str) -> dict[str, Any]:
        """Point the variant's embedder at ``tau2.embeddings`` and have the worker index the corpus now: a missing
        key, or an endpoint that cannot embed it, is refused here in one line, before any episode."""
        self._check_key(config, "embeddings", provider)
        embeddings = config.embeddings
        variable = embeddings.api_key_env or (None if embeddings.base_url else PROVIDER_KEY_VARIABLES[provider])
        return self._connect(
            "embeddings",
            "connect_embeddings",
            config.start_timeout_s,
            base_url=embeddings.base_url,
            model=embeddings.model,
            api_key_env=variable,
            request_timeout_s=embeddings.timeout_s,
            cache_dir=embeddings.cache_dir or str(cache_root() / "embeddings"),
        )

    def _read_line(self, timeout_s: float, doing: str) -> dict:
        """The worker's next answer line: waited for with select() (no thread per request: ~0.1 ms of each)."""
        deadline = time.monotonic() + timeout_s
        while (end := self._pending.find(b"\n")) < 0:
            ready, _, _ = select.select([self._answers], [], [], max(deadline - time.monotonic(), 0))
            chunk = os.read(self._answers, 1 << 20) if ready else None
            if not chunk:
                state = self._exit_state() if chunk == b"" else f"gave no answer in {timeout_s:.0f} s"
                raise Tau2WorkerError(f"tau2 {self.config.version} worker {state} while {doing} (its stderr says why)")
            self._pending += chunk
        line = bytes(self._pending[:end])
        del self._pending[: end + 1]
        return json.loads(line)

    def _exit_state(self, wait_s: float = 1.0) -> str:
        """How the worker ended, once its answers closed: a process is reaped a moment after its pipes close, so
        its exit status is waited for (up to ``wait_s``) rather than read at once (``poll()`` then says None)."""
        try:
            return f"exited with status {self._process.wait(timeout=wait_s)}"
        except subprocess.TimeoutExpired:
            return f"closed its output and was still running {wait_s:.0f} s later"

    def request(self, op: str, *, wait_s: float = 600.0, **args: Any) -> Any:
        """One request (``args``: the operation's; ``wait_s``: how long its answer is waited for); returns its
        result or raises the error type its answer names."""
        with self._lock:
            self._next_id += 1
            try:
                self._process.stdin.write(json.dumps({"id": self._next_id, "op": op, "args": args}) + "\n")
                self._process.stdin.flush()
            except (BrokenPipeError, ValueError) as e:
                raise Tau2WorkerError(f"tau2 {self.config.version} worker is gone ({e})") from e
            reply = self._read_line(wait_s, f"answering {op}")
        if reply.get("ok"):
            return reply["result"]
        kind, error = reply.get("kind"), reply.get("error")
        if kind == "bad_request":
            raise Tau2RequestError(error)
        if kind == "judge":
            raise Tau2JudgeError(error)
        if kind == "service":
            raise Tau2ServiceError(error)
        raise Tau2WorkerError(f"tau2 {self.config.version} {op} failed: {error}")

    def verify(self, episode_id: str, messages: list[dict], termination_reason: str) -> dict:
        """The release's reward for a live episode (the worker drops it once scored), judge retried."""
        return self._judged(
            "verify", episode_id, episode_id=episode_id, messages=messages, termination_reason=termination_reason
        )

    def score(self, domain: str, task_id: str, messages: list[dict], termination_reason: str) -> dict:
        """The release's reward for a trajectory of the task, judge retried. Stateless (no episode of this
        worker's), so a worker of its own can score while another serves the episodes' tool calls."""
        return self._judged(
            "evaluate",
            f"{domain} task {task_id}",
            domain=domain,
            task_id=task_id,
            messages=messages,
            termination_reason=termination_reason,
        )

    def _judged(self, op: str, what: str, **args: Any) -> dict:
        """``op`` tried up to ``judge.max_attempts`` times while the judge faults: each try a whole, safe re-grade."""
        attempts = self.config.judge.max_attempts
        for attempt in range(1, attempts + 1):
            try:
                return self.request(op, **args)
            except Tau2JudgeError as e:
                if attempt == attempts:
                    raise Tau2JudgeError(f"{e} (after {attempts} attempts)") from e
                logger.warning("%s: %s; grading again (%d of %d)", what, e, attempt + 1, attempts)
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._process.poll() is None:
            self._process.stdin.close()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()

    def __enter__(self) -> "Tau2Worker":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def worker_for(config: Tau2ReleaseConfig, running: Tau2Worker | None = None) -> AbstractContextManager[Tau2Worker]:
    """``running`` (left running), else a worker of ``config``'s release started for the block and closed after it."""
    return contextlib.nullcontext(running) if running is not None else Tau2Worker(config)
