"""A transformers model as an :class:`~nemo_tau2.generation.engine.Engine`, with continuous batching and hot weights.

Requests from any event loop are queued to one worker thread. When idle, it takes the first request and waits up
to ``batch_wait_s`` for others; while decoding, it admits waiting requests between steps (up to
``max_batch_size`` rows), so nobody waits for another request's generation to end.

The worker holds ``weights_lock`` for a whole busy period. :meth:`HFEngine.update_weights` first tells the worker
to stop admitting requests, then takes the lock once the rows in flight have finished: a completion is generated
entirely by one version of the weights (``weight_version``), and requests that arrive meanwhile wait for the new
weights.

Reported logprobs are those of the raw model distribution (see :mod:`nemo_tau2.generation.hf_generate`).
"""

import asyncio
import concurrent.futures
import contextlib
import itertools
import logging
import queue
import random
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jinja2
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

from nemo_tau2.generation.engine import GeneratedToken, GenerationRequest, GenerationResult, TokenLogprob
from nemo_tau2.generation.errors import BadRequestError, EngineError
from nemo_tau2.generation.hf_generate import DecodeBatch, RowOutput, RowRequest
from nemo_tau2.generation.weight_stream import WeightStream

logger = logging.getLogger(__name__)


@dataclass
class _Pending:
    request: GenerationRequest
    future: concurrent.futures.Future


def _stop_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    ids: set[int] = set()
    eos = model.generation_config.eos_token_id if model.generation_config is not None else None
    for value in (eos, tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list):
            ids.update(value)
    if not ids:
        raise ValueError(
            "the model has no eos_token_id (generation_config or tokenizer); cannot tell when a turn ends"
        )
    return frozenset(ids)


class HFEngine:
    """Serve ``model`` + ``tokenizer`` (its chat template, or ``chat_template``) through the vLLM surface."""

    supports_forced_tool_choice = False

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        model_name: str,
        max_model_len: int | None = None,
        max_batch_size: int = 16,
        batch_wait_s: float = 0.005,
        chat_template: str | None = None,
    ) -> None:
        if chat_template is None and not tokenizer.chat_template:
            raise ValueError(f"tokenizer of {model_name!r} has no chat template; give hf_cfg.chat_template")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.max_model_len = max_model_len or int(model.config.max_position_embeddings)
        self.end_of_turn_ids = _stop_ids(model, tokenizer)
        self.chat_template = chat_template
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        self.weight_version = 0
        self.weights_torn = False
        """True after a weight update that broke off mid-way: requests are refused until a complete one."""
        self.largest_batch = 0
        """Most requests generated together so far (observability for tests and benchmarks)."""
        self.weights_lock = threading.Lock()
        # Fast tokenizers mutate their truncation/padding state while encoding: one encoder at a time.
        self._encode_lock = threading.Lock()
        self._pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.end_of_turn_ids)
        self._queue: queue.Queue[_Pending | None] = queue.Queue()
        self._token_text: dict[int, str] = {}
        self._stopping = False
        self._no_update_pending = threading.Event()
        self._no_update_pending.set()
        self._worker = threading.Thread(target=self._serve, name="hf-generation", daemon=True)
        self._worker.start()

    @property
    def running(self) -> bool:
        """Whether the generation worker thread is alive."""
        return self._worker is not None and self._worker.is_alive()

    # ---- Engine protocol -------------------------------------------------------------------------------------

    async def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        chat_template_kwargs: dict[str, Any],
        add_generation_prompt: bool,
    ) -> list[int]:
        return await asyncio.to_thread(self._render, messages, tools, chat_template_kwargs, add_generation_prompt)

    async def tokenize(self, text: str, add_special_tokens: bool) -> list[int]:
        with self._encode_lock:
            return self.tokenizer(text, add_special_tokens=add_special_tokens).input_ids

    async def detokenize(self, token_ids: list[int]) -> str:
        self._check_ids(token_ids, "tokens")
        return self.tokenizer.decode(token_ids)

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        if not self.running:
            raise EngineError("the hf generation worker has stopped")
        if self.weights_torn:
            raise EngineError("the served weights are incomplete after a failed update; update the weights again")
        # A client's recorded ids (prefix correction) reach the embedding as they are: one out of range would fail
        # the whole batch it is decoded with, so it is refused here.
        self._check_ids(request.prompt_ids, "prompt_token_ids")
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put(_Pending(request, future))
        return await asyncio.wrap_future(future)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    # ---- weights ---------------------------------------------------------------------------------------------

    def update_weights(
        self, state_dict: Mapping[str, torch.Tensor] | WeightStream, weight_version: int | None = None
    ) -> int:
        """Copy new weights into the served model in place once the rows in flight are done; returns the version:
        ``weight_version`` when given (the trainer labels weights with its step), else one more than before.

        ``state_dict`` is a mapping or a :class:`WeightStream` (tensors arriving one by one from a sharded trainer).
        Every parameter and buffer of the model must be named with its shape, and this is checked before anything
        is copied (a partial or mismatched update would serve a silently mixed model). If a stream breaks off
        mid-way, the engine refuses requests until a complete update succeeds.
        """
        self._no_update_pending.clear()  # the worker stops admitting requests and releases the lock when idle
        try:
            return self._copy_weights(WeightStream.of(state_dict), weight_version)
        finally:
            self._no_update_pending.set()

    def _copy_weights(self, stream: WeightStream, weight_version: int | None) -> int:
        with self.weights_lock:
            current = self.model.state_dict()
            missing = sorted(set(current) - set(stream.shapes))
            unexpected = sorted(set(stream.shapes) - set(current))
            if missing or unexpected:
                raise ValueError(
                    f"state_dict does not match the served model: missing {missing[:5]}, unexpected {unexpected[:5]}"
                )
            for name, target in current.items():  # check everything before copying anything
                if tuple(stream.shapes[name]) != tuple(target.shape):
                    shape = tuple(stream.shapes[name])
                    raise ValueError(f"state_dict[{name!r}] has shape {shape}, expected {tuple(target.shape)}")
            copied: set[str] = set()
            self.weights_torn = True  # until every tensor is in
            with torch.no_grad():
                for name, tensor in stream:
                    if name not in current or name in copied or tuple(tensor.shape) != tuple(current[name].shape):
                        raise EngineError(
                            f"weight stream: {name!r} is unexpected, repeated or not its announced shape"
                        )
                    current[name].copy_(tensor.to(device=current[name].device, dtype=current[name].dtype))
                    copied.add(name)
            if copied != set(current):
                raise EngineError(f"weight stream ended without {sorted(set(current) - copied)[:5]}")
            self.weights_torn = False
            self.weight_version = self.weight_version + 1 if weight_version is None else weight_version
            logger.info("hf engine %s: weights updated to version %d", self.model_name, self.weight_version)
            return self.weight_version

    def update_weights_from_checkpoint(self, checkpoint_dir: str, weight_version: int | None = None) -> int:
        """Load a ``save_pretrained`` directory and copy its weights in (see :meth:`update_weights`)."""
        loaded = AutoModelForCausalLM.from_pretrained(checkpoint_dir, local_files_only=True, dtype=self.model.dtype)
        return self.update_weights(loaded.state_dict(), weight_version)

    def close(self) -> None:
        """Stop the worker thread once the rows in flight are done; requests still queued fail."""
        worker, self._worker = self._worker, None
        if worker is None:
            return
        self._queue.put(None)
        worker.join()
        while not self._queue.empty():
            pending = self._queue.get_nowait()
            if pending is not None:
                pending.future.set_exception(EngineError("the hf engine was shut down"))

    # ---- internals -------------------------------------------------------------------------------------------

    def _check_ids(self, token_ids: list[int], where: str) -> None:
        vocab = self.model.get_input_embeddings().num_embeddings
        bad = next((token for token in token_ids if not 0 <= token < vocab), None)
        if bad is not None:
            raise BadRequestError(f"{where}: token id {bad} is outside the model's vocabulary (0..{vocab - 1})")

    def _render(self, messages, tools, chat_template_kwargs, add_generation_prompt) -> list[int]:
        with self._encode_lock:
            return self._render_locked(messages, tools, chat_template_kwargs, add_generation_prompt)

    def _render_locked(self, messages, tools, chat_template_kwargs, add_generation_prompt) -> list[int]:
        try:
            text = self.tokenizer.apply_chat_template(
                messages,
                tools=tools,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
                chat_template=self.chat_template,
                **chat_template_kwargs,
            )
        except (jinja2.TemplateError, TypeError, KeyError) as e:
            raise BadRequestError(f"messages: the chat template cannot render them: {e}") from e
        return self.tokenizer(text, add_special_tokens=False).input_ids

    def _text_of(self, token_id: int) -> str:
        text = self._token_text.get(token_id)
        if text is None:
            text = self._token_text[token_id] = self.tokenizer.decode([token_id])
        return text

    def _take(self, limit: int, wait_s: float) -> list[_Pending]:
        """Up to ``limit`` queued requests, waiting at most ``wait_s`` for them; notes a shutdown request."""
        taken: list[_Pending] = []
        deadline = time.monotonic() + wait_s
        while len(taken) < limit and not self._stopping:
            try:
                item = self._queue.get(timeout=max(deadline - time.monotonic(), 0.0))
            except queue.Empty:
                break
            if item is None:
                self._stopping = True
            else:
                taken.append(item)
        return taken

    def _serve(self) -> None:
        """Worker loop: admit waiting requests between decode steps, one busy period per hold of the weights."""
        batch = DecodeBatch(self.model, self.end_of_turn_ids, self._pad_id)
        futures: dict[int, concurrent.futures.Future] = {}
        # Tags are serial numbers, never id(): a finished request's object can be freed and its id reused by a
        # newer one while an older row with that tag is still decoding (results would go to the wrong caller).
        tags = itertools.count()
        holding = False
        while True:
            if not len(batch):
                if holding:
                    self.weights_lock.release()  # between busy periods a weight update can go in
                    holding = False
                first = None if self._stopping else self._queue.get()
                if first is None:
                    return
                self._no_update_pending.wait()
                self.weights_lock.acquire()
                holding = True
                new = [first, *self._take(self.max_batch_size - 1, self.batch_wait_s)]
            elif self._no_update_pending.is_set():
                new = self._take(self.max_batch_size - len(batch), 0.0)
            else:
                new = []  # an update is waiting: finish the rows in flight, admit nothing
            new = [pending for pending in new if not pending.future.cancelled()]
            gone = {tag for tag, future in futures.items() if future.cancelled()}
            if gone:  # cancelled requests (the client left, the server stops) are dropped between tokens
                batch.drop(gone)
                for tag in gone:
                    del futures[tag]
            try:
                if new:
                    new_tags = [next(tags) for _ in new]
                    batch.add([self._row(p.request) for p in new], new_tags)
                    futures.update(zip(new_tags, (p.future for p in new), strict=True))
                    self.largest_batch = max(self.largest_batch, len(batch))
                finished = batch.step()
            except Exception as e:  # the worker must survive a failing step; each caller gets the error
                logger.exception("hf generation step failed")
                for future in futures.values():
                    with contextlib.suppress(concurrent.futures.InvalidStateError):  # cancelled meanwhile
                        future.set_exception(EngineError(f"generation failed: {e!r}"))
                futures.clear()
                batch = DecodeBatch(self.model, self.end_of_turn_ids, self._pad_id)
                continue
            for tag, output in finished:
                with contextlib.suppress(concurrent.futures.InvalidStateError):  # cancelled meanwhile
                    futures.pop(tag).set_result(self._result(output))

    def _row(self, request: GenerationRequest) -> RowRequest:
        generator = torch.Generator()
        generator.manual_seed(request.seed if request.seed is not None else random.getrandbits(63))
        return RowRequest(
            prompt_ids=request.prompt_ids,
            max_tokens=request.max_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            top_logprobs=request.top_logprobs,
            generator=generator,
        )

    def _result(self, output: RowOutput) -> GenerationResult:
        tokens = []
        for step, (token_id, logprob) in enumerate(zip(output.token_ids, output.logprobs, strict=True)):
            top = [TokenLogprob(i, self._text_of(i), lp) for i, lp in output.top[step]] if output.top else []
            tokens.append(GeneratedToken(token_id=token_id, text=self._text_of(token_id), logprob=logprob, top=top))
        text = self.tokenizer.decode(output.token_ids, skip_special_tokens=True)
        return GenerationResult(  # under weights_lock: no update can change the version of a busy period
            tokens=tokens,
            text=text,
            finish_reason=output.finish_reason,
            weight_version=self.weight_version,  # type: ignore[arg-type]
        )
