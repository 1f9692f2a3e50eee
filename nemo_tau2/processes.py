"""Child processes that never outlive the process that started them (even when it is killed with SIGKILL), and
that inherit no secret they do not need."""

import ctypes
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """``preexec_fn`` for ``subprocess.Popen``: the kernel sends the child SIGTERM when its parent dies (Linux)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


# ---------------------------------------------------------------- what a child process may see

_SECRET_WORDS = {
    *("password", "passwd", "secret", "secrets", "credential", "credentials", "apikey", "authorization", "bearer")
}
_SECRET_KEY_PREFIXES = {"api", "private", "access", "secret", "signing", "encryption"}
# `<word>_token` keys that name a tokenizer's special token or a count, not a credential.
_NON_SECRET_TOKEN_PREFIXES = {
    *("pad", "eos", "bos", "unk", "sep", "cls", "mask", "stop", "start", "end", "special", "first", "last"),
    *("max", "min", "num", "think", "thinking", "image", "audio", "video"),
}


def is_secret_key(key: str) -> bool:
    """Whether a config key looks like it holds a secret (``api_key``, ``hf_token``, ``password``, ...).

    Keys that only *name* an environment variable (``api_key_env``, ``token_env_var``) and token-count or
    tokenizer keys (``max_tokens``, ``stop_token_ids``, ``pad_token``, ``token_level_loss``) are not secrets.
    """
    words = [w.lower() for w in re.split(r"[_\-\s.]+|(?<=[a-z])(?=[A-Z])", key) if w]
    if not words or words[-1] == "env" or words[-2:] == ["env", "var"]:
        return False
    if _SECRET_WORDS.intersection(words):
        return True
    if words[-1] == "key" and len(words) > 1 and words[-2] in _SECRET_KEY_PREFIXES:
        return True
    if words[-1] == "token":
        return len(words) == 1 or words[-2] not in _NON_SECRET_TOKEN_PREFIXES
    return False


_SECRET_VALUES: set[str] = set()
_NOT_SECRET = {"", "EMPTY", "dummy", "none", "None"}


def register_secret(value: str | None) -> None:
    """Remember a secret this process holds (an endpoint's API key), so that no child inherits it by accident."""
    if value and value not in _NOT_SECRET:
        _SECRET_VALUES.add(value)


def registered_secrets() -> frozenset[str]:
    """The secrets :func:`register_secret` was given (what a report must scrub from the text it embeds)."""
    return frozenset(_SECRET_VALUES)


HUB_TOKEN_VARIABLES = frozenset({"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"})
"""The Hugging Face Hub's credential: kept for processes that load models by name (a gated model needs it)."""


def child_environment(
    extra: dict[str, str] | None = None,
    *,
    base: dict[str, str] | None = None,
    drop_secret_names: bool = False,
    keep: frozenset[str] = frozenset(),
) -> dict[str, str]:
    """The environment for a child process: ``base`` (default: ours) without any variable holding a registered
    secret and, with ``drop_secret_names``, without any whose name looks like one (``OPENAI_API_KEY``, ``HF_TOKEN``:
    for children that never call an endpoint, such as the Gym servers and vLLM) except the names in ``keep``; then
    ``extra``."""
    env = {
        name: value
        for name, value in (os.environ if base is None else base).items()
        if value not in _SECRET_VALUES and (name in keep or not (drop_secret_names and is_secret_key(name.lower())))
    }
    return env | (extra or {})


def wait_for_listener(socket_path: Path, process: subprocess.Popen, timeout_s: float = 30.0) -> None:
    """Until ``process`` listens at ``socket_path`` (or ended, or ``timeout_s`` passed): a template listens before it
    imports (:func:`listening_socket`), so requesters that come after this queue on it rather than start their own."""
    deadline = time.monotonic() + timeout_s
    while not socket_path.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)


def listening_socket(socket_path: str | Path, backlog: int = 64) -> socket.socket:
    """A ``SOCK_SEQPACKET`` listener that appears at ``socket_path`` only once it accepts, its owner's alone: bound
    at a name of its own beside it (mode 0600 from the start), listening, then renamed into place. A requester that
    sees the path (:func:`wait_for_listener`) is queued, never refused; bound in place, a requester on a loaded box
    met the moment between ``bind`` and ``listen`` (~1 in 100 starts) and started its own process instead.
    (The tau2 release's template, which runs in the release's interpreter, does the same in its own file.)"""
    path = Path(socket_path)
    staging = path.with_name(f".{os.getpid()}.sock")  # short: a socket's path has 107 bytes
    staging.unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    umask = os.umask(0o177)
    try:
        listener.bind(str(staging))
    finally:
        os.umask(umask)
    listener.listen(backlog)
    os.replace(staging, path)
    return listener
