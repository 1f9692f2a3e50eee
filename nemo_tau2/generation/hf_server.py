"""The hf backend's server: in this process on a thread (training on CPU), or standalone as a CLI.

In-process, the trainer keeps a handle on the :class:`~nemo_tau2.generation.hf_engine.HFEngine` and pushes a
state dict after each step. Standalone (``python -m nemo_tau2.generation.hf_server --model DIR``), weights are
updated over HTTP from a checkpoint directory: ``POST /update_weights {"checkpoint_dir": DIR, "weight_version": n}``
(``n`` optional: the label completions of these weights report) answers ``{"weight_version": n}`` once the new
weights serve. Both modes also expose that route.
"""

import argparse
import logging
import os
import sys
import threading
import time
from pathlib import Path

import torch
from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from nemo_tau2.generation.config import HfConfig
from nemo_tau2.generation.errors import BadRequestError, GenerationStartupError
from nemo_tau2.generation.hf_engine import HFEngine
from nemo_tau2.generation.openai_app import build_app
from nemo_tau2.generation.serving import BackgroundServer

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class UpdateWeightsRequest(BaseModel):
    """POST /update_weights."""

    model_config = ConfigDict(extra="forbid")

    checkpoint_dir: str
    weight_version: int | None = Field(default=None, ge=0)


def weight_update_routes(engine: HFEngine):
    """Routes that load new weights into ``engine`` from a ``save_pretrained`` directory."""

    def add(app: FastAPI) -> None:
        @app.post("/update_weights")
        def update_weights(body: UpdateWeightsRequest) -> dict[str, int]:
            if not Path(body.checkpoint_dir).is_dir():
                raise BadRequestError(f"checkpoint_dir: {body.checkpoint_dir!r} is not a directory")
            try:
                version = engine.update_weights_from_checkpoint(body.checkpoint_dir, body.weight_version)
            except (OSError, ValueError) as e:
                raise BadRequestError(f"checkpoint_dir: cannot load weights from {body.checkpoint_dir!r}: {e}") from e
            return {"weight_version": version}

        @app.get("/weight_version")
        def weight_version() -> dict[str, int]:
            return {"weight_version": engine.weight_version}

    return add


def check_model_source(model_name: str) -> None:
    """Fail fast, before loading anything, when ``model_name`` is neither a model directory nor in the HF cache."""
    path = Path(model_name).expanduser()
    if path.exists() or model_name.startswith((".", "/", "~")):
        if not (path / "config.json").is_file():
            raise GenerationStartupError(
                f"policy.generation.model_name: {model_name!r} is not a model directory (no config.json there); "
                "give a directory written by save_pretrained or a cached Hugging Face model id"
            )
        return
    from huggingface_hub import try_to_load_from_cache

    if not isinstance(try_to_load_from_cache(model_name, "config.json"), str):
        raise GenerationStartupError(
            f"policy.generation.model_name: {model_name!r} is neither a local directory nor in the local Hugging "
            f"Face cache, and nothing is downloaded at run time; download it first (`hf download {model_name}`) "
            "or give a directory"
        )


def load_pretrained(model_name: str, dtype: str, device: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Model and tokenizer from a local directory or the local Hugging Face cache (never the network)."""
    check_model_source(model_name)
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_name, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(model_name, local_files_only=True, dtype=_DTYPES[dtype])
    except (OSError, ValueError) as e:
        first_line = str(e).splitlines()[0][:300]
        raise GenerationStartupError(
            f"policy.generation.model_name: cannot load {model_name!r} ({e.__class__.__name__}: {first_line})"
        ) from e
    return model.to(device), tokenizer


def read_chat_template(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        return Path(path).read_text()
    except OSError as e:
        raise GenerationStartupError(f"chat_template: cannot read {path!r}: {e.strerror}") from e


class InProcessHfServer:
    """An :class:`HFEngine` served on a background thread; ``engine.update_weights`` swaps weights in place."""

    def __init__(self, engine: HFEngine, cfg: HfConfig) -> None:
        self.engine = engine
        app = build_app(engine, extra_routes=weight_update_routes(engine))
        self._server = BackgroundServer(app, cfg.host, cfg.port, key="policy.generation.hf_cfg.port")
        try:
            self._server.start(timeout_s=cfg.startup_timeout_s)
        except GenerationStartupError:
            engine.close()
            raise

    @property
    def base_url(self) -> str:
        return f"{self._server.base_url}/v1"

    def shutdown(self) -> None:
        self._server.stop()
        self.engine.close()


def _watch_parent(parent_pid: int) -> None:
    """Exit when the process that started us is gone, so a crashed trainer leaves no orphan server."""
    while True:
        if os.getppid() != parent_pid:
            os._exit(0)
        time.sleep(1.0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve a transformers causal LM through the vLLM surface.")
    parser.add_argument("--model", required=True, help="save_pretrained directory or cached HF model id")
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=sorted(_DTYPES), default="float32")
    parser.add_argument("--max-batch-size", type=int, default=16)
    parser.add_argument("--batch-wait-ms", type=float, default=5.0)
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--chat-template", default=None, help="path to a Jinja chat template")
    parser.add_argument("--parent-pid", type=int, default=None, help="exit when this process is gone")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.parent_pid is not None:
        threading.Thread(target=_watch_parent, args=(args.parent_pid,), daemon=True).start()
    try:
        model, tokenizer = load_pretrained(args.model, args.dtype, args.device)
        engine = HFEngine(
            model,
            tokenizer,
            model_name=args.served_model_name or args.model,
            max_model_len=args.max_model_len,
            max_batch_size=args.max_batch_size,
            batch_wait_s=args.batch_wait_ms / 1000,
            chat_template=read_chat_template(args.chat_template),
        )
    except (GenerationStartupError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    import uvicorn

    app = build_app(engine, extra_routes=weight_update_routes(engine))
    from nemo_tau2.generation.serving import SHUTDOWN_GRACE_S

    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
    )


if __name__ == "__main__":
    main()
