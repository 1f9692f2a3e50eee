"""Client-side conformance check of the vLLM surface: point it at a base URL, get every deviation at once.

Use it on any policy endpoint before a long run (``check_surface(handle.base_urls[0])``), and in tests of every
backend. It exercises what NeMo-Gym's ``vllm_model`` relies on: token ids as ``token_id:<int>``, one logprob per
generated token, ``prompt_token_ids`` equal to ``/tokenize``, the prefix-correction splice, 400 errors in vLLM's
shape, the context-length error text, and (with a probe prompt) structured tool calls.
"""

import json
import math
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any


class SurfaceDeviation(AssertionError):
    """The endpoint deviates from the surface; ``problems`` lists each deviation."""

    def __init__(self, base_url: str, problems: list[str]) -> None:
        self.problems = problems
        super().__init__(f"{base_url} deviates from the vLLM surface:\n" + "\n".join(f"  - {p}" for p in problems))


@dataclass
class ToolCallProbe:
    """A prompt the model answers with a tool call (e.g. a trained tiny model's, or a constrained one)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    tool_choice: str = "auto"
    expected_name: str | None = None
    max_tokens: int = 64
    expect_tool_calls_finish: bool = True
    """Require finish_reason tool_calls (stock vLLM may say stop when tool_choice forces the call)."""


@dataclass
class SurfaceReport:
    """What the check saw, for further assertions by the caller."""

    model: str
    max_model_len: int
    completion: dict[str, Any]
    tool_completion: dict[str, Any] | None = None
    problems: list[str] = field(default_factory=list)


def call_json(
    method: str, url: str, body: dict[str, Any] | None = None, *, timeout_s: float, api_key: str = "EMPTY"
) -> tuple[int, Any]:
    """One HTTP call with a JSON body; returns (status, decoded JSON or text) for any status."""
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"}
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    try:
        return status, json.loads(raw) if raw else None
    except json.JSONDecodeError:
        return status, raw.decode(errors="replace")


class _Client:
    def __init__(self, base_url: str, api_key: str, timeout_s: float) -> None:
        self.base = base_url.rstrip("/")
        self.root = self.base.removesuffix("/v1")
        self.api_key = api_key
        self.timeout_s = timeout_s

    def call(self, method: str, url: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
        return call_json(method, url, body, api_key=self.api_key, timeout_s=self.timeout_s)


_HELLO = [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "Say hello."}]


def _check_completion(r: dict[str, Any], max_tokens: int, as_ids: bool, top: int, problems: list[str]) -> None:
    where = "chat completion"
    if r.get("object") != "chat.completion" or len(r.get("choices") or []) != 1:
        problems.append(f"{where}: expected object chat.completion with exactly one choice, got {str(r)[:200]}")
        return
    choice = r["choices"][0]
    ids = choice.get("token_ids")
    content = (choice.get("logprobs") or {}).get("content")
    usage = r.get("usage") or {}
    if not isinstance(ids, list) or not isinstance(r.get("prompt_token_ids"), list):
        problems.append(f"{where}: choices[0].token_ids and prompt_token_ids must be lists of ints")
        return
    if choice.get("finish_reason") not in ("stop", "length", "tool_calls"):
        problems.append(f"{where}: finish_reason {choice.get('finish_reason')!r}")
    if choice.get("message", {}).get("role") != "assistant":
        problems.append(f"{where}: message.role must be assistant")
    if usage.get("completion_tokens") != len(ids) or usage.get("prompt_tokens") != len(r["prompt_token_ids"]):
        problems.append(f"{where}: usage {usage} does not match token_ids/prompt_token_ids lengths")
    if not 0 < len(ids) <= max_tokens:
        problems.append(f"{where}: generated {len(ids)} tokens with max_tokens={max_tokens}")
    if not isinstance(content, list) or len(content) != len(ids):
        problems.append(f"{where}: logprobs.content must have one entry per generated token ({len(ids)})")
        return
    for i, (entry, token_id) in enumerate(zip(content, ids, strict=True)):
        label = entry.get("token")
        if as_ids and label != f"token_id:{token_id}":
            problems.append(f"{where}: logprobs.content[{i}].token is {label!r}, expected 'token_id:{token_id}'")
            break
        if not as_ids and (not isinstance(label, str) or label.startswith("token_id:")):
            problems.append(f"{where}: logprobs.content[{i}].token is {label!r} without return_tokens_as_token_ids")
            break
        logprob = entry.get("logprob")
        if not isinstance(logprob, float | int) or not math.isfinite(logprob) or logprob > 1e-6:
            problems.append(f"{where}: logprobs.content[{i}].logprob is {logprob!r}, expected a finite value <= 0")
            break
        if len(entry.get("top_logprobs") or []) != top or not isinstance(entry.get("bytes"), list):
            problems.append(f"{where}: logprobs.content[{i}] needs bytes and exactly {top} top_logprobs")
            break


def error_body(response: Any) -> dict[str, Any] | None:
    """The error object of a vLLM error answer, in either of vLLM's shapes, else None.

    vLLM up to 0.10 answers ``{"object": "error", "message", "type", "param", "code"}``; later releases (0.32 among
    them) nest it as ``{"error": {"message", "type", "param", "code"}}``.
    """
    if not isinstance(response, dict):
        return None
    nested = response.get("error")
    error = nested if isinstance(nested, dict) else response if response.get("object") == "error" else None
    if error is None or not isinstance(error.get("message"), str):
        return None
    return error


def _expect_400(client: _Client, body: dict[str, Any], mention: str, problems: list[str]) -> None:
    status, r = client.call("POST", f"{client.base}/chat/completions", body)
    error = error_body(r)
    if status != 400 or error is None or error.get("code") != status or mention not in error["message"]:
        problems.append(f"a request with {mention} must get a 400 error naming it, got HTTP {status}: {str(r)[:200]}")


def _check_splice(client: _Client, model: str, first: dict[str, Any], problems: list[str]) -> None:
    choice = first["choices"][0]
    prefix = first["prompt_token_ids"] + choice["token_ids"]
    # The assistant text is deliberately not what was generated: the prompt must follow the ids, not the text.
    assistant = {
        "role": "assistant",
        "content": "(text that differs from the generated tokens)",
        "prompt_token_ids": first["prompt_token_ids"],
        "generation_token_ids": choice["token_ids"],
        "generation_log_probs": [e["logprob"] for e in choice["logprobs"]["content"]],
    }
    messages = [*_HELLO, assistant, {"role": "user", "content": "Thanks. Say it again."}]
    status, tok = client.call("POST", f"{client.root}/tokenize", {"model": model, "messages": messages})
    if status != 200 or tok.get("tokens", [])[: len(prefix)] != prefix or len(tok["tokens"]) <= len(prefix):
        problems.append(f"/tokenize of turn 2 must start with turn 1's prompt + generated ids (HTTP {status})")
        return
    body = {"model": model, "messages": messages, "max_tokens": 2, "logprobs": True, "top_logprobs": 0}
    body |= {"return_token_ids": True}
    status, second = client.call("POST", f"{client.base}/chat/completions", body)
    if status != 200 or second.get("prompt_token_ids") != tok["tokens"]:
        problems.append("turn 2's chat completion must use exactly the prompt ids /tokenize returns")


def _check_tool_call(client: _Client, model: str, probe: ToolCallProbe, report: SurfaceReport) -> None:
    body = {
        "model": model,
        "messages": probe.messages,
        "tools": probe.tools,
        "tool_choice": probe.tool_choice,
        "temperature": 0.0,
        "top_p": 1.0,
        "max_tokens": probe.max_tokens,
        "logprobs": True,
        "top_logprobs": 0,
        "return_tokens_as_token_ids": True,
        "return_token_ids": True,
    }
    status, r = client.call("POST", f"{client.base}/chat/completions", body)
    if status != 200:
        report.problems.append(f"tool-call probe: HTTP {status}: {str(r)[:200]}")
        return
    report.tool_completion = r
    choice = r["choices"][0]
    calls = choice["message"].get("tool_calls") or []
    if not calls or (probe.expect_tool_calls_finish and choice.get("finish_reason") != "tool_calls"):
        report.problems.append(f"tool-call probe: expected tool_calls and finish_reason tool_calls, got {choice}")
        return
    for call in calls:
        function = call.get("function") or {}
        try:
            arguments = json.loads(function.get("arguments", ""))
        except json.JSONDecodeError:
            arguments = None
        if (
            not isinstance(call.get("id"), str)
            or not call["id"]
            or call.get("type") != "function"
            or not isinstance(arguments, dict)
        ):
            report.problems.append(f"tool-call probe: malformed tool call {call}")
        if probe.expected_name is not None and function.get("name") != probe.expected_name:
            report.problems.append(
                f"tool-call probe: called {function.get('name')!r}, expected {probe.expected_name!r}"
            )
    if "<tool_call>" in (choice["message"].get("content") or ""):
        report.problems.append("tool-call probe: parsed calls must be removed from content")


def check_surface(
    base_url: str,
    *,
    api_key: str = "EMPTY",
    tool_probe: ToolCallProbe | None = None,
    check_splice: bool = True,
    check_rejections: bool = True,
    check_context_limit: bool = True,
    max_tokens: int = 8,
    timeout_s: float = 300.0,
) -> SurfaceReport:
    """Exercise the surface at ``base_url`` (ending in /v1) and raise :class:`SurfaceDeviation` listing problems.

    Args:
        check_splice: Check the prefix-correction splice (stock vLLM does not implement it).
        check_rejections: Check that ``stream``, ``top_k`` and ``stop`` get a 400 (stock vLLM accepts them).
        check_context_limit: Send a prompt longer than ``max_model_len`` (costly for very long contexts).
    """
    client = _Client(base_url, api_key, timeout_s)
    problems: list[str] = []
    status, _ = client.call("GET", f"{client.root}/health")
    if status != 200:
        raise SurfaceDeviation(base_url, [f"GET /health answered {status}"])
    status, models = client.call("GET", f"{client.base}/models")
    if status != 200 or not (models or {}).get("data"):
        raise SurfaceDeviation(base_url, [f"GET /v1/models answered {status}: {str(models)[:200]}"])
    model = models["data"][0]["id"]
    request = {"model": model, "messages": _HELLO, "max_tokens": max_tokens, "temperature": 1.0, "top_p": 1.0}
    request |= {"seed": 0, "logprobs": True, "top_logprobs": 0, "return_tokens_as_token_ids": True}
    request |= {"return_token_ids": True}  # vLLM >= 0.10.2 adds the token id fields only when asked; we always do
    status, first = client.call("POST", f"{client.base}/chat/completions", request)
    if status != 200:
        raise SurfaceDeviation(base_url, [f"a plain chat completion failed with HTTP {status}: {str(first)[:300]}"])
    _check_completion(first, max_tokens, as_ids=True, top=0, problems=problems)
    status, tok = client.call("POST", f"{client.root}/tokenize", {"model": model, "messages": _HELLO})
    max_model_len = (tok or {}).get("max_model_len") if isinstance(tok, dict) else None
    if status != 200 or tok.get("tokens") != first.get("prompt_token_ids") or tok.get("count") != len(tok["tokens"]):
        problems.append(f"/tokenize must return the chat completion's prompt ids and their count (HTTP {status})")
    status, second = client.call(
        "POST", f"{client.base}/chat/completions", request | {"top_logprobs": 2, "return_tokens_as_token_ids": False}
    )
    if status != 200:
        problems.append(f"a chat completion with top_logprobs=2 failed with HTTP {status}")
    else:
        _check_completion(second, max_tokens, as_ids=False, top=2, problems=problems)
    if check_rejections:
        _expect_400(client, request | {"stream": True}, "stream", problems)
        _expect_400(client, request | {"top_k": 5}, "top_k", problems)
        _expect_400(client, request | {"stop": ["hello"]}, "stop", problems)
    if check_splice and not problems:
        _check_splice(client, model, first, problems)
    if check_context_limit and isinstance(max_model_len, int):
        long_messages = [{"role": "user", "content": "hello " * (max_model_len + 16)}]
        _expect_400(
            client, {"model": model, "messages": long_messages, "max_tokens": 4}, "maximum context length", problems
        )
    report = SurfaceReport(model=model, max_model_len=max_model_len or 0, completion=first, problems=problems)
    if tool_probe is not None:
        _check_tool_call(client, model, tool_probe, report)
    if report.problems:
        raise SurfaceDeviation(base_url, report.problems)
    return report
