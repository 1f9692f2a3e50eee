"""The hf backend over real HTTP: surface, tool calls, token ids, exact logprobs, batching, weight updates."""

import concurrent.futures
import copy
import json
import socket
import time

import pytest
import torch

from nemo_tau2.generation import GenerationStartupError, start_generation
from nemo_tau2.generation.surface_check import ToolCallProbe, call_json, check_surface
from nemo_tau2.generation.tiny_model import WEATHER_TOOL, build_tiny_model
from tests.forward_logprobs import forward_logprobs

from .conftest import TOOL_PROMPT, TOOL_REPLY, hf_config

CALL_TIMEOUT_S = 300  # one call to a CPU server on a busy machine (call_json asks for its wait)

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello! How can I help you today?"}]


def _chat(handle, messages, **fields):
    body = {"model": handle.model_name, "messages": messages, "logprobs": True, "top_logprobs": 0}
    body |= {"return_tokens_as_token_ids": True} | fields
    status, response = call_json("POST", f"{handle.base_urls[0]}/chat/completions", body, timeout_s=CALL_TIMEOUT_S)
    assert status == 200, response
    return response


def _reported(response, weight_version: int = 0) -> tuple[list[int], list[int], torch.Tensor]:
    assert response["weight_version"] == weight_version  # the label of the weights that sampled it
    choice = response["choices"][0]
    reported = torch.tensor([entry["logprob"] for entry in choice["logprobs"]["content"]])
    return response["prompt_token_ids"], choice["token_ids"], reported


def test_hf_server_passes_the_surface_check_with_a_tool_call(hf_handle):
    probe = ToolCallProbe(messages=TOOL_PROMPT, tools=[WEATHER_TOOL], expected_name="get_weather")
    report = check_surface(hf_handle.base_urls[0], tool_probe=probe)
    (call,) = report.tool_completion["choices"][0]["message"]["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}


def test_tool_call_tokens_detokenize_to_the_parsed_text(hf_handle, taught_tiny):
    response = _chat(hf_handle, TOOL_PROMPT, tools=[WEATHER_TOOL], temperature=0.0, max_tokens=64)
    generated = response["choices"][0]["token_ids"]
    assert generated[-1] == taught_tiny.tokenizer.eos_token_id  # the end-of-turn token is reported, as vLLM does
    assert taught_tiny.tokenizer.decode(generated, skip_special_tokens=True) == TOOL_REPLY


def test_sampled_token_ids_detokenize_to_the_returned_text(hf_handle, taught_tiny):
    response = _chat(hf_handle, CHAT, max_tokens=24, seed=3)
    generated = response["choices"][0]["token_ids"]
    content = response["choices"][0]["message"]["content"] or ""
    assert taught_tiny.tokenizer.decode(generated, skip_special_tokens=True) == content
    root = hf_handle.base_urls[0].removesuffix("/v1")
    status, detok = call_json("POST", f"{root}/detokenize", {"tokens": generated}, timeout_s=CALL_TIMEOUT_S)
    assert status == 200 and detok["prompt"] == taught_tiny.tokenizer.decode(generated)
    status, tok = call_json("POST", f"{root}/tokenize", {"prompt": detok["prompt"]}, timeout_s=CALL_TIMEOUT_S)
    assert status == 200 and tok["tokens"] == taught_tiny.tokenizer(detok["prompt"]).input_ids


def test_logprobs_match_a_forward_pass_before_and_after_an_in_place_update(taught_tiny):
    untrained = build_tiny_model(seed=1).model
    with start_generation(
        hf_config(batch_wait_ms=200), model=copy.deepcopy(untrained), tokenizer=taught_tiny.tokenizer
    ) as handle:
        prompts = [CHAT, TOOL_PROMPT, CHAT[1:]]  # different lengths: batched rows are left-padded

        def sample_all(seed, weight_version):
            with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
                jobs = [pool.submit(_chat, handle, m, max_tokens=12, seed=seed + i) for i, m in enumerate(prompts)]
                return [_reported(job.result(), weight_version) for job in jobs]

        for prompt_ids, generated, reported in sample_all(seed=10, weight_version=0):
            expected = forward_logprobs(untrained, prompt_ids, generated)
            assert torch.allclose(reported, expected, atol=1e-4), (reported - expected).abs().max()
        assert handle.engine.largest_batch >= 2

        assert handle.update_weights(taught_tiny.model.state_dict(), weight_version=3) == 3  # a trainer step
        for prompt_ids, generated, reported in sample_all(seed=20, weight_version=3):
            expected = forward_logprobs(taught_tiny.model, prompt_ids, generated)
            assert torch.allclose(reported, expected, atol=1e-4), (reported - expected).abs().max()
            stale = forward_logprobs(untrained, prompt_ids, generated)
            assert not torch.allclose(reported, stale, atol=1e-2)  # the served weights did change


def test_batched_greedy_generation_equals_one_at_a_time(taught_tiny):
    with start_generation(
        hf_config(batch_wait_ms=200), model=copy.deepcopy(taught_tiny.model), tokenizer=taught_tiny.tokenizer
    ) as handle:
        prompts = [CHAT, TOOL_PROMPT, CHAT[1:], TOOL_PROMPT[1:]]
        alone = [_chat(handle, m, temperature=0.0, max_tokens=10)["choices"][0]["token_ids"] for m in prompts]
        with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
            jobs = [pool.submit(_chat, handle, m, temperature=0.0, max_tokens=10) for m in prompts]
            together = [job.result()["choices"][0]["token_ids"] for job in jobs]
        assert handle.engine.largest_batch >= 2
        assert together == alone


def test_update_weights_rejects_a_state_dict_of_another_shape_and_changes_nothing(hf_handle):
    before = {name: tensor.clone() for name, tensor in hf_handle.engine.model.state_dict().items()}
    other = build_tiny_model(seed=0, hidden_size=32).model.state_dict()
    other["model.embed_tokens.weight"] = torch.zeros_like(before["model.embed_tokens.weight"])  # would fit
    with pytest.raises(ValueError, match="has shape"):
        hf_handle.update_weights(other)
    after = hf_handle.engine.model.state_dict()
    assert all(torch.equal(before[name], after[name]) for name in before)
    with pytest.raises(ValueError, match="missing"):
        hf_handle.update_weights({})
    assert hf_handle.engine.weight_version == 0


def test_forced_tool_choice_is_refused_without_constrained_decoding(hf_handle):
    body = {"messages": TOOL_PROMPT, "tools": [WEATHER_TOOL], "tool_choice": "required"}
    status, error = call_json("POST", f"{hf_handle.base_urls[0]}/chat/completions", body, timeout_s=CALL_TIMEOUT_S)
    assert status == 400 and "tool_choice" in error["message"] and error["object"] == "error"


def test_wrong_model_name_is_404_naming_the_served_model(hf_handle):
    status, error = call_json(
        "POST",
        f"{hf_handle.base_urls[0]}/chat/completions",
        {"model": "x", "messages": CHAT},
        timeout_s=CALL_TIMEOUT_S,
    )
    assert status == 404 and "`tiny`" in error["message"]


def test_busy_configured_port_is_reported_before_starting(taught_tiny):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(GenerationStartupError, match=f"hf_cfg.port: port {port} on 127.0.0.1 is already in use"):
            start_generation(hf_config(port=port), model=taught_tiny.model, tokenizer=taught_tiny.tokenizer)


def test_shutdown_stops_the_server_and_frees_its_port(taught_tiny):
    handle = start_generation(hf_config(), model=copy.deepcopy(taught_tiny.model), tokenizer=taught_tiny.tokenizer)
    root = handle.base_urls[0].removesuffix("/v1")
    port = int(root.rsplit(":", 1)[1])
    handle.shutdown()
    handle.shutdown()  # idempotent
    with socket.socket() as probe, pytest.raises(ConnectionRefusedError):
        probe.connect(("127.0.0.1", port))
    with socket.socket() as probe:  # free again (connections in TIME_WAIT do not block a listener)
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", port))
    assert not handle.engine.running


def test_a_failing_engine_is_a_500_in_the_error_shape_not_a_hang(taught_tiny):
    with start_generation(hf_config(), model=copy.deepcopy(taught_tiny.model), tokenizer=taught_tiny.tokenizer) as h:
        h.engine.close()
        status, error = call_json(
            "POST", f"{h.base_urls[0]}/chat/completions", {"messages": CHAT, "max_tokens": 2}, timeout_s=CALL_TIMEOUT_S
        )
        assert status == 500 and error["object"] == "error" and "model backend failed" in error["message"]


def test_an_update_waits_for_completions_in_flight_which_keep_one_weight_version(taught_tiny):
    untrained = build_tiny_model(seed=1).model
    with start_generation(hf_config(), model=copy.deepcopy(untrained), tokenizer=taught_tiny.tokenizer) as handle:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            job = pool.submit(_chat, handle, CHAT, max_tokens=200, temperature=0.0)
            while handle.engine.largest_batch == 0:
                time.sleep(0.005)
            assert not job.done()
            assert handle.update_weights(taught_tiny.model.state_dict()) == 1
            prompt_ids, generated, reported = _reported(job.result(), weight_version=0)  # says so, too
        assert len(generated) == 200  # long enough to be in flight during the update
        expected = forward_logprobs(untrained, prompt_ids, generated)
        assert torch.allclose(reported, expected, atol=1e-4)  # all of it from the weights it started with
        tool_reply = _chat(handle, TOOL_PROMPT, tools=[WEATHER_TOOL], temperature=0.0, max_tokens=64)
        _, after, _ = _reported(tool_reply, weight_version=1)
        assert taught_tiny.tokenizer.decode(after, skip_special_tokens=True) == TOOL_REPLY


def test_each_of_many_concurrent_requests_gets_its_own_completion(taught_tiny):
    """Rows join and leave the running batch in waves; every caller must get the completion of its own request
    (a finished request's tag must never be reused by a newer one while rows are in flight)."""
    with start_generation(
        hf_config(batch_wait_ms=1, max_batch_size=6),
        model=copy.deepcopy(taught_tiny.model),
        tokenizer=taught_tiny.tokenizer,
    ) as handle:
        prompts = [CHAT, TOOL_PROMPT, CHAT[1:], TOOL_PROMPT[1:]]
        jobs = [(prompts[i % 4], 1 + (i * 7) % 40) for i in range(120)]
        alone = {
            (i % 4, n): _chat(handle, m, temperature=0.0, max_tokens=n)["choices"][0]["token_ids"]
            for i, (m, n) in enumerate(jobs)
        }
        with concurrent.futures.ThreadPoolExecutor(24) as pool:
            futures = [pool.submit(_chat, handle, m, temperature=0.0, max_tokens=n) for m, n in jobs]
            together = [future.result()["choices"][0]["token_ids"] for future in futures]
        for i, ((_, n), tokens) in enumerate(zip(jobs, together, strict=True)):
            assert tokens == alone[(i % 4, n)], i
