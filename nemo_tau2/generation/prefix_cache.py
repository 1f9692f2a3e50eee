"""vLLM's prefix-cache counters, read from each replica's ``/metrics``, to report a run's cache hit rate.

Multi-turn episodes re-send their whole history every turn; how much of it vLLM serves from its prefix cache (not
recomputed) shows whether episodes stay on the replica that holds their history (sticky routing) and whether weight
updates reset the cache as they must. vLLM counts queried and hit prompt tokens per engine
(``vllm:prefix_cache_queries_total``, ``vllm:prefix_cache_hits_total``); a run's rate is the change of the two
summed over replicas between its start and its end. Backends that do not expose them give None.
"""

import logging
import urllib.error
import urllib.request
from dataclasses import dataclass

logger = logging.getLogger(__name__)

QUERIES = "vllm:prefix_cache_queries_total"
HITS = "vllm:prefix_cache_hits_total"


@dataclass(frozen=True)
class PrefixCacheCounters:
    """Prompt tokens looked up in, and found in, the prefix cache, summed over replicas (monotonic counters)."""

    queries: float
    hits: float

    def hit_rate_since(self, earlier: "PrefixCacheCounters") -> float | None:
        """Hits / queries between ``earlier`` and these counters; None when nothing was queried."""
        queries = self.queries - earlier.queries
        return (self.hits - earlier.hits) / queries if queries > 0 else None


def parse_prefix_cache_counters(metrics_text: str) -> PrefixCacheCounters | None:
    """The two counters in Prometheus text (summed over label sets), or None if the text has neither."""
    found = {QUERIES: 0.0, HITS: 0.0}
    seen = False
    for line in metrics_text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in found:
            found[name] += float(line.rsplit(" ", 1)[1])
            seen = True
    return PrefixCacheCounters(found[QUERIES], found[HITS]) if seen else None


def read_prefix_cache_counters(base_urls: list[str], timeout_s: float = 10.0) -> PrefixCacheCounters | None:
    """The counters summed over the replicas behind ``base_urls`` (each ending in ``/v1``); None when any replica
    does not report them (another backend, or an unreachable replica: a partial sum would mislead)."""
    queries = hits = 0.0
    for base_url in base_urls:
        url = base_url.removesuffix("/").removesuffix("/v1") + "/metrics"
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as response:
                counters = parse_prefix_cache_counters(response.read().decode(errors="replace"))
        except (urllib.error.URLError, OSError, ValueError) as e:
            logger.debug("no prefix-cache counters from %s: %s", url, e)
            return None
        if counters is None:
            return None
        queries, hits = queries + counters.queries, hits + counters.hits
    return PrefixCacheCounters(queries, hits)
