"""megatron-core on a machine without CUDA: the few places where it hard-codes the GPU, pointed at the CPU.

megatron-core (0.19.2) has no CPU mode, yet its model, parallel state, schedules and DDP are plain torch and run on
gloo once these spots stop asking for CUDA. :func:`apply_cpu_mode` swaps the name ``torch`` inside exactly the
modules listed in :data:`PATCHED_MODULES` for :class:`_TorchOnCpu`, a view of torch whose differences are:

- ``torch.cuda.current_device()`` is the CPU device: the global memory buffer (``utils``), RoPE's ``inv_freq``
  without ``use_cpu_initialization``, the gather/scatter buffers of the tensor-parallel collectives (``mappings``,
  ``layers``), the pipeline's send/receive buffers, DDP's grad buffers (``param_and_grad_buffer``) and optimizer
  scratch tensors allocate there; the default causal mask (`transformer.utils`) is built with `device="cuda"`.
- ``torch.cuda.get_rng_state`` / ``set_rng_state`` / ``manual_seed`` are the CPU generator's: the model-parallel RNG
  tracker (``model_parallel_cuda_manual_seed``, ``get_cuda_rng_tracker().fork()``) keeps its per-TP-rank streams on
  the CPU generator, so weight init and dropout in TP regions stay reproducible.
- ``torch.cuda.synchronize()`` (``dist_checkpointing``'s writers), ``current_stream()`` / ``Stream`` / ``Event`` are
  no-ops: DDP's grad sync waits on streams and events
  that do not exist on CPU (gloo's collectives are synchronous for these purposes).
- ``device='cuda'`` in ``torch.tensor`` / ``zeros`` / ``empty`` / ``ones`` becomes the CPU: the grad-norm and
  found-inf scalars of the optimizers and grad clipping.

A few functions use tensor methods that assume CUDA: the optimizers accept a parameter only if ``tensor.type()`` is
``'torch.cuda.FloatTensor'`` (fp32) or ``'torch.cuda.BFloat16Tensor'`` / ``'torch.cuda.HalfTensor'`` (16-bit: these
get an fp32 master copy) (``DistributedOptimizer.__init__`` and ``_build_model_and_main_param_groups``,
``Float16OptimizerWithFloat16Params.__init__``, ``clip_grad_by_total_norm_fp32``), and
``LanguageModule.setup_embeddings_and_output_layer`` moves the tied embedding to the GPU (``weight.data.cuda()``)
before all-reducing it between the first and last pipeline stages. While they run (``_tensor_methods_on_cpu``), a
CPU tensor of those dtypes reports the CUDA type name and ``Tensor.cuda()`` returns the tensor itself; outside those
calls both methods are torch's own.

The RNG helpers ``_get_cuda_rng_state`` / ``_set_cuda_rng_state`` of ``tensor_parallel.random`` go through
``torch.cuda.default_generators`` and ``_lazy_call``; they are replaced by the CPU generator's get/set.

Nothing in torch itself is patched (other code keeps seeing the real ``torch.cuda``), and where CUDA is available
nothing is patched at all: :func:`apply_cpu_mode` returns False and megatron-core runs as released.
"""

import contextlib
import functools
import importlib
import types
from typing import Any

import torch

PATCHED_MODULES = (
    "megatron.core.utils",
    "megatron.core.transformer.utils",
    "megatron.core.tensor_parallel.random",
    "megatron.core.tensor_parallel.mappings",
    "megatron.core.tensor_parallel.layers",
    "megatron.core.tensor_parallel.utils",
    "megatron.core.transformer.module",
    "megatron.core.transformer.attention",
    "megatron.core.transformer.dot_product_attention",
    "megatron.core.transformer.transformer_layer",
    "megatron.core.models.gpt.gpt_model",
    "megatron.core.models.common.embeddings.rotary_pos_embedding",
    "megatron.core.distributed.param_and_grad_buffer",
    "megatron.core.distributed.distributed_data_parallel",
    "megatron.core.distributed.finalize_model_grads",
    "megatron.core.optimizer.optimizer",
    "megatron.core.optimizer.clip_grads",
    "megatron.core.optimizer.distrib_optimizer",
    "megatron.core.pipeline_parallel.schedules",
    "megatron.core.pipeline_parallel.p2p_communication",
    "megatron.core.pipeline_parallel.utils",
    "megatron.core.dist_checkpointing.exchange_utils",
    "megatron.core.dist_checkpointing.strategies.async_utils",
    "megatron.core.dist_checkpointing.strategies.filesystem_async",
    "megatron.core.dist_checkpointing.strategies.fully_parallel",
    "megatron.core.dist_checkpointing.strategies.state_dict_saver",
    "megatron.core.dist_checkpointing.strategies.torch",
)

_CPU = torch.device("cpu")
_applied = False


def _on_cpu(device: Any) -> Any:
    if device is None:
        return None
    as_device = torch.device(device) if isinstance(device, str | torch.device) else None
    return _CPU if as_device is None or as_device.type == "cuda" else device


class _NoStream:
    """A CUDA stream/event stand-in: waiting and recording do nothing (CPU work is already ordered)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def wait_stream(self, *args: Any) -> None:
        pass

    def wait_event(self, *args: Any) -> None:
        pass

    def record_event(self, *args: Any) -> "_NoStream":
        return _NoStream()

    def record(self, *args: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def __enter__(self) -> "_NoStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


class _CudaOnCpu:
    """``torch.cuda`` as the patched modules see it: the CPU device, the CPU generator, no streams."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cuda, name)

    @staticmethod
    def current_device() -> torch.device:
        return _CPU

    @staticmethod
    def is_available() -> bool:
        return False

    @staticmethod
    def get_rng_state(device: Any = None) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, device: Any = None) -> None:
        torch.set_rng_state(state)

    @staticmethod
    def manual_seed(seed: int) -> None:
        torch.manual_seed(seed)

    @staticmethod
    def current_stream(device: Any = None) -> _NoStream:
        return _NoStream()

    @staticmethod
    def stream(stream: Any = None) -> _NoStream:
        return _NoStream()

    @staticmethod
    def synchronize(device: Any = None) -> None:
        pass

    Stream = _NoStream
    Event = _NoStream
    random = types.SimpleNamespace(get_rng_state=lambda device=None: torch.get_rng_state())


def _factory(make: Any) -> Any:
    def on_cpu(*args: Any, device: Any = None, **kwargs: Any) -> torch.Tensor:
        return make(*args, device=_on_cpu(device), **kwargs)

    return on_cpu


class _TorchOnCpu(types.ModuleType):
    """``torch`` for the patched modules: everything is torch's, except ``cuda`` and the factories above."""

    def __init__(self) -> None:
        super().__init__("torch")
        self.cuda = _CudaOnCpu()
        for name in ("tensor", "zeros", "empty", "ones", "full"):
            setattr(self, name, _factory(getattr(torch, name)))

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


_CUDA_TYPE_NAMES = {f"torch.{kind}": f"torch.cuda.{kind}" for kind in ("FloatTensor", "BFloat16Tensor", "HalfTensor")}


@contextlib.contextmanager
def _tensor_methods_on_cpu():
    original_type, original_cuda = torch.Tensor.type, torch.Tensor.cuda

    def cuda_name(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        name = original_type(tensor, *args, **kwargs)
        return _CUDA_TYPE_NAMES.get(name, name) if not args and not kwargs else name

    torch.Tensor.type = cuda_name
    torch.Tensor.cuda = lambda tensor, *args, **kwargs: tensor
    try:
        yield
    finally:
        torch.Tensor.type, torch.Tensor.cuda = original_type, original_cuda


def _with_tensor_methods_on_cpu(function: Any) -> Any:
    @functools.wraps(function)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        with _tensor_methods_on_cpu():
            return function(*args, **kwargs)

    return wrapped


def apply_cpu_mode() -> bool:
    """Point megatron-core's CUDA-only spots at the CPU when CUDA is absent; True if it did (idempotent)."""
    global _applied
    if torch.cuda.is_available():
        return False
    if _applied:
        return True
    torch_on_cpu = _TorchOnCpu()
    for name in PATCHED_MODULES:
        module = importlib.import_module(name)
        module.torch = torch_on_cpu
    random = importlib.import_module("megatron.core.tensor_parallel.random")
    random._get_cuda_rng_state = lambda device="cuda", clone=False, graph_safe=False: torch.get_rng_state()
    random._set_cuda_rng_state = lambda new_state, device=-1, graph_safe=False: torch.set_rng_state(new_state)
    clip_grads = importlib.import_module("megatron.core.optimizer.clip_grads")
    optimizer = importlib.import_module("megatron.core.optimizer.optimizer")
    optimizer.clip_grad_by_total_norm_fp32 = _with_tensor_methods_on_cpu(clip_grads.clip_grad_by_total_norm_fp32)
    distributed = importlib.import_module("megatron.core.optimizer.distrib_optimizer").DistributedOptimizer
    build = distributed.__dict__["_build_model_and_main_param_groups"].__func__  # a classmethod
    distributed._build_model_and_main_param_groups = classmethod(_with_tensor_methods_on_cpu(build))
    distributed.__init__ = _with_tensor_methods_on_cpu(distributed.__init__)
    optimizer.Float16OptimizerWithFloat16Params.__init__ = _with_tensor_methods_on_cpu(
        optimizer.Float16OptimizerWithFloat16Params.__init__
    )
    language = importlib.import_module("megatron.core.models.common.language_module.language_module").LanguageModule
    language.setup_embeddings_and_output_layer = _with_tensor_methods_on_cpu(
        language.setup_embeddings_and_output_layer
    )
    _applied = True
    return True
