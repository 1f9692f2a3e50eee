"""A vLLM worker extension that reloads weights from a checkpoint directory, for in-place updates during training.

vLLM mixes ``--worker-extension-cls`` into every GPU worker; its dev-mode ``POST /collective_rpc`` route then calls
a method of that class on all workers of a server (string arguments only). The trainer saves a checkpoint
(``save_pretrained``: ``*.safetensors``) and each replica streams it through the model's own ``load_weights``,
which knows the model's tensor-parallel sharding and fused layouts; the engine, KV cache and HTTP server stay up.

This module is imported inside vLLM's worker processes only; it needs torch and safetensors, not vLLM.
"""

from collections.abc import Iterator
from pathlib import Path

RELOAD_METHOD = "nemo_tau2_load_checkpoint"


def iter_checkpoint_tensors(checkpoint_dir: str) -> Iterator[tuple[str, "object"]]:
    """(name, CPU tensor) for every tensor of every ``*.safetensors`` file in ``checkpoint_dir``."""
    from safetensors import safe_open

    files = sorted(Path(checkpoint_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in checkpoint_dir {checkpoint_dir!r}")
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as tensors:
            for name in tensors.keys():  # noqa: SIM118 - safe_open objects are not iterable
                yield name, tensors.get_tensor(name)


class CheckpointReloadExtension:
    """Mixed into vLLM workers; ``self.model_runner`` is the worker's."""

    def nemo_tau2_load_checkpoint(self, checkpoint_dir: str) -> int:
        """Load every tensor of ``checkpoint_dir`` into the running model; returns how many parameters changed."""
        import torch

        loaded = self.model_runner.model.load_weights(weights=iter_checkpoint_tensors(checkpoint_dir))  # type: ignore[attr-defined]
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return len(loaded) if loaded is not None else -1
