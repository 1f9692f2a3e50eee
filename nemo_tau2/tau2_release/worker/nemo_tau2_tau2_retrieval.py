"""The environment arguments of a run, for the worker: what tau2 v1.0.1's runner passes a domain's environment.

Most domains take none. banking_knowledge takes its knowledge-retrieval variant (tau2's ``--retrieval-config``, with
``--retrieval-config-kwargs``), the task (``golden_retrieval`` puts the task's documents in the prompt) and the
read-log allowlist (the discoverable read tools the task's gold calls: only their calls are logged for the DB
hash). They come from the runner's own ``_build_env_kwargs`` on a ``TextRunConfig`` of the run, so they are tau2's
by construction, for the seed, the prompt and tools, and the three environments ``evaluate_simulation`` builds.
"""

import hashlib

from tau2.data_model.simulation import TextRunConfig
from tau2.runner.build import _build_env_kwargs

KNOWLEDGE_DOMAINS = ("banking_knowledge",)


class RunRetrieval:
    """The run's variant (None: tau2's own default for the domain, ``alltools``) and its keyword overrides."""

    def __init__(self) -> None:
        self.fields: dict = {}

    def configure(self, variant: str | None, kwargs: dict | None = None) -> dict:
        """Check ``variant`` against the release's registry (``ValueError``, naming the variants, if unknown) and
        keep it. Returns its canonical name, the outside services it calls (:func:`variant_needs`) and whether the
        agent's prompt differs from task to task."""
        if variant is None:
            self.fields = {}
            return {"variant": None, "needs": [], "task_specific": False}
        from tau2.domains.banking_knowledge.retrieval import resolve_variant

        resolved = resolve_variant(variant, **(kwargs or {}))
        share_bm25_indexes()
        self.fields = {"retrieval_config": variant, "retrieval_config_kwargs": dict(kwargs) if kwargs else None}
        # golden_retrieval's prompt holds the task's own documents (tau2: "the policy is task-specific")
        task_specific = resolved.name == "golden_retrieval"
        return {"variant": resolved.name, "needs": variant_needs(resolved), "task_specific": task_specific}

    def env_kwargs(self, domain: str, task) -> dict:
        """What tau2's runner passes ``domain``'s environment constructor for ``task``."""
        fields = self.fields if domain in KNOWLEDGE_DOMAINS else {}
        return _build_env_kwargs(TextRunConfig(domain=domain, **fields), task)

    def run_fields(self, domain: str) -> dict:
        """The ``TextRunConfig`` fields a results file of ``domain`` records (the variant, for a knowledge domain)."""
        return dict(self.fields) if domain in KNOWLEDGE_DOMAINS else {}


def variant_needs(variant) -> list:
    """The outside services a variant calls: ``shell`` (tau2's sandbox, confined by bubblewrap), ``openai_embeddings``
    or ``openrouter_embeddings`` (an embedding endpoint), ``reranker`` (an LLM through litellm)."""
    needs = []
    if getattr(variant, "shell", None) is not None:
        needs.append("shell")
    for spec in (variant.kb_search, variant.kb_search_bm25, variant.kb_search_dense):
        if spec is None:
            continue
        if spec.type == "embedding":
            needs.append(f"{spec.embedder_type}_embeddings")
        if spec.reranker:
            needs.append("reranker")
    return sorted(set(needs))


def share_bm25_indexes() -> None:
    """One BM25 index per corpus and worker, not one per environment: tau2's ``bm25_indexer`` tokenises the 698
    documents and builds ``BM25Okapi`` for every environment it builds (~45 ms; four an episode: the seed and the
    evaluator's three). The index is only read afterwards (``get_scores``), so every environment of the worker gets
    the same one, keyed by a digest of the documents' ids and texts: what tau2 would have built, built once."""
    import tau2.knowledge.document_preprocessors.bm25_indexer  # noqa: F401  (its import registers it)
    import tau2.knowledge.registry as registry

    base = registry.DOCUMENT_PREPROCESSORS["bm25_indexer"]
    if getattr(base, "nemo_tau2_shared", False):
        return
    built: dict[tuple, tuple] = {}

    class SharedBM25Indexer(base):
        nemo_tau2_shared = True

        def process(self, documents, state):
            digest = hashlib.sha256()
            for doc in documents:
                text = doc.get(self.content_field) or doc.get("content") or doc.get("text") or ""
                digest.update(f"{doc.get('id')}\0{text}\0".encode())
            key = (self.state_key, digest.hexdigest())
            if key not in built:
                fresh: dict = {}
                super().process(documents, fresh)
                built[key] = (fresh[self.state_key], fresh[f"{self.state_key}_doc_ids"])
            state[self.state_key], doc_ids = built[key]
            state[f"{self.state_key}_doc_ids"] = list(doc_ids)
            return documents

    registry.DOCUMENT_PREPROCESSORS["bm25_indexer"] = SharedBM25Indexer
