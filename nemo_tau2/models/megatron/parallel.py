"""megatron-core's parallel state for this process: CPU mode when CUDA is absent, TP/PP groups, seeded RNG streams.

The caller owns ``torch.distributed`` (gloo on CPU, NCCL on GPUs); this sets megatron-core's groups on top of it.
Data parallelism is what remains: ``world_size / (TP * PP)`` ranks.
"""

import torch.distributed as dist

from nemo_tau2.models.megatron.cpu_mode import apply_cpu_mode


def initialize_megatron(tensor_model_parallel_size: int, pipeline_model_parallel_size: int, seed: int) -> None:
    """Megatron's TP/PP/DP groups over the existing process group, and its RNG tracker seeded per TP rank."""
    apply_cpu_mode()
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    if not dist.is_initialized():
        raise RuntimeError("megatron backend: torch.distributed must be initialised before megatron-core")
    world = dist.get_world_size()
    model_parallel = tensor_model_parallel_size * pipeline_model_parallel_size
    if world % model_parallel:
        raise ValueError(
            f"megatron backend: world size {world} is not divisible by TP x PP = {model_parallel}; "
            "set policy.num_workers to a multiple of it"
        )
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=tensor_model_parallel_size,
        pipeline_model_parallel_size=pipeline_model_parallel_size,
    )
    model_parallel_cuda_manual_seed(seed)


def destroy_megatron() -> None:
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
