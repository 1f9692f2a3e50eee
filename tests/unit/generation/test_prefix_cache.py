"""Reading vLLM's prefix-cache counters from Prometheus text (the live tests read them from real vLLM)."""

from nemo_tau2.generation.prefix_cache import PrefixCacheCounters, parse_prefix_cache_counters

METRICS = """# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 184.0
vllm:prefix_cache_queries_created{engine="0",model_name="m"} 1.79e+09
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 128.0
vllm:external_prefix_cache_hits_total{engine="0",model_name="m"} 7.0
vllm:prefix_cache_queries_total{engine="1",model_name="m"} 16.0
"""


def test_counters_are_summed_over_engines_and_other_series_are_ignored():
    assert parse_prefix_cache_counters(METRICS) == PrefixCacheCounters(queries=200.0, hits=128.0)


def test_text_without_the_counters_gives_none():
    assert parse_prefix_cache_counters("# nothing\nother_metric 1.0\n") is None


def test_a_runs_hit_rate_is_the_change_of_both_counters():
    start, end = PrefixCacheCounters(100, 40), PrefixCacheCounters(300, 190)
    assert end.hit_rate_since(start) == 0.75
    assert start.hit_rate_since(start) is None
