"""Where the trainer ranks run: one in this process, or ``num_workers`` Ray actors joined in a torch.distributed group.

Both groups answer ``run(method, per_worker_args)`` (one call per rank, results in rank order),
``run_rank0(method, *args)`` and ``stream_rank0(method, *args)`` (a generator method run on every rank, rank 0's
items streamed back); the :class:`~nemo_tau2.models.policy.lm_policy.Policy` does not know which it holds.

Ray actors take one CPU (``device: cpu``, gloo) or one GPU each (``device: cuda``, NCCL; Ray sets
``CUDA_VISIBLE_DEVICES`` so each sees its GPU as ``cuda:0``). If Ray is not running, it is started for this
process (``num_cpus`` = workers on CPU, no dashboard) and stopped on ``shutdown``; a Ray the caller started is
used and left running. With FSDP2 only rank 0 receives (or loads) the model; the other ranks get its architecture.
With ``megatron_cfg.enabled`` the actors are ``MegatronPolicyWorker`` ranks (always actors: megatron-core's parallel
state is per process).
A sharded policy with one rank runs in this process in a one-rank group of its own.
"""

import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from nemo_tau2.cluster import ClusterConfig, import_ray, ray_connection
from nemo_tau2.models.policy.building import architecture_of
from nemo_tau2.models.policy.config import PolicyConfig
from nemo_tau2.models.policy.worker import PolicyWorker

logger = logging.getLogger(__name__)


class LocalWorkerGroup:
    """The single replica, in this process (no Ray, no process group)."""

    world_size = 1

    def __init__(self, cfg: PolicyConfig, **worker_kwargs: Any) -> None:
        self.worker = PolicyWorker(cfg, **worker_kwargs)
        if cfg.dtensor_cfg.enabled:
            self.worker.init_distributed(self.worker.rendezvous_address())

    def run(self, method: str, per_worker_args: Sequence[tuple]) -> list[Any]:
        (args,) = per_worker_args
        return [getattr(self.worker, method)(*args)]

    def run_rank0(self, method: str, *args: Any) -> Any:
        return getattr(self.worker, method)(*args)

    def stream_rank0(self, method: str, *args: Any) -> Iterator[Any]:
        yield from getattr(self.worker, method)(*args)

    def shutdown(self) -> None:
        self.worker.close()


class RayWorkerGroup:
    """``cfg.num_workers`` :class:`PolicyWorker` actors in one data-parallel process group.

    Args:
        cfg: The policy config (``num_workers`` > 1, or any with ``megatron_cfg.enabled``).
        model / tokenizer: Objects to replicate (shipped once through the object store), or None to let each
            actor load ``cfg.model_name``.
        init_reference_model: Passed to every worker.
        seed: Worker ``r`` seeds its RNGs with ``seed + r``.
        ray_init_kwargs: Extra ``ray.init`` arguments, used only if this group starts Ray.
    """

    def __init__(
        self,
        cfg: PolicyConfig,
        *,
        model: PreTrainedModel | None,
        tokenizer: PreTrainedTokenizerBase | None,
        init_reference_model: bool,
        seed: int,
        ray_init_kwargs: dict[str, Any] | None = None,
    ) -> None:
        ray = self._ray = import_ray()
        self.world_size = cfg.num_workers
        self.actors: list[Any] = []
        self._ray_connection = ExitStack()  # a local Ray of this group's own, when no run opened one before it
        started = time.monotonic()
        local_sizing: dict[str, Any] = {"num_cpus": cfg.num_workers} if cfg.device == "cpu" else {}
        self._ray_connection.enter_context(ray_connection(ClusterConfig(), **(local_sizing | (ray_init_kwargs or {}))))
        try:
            resources = {"num_cpus": 1, "num_gpus": 1 if cfg.device == "cuda" else 0}
            worker_cls: type = PolicyWorker
            if cfg.megatron_cfg.enabled:  # its own module; megatron-core is imported only by its ranks
                from nemo_tau2.models.megatron.worker import MegatronPolicyWorker

                worker_cls = MegatronPolicyWorker
            actor_cls = ray.remote(**resources)(worker_cls)
            shared = {"tokenizer": tokenizer, "init_reference_model": init_reference_model}
            model_ref = ray.put(model) if model is not None else None
            if cfg.dtensor_cfg.enabled:  # rank 0 holds the weights, the others build empty shards of the architecture
                others = {"model_config": architecture_of(cfg, model)}
                per_rank = [{"model": model_ref}] + [others] * (self.world_size - 1)
            else:
                per_rank = [{"model": model_ref}] * self.world_size
            self.actors = [
                actor_cls.remote(cfg, rank=rank, world_size=self.world_size, **shared, **per_rank[rank])
                for rank in range(self.world_size)
            ]
            address = ray.get(self.actors[0].rendezvous_address.remote())
            ray.get([actor.init_distributed.remote(address) for actor in self.actors])
            ray.get([actor.seed.remote(seed + rank) for rank, actor in enumerate(self.actors)])
            self.node_ids: list[str] = ray.get([actor.__ray_call__.remote(_node_id) for actor in self.actors])
        except BaseException:
            self.shutdown()
            raise
        logger.info(
            "%d Ray policy workers ready in %.1f s on %d node(s) of the Ray cluster at %s",
            self.world_size, time.monotonic() - started, len(set(self.node_ids)),
            ray.get_runtime_context().gcs_address,
        )  # fmt: skip

    def run(self, method: str, per_worker_args: Sequence[tuple]) -> list[Any]:
        if len(per_worker_args) != len(self.actors):
            raise ValueError(f"{method}: {len(per_worker_args)} argument tuples for {len(self.actors)} workers")
        pairs = zip(self.actors, per_worker_args, strict=True)
        futures = [getattr(actor, method).remote(*args) for actor, args in pairs]
        return self._ray.get(futures)

    def run_rank0(self, method: str, *args: Any) -> Any:
        return self._ray.get(getattr(self.actors[0], method).remote(*args))

    def stream_rank0(self, method: str, *args: Any) -> Iterator[Any]:
        """Run the generator ``method`` on every rank; yield rank 0's items as they come (at most two in flight,
        so the object store never holds the whole stream). Every rank's walk is finished even if the consumer
        stops early: they are collectives."""
        ray = self._ray
        streams = [
            getattr(actor, method)
            .options(num_returns="streaming", _generator_backpressure_num_objects=2)
            .remote(*args)
            for actor in self.actors
        ]
        try:
            for ref in streams[0]:
                yield ray.get(ref)
        finally:
            for stream in streams:
                for ref in stream:
                    ray.get(ref)

    def shutdown(self) -> None:
        """Leave the process group, end the actors, and stop Ray if this group started it."""
        ray = self._ray
        if self.actors:
            try:
                ray.get([actor.close.remote() for actor in self.actors], timeout=60)
                # they answered: each exits as a process does, its atexit handlers run (ray.kill skips them, and
                # with them coverage's save of the ranks' code); ray.kill below ends any that has not
                ends = [actor.__ray_terminate__.remote() for actor in self.actors]
                ray.wait(ends, num_returns=len(ends), timeout=30)
            except (ray.exceptions.RayError, TimeoutError) as e:
                logger.warning("policy workers did not close cleanly: %s", e)
            for actor in self.actors:
                ray.kill(actor)
            self.actors = []
        self._ray_connection.close()


def _node_id(_worker: PolicyWorker) -> str:
    """The Ray node a worker actor runs on (run inside the actor through ``__ray_call__``)."""
    return import_ray().get_runtime_context().get_node_id()
