"""The vllm backend: config -> command line and GPU layout on CPU; the live server only where a GPU is."""

import importlib.util
import os

import pytest
import torch
from safetensors.torch import save_file

from nemo_tau2.generation import GenerationConfig, GenerationStartupError, start_generation
from nemo_tau2.generation.surface_check import ToolCallProbe, check_surface
from nemo_tau2.generation.tiny_model import WEATHER_TOOL
from nemo_tau2.generation.vllm_launcher import replica_gpu_groups, require_vllm, vllm_server_command
from nemo_tau2.generation.vllm_worker import CheckpointReloadExtension, iter_checkpoint_tensors

from .conftest import TOOL_PROMPT

HAS_VLLM = importlib.util.find_spec("vllm") is not None


def _cfg(**vllm_cfg) -> GenerationConfig:
    return GenerationConfig(
        backend="vllm", model_name="Qwen/Qwen3-4B-Instruct-2507", temperature=1.0, top_p=1.0, vllm_cfg=vllm_cfg
    )


def _flags(command: list[str]) -> dict[str, str | None]:
    flags: dict[str, str | None] = {}
    for i, part in enumerate(command):
        if part.startswith("--"):
            following = command[i + 1] if i + 1 < len(command) else None
            flags[part] = None if following is None or following.startswith("--") else following
    return flags


def test_config_translates_to_one_openai_server_command_line():
    cfg = _cfg(
        tensor_parallel_size=2,
        gpu_memory_utilization=0.6,
        max_model_len=8192,
        http_server_serving_chat_kwargs={"tool_parser": "hermes", "chat_template": "/t/chat.jinja"},
        extra_args=["--max-num-seqs", "64"],
    )
    command = vllm_server_command(cfg, port=8123, python="python")
    assert command[:3] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
    flags = _flags(command)
    assert flags["--model"] == flags["--served-model-name"] == "Qwen/Qwen3-4B-Instruct-2507"
    assert (flags["--host"], flags["--port"]) == ("127.0.0.1", "8123")
    assert flags["--tensor-parallel-size"] == "2" and flags["--gpu-memory-utilization"] == "0.6"
    assert flags["--max-model-len"] == "8192" and flags["--dtype"] == "bfloat16"
    assert "--enable-auto-tool-choice" in flags and flags["--tool-call-parser"] == "hermes"
    assert flags["--chat-template"] == "/t/chat.jinja"
    assert flags["--generation-config"] == "vllm"  # the model's generation_config.json must not change sampling
    assert flags["--worker-extension-cls"] == "nemo_tau2.generation.vllm_worker.CheckpointReloadExtension"
    assert command[-2:] == ["--max-num-seqs", "64"]


def test_optional_flags_are_left_out_when_not_configured():
    flags = _flags(vllm_server_command(_cfg(http_server_serving_chat_kwargs={"enable_auto_tools": False}), port=1))
    for absent in ("--max-model-len", "--enable-auto-tool-choice", "--tool-call-parser", "--chat-template"):
        assert absent not in flags


def test_replicas_get_disjoint_tensor_parallel_gpu_groups():
    assert replica_gpu_groups(["0", "1", "2", "3"], 2, 2) == [["0", "1"], ["2", "3"]]
    assert replica_gpu_groups(["4", "5"], 1, 2) == [["4"], ["5"]]
    with pytest.raises(GenerationStartupError, match=r"2 replica\(s\) x tensor_parallel_size 2 need 4 GPU\(s\)"):
        replica_gpu_groups(["0", "1"], 2, 2)


@pytest.mark.skipif(HAS_VLLM, reason="vllm is installed here, so the missing-dependency message cannot show")
def test_missing_vllm_says_how_to_install_it():
    with pytest.raises(GenerationStartupError, match=r"install it with `uv sync --extra vllm`"):
        require_vllm()
    with pytest.raises(GenerationStartupError, match="needs the vllm package"):
        start_generation(_cfg())


def test_worker_extension_streams_a_saved_checkpoint_into_load_weights(taught_tiny, tmp_path):
    taught_tiny.model.save_pretrained(tmp_path)
    received = {}

    class _Model:  # stands in for a vLLM model: load_weights consumes (name, tensor) pairs
        def load_weights(self, weights):
            received.update(weights)
            return set(received)

    class _Runner:
        model = _Model()

    worker = CheckpointReloadExtension()
    worker.model_runner = _Runner()
    assert worker.nemo_tau2_load_checkpoint(str(tmp_path)) == len(received) > 0
    expected = taught_tiny.model.state_dict()
    for name, tensor in received.items():
        assert torch.equal(tensor, expected[name])


def test_a_checkpoint_dir_without_safetensors_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors files"):
        list(iter_checkpoint_tensors(str(tmp_path)))
    save_file({"w": torch.zeros(2)}, str(tmp_path / "a.safetensors"))
    assert [name for name, _ in iter_checkpoint_tensors(str(tmp_path))] == ["w"]


@pytest.mark.skipif(
    not (torch.cuda.is_available() and HAS_VLLM), reason="needs a CUDA GPU and the vllm extra (uv sync --extra vllm)"
)
def test_live_vllm_server_speaks_the_surface(tmp_path):
    model = os.environ.get("NEMO_TAU2_VLLM_TEST_MODEL", "Qwen/Qwen3-0.6B")
    cfg = GenerationConfig(
        backend="vllm",
        model_name=model,
        temperature=1.0,
        top_p=1.0,
        vllm_cfg={"gpu_memory_utilization": 0.5, "max_model_len": 4096, "enforce_eager": True},
    )
    probe = ToolCallProbe(
        messages=TOOL_PROMPT, tools=[WEATHER_TOOL], tool_choice="required", expect_tool_calls_finish=False
    )
    with start_generation(cfg) as handle:
        # stock vLLM ignores prompt_token_ids on messages and accepts stream/top_k/stop (see vllm_launcher)
        check_surface(handle.base_urls[0], tool_probe=probe, check_splice=False, check_rejections=False)
