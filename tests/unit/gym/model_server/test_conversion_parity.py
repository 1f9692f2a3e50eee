"""fast_vllm_model's mapping against NeMo-Gym's own: the same chat request for every Responses request, the same
output items for every chat message (NeMo-Gym's converter and vllm_model's preprocessing, called as libraries)."""

import json
from itertools import product
from unittest.mock import MagicMock

import pytest
from nemo_gym.openai_utils import NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.responses_converter import VLLMConverter
from nemo_gym.server_utils import ServerClient
from responses_api_models.vllm_model.app import VLLMModel, VLLMModelConfig

from nemo_tau2.gym.model_server import conversion
from nemo_tau2.gym.model_server.app import FastVLLMModelConfig
from nemo_tau2.gym.model_server.endpoint import server_settings_applied
from nemo_tau2.gym.nemo_gym_compat import CHAT_MAPPING
from nemo_tau2.tau2_env import domains
from nemo_tau2.tau2_env.gym_rows import task_row

TOKENS = {"prompt_token_ids": [1, 2, 3], "generation_token_ids": [4, 5], "generation_log_probs": [-0.5, -0.25]}
LATER_TOKENS = {"prompt_token_ids": [1, 2, 3, 4, 5, 6], "generation_token_ids": [7], "generation_log_probs": [-1.0]}


def _call(call_id: str, name: str, arguments: dict, **extra) -> dict:
    item = {"type": "function_call", "call_id": call_id, "name": name, "arguments": json.dumps(arguments)}
    return item | {"id": call_id, "status": "completed"} | extra


def _assistant(text: str, **extra) -> dict:
    content = [{"type": "output_text", "text": text, "annotations": []}]
    return {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed", "content": content} | extra


def _episode(domain: str) -> list[dict]:
    """A tau2 row's start and a transcript with every item kind the agent sends."""
    row = task_row(domain, domains.get_tasks(domain, "test")[0].id)["responses_create_params"]
    return [
        *row["input"],
        {"role": "user", "content": "Hi, I need help with my booking."},
        _call("call_a", "get_user_details", {"user_id": "u1"}, **TOKENS),
        {"type": "function_call_output", "call_id": "call_a", "output": '{"name": "Ann"}'},
        _assistant("Which reservation?"),
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "The one to Paris."}]},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "look it up"}]},
        _assistant("Let me check both."),
        _call("call_b", "get_reservation_details", {"reservation_id": "R1"}),
        _call("call_c", "get_reservation_details", {"reservation_id": "R2"}, **LATER_TOKENS),
        {"type": "function_call_output", "call_id": "call_b", "output": "{}"},
        {"type": "function_call_output", "call_id": "call_c", "output": "Error: not found"},
        {"role": "developer", "content": "Be brief."},
        _assistant("Done."),
    ]


def _bodies() -> list[dict]:
    bodies = []
    for domain in ("airline", "retail", "telecom"):
        row = task_row(domain, domains.get_tasks(domain, "test")[0].id)["responses_create_params"]
        bodies.append(row | {"input": _episode(domain), "user": f"tau2|{domain}|x|policy"})
    bodies.append({"input": "Hello there", "max_output_tokens": 64, "temperature": 0.0, "top_p": 0.9})
    bodies.append(
        {
            "input": [
                {"role": "system", "content": "You are a customer."},
                {
                    "role": "user",
                    "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}],
                },
            ],
            "store": False,
            "metadata": {"extra_body": '{"seed": 5}', "chat_template_kwargs": '{"enable_thinking": false}'},
            "top_logprobs": None,
        }
    )
    return bodies


CONFIG_VARIANTS = [
    {},
    {"chat_template_kwargs": {"enable_thinking": True}, "extra_body": {"seed": 1, "repetition_penalty": 1.1}},
    {"replace_developer_role_with_system": True},
]


def _config_fields(with_token_ids: bool, variant: dict) -> dict:
    common = {"host": "127.0.0.1", "port": 0, "entrypoint": "app.py", "name": "policy_model"}
    common |= {
        "base_url": "http://127.0.0.1:9/v1",
        "api_key": "EMPTY",
        "model": "served-name",
    }  # pragma: allowlist secret
    return common | {"return_token_id_information": with_token_ids, "uses_reasoning_parser": False} | variant


def _configs(with_token_ids: bool, variant: dict) -> tuple[VLLMModelConfig, FastVLLMModelConfig]:
    fields = _config_fields(with_token_ids, variant)
    return VLLMModelConfig(**fields), FastVLLMModelConfig(**fields)


def _nemo_gym_chat_request(config: VLLMModelConfig, body: dict) -> dict:
    converter = VLLMConverter(
        return_token_id_information=config.return_token_id_information, uses_reasoning_parser=False
    )
    params = converter.responses_to_chat_completion_create_params(NeMoGymResponseCreateParamsNonStreaming(**body))
    vllm_model = VLLMModel(config=config, server_client=MagicMock(spec=ServerClient))  # as NeMo-Gym's tests make one
    vllm_model._converter = converter
    return vllm_model._preprocess_chat_completion_create_params(None, params.model_dump(exclude_unset=True))


def _plain(value):
    return json.loads(json.dumps(value))


@pytest.mark.parametrize(("with_token_ids", "variant"), list(product([True, False], CONFIG_VARIANTS)))
def test_chat_requests_are_nemo_gyms(with_token_ids, variant):
    stock_config, fast_config = _configs(with_token_ids, variant)
    for body in _bodies():
        expected = _plain(_nemo_gym_chat_request(stock_config, json.loads(json.dumps(body))))
        ours = server_settings_applied(
            fast_config, conversion.chat_request(json.loads(json.dumps(body)), with_token_ids)
        )
        if with_token_ids:
            assert ours.pop("return_token_ids") is True  # ours only: vLLM >= 0.10.2 then returns the prompt ids
        assert _plain(ours) == expected


def test_token_ids_ride_on_their_turns_assistant_message():
    messages = conversion.chat_messages(_episode("airline"), with_token_ids=True)
    assistants = [m for m in messages if m["role"] == "assistant"]
    carried = [m.get("generation_token_ids") for m in assistants]
    # the greeting has none; the turns that generated ids carry them (NeMo-Gym 0.4.0: every later turn too)
    if CHAT_MAPPING.token_ids_on_later_assistant_messages:
        assert carried == [None, [4, 5], [4, 5], [7], [7]]
    else:
        assert carried == [None, [4, 5], None, [7], None]


ASSISTANT_MESSAGES = [
    {"role": "assistant", "content": "Sure, one moment."},
    {"role": "assistant", "content": None, "tool_calls": []},
    {
        "role": "assistant",
        "content": "Checking.",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            {"id": "call_2", "type": "function", "function": {"name": "g", "arguments": '{"a": 1}'}},
        ],
    },
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "c", "type": "function", "function": {"name": "h", "arguments": "{}"}}],
    },
]


def _without_message_ids(items: list[dict]) -> list[dict]:
    return [{k: v for k, v in item.items() if not (k == "id" and item["type"] == "message")} for item in items]


@pytest.mark.parametrize("message", ASSISTANT_MESSAGES)
@pytest.mark.parametrize("with_token_ids", [True, False])
def test_output_items_are_nemo_gyms(message, with_token_ids):
    converter = VLLMConverter(return_token_id_information=with_token_ids, uses_reasoning_parser=False)
    stock_message = dict(message) | (TOKENS if with_token_ids else {})
    expected = [item.model_dump() for item in converter.postprocess_assistant_message_dict(stock_message)]
    ours = conversion.output_items(dict(message), dict(TOKENS) if with_token_ids else None)
    assert _plain(_without_message_ids(ours)) == _plain(_without_message_ids(expected))


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ({"input": [], "top_k": 5}, "unknown Responses API parameter(s) ['top_k']"),
        ({"input": [], "stream": True}, "stream: true is not supported"),
        ({"input": 5}, "input must be a string or a list of items, got int"),
        ({"input": [{"type": "web_search_call"}]}, "input[0].type 'web_search_call' is not supported"),
        ({"input": [{"type": "function_call", "name": "f"}]}, "input[0] (function_call) lacks call_id, arguments"),
        ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role 'tool' is not user, system, developer or"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_audio"}]}]},
            "input[0].content: part type 'input_audio' is not supported",
        ),
        ({"input": [], "tools": [{"type": "web_search"}]}, "tools[0] must be a function tool with a name"),
    ],
)
def test_requests_it_cannot_convert_name_the_problem(body, problem):
    with pytest.raises(conversion.BadRequest) as caught:
        conversion.chat_request(body, with_token_ids=True)
    assert problem in str(caught.value)


@pytest.mark.parametrize(
    ("setting", "value"),
    [("uses_reasoning_parser", True), ("is_responses_native", True), ("sequential_reasoning_allowed", False)],
)
def test_settings_it_does_not_implement_are_refused_at_start_up(setting, value):
    with pytest.raises(
        ValueError, match=f"does not implement {setting}: {str(value).lower()}; use NeMo-Gym's vllm_model"
    ):
        FastVLLMModelConfig(**_config_fields(True, {setting: value}))


def test_a_misspelt_config_key_is_refused():
    with pytest.raises(ValueError, match="'return_token_ids' \\(did you mean 'return_token_id_information'\\?\\)"):
        FastVLLMModelConfig(**_config_fields(True, {"return_token_ids": True}))


@pytest.mark.parametrize("with_token_ids", [True, False])
def test_output_items_replay_as_history_as_nemo_gyms(with_token_ids):
    """Items as vllm_model dumps them (0.7.0: with ``phase`` / ``namespace`` null, and ``routed_experts`` beside the
    token ids) go back as the next turn's history, and ours and NeMo-Gym's are the same items."""
    stock_config, fast_config = _configs(with_token_ids, {})
    converter = VLLMConverter(return_token_id_information=with_token_ids, uses_reasoning_parser=False)
    replayed = []
    for message in ASSISTANT_MESSAGES:
        stock_message = dict(message) | (TOKENS if with_token_ids else {})
        stock = [item.model_dump() for item in converter.postprocess_assistant_message_dict(stock_message)]
        ours = conversion.output_items(dict(message), dict(TOKENS) if with_token_ids else None)
        assert sorted(stock[-1]) == sorted(ours[-1])  # the same keys, nulls included
        replayed += [*ours, {"role": "user", "content": "next"}]
    body = {"input": [{"role": "user", "content": "Hi"}, *replayed]}
    expected = _plain(_nemo_gym_chat_request(stock_config, json.loads(json.dumps(body))))
    ours = server_settings_applied(fast_config, conversion.chat_request(json.loads(json.dumps(body)), with_token_ids))
    ours.pop("return_token_ids", None)
    assert _plain(ours) == expected


RELEASE_DEPENDENT = [
    {"input": [{"role": "user", "content": "Hi"}, _assistant("Done.", phase="final_answer")]},
    {"input": [{"role": "user", "content": "Hi"}, _call("c", "f", {}, namespace="tools")]},
    {"input": "Hi", "truncation": "auto"},
    {"input": "Hi", "tool_choice": "required"},
    {
        "input": [{"role": "system", "content": "You are a customer."}, {"role": "user", "content": "Hi"}],
        "instructions": "Be brief.",
        "parallel_tool_calls": False,
        "tool_choice": "auto",
    },
]


@pytest.mark.parametrize("body", RELEASE_DEPENDENT)
def test_what_the_releases_map_differently_is_mapped_as_the_installed_one_does(body):
    """Item fields and parameters without a chat counterpart, instructions, tool settings without tools: refused
    where the installed release's vllm_model refuses them (0.7.0), else mapped as it maps them (0.4.0 drops them)."""
    stock_config, fast_config = _configs(False, {})
    try:
        expected = _plain(_nemo_gym_chat_request(stock_config, json.loads(json.dumps(body))))
    except (NotImplementedError, ValueError):
        expected = None
    if expected is None:
        with pytest.raises(conversion.BadRequest, match="counterpart|needs at least one tool"):
            conversion.chat_request(json.loads(json.dumps(body)), with_token_ids=False)
    else:
        assert _plain(server_settings_applied(fast_config, conversion.chat_request(body, False))) == expected


NEMO_GYM_0_7_KEYS = [
    ("sampling_overrides", {"temperature": 1.0}),
    ("use_completions_api", True),
    ("reasoning_field", "reasoning"),
    ("continue_final_assistant_message", True),
    ("endpoint_file", "/tmp/endpoint"),
]


@pytest.mark.parametrize(("setting", "value"), NEMO_GYM_0_7_KEYS)
def test_nemo_gym_0_7_keys_it_does_not_implement_are_refused_at_start_up(setting, value):
    if setting not in VLLMModelConfig.model_fields:
        pytest.skip(f"the installed NeMo-Gym's vllm_model has no {setting} (0.7.0 has; its CI environment runs this)")
    with pytest.raises(ValueError, match=f"does not implement {setting}: .*; use NeMo-Gym's vllm_model"):
        FastVLLMModelConfig(**_config_fields(True, {setting: value}))


@pytest.mark.parametrize("setting", ["supply_prefix_token_ids", "request_prompt_and_generation_token_ids"])
def test_nemo_gym_0_7_keys_it_always_implements_are_accepted(setting):
    if setting not in VLLMModelConfig.model_fields:
        pytest.skip(f"the installed NeMo-Gym's vllm_model has no {setting} (0.7.0 has; its CI environment runs this)")
    assert getattr(FastVLLMModelConfig(**_config_fields(True, {setting: True})), setting) is True


@pytest.mark.parametrize("enabled", [True, False])
def test_nemo_gyms_token_id_capture_is_refused_at_start_up(enabled):
    """0.7.0's run-wide capture wraps vllm_model's own call path, which this server's routes bypass: on, its records
    would miss every call, so the server refuses to start; off (or absent, as on 0.4.0), it starts."""
    from nemo_gym.server_utils import BaseServerConfig, ServerClient
    from omegaconf import OmegaConf

    from nemo_tau2.gym.model_server.app import FastVLLMModel

    client = ServerClient(
        head_server_config=BaseServerConfig(host="127.0.0.1", port=0),
        global_config_dict=OmegaConf.create({"token_id_capture": {"enabled": enabled}}),
    )
    config = FastVLLMModelConfig(**_config_fields(True, {}))
    if enabled:
        with pytest.raises(ValueError, match="does not take part in NeMo-Gym's token_id_capture .* use vllm_model"):
            FastVLLMModel(config=config, server_client=client)
    else:
        assert FastVLLMModel(config=config, server_client=client).config.name == "policy_model"
