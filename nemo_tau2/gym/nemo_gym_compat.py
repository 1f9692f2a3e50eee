"""What differs between the NeMo-Gym releases this project runs on, in one place: 0.4.0 (Python 3.12, the newest
release for it) and 0.7.0 (Python >= 3.13.14). Nothing here asks for a version number: each difference is read off
the installed release's own classes or its version, here, so the same code is right on both.

- **Model routes.** 0.4.0's ``SimpleResponsesAPIModel`` routes ``/v1/responses`` and ``/v1/chat/completions`` to
  the server's ``responses`` / ``chat_completions``; 0.7.0 routes them to ``responses_dispatch`` /
  ``chat_completions_dispatch``, which validate with pydantic (422) and call ``chat_completions(request=, body=)``.
  :class:`OwnModelRoutes` answers both hook names with the server's own handlers, so its fast path, its status
  codes (400 bad JSON, 502 endpoint failure) and its output items hold on either release.
- **Chat mapping.** 0.7.0's ``vllm_model`` maps a Responses request differently: token ids ride only on the
  assistant message of their own turn (0.4.0: on every later one too); ``tool_calls: []`` is omitted and an empty
  assistant turn kept; Responses parameters and item fields with no chat counterpart are refused (0.4.0 dropped
  them); ``instructions`` become the leading system message (0.4.0 dropped them); ``tool_choice`` and
  ``parallel_tool_calls`` go only with tools. :data:`CHAT_MAPPING` says which, so ``fast_vllm_model`` sends what
  the installed release's ``vllm_model`` sends.
- **Output items.** 0.7.0's items gained optional fields (``phase`` on messages, ``namespace`` on function calls)
  that ``vllm_model`` dumps as null; :data:`OUTPUT_ITEM_NULLS` lists what the installed release's item models add
  beyond what every release has, so our items carry the same keys as ``vllm_model``'s.
  Likewise :data:`FUNCTION_TOOL_NULLS` for the tools the Responses object echoes.
- **Resources server routes.** 0.7.0's base adds ``POST /close_session`` and ``GET /reverify_mode``;
  :func:`add_route_if_missing` gives a server the route on 0.4.0 too (on 0.7.0 the base's route already calls the
  server's override).
- **Serving.** 0.7.0's ``run_webserver`` wraps every route in a disconnect-cancelling middleware (our servers
  decide per path: ``cancel_on_disconnect``), and importing its ``server_utils`` puts a handler on the root logger,
  which turns ``logging.basicConfig`` into a no-op: :class:`OwnCancellation` and :func:`configure_server_logging`.
"""

import logging
from dataclasses import dataclass
from importlib.metadata import version

from fastapi import FastAPI, Request, Response
from nemo_gym.openai_utils import NeMoGymResponseFunctionToolCall, NeMoGymResponseOutputMessage
from openai.types.responses import FunctionTool

NEMO_GYM_VERSION = version("nemo-gym")


@dataclass(frozen=True)
class ChatMapping:
    """How the installed release's ``vllm_model`` turns a Responses request into a chat request, where releases
    differ."""

    token_ids_on_later_assistant_messages: bool
    empty_tool_calls_sent: bool
    empty_assistant_turns_sent: bool
    refuses_what_chat_cannot_express: bool
    instructions_as_system_message: bool
    tool_settings_only_with_tools: bool


_RELEASE_0_4 = tuple(int(part) for part in NEMO_GYM_VERSION.split(".")[:2]) < (0, 5)
CHAT_MAPPING = ChatMapping(
    token_ids_on_later_assistant_messages=_RELEASE_0_4,
    empty_tool_calls_sent=_RELEASE_0_4,
    empty_assistant_turns_sent=not _RELEASE_0_4,
    refuses_what_chat_cannot_express=not _RELEASE_0_4,
    instructions_as_system_message=not _RELEASE_0_4,
    tool_settings_only_with_tools=not _RELEASE_0_4,
)

_MESSAGE_KEYS = frozenset({"id", "content", "role", "status", "type"})
_FUNCTION_CALL_KEYS = frozenset({"arguments", "call_id", "name", "type", "id", "status"})


def _optional_nulls(model: type, known: frozenset[str]) -> dict[str, None]:
    """The fields of ``model`` beyond ``known`` that default to None (what the model dumps as null)."""
    return {
        name: None
        for name, field in model.model_fields.items()
        if name not in known and not field.is_required() and field.default is None
    }


OUTPUT_ITEM_NULLS: dict[str, dict[str, None]] = {
    "message": _optional_nulls(NeMoGymResponseOutputMessage, _MESSAGE_KEYS),
    "function_call": _optional_nulls(NeMoGymResponseFunctionToolCall, _FUNCTION_CALL_KEYS),
}
"""Per output item type, the null fields the installed release's item model adds (0.4.0: none; 0.7.0: ``phase`` on
messages, ``namespace`` on function calls)."""
FUNCTION_TOOL_NULLS: dict[str, None] = _optional_nulls(FunctionTool, frozenset({"name", "type"}))
"""The optional fields of a function tool as the Responses object echoes it (vllm_model dumps the installed openai's
``FunctionTool``: openai 2.44, NeMo-Gym 0.7.0's, adds ``defer_loading``)."""


class OwnModelRoutes:
    """Mix into a ``SimpleResponsesAPIModel`` subclass (before the Gym base) whose ``responses(request)`` and
    ``chat_completions(request)`` read the raw request themselves: 0.7.0's dispatch hooks then call them as 0.4.0's
    routes do, with no pydantic validation in between."""

    async def responses_dispatch(self, request: Request) -> Response:
        return await self.responses(request)

    async def chat_completions_dispatch(self, request: Request) -> Response:
        return await self.chat_completions(request)


class OwnCancellation:
    """Mix into a Gym server that decides per path whether a request whose client left is cancelled
    (``cancel_on_disconnect``): 0.7.0's ``run_webserver`` would otherwise cancel every route's requests."""

    def setup_cancellation_middleware(self, app: FastAPI) -> None:
        """Nothing: the server's request gate cancels the paths that ask for it."""


def add_route_if_missing(app: FastAPI, method: str, path: str, endpoint) -> None:
    """Route ``method path`` to ``endpoint`` unless the Gym base already routes it (there, to the server's override
    of the base's handler)."""
    if not any(getattr(route, "path", None) == path and method in route.methods for route in app.router.routes):
        app.add_api_route(path, endpoint, methods=[method])


def configure_server_logging(level: str) -> None:
    """INFO lines (uvicorn's access log, our own) in the server's log on either release: 0.7.0 installs a root
    handler at import, so the handler is replaced rather than added only when none exists."""
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s", force=True)
