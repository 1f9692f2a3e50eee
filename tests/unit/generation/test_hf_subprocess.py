"""The hf backend as a standalone process: served from a checkpoint dir, updated over HTTP, stopped cleanly."""

import pathlib

import pytest

from nemo_tau2.generation import GenerationStartupError, start_generation
from nemo_tau2.generation.surface_check import call_json
from nemo_tau2.generation.tiny_model import WEATHER_TOOL, build_tiny_model

from .conftest import TOOL_PROMPT, hf_config

CALL_TIMEOUT_S = 300  # one call to a CPU server on a busy machine (call_json asks for its wait)


def processes_with_port(port: int) -> list[int]:
    """Pids whose command line has ``--port <port>`` (how our launchers pass it)."""
    needle = f"--port\0{port}\0".encode()
    pids = []
    for cmdline in pathlib.Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if needle in cmdline.read_bytes():
                pids.append(int(cmdline.parent.name))
        except OSError:
            continue
    return pids


def _greedy_tool_calls(handle):
    body = {"messages": TOOL_PROMPT, "tools": [WEATHER_TOOL], "temperature": 0.0, "max_tokens": 40}
    status, response = call_json("POST", f"{handle.base_urls[0]}/chat/completions", body, timeout_s=CALL_TIMEOUT_S)
    assert status == 200, response
    return response["choices"][0]["message"]["tool_calls"]


def test_standalone_server_updates_weights_from_a_checkpoint_and_leaves_no_process(taught_tiny, tmp_path):
    taught_dir, other_dir = tmp_path / "taught", tmp_path / "other"
    taught_tiny.model.save_pretrained(taught_dir)
    taught_tiny.tokenizer.save_pretrained(taught_dir)
    build_tiny_model(seed=1).model.save_pretrained(other_dir)

    handle = start_generation(hf_config(in_process=False).model_copy(update={"model_name": str(taught_dir)}))
    port = int(handle.base_urls[0].removesuffix("/v1").rsplit(":", 1)[1])
    try:
        assert processes_with_port(port)
        assert _greedy_tool_calls(handle)[0]["function"]["name"] == "get_weather"
        assert handle.update_weights(checkpoint_dir=str(other_dir)) == 1
        assert not _greedy_tool_calls(handle)  # the untrained weights serve now
        with pytest.raises(ValueError, match="is not a directory"):
            handle.update_weights(checkpoint_dir=str(tmp_path / "missing"))
        with pytest.raises(NotImplementedError, match="only hf with in_process"):
            handle.update_weights({})
    finally:
        handle.shutdown()
    assert processes_with_port(port) == []


@pytest.mark.parametrize("in_process", [True, False])
def test_a_missing_model_directory_is_one_clear_sentence(tmp_path, in_process):
    cfg = hf_config(in_process=in_process).model_copy(update={"model_name": str(tmp_path / "nowhere")})
    with pytest.raises(GenerationStartupError, match="is not a model directory"):
        start_generation(cfg)


def test_an_uncached_model_id_is_reported_instead_of_downloaded():
    cfg = hf_config().model_copy(update={"model_name": "someone/not-cached-model"})
    with pytest.raises(GenerationStartupError, match="nothing is downloaded at run time"):
        start_generation(cfg)
