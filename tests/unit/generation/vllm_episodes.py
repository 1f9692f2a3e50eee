"""tau2 mock episodes on the module's vLLM replicas, each behind a recording proxy, for the live tests."""

from dataclasses import dataclass, field

from nemo_tau2.experience.rollouts import RolloutResult, SamplingParams, run_nemo_gym_rollout_sync
from nemo_tau2.generation import GenerationConfig
from nemo_tau2.generation.launch import GenerationHandle
from nemo_tau2.generation.prefix import find_token_prefix
from nemo_tau2.generation.surface_check import call_json
from nemo_tau2.gym.environment import Tau2Environment, Tau2EnvironmentSpec
from nemo_tau2.gym.episode_config import NemoGymEnvConfig
from nemo_tau2.tau2_env.gym_rows import task_row
from tests.replica_proxy import ReplicaProxy

CALL_TIMEOUT_S = 300  # one call to a CPU server on a busy machine (call_json asks for its wait)

TASKS = ("update_task_1", "create_task_1", "impossible_task_1")


@dataclass
class MockRun:
    results: list[RolloutResult]
    proxies: list[ReplicaProxy]
    hit_rate: float | None = None
    per_replica: list[list[tuple[dict, dict]]] = field(default_factory=list)

    def completions(self) -> list[tuple[dict, dict]]:
        return [pair for replica in self.per_replica for pair in replica]

    def later_turn_hit_rate(self) -> float:
        """Share of the prompt tokens of turns >= 2 that vLLM served from its prefix cache (each answer's
        ``usage.prompt_tokens_details.cached_tokens``; the server runs with ``--enable-prompt-tokens-details``)."""
        cached = prompt = 0
        for request, answer in self.completions():
            if find_token_prefix(request["messages"]) is not None:
                usage = answer["usage"]
                cached += (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
                prompt += usage["prompt_tokens"]
        return cached / prompt

    def turns_off_their_replica(self) -> int:
        """Turns (t+1) served by another replica than the one that generated turn t."""
        answered = [
            {tuple(answer["prompt_token_ids"] + answer["choices"][0]["token_ids"]) for _, answer in replica}
            for replica in self.per_replica
        ]
        off = 0
        for index, replica in enumerate(self.per_replica):
            for request, _ in replica:
                recorded = find_token_prefix(request["messages"])
                off += recorded is not None and tuple(recorded) not in answered[index]
        return off


def mock_episodes(
    vllm: GenerationHandle,
    *,
    strip_token_ids: bool = False,
    routing: str = "sticky",
    temperature: float = 0.0,
    samples: int = 1,
) -> MockRun:
    """Run the mock tasks through proxies in front of ``vllm``'s replicas (prefix caches reset first)."""
    for base_url in vllm.base_urls:
        status, answer = call_json(
            "POST", base_url.removesuffix("/v1") + "/reset_prefix_cache", {}, timeout_s=CALL_TIMEOUT_S
        )
        assert status == 200, answer
    proxies = [ReplicaProxy(url, strip_token_ids=strip_token_ids) for url in vllm.base_urls]
    try:
        policy = GenerationHandle(backend="vllm", base_urls=[p.base_url for p in proxies], model_name=vllm.model_name)
        spec = Tau2EnvironmentSpec(
            policy=policy,
            user=GenerationConfig(backend="fake", fake_cfg={}, temperature=0.0, top_p=1.0),
            domains=["mock"],
            gym=NemoGymEnvConfig(max_steps=12, return_token_ids=True, replica_routing=routing),
        )
        rows = [task_row("mock", task, split="base") | {"sample_index": k} for task in TASKS for k in range(samples)]
        sampling = SamplingParams(temperature=temperature, top_p=1.0, max_new_tokens=48)
        with Tau2Environment(spec) as environment:
            before = policy.prefix_cache_counters()
            results = run_nemo_gym_rollout_sync(rows, environment.agent_urls, sampling, 1, keep_full_result=True)
            after = policy.prefix_cache_counters()
        hit_rate = after.hit_rate_since(before) if before and after else None
        return MockRun(results, proxies, hit_rate, [list(p.completions) for p in proxies])
    finally:
        for proxy in proxies:
            proxy.__exit__()
