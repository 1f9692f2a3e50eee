"""The CPU mode patches megatron-core only where CUDA is absent, and only inside megatron-core's own modules."""

import importlib.util
import sys

import pytest
import torch

from nemo_tau2.models.megatron import cpu_mode

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("megatron") is None, reason="needs the megatron extra (uv sync --extra megatron)"
)


def test_nothing_is_patched_where_cuda_is_available(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(cpu_mode, "_applied", False)
    before = {name: getattr(sys.modules.get(name), "torch", None) for name in cpu_mode.PATCHED_MODULES}
    assert cpu_mode.apply_cpu_mode() is False
    after = {name: getattr(sys.modules.get(name), "torch", None) for name in cpu_mode.PATCHED_MODULES}
    assert after == before
    assert not any(isinstance(value, cpu_mode._TorchOnCpu) for value in after.values())


def test_the_view_of_torch_maps_cuda_to_the_cpu_and_leaves_torch_alone():
    view = cpu_mode._TorchOnCpu()
    assert view.cuda.current_device() == torch.device("cpu")
    assert view.zeros(2, device="cuda").device.type == "cpu"
    assert view.tensor([1.0], device=torch.device("cuda", 0)).device.type == "cpu"
    assert view.empty(1, device="meta").device.type == "meta"  # other devices pass through
    torch.manual_seed(3)
    state = view.cuda.get_rng_state()
    assert torch.equal(state, torch.get_rng_state())
    assert view.nn is torch.nn and view.float32 is torch.float32
    assert torch.cuda.current_device is not view.cuda.current_device  # torch itself is untouched
