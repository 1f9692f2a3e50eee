"""The outside services tau2 calls, pointed at the endpoints the run configures (runs in the worker): the
NL-assertion judge, and the embedding endpoint and LLM reranker of banking_knowledge's retrieval variants.

tau2 v1.0.1's embedders build their own OpenAI clients: ``OpenAIEmbedder`` on ``OPENAI_BASE_URL``/``OPENAI_API_KEY``
from the process environment, ``OpenRouterEmbedder`` on OpenRouter's URL. Pointing the process environment elsewhere
would also move the NL judge's and the reranker's litellm/OpenAI calls, so instead the two registries tau2's
pipelines look embedders up in (the document indexer's and the query encoder's) get subclasses of tau2's own
embedders whose client is the configured endpoint: what tau2 sends (texts, model, the Qwen query instruction) and
does with the vectors is its own. The same mechanism as the judge: tau2's module-level settings, rebound once at
start.

Document embeddings are computed once per model and corpus, not once per environment (tau2 builds four per
episode, and reads its pickle back for each): :class:`SharedEmbeddingsCache` takes the place of tau2's cache, keeps
them in memory and on disk (``<cache_dir>/<provider>-<model>-<corpus digest>.npz``, written whole by rename), and
the first indexing runs under a lock of the folder, so workers starting together embed the corpus once.

An endpoint that fails mid-episode must not become a tool answer (tau2's ``get_response`` turns any exception
into an ``Error: ...`` message the policy would be scored on): each failure is recorded, and the worker raises
:class:`ServiceError` for the request it happened in (an infrastructure error, never a score).
"""

import fcntl
import hashlib
import json
import os
import re
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import tau2.evaluator.evaluator_nl_assertions as nl_assertions
from openai import OpenAI
from pydantic.errors import PydanticUserError

#: tau2's own key variable per provider (its embedders read it when given no key).
DEFAULT_KEY_VARIABLES = {"openai": "OPENAI_API_KEY", "openrouter": "OPENROUTER_API_KEY"}


class ServiceError(Exception):
    """An outside service failed while a request was answered: infrastructure, never a score."""


class Refused(ValueError):
    """A service the run configures cannot be used here (one line naming the key and the fix): refused at start."""


_endpoint: dict = {}
_faults: list[str] = []
_counts = {"document_texts": 0, "query_texts": 0, "document_requests": 0, "query_requests": 0}


def take_faults() -> list[str]:
    """The failures recorded since the last call (each: which endpoint, what failed)."""
    faults = list(_faults)
    _faults.clear()
    return faults


def record_fault(message: str) -> None:
    _faults.append(message)


def raise_faults(doing: str) -> None:
    """:class:`ServiceError` if a service failed during ``doing`` (its answer then says nothing true)."""
    faults = take_faults()
    if faults:
        raise ServiceError(f"{faults[-1]} while {doing}")


def counts() -> dict:
    return dict(_counts)


def configure_judge(model: str, base_url: str | None = None, api_key_env: str | None = None, **llm_args) -> dict:
    """Point tau2's NL-assertion judge (its model and litellm arguments) at the configured endpoint."""
    args = dict(nl_assertions.DEFAULT_LLM_NL_ASSERTIONS_ARGS)
    args.update({key: value for key, value in llm_args.items() if value is not None})
    litellm_model = model
    if base_url:
        litellm_model = model if model.startswith("openai/") else f"openai/{model}"
        args["api_base"] = base_url
        args["api_key"] = os.environ.get(api_key_env, "") if api_key_env else "none"
    elif api_key_env:
        args["api_key"] = os.environ.get(api_key_env, "")
    nl_assertions.DEFAULT_LLM_NL_ASSERTIONS = litellm_model
    nl_assertions.DEFAULT_LLM_NL_ASSERTIONS_ARGS = args
    return {"model": litellm_model, "base_url": base_url}


def connect_embeddings(
    base_url: str | None, model: str | None, api_key_env: str | None, request_timeout_s: float, cache_dir: str, index
) -> dict:
    """Register the configured endpoint with tau2's embedding pipelines, install the shared cache, and ``index``
    (build one environment: the corpus embedded, or read from the cache) under the cache folder's lock."""
    import tau2.knowledge.document_preprocessors.embedding_indexer as indexer
    import tau2.knowledge.embeddings_cache as embeddings_cache
    import tau2.knowledge.input_preprocessors.embedding_encoder as encoder

    _endpoint.update(
        base_url=base_url, model=model, api_key_env=api_key_env, timeout_s=request_timeout_s, cache_dir=cache_dir
    )
    for registry, role in ((indexer.EMBEDDER_REGISTRY, "document"), (encoder.EMBEDDER_REGISTRY, "query")):
        for provider in ("openai", "openrouter"):
            base = registry[provider]
            if not getattr(base, "nemo_tau2_configured", False):
                registry[provider] = _one_per_settings(_configured_embedder(base, provider, role))
    embeddings_cache._global_cache = SharedEmbeddingsCache(Path(cache_dir))
    with cache_lock():
        try:
            index()
        except Exception:
            raise_faults("embedding the knowledge base")
            raise
    return {"base_url": base_url, "model": model, "cache_dir": cache_dir, "counts": counts()}


def _configured_embedder(base: type, provider: str, role: str) -> type:
    class Configured(base):
        nemo_tau2_configured = True

        def __init__(self, model: str, **params):
            variable = _endpoint["api_key_env"] or (None if _endpoint["base_url"] else DEFAULT_KEY_VARIABLES[provider])
            key = (os.environ.get(variable, "") if variable else "") or "none"
            super().__init__(model=_endpoint["model"] or model, api_key=key, **params)
            if _endpoint["base_url"]:
                self.client = OpenAI(base_url=_endpoint["base_url"], api_key=key, timeout=_endpoint["timeout_s"])
            else:
                self.client = self.client.with_options(timeout=_endpoint["timeout_s"])
            self.endpoint = f"{provider} embeddings at {self.client.base_url}"

        def embed(self, texts, *args, **kwargs):
            _counts[f"{role}_requests"] += 1
            try:
                vectors = super().embed(texts, *args, **kwargs)
            except Exception as e:
                _faults.append(f"{self.endpoint} failed ({type(e).__name__}: {_one_line(e)})")
                raise
            _counts[f"{role}_texts"] += len(texts)
            return vectors

    Configured.__name__ = Configured.__qualname__ = f"Configured{base.__name__}"
    return Configured


def _one_per_settings(cls: type):
    """What the registry builds ``cls`` with, one instance per settings and worker: tau2 builds a new embedder or
    reranker, hence a new OpenAI client (~20 ms: its HTTP client and TLS context), for every environment it builds;
    these hold no state of an episode (their query cache is tau2's own, process-wide), so all share one."""
    instances: dict[str, object] = {}

    def build(**params):
        key = json.dumps(params, sort_keys=True, default=str)
        if key not in instances:
            instances[key] = cls(**params)
        return instances[key]

    build.nemo_tau2_configured = True
    build.nemo_tau2_base = cls.__mro__[1]
    return build


def _one_line(error: Exception) -> str:
    return re.sub(r"\s+", " ", str(error)).strip()[:300]


def connect_reranker(
    base_url: str | None, model: str | None, api_key_env: str | None, request_timeout_s: float
) -> dict:
    """Register, for tau2's ``pointwise_llm_reranker``, a subclass of its own whose client is the configured
    endpoint. tau2 drops a document whose rating fails (``rate_doc`` returns None on any exception): a silent
    change of the search results, so each such failure is recorded here and the request answers it as an
    infrastructure error.

    One failure is asked again first: the OpenAI client's own ``PydanticUserError``. tau2 rates in a pool of fresh
    threads, ``parse`` builds its generic response classes in each (pydantic caches them per thread), and pydantic's
    class building is not thread-safe, so a rating can meet a class another thread is still building ("BaseModel
    cannot be instantiated directly", once in a fresh-clone CI run, 2026-12-04). The endpoint had answered and a
    rating is a read, so asking again is safe; a second failure is recorded as any other."""
    import tau2.knowledge.postprocessors.pointwise_llm_reranker  # noqa: F401  (its import registers it)
    import tau2.knowledge.registry as registry

    base = registry.POSTPROCESSORS["pointwise_llm_reranker"]
    base = getattr(base, "nemo_tau2_base", base)  # connected before: tau2's own class again
    variable = api_key_env or (None if base_url else DEFAULT_KEY_VARIABLES["openai"])
    endpoint = {"base_url": base_url, "model": model, "variable": variable, "timeout_s": request_timeout_s}

    class ConfiguredReranker(base):
        nemo_tau2_configured = True

        def __init__(self, model: str = "gpt-5.2", **params):
            key = (os.environ.get(endpoint["variable"], "") if endpoint["variable"] else "") or "none"
            params["api_key"] = key
            super().__init__(model=endpoint["model"] or model, **params)
            if endpoint["base_url"]:
                self.client = OpenAI(base_url=endpoint["base_url"], api_key=key, timeout=endpoint["timeout_s"])
            else:
                self.client = self.client.with_options(timeout=endpoint["timeout_s"])

        def _rate_passage(self, query: str, doc_id: str, passage: str) -> int:
            try:
                try:
                    return super()._rate_passage(query, doc_id, passage)
                except PydanticUserError:  # the client's own classes, half built by another thread (see above)
                    return super()._rate_passage(query, doc_id, passage)
            except Exception as e:
                record_fault(f"reranker at {self.client.base_url} failed ({type(e).__name__}: {_one_line(e)})")
                raise

    registry.POSTPROCESSORS["pointwise_llm_reranker"] = _one_per_settings(ConfiguredReranker)
    return {"base_url": base_url, "model": model or "gpt-5.2"}


class SharedEmbeddingsCache:
    """tau2's ``EmbeddingsCache`` interface (``get``/``put`` of a corpus' embeddings), held in memory and on disk,
    keyed by provider, model (the one actually called) and a digest of every document's id and text."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True)
        self._memory: dict[str, tuple] = {}

    def _path(self, documents: list, embedder_type: str, embedder_config: dict | None) -> Path:
        config = dict(embedder_config or {})
        variant_model = config.pop("model", "default")
        model = _endpoint.get("model") or variant_model
        digest = hashlib.sha256(repr(sorted(config.items())).encode())
        for doc in sorted(documents, key=lambda doc: doc["id"]):
            digest.update(f"{doc['id']}\0{doc['text']}\0".encode())
        safe_model = re.sub(r"[^A-Za-z0-9._-]+", "_", model)
        return self.directory / f"{embedder_type}-{safe_model}-{digest.hexdigest()[:24]}.npz"

    def get(self, documents: list, embedder_type: str, embedder_config: dict | None = None):
        path = self._path(documents, embedder_type, embedder_config)
        if path.name not in self._memory and path.is_file():
            try:
                with np.load(path, allow_pickle=False) as stored:
                    self._memory[path.name] = (stored["embeddings"], [str(i) for i in stored["doc_ids"]])
            except (OSError, ValueError, KeyError):
                path.unlink(missing_ok=True)  # torn or foreign: embedded again, and rewritten whole
        cached = self._memory.get(path.name)
        if cached is None or cached[1] != [doc["id"] for doc in documents]:
            return None
        return cached

    def put(self, documents: list, embedder_type: str, embeddings, doc_ids: list, embedder_config=None) -> None:
        path = self._path(documents, embedder_type, embedder_config)
        self._memory[path.name] = (np.asarray(embeddings), list(doc_ids))
        partial = path.with_name(f".{path.name}.{os.getpid()}.partial.npz")
        np.savez(partial, embeddings=np.asarray(embeddings), doc_ids=np.asarray(doc_ids, dtype=str))
        os.replace(partial, path)


@contextmanager
def cache_lock():
    """The cache folder's lock: one worker indexes a corpus while the others sharing the folder wait, then read."""
    directory = Path(_endpoint["cache_dir"])
    with open(directory / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
