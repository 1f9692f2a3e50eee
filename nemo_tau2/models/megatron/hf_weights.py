"""HF folders in and out of a megatron-core ``GPTModel``: every rank loads its slice; rank 0 exports whole tensors.

Loading reads the HF safetensors files (``save_pretrained`` layout, single file or indexed shards), converts them
to Megatron's layout (:mod:`nemo_tau2.models.megatron.conversion`) and copies into each parameter the slice its
tensor- and pipeline-parallel position owns. Exporting gathers each parameter's tensor-parallel slices, collects the
pipeline stages on rank 0 and converts back to HF names, streamed into :func:`weights.write_safetensors`: the same
files the FSDP2 backend writes, which vLLM reload, the hf engine and transformers read.
"""

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from nemo_tau2.models.megatron.conversion import hf_to_megatron, megatron_to_hf, stage_state, tp_merge, tp_shard
from nemo_tau2.models.megatron.model import layer_offset
from nemo_tau2.models.policy.weights import SAFETENSORS_INDEX, write_safetensors


def read_hf_state(folder: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of an HF model folder (``model.safetensors`` or the files its index names), on the CPU."""
    from safetensors.torch import load_file

    folder = Path(folder)
    index = folder / SAFETENSORS_INDEX
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else []
    paths = [folder / name for name in files] or [folder / "model.safetensors"]
    missing = [str(path) for path in paths if not path.exists()]
    if missing:
        raise FileNotFoundError(f"megatron backend: no safetensors weights at {missing[0]} (save_pretrained layout)")
    state: dict[str, torch.Tensor] = {}
    for path in paths:
        state.update(load_file(str(path)))
    return state


def _parallel_position() -> tuple[int, int]:
    from megatron.core import parallel_state

    return parallel_state.get_tensor_model_parallel_rank(), parallel_state.get_tensor_model_parallel_world_size()


def _local_names(model: Any) -> dict[str, torch.nn.Parameter]:
    return dict(model.named_parameters())


def load_hf_state(model: Any, hf_state: dict[str, torch.Tensor], hf_config: Any) -> None:
    """Copy this rank's slice of the HF weights into ``model`` (one pipeline stage); every parameter must be set."""
    tp_rank, tp_size = _parallel_position()
    full = hf_to_megatron(hf_state, hf_config, padded_vocab_size=model.vocab_size)
    tied = bool(getattr(hf_config, "tie_word_embeddings", False))
    if tied and model.post_process and not model.pre_process:  # the last stage's copy of the shared embedding
        full["output_layer.weight"] = full["embedding.word_embeddings.weight"]
    local = stage_state(
        full,
        first_layer=layer_offset(model),
        num_layers=len(model.decoder.layers),
        pre_process=model.pre_process,
        post_process=model.post_process,
    )
    params = _local_names(model)
    missing = sorted(set(params) - set(local))
    if missing:
        raise ValueError(f"megatron backend: no HF weight for {missing[:3]}")
    with torch.no_grad():
        for name, param in params.items():
            value = tp_shard(name, local[name], tp_rank, tp_size)
            if tuple(value.shape) != tuple(param.shape):
                raise ValueError(f"megatron backend: {name} is {tuple(value.shape)} in the HF weights, "
                                 f"{tuple(param.shape)} in the model")  # fmt: skip
            param.copy_(value.to(param.dtype))


def _global_name(name: str, offset: int) -> str:
    if name.startswith("decoder.layers."):
        layer, rest = name.removeprefix("decoder.layers.").split(".", 1)
        return f"decoder.layers.{int(layer) + offset}.{rest}"
    return name


def iter_full_megatron_state(model: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """``(global Megatron name, full CPU tensor)`` of this stage, TP slices gathered (a collective per tensor)."""
    from megatron.core import parallel_state

    tp_rank, tp_size = _parallel_position()
    group = parallel_state.get_tensor_model_parallel_group() if tp_size > 1 else None
    offset = layer_offset(model)
    tied = bool(model.share_embeddings_and_output_weights)
    for name, param in _local_names(model).items():
        if tied and name == "output_layer.weight":
            continue  # the shared embedding, exported once by the first stage
        tensor = param.detach()
        if tp_size > 1:
            shards = [torch.empty_like(tensor) for _ in range(tp_size)]
            dist.all_gather(shards, tensor.contiguous(), group=group)
            tensor = tp_merge(name, shards)
        yield _global_name(name, offset), tensor.to("cpu")


def full_hf_state(model: Any, hf_config: Any) -> dict[str, torch.Tensor] | None:
    """The whole model in HF names and layouts on global rank 0 (None elsewhere); every rank must call it."""
    from megatron.core import parallel_state

    stage = dict(iter_full_megatron_state(model))
    pp_size = parallel_state.get_pipeline_model_parallel_world_size()
    first_of_stage = parallel_state.get_tensor_model_parallel_rank() == 0 and (
        parallel_state.get_data_parallel_rank() == 0
    )
    if pp_size > 1:
        stages: list[Any] = [None] * pp_size
        group = parallel_state.get_pipeline_model_parallel_group()
        dist.all_gather_object(stages, stage if first_of_stage else None, group=group)
    if dist.is_initialized() and dist.get_rank() != 0:
        return None
    if pp_size > 1:
        stage = {name: tensor for part in stages for name, tensor in part.items()}
    return megatron_to_hf(stage, hf_config)


def save_hf_folder(model: Any, hf_config: Any, directory: str | Path) -> Path | None:
    """Write the model as ``save_pretrained`` would (safetensors + ``config.json``) on rank 0; a collective."""
    state = full_hf_state(model, hf_config)
    if state is None:
        return None
    directory = Path(directory)
    write_safetensors(state.items(), directory)
    hf_config.save_pretrained(directory)
    return directory
