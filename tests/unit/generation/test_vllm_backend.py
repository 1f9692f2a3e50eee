"""The vllm backend without a server: command line, process environment, interpreter checks, checkpoint layouts.

The live server is exercised in test_vllm_live.py.
"""

import importlib.util
import struct
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from nemo_tau2.generation import GenerationConfig, GenerationStartupError
from nemo_tau2.generation.safetensors_layout import CheckpointLayoutError, layout_differences, read_layout
from nemo_tau2.generation.surface_check import error_body
from nemo_tau2.generation.vllm_launcher import (
    EXTENSION_DIR,
    TESTED_VLLM_VERSION,
    VLLM_ENV_FOLDER_ENV,
    VLLM_PYTHON_ENV,
    VllmReplicas,
    WeightUpdateError,
    replica_cpu_binds,
    replica_gpu_groups,
    require_vllm,
    vllm_python,
    vllm_server_command,
    vllm_server_env,
)
from tests.env_python import environment_python


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


def test_config_translates_to_one_openai_server_command_line_run_by_the_configured_python():
    cfg = _cfg(
        python="/envs/vllm/bin/python",
        tensor_parallel_size=2,
        gpu_memory_utilization=0.6,
        max_model_len=8192,
        http_server_serving_chat_kwargs={"tool_parser": "hermes", "chat_template": "/t/chat.jinja"},
        extra_args=["--max-num-seqs", "64"],
    )
    command = vllm_server_command(cfg, port=8123)
    assert command[:3] == ["/envs/vllm/bin/python", "-m", "nemo_tau2_vllm_server"]  # ours: vLLM's + the splice
    flags = _flags(command)
    assert flags["--model"] == flags["--served-model-name"] == "Qwen/Qwen3-4B-Instruct-2507"
    assert (flags["--host"], flags["--port"]) == ("127.0.0.1", "8123")
    assert flags["--tensor-parallel-size"] == "2" and flags["--gpu-memory-utilization"] == "0.6"
    assert flags["--max-model-len"] == "8192" and flags["--dtype"] == "bfloat16"
    assert "--enable-auto-tool-choice" in flags and flags["--tool-call-parser"] == "hermes"
    assert flags["--chat-template"] == "/t/chat.jinja"
    assert flags["--generation-config"] == "vllm"  # the model's generation_config.json must not change sampling
    assert flags["--worker-extension-cls"] == "nemo_tau2_vllm_extension.WeightReloadExtension"
    assert "--enforce-eager" not in flags  # cuda: compiled graphs unless asked
    assert command[-2:] == ["--max-num-seqs", "64"]


def test_stock_vllm_can_still_be_asked_for_with_the_same_flags():
    ours, stock = (vllm_server_command(_cfg(server=server), port=1) for server in ("nemo_tau2", "stock"))
    assert stock[2] == "vllm.entrypoints.openai.api_server" and stock[3:] == ours[3:]


def test_optional_flags_are_left_out_when_not_configured():
    flags = _flags(vllm_server_command(_cfg(http_server_serving_chat_kwargs={"enable_auto_tools": False}), port=1))
    for absent in ("--max-model-len", "--enable-auto-tool-choice", "--tool-call-parser", "--chat-template"):
        assert absent not in flags


def test_cpu_mode_runs_eager_hides_gpus_sizes_the_kv_cache_and_never_asks_for_gpu_memory():
    cfg = _cfg(device="cpu", cpu_kvcache_space_gb=3, python="/envs/vllm-cpu/bin/python")
    flags = _flags(vllm_server_command(cfg, port=1))
    assert "--enforce-eager" in flags and "--gpu-memory-utilization" not in flags
    vllm_cfg = cfg.vllm_cfg
    assert vllm_cfg is not None
    env = vllm_server_env(vllm_cfg, [], base={"PYTHONPATH": "/project/site", "VIRTUAL_ENV": "/project/.venv"})
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["VLLM_CPU_KVCACHE_SPACE"] == "3"
    assert env["VLLM_SERVER_DEV_MODE"] == "1"
    # another environment's interpreter sees only our extension's folder, not this environment's paths
    assert env["PYTHONPATH"] == str(EXTENSION_DIR) and "VIRTUAL_ENV" not in env
    explicit = _cfg(device="cpu", enforce_eager=False).vllm_cfg
    assert explicit is not None and "--enforce-eager" not in _flags(
        vllm_server_command(_cfg(**explicit.model_dump()), port=1)
    )


def test_cuda_mode_gives_each_replica_its_own_gpus():
    vllm_cfg = _cfg(python=sys.executable).vllm_cfg
    assert vllm_cfg is not None
    env = vllm_server_env(vllm_cfg, ["2", "3"], base={"PYTHONPATH": "/project/site"})
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3" and "VLLM_CPU_KVCACHE_SPACE" not in env
    assert env["PYTHONPATH"].split(":") == [str(EXTENSION_DIR), "/project/site"]  # same environment: kept


def test_replicas_get_disjoint_tensor_parallel_gpu_groups():
    assert replica_gpu_groups(["0", "1", "2", "3"], 2, 2) == [["0", "1"], ["2", "3"]]
    assert replica_gpu_groups(["4", "5"], 1, 2) == [["4"], ["5"]]
    with pytest.raises(GenerationStartupError, match=r"need 4 GPU\(s\).*set vllm_cfg.device=cpu"):
        replica_gpu_groups(["0", "1"], 2, 2)


def test_cpu_replicas_bind_their_threads_to_disjoint_cores():
    """Left to vLLM, every CPU replica binds its threads to the same first core (each is a server of its own)."""
    assert replica_cpu_binds([0, 1], 1, 2) == ["0", "1"]
    assert replica_cpu_binds([0, 1, 2, 3, 4], 1, 2) == ["0,1", "2,3"]
    assert replica_cpu_binds([2, 3, 4, 5, 6, 7, 8, 9], 2, 2) == ["2,3|4,5", "6,7|8,9"]
    assert replica_cpu_binds([0, 1], 1, 3) == ["nobind"] * 3  # fewer cores than ranks: the threads float
    assert replica_cpu_binds([0, 1], 1, 1) is None  # one replica: vLLM's own choice


def test_the_interpreter_comes_from_the_config_then_the_environment_variable_then_this_process(monkeypatch, tmp_path):
    monkeypatch.setenv(VLLM_PYTHON_ENV, "/from/env/python")
    assert vllm_python(_cfg(python="/from/config/python").vllm_cfg) == "/from/config/python"
    assert vllm_python(_cfg().vllm_cfg) == "/from/env/python"
    monkeypatch.delenv(VLLM_PYTHON_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # no environment built there
    assert vllm_python(_cfg().vllm_cfg) == sys.executable


def test_with_nothing_exported_the_environment_the_set_up_built_is_found_else_one_line_names_the_set_up(
    monkeypatch, tmp_path
):
    """A user who ran `scripts/setup.sh` runs a vLLM config with nothing exported: the environment is found where
    the set-up built it (the same folder the build script prints, asked here: seconds when cached). Without one,
    and without vLLM in this interpreter, the error is one line naming the set-up command."""
    for variable in (VLLM_PYTHON_ENV, VLLM_ENV_FOLDER_ENV):
        monkeypatch.delenv(variable, raising=False)
    printed = environment_python(VLLM_PYTHON_ENV, "vllm", "vLLM")  # `scripts/setup.sh vllm`'s last line
    monkeypatch.delenv(VLLM_PYTHON_ENV)  # environment_python exports it for what the tests start
    cpu = _cfg(device="cpu").vllm_cfg
    assert vllm_python(cpu) == printed and require_vllm(cpu).startswith(TESTED_VLLM_VERSION)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # a machine where the set-up did not run
    assert vllm_python(cpu) == sys.executable
    with pytest.raises(GenerationStartupError) as refused:
        require_vllm(cpu)
    assert "\n" not in str(refused.value) and "run `scripts/setup.sh vllm` (found there" in str(refused.value)
    half_built = tmp_path / "nemo-tau2" / Path(printed).parents[1].name  # no stamp: a build that did not finish
    (half_built / "bin").mkdir(parents=True)
    (half_built / "bin" / "python").symlink_to(printed)
    assert vllm_python(cpu) == sys.executable
    (half_built / ".nemo_tau2_stamp").write_text("cpu\n")
    assert vllm_python(cpu) == str(half_built / "bin" / "python")


def test_an_interpreter_without_vllm_or_that_does_not_exist_is_named_with_the_command_that_builds_one(tmp_path):
    # vLLM runs from its own environment (its pins conflict with NeMo-Gym's): the project's has none
    assert importlib.util.find_spec("vllm") is None
    with pytest.raises(GenerationStartupError, match=r"has no vllm package: build it with `scripts/setup.sh vllm`"):
        require_vllm(_cfg(python=sys.executable, device="cpu").vllm_cfg)
    missing = str(tmp_path / "nope" / "python")
    with pytest.raises(GenerationStartupError, match=r"which does not exist; build it with .*--device cuda"):
        require_vllm(_cfg(python=missing).vllm_cfg)
    with pytest.raises(GenerationStartupError, match="does not exist"):  # nothing else starts
        VllmReplicas(_cfg(python=missing))


def test_both_vllm_error_shapes_are_read():
    flat = {"object": "error", "message": "maximum context length is 8", "type": "BadRequestError", "code": 400}
    nested = {
        "error": {"message": "maximum context length is 8", "type": "BadRequestError", "param": None, "code": 400}
    }
    assert error_body(flat)["message"] == error_body(nested)["message"] == "maximum context length is 8"
    for not_an_error in ({"detail": "x"}, {"error": "text"}, [], "text", None, {"object": "error"}):
        assert error_body(not_an_error) is None


# ---------------------------------------------------------------------------------------------------- layouts


def _folder(tmp_path, name, tensors: dict[str, torch.Tensor]):
    folder = tmp_path / name
    folder.mkdir()
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


def test_a_layout_is_read_from_headers_and_differences_are_named(tmp_path):
    served = {"a.weight": torch.zeros(4, 2), "b.weight": torch.zeros(3)}
    reference = read_layout(_folder(tmp_path, "ref", served))
    assert reference == {"a.weight": (4, 2), "b.weight": (3,)}
    same = read_layout(_folder(tmp_path, "same", {k: torch.ones_like(v) for k, v in served.items()}))
    assert layout_differences(reference, same) == []
    other = read_layout(_folder(tmp_path, "other", {"a.weight": torch.zeros(2, 4), "c.weight": torch.zeros(1)}))
    problems = layout_differences(reference, other)
    assert problems == [
        "1 tensor(s) missing: b.weight",
        "1 unexpected tensor(s): c.weight",
        "1 tensor(s) of another shape: a.weight [2, 4] (expected [4, 2])",
    ]


@pytest.mark.parametrize("cut", [0, 5, 8, 20, -1])
def test_a_torn_or_foreign_checkpoint_file_is_refused(tmp_path, cut):
    folder = _folder(tmp_path, "torn", {"a.weight": torch.zeros(64, 64)})
    path = folder / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[:cut] if cut >= 0 else data[:-1])
    with pytest.raises(CheckpointLayoutError):
        read_layout(folder)


def test_a_header_that_is_not_json_and_an_empty_folder_are_refused(tmp_path):
    folder = tmp_path / "garbage"
    folder.mkdir()
    with pytest.raises(CheckpointLayoutError, match=r"no \*.safetensors files"):
        read_layout(folder)
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", 4) + b"{{{{")
    with pytest.raises(CheckpointLayoutError, match="unreadable safetensors header"):
        read_layout(folder)


def test_a_checkpoint_is_checked_against_the_served_models_layout_before_anything_is_sent(tmp_path):
    replicas = VllmReplicas.__new__(VllmReplicas)  # no server: check_checkpoint reads files only
    replicas.layout = read_layout(_folder(tmp_path, "served", {"w": torch.zeros(2, 2)}))
    assert replicas.check_checkpoint(str(_folder(tmp_path, "good", {"w": torch.ones(2, 2)}))) == {"w": (2, 2)}
    with pytest.raises(WeightUpdateError, match="tensor.* missing: w.*the previous weights keep serving"):
        replicas.check_checkpoint(str(_folder(tmp_path, "bad", {"v": torch.ones(2, 2)})))
    with pytest.raises(WeightUpdateError, match="no \\*.safetensors files"):
        replicas.check_checkpoint(str(tmp_path / "missing"))


# ------------------------------------------------------------------------------------------ worker extension


def _extension():
    spec = importlib.util.spec_from_file_location("ext", EXTENSION_DIR / "nemo_tau2_vllm_extension.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_worker_extension_reprepares_exactly_the_modules_that_share_a_weight():
    prepared = []

    class Method:
        def process_weights_after_loading(self, layer):
            prepared.append(layer.name)

    class Layer(torch.nn.Module):
        def __init__(self, name, weight):
            super().__init__()
            self.name, self.weight, self.quant_method = name, weight, Method()

    shared = torch.nn.Parameter(torch.zeros(4, 2))
    model = torch.nn.ModuleList(
        [Layer("embed", shared), Layer("lm_head", shared), Layer("mlp", torch.nn.Parameter(torch.zeros(3, 3)))]
    )
    calls = []

    class Worker(_extension().WeightReloadExtension):
        def reload_weights(self, **kwargs):
            calls.append(kwargs)

        class model_runner:  # noqa: N801 - stands in for vLLM's attribute
            @staticmethod
            def get_model():
                return model

    assert Worker().nemo_tau2_reload_weights("/ckpt") == 2
    assert calls == [{"weights_path": "/ckpt"}] and sorted(prepared) == ["embed", "lm_head"]
