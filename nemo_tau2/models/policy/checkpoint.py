"""Checkpoint directories: layout, RNG states, the caller's state, finding the latest and keeping the last K.

A checkpoint is one directory ``<checkpoint_dir>/step_<N>``::

    step_<N>/
      policy/              torch.distributed.checkpoint (DCP): model weights and optimizer state, keyed by
                           parameter name; each rank writes its own shards (.distcp files + .metadata)
      scheduler.pt         LR-scheduler state (identical on every rank)
      rng_state.pt         python / numpy / torch CPU / CUDA RNG states of this process and of each Ray worker
      hf_config/           the model's config.json and the tokenizer (with policy/, everything an HF export needs)
      trainer_state.json   the caller's state (step, data position, curriculum, ...), as given

The same format serves sharded (FSDP2) and unsharded training, and DCP reshards on load: a checkpoint written by
N ranks loads into M ranks, sharded or not. It is written under ``tmp_step_<N>`` and renamed when complete, so a
crash mid-save never leaves a ``step_<N>`` that :func:`latest_checkpoint` would pick. With several nodes,
``checkpoint_dir`` must be on a filesystem every rank sees.

The Megatron backend (``policy.megatron_cfg.enabled``) writes ``megatron/`` instead of ``policy/``: megatron-core's
distributed checkpoint (``metadata.json``, each rank's shards) and ``layout.json``, the TP/PP/DP sizes and optimizer
format that wrote it; by default it loads into any TP/PP/DP sizes (``megatron_config.layout_refusal`` says when
not). A checkpoint of one backend is refused by the other in one line (:class:`CheckpointMismatchError`), as is a
Megatron checkpoint the run's layout cannot read.
"""

import contextlib
import json
import logging
import random
import re
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from nemo_tau2.models.policy.megatron_config import layout_refusal

logger = logging.getLogger(__name__)

POLICY_DIR = "policy"
MEGATRON_DIR = "megatron"
MEGATRON_LAYOUT_FILE = "layout.json"
SCHEDULER_FILE = "scheduler.pt"
HF_CONFIG_DIR = "hf_config"
RNG_FILE = "rng_state.pt"
TRAINER_STATE_FILE = "trainer_state.json"
_STEP_RE = re.compile(r"^step_(\d+)$")


def step_dir(checkpoint_dir: str | Path, step: int) -> Path:
    """``<checkpoint_dir>/step_<step>``."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    return Path(checkpoint_dir) / f"step_{step}"


def list_checkpoints(checkpoint_dir: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under ``checkpoint_dir`` as ``(step, path)``, oldest first (none if it is absent)."""
    root = Path(checkpoint_dir)
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        match = _STEP_RE.match(path.name)
        if match and path.is_dir() and (path / TRAINER_STATE_FILE).is_file():
            found.append((int(match.group(1)), path))
    return sorted(found)


def latest_checkpoint(checkpoint_dir: str | Path) -> Path | None:
    """The ``step_<N>`` directory with the largest N, or None when there is none (a fresh run)."""
    found = list_checkpoints(checkpoint_dir)
    return found[-1][1] if found else None


def prune_checkpoints(checkpoint_dir: str | Path, keep_last: int) -> list[Path]:
    """Delete all but the ``keep_last`` most recent checkpoints (and leftover ``tmp_step_*``); returns the deleted."""
    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1, got {keep_last}")
    found = list_checkpoints(checkpoint_dir)
    doomed = [path for _, path in found[:-keep_last]]
    root = Path(checkpoint_dir)
    if root.is_dir():
        doomed += [path for path in root.glob("tmp_step_*") if path.is_dir()]
    for path in doomed:
        shutil.rmtree(path)
        logger.info("deleted checkpoint %s", path)
    return doomed


def temporary_dir(final: Path) -> Path:
    """The directory a checkpoint is written to before being renamed to ``final`` (emptied if left over)."""
    if final.exists():
        raise ValueError(f"checkpoint directory {str(final)!r} already exists; refusing to overwrite it")
    tmp = final.with_name(f"tmp_{final.name}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    return tmp


def write_trainer_state(directory: Path, trainer_state: dict[str, Any]) -> None:
    try:
        text = json.dumps(trainer_state, indent=2, sort_keys=True, allow_nan=True)
    except (TypeError, ValueError) as e:
        raise ValueError(f"trainer_state must be JSON-serialisable (plain dicts, lists, numbers, strings): {e}") from e
    (directory / TRAINER_STATE_FILE).write_text(text)


def read_trainer_state(directory: Path) -> dict[str, Any]:
    return json.loads((directory / TRAINER_STATE_FILE).read_text())


def get_rng_state() -> dict[str, Any]:
    """This process's python, numpy, torch CPU and (if initialised) CUDA RNG states."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`get_rng_state` captured."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class CheckpointMismatchError(ValueError):
    """A checkpoint this run cannot resume although it may be whole (another backend or Megatron layout): resuming
    must stop on it, never skip it as incomplete and start afresh."""


def check_checkpoint_dir(directory: str | Path, megatron_layout: dict[str, Any] | None) -> Path:
    """``directory`` as a Path, or a one-line ValueError naming what is missing from it, or a
    :class:`CheckpointMismatchError` when another backend or Megatron layout wrote it. ``megatron_layout``: this
    run's (``megatron_config.megatron_layout``), None for the torch backend."""
    path = Path(directory)
    mine, other = (MEGATRON_DIR, POLICY_DIR) if megatron_layout is not None else (POLICY_DIR, MEGATRON_DIR)
    if (path / other).is_dir() and not (path / mine).exists():
        backends = {MEGATRON_DIR: "the Megatron backend", POLICY_DIR: "the torch backend"}
        raise CheckpointMismatchError(
            f"{str(path)!r} was written by {backends[other]} ({other}/), this run trains with {backends[mine]} "
            f"(policy.megatron_cfg.enabled={str(megatron_layout is not None).lower()}): resume it with that backend, "
            "or set another checkpointing.checkpoint_dir"
        )
    if megatron_layout is None:
        parts = (f"{POLICY_DIR}/.metadata", SCHEDULER_FILE, RNG_FILE, TRAINER_STATE_FILE)
    else:
        weights = (f"{MEGATRON_DIR}/metadata.json", f"{MEGATRON_DIR}/{MEGATRON_LAYOUT_FILE}")
        parts = (*weights, SCHEDULER_FILE, RNG_FILE, TRAINER_STATE_FILE)
    missing = [name for name in parts if not (path / name).exists()]
    if missing:
        raise ValueError(f"{str(path)!r} is not a complete checkpoint: missing {missing}")
    if megatron_layout is not None:
        layout_file = path / MEGATRON_DIR / MEGATRON_LAYOUT_FILE
        try:
            written = json.loads(layout_file.read_text())
        except (ValueError, UnicodeDecodeError):
            written = None
        if not isinstance(written, dict):
            raise ValueError(f"{str(path)!r} is not a complete checkpoint: {layout_file.name} is not a JSON object")
        refusal = layout_refusal(written, megatron_layout)
        if refusal is not None:
            raise CheckpointMismatchError(f"{str(path)!r} {refusal}")
    return path


@contextlib.contextmanager
def _single_process_is_intended() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


def save_model_and_optimizer(
    directory: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, distributed: bool
) -> None:
    """Every rank of the group (or this process alone) writes its shards of weights and optimizer state."""
    model_state, optimizer_state = get_state_dict(model, optimizer)
    with _single_process_is_intended():
        dcp.save({"model": model_state, "optim": optimizer_state}, checkpoint_id=directory / POLICY_DIR,
                 no_dist=not distributed)  # fmt: skip


def load_model_and_optimizer(
    directory: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, distributed: bool
) -> None:
    """Read this rank's shards (resharded from however many ranks wrote them) into the model and optimizer."""
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optimizer_state}
    try:
        with _single_process_is_intended():
            dcp.load(state, checkpoint_id=directory / POLICY_DIR, no_dist=not distributed)
    except (CheckpointException, RuntimeError, ValueError, KeyError) as e:
        first_line = (str(e).splitlines() or [type(e).__name__])[0][:300]
        raise ValueError(f"checkpoint {str(directory)!r} does not fit this model and optimizer: {first_line}") from e
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
