"""A scripted fake OpenAI-compatible server for tests and benchmarks, importable by users' own tests.

It speaks the surface NeMo-Gym's ``vllm_model`` uses (``/v1/chat/completions`` with tool calls, token ids and
logprobs, ``/tokenize``), answers each conversation from a script found by a key in the request, and can be told
to fail. See ``README.md`` beside this file for the key format, the tokenizer and the fault kinds.

Typical use::

    from nemo_tau2.testing import start_fake_server, tau2_key

    with start_fake_server() as fake:
        # point a policy and a user simulator at fake.base_url; send user=tau2_key(domain, task_id, episode, role)
        fake.inject_fault("http_503", count=1, key_pattern=r"\\|user$")
        ...
        assert fake.stats().requests_by_key[key] == 2
"""

from nemo_tau2.generation.contiguity import ContiguityBreak, check_contiguity
from nemo_tau2.testing.chat_tokens import ALT_SPACE_ID, SPECIAL_TOKENS, VOCAB_SIZE, TemplateError, prompt_ids
from nemo_tau2.testing.config import ControlRequest, FakeServerConfig, ScriptSpec, TurnSpec
from nemo_tau2.testing.engine import FakeEngine, FakeStats, RequestError
from nemo_tau2.testing.faults import FaultKind, FaultSpec
from nemo_tau2.testing.handles import FakeServerHandle
from nemo_tau2.testing.scripts import (
    Script,
    ScriptError,
    ScriptProvider,
    ScriptRequest,
    ToolCallSpec,
    Turn,
    TurnListScript,
)
from nemo_tau2.testing.tau2_provider import Tau2ScriptProvider
from nemo_tau2.testing.tau2_scripts import (
    OUT_OF_SCOPE,
    STOP,
    TRANSFER,
    PolicyScriptConfig,
    ScriptedUser,
    Tau2Key,
    Tau2ScriptsConfig,
    UserScriptConfig,
    device_action_request,
    parse_device_action,
    tau2_key,
)

_LAZY = {"connect_fake_server", "serve_fake_server", "start_fake_server"}


def __getattr__(name: str):
    # Imported on first use: `python -m nemo_tau2.testing.fake_server` must not find the module already imported.
    if name in _LAZY:
        from nemo_tau2.testing import fake_server

        return getattr(fake_server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ALT_SPACE_ID",
    "OUT_OF_SCOPE",
    "SPECIAL_TOKENS",
    "STOP",
    "TRANSFER",
    "VOCAB_SIZE",
    "ContiguityBreak",
    "ControlRequest",
    "FakeEngine",
    "FakeServerConfig",
    "FakeServerHandle",
    "FakeStats",
    "FaultKind",
    "FaultSpec",
    "PolicyScriptConfig",
    "RequestError",
    "Script",
    "ScriptError",
    "ScriptProvider",
    "ScriptRequest",
    "ScriptSpec",
    "ScriptedUser",
    "Tau2Key",
    "Tau2ScriptProvider",
    "Tau2ScriptsConfig",
    "TemplateError",
    "ToolCallSpec",
    "Turn",
    "TurnListScript",
    "TurnSpec",
    "UserScriptConfig",
    "check_contiguity",
    "connect_fake_server",
    "device_action_request",
    "parse_device_action",
    "prompt_ids",
    "serve_fake_server",
    "start_fake_server",
    "tau2_key",
]
