"""The KV cache of a :class:`~nemo_tau2.generation.hf_generate.DecodeBatch`: a transformers ``Cache`` whose layers
grow in place, plus the row surgery continuous batching needs (merge prefilled rows in, keep some rows).

transformers' ``DynamicLayer`` concatenates on every update, so each decode step copies the whole cache. A
:class:`RowLayer` keeps spare columns along time and writes a step's keys and values into them; ``keys`` and
``values`` are views of the first ``length`` columns. The buffer is copied only when its room runs out (it then
grows by a quarter), when rows are merged in, and when rows leave, so a step's cost does not grow with the copy of
everything decoded so far.

Rows are right-aligned: a row's padding columns (keys and values zero) come first, and the attention mask hides
them; position ids are explicit, so a row's logits do not depend on its padding.
"""

import torch
from transformers.cache_utils import Cache, DynamicLayer

MIN_SPARE = 64
"""Columns of room added at least whenever a buffer is (re)allocated."""


def _spare(length: int) -> int:
    return max(MIN_SPARE, length // 4)


class RowLayer(DynamicLayer):
    """One layer's keys and values, [rows, kv_heads, time, head_dim], in a buffer with spare time columns."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.key_room: torch.Tensor | None = None
        """The whole key buffer, spare time columns included (``keys`` is a view of its first ``length``)."""
        self.value_room: torch.Tensor | None = None
        self.length = 0

    def place(self, keys: torch.Tensor, values: torch.Tensor, *, room: int = 0) -> None:
        """Hold ``keys`` / ``values`` (copied once into a new buffer with at least ``room`` free columns)."""
        length = keys.shape[2]
        columns = length + max(room, _spare(length))
        key_room = keys.new_empty((*keys.shape[:2], columns, keys.shape[3]))
        value_room = values.new_empty((*values.shape[:2], columns, values.shape[3]))
        key_room[:, :, :length] = keys
        value_room[:, :, :length] = values
        self.adopt(key_room, value_room, length)

    def adopt(self, key_room: torch.Tensor, value_room: torch.Tensor, length: int) -> None:
        """Use these buffers as they are; their first ``length`` time columns are the cached keys and values."""
        self.key_room, self.value_room = key_room, value_room
        self.dtype, self.device, self.is_initialized = key_room.dtype, key_room.device, True
        self._expose(length)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Append ``key_states`` / ``value_states`` along time; return every cached key and value (views)."""
        if self.key_room is None:
            self.place(key_states, value_states)
            return self.keys, self.values
        end = self.length + key_states.shape[-2]
        if end > self.key_room.shape[2]:  # out of room: one copy into a larger buffer
            self.place(self.keys, self.values, room=key_states.shape[-2])
        self.key_room[:, :, self.length : end] = key_states
        self.value_room[:, :, self.length : end] = value_states
        self._expose(end)
        return self.keys, self.values

    def _expose(self, length: int) -> None:
        self.length = length
        self.keys = self.key_room[:, :, :length]
        self.values = self.value_room[:, :, :length]


class RowCache(Cache):
    """One :class:`RowLayer` per model layer, created as the forward pass reaches it."""

    def __init__(self) -> None:
        super().__init__(layer_class_to_replicate=RowLayer)

    @property
    def width(self) -> int:
        """Time columns held (padding included): the attention mask's width."""
        return self.layers[0].length if self.layers else 0

    def merge(self, other: "RowCache") -> None:
        """Append ``other``'s rows after this cache's, right-aligned to the wider of the two."""
        width = max(self.width, other.width)
        for mine, theirs in zip(self.layers, other.layers, strict=True):
            keys = _right_aligned(mine.keys, theirs.keys, width)
            mine.adopt(keys, _right_aligned(mine.values, theirs.values, width), width)

    def keep(self, rows: torch.Tensor, start: int) -> None:
        """Keep only ``rows`` (an index tensor), from time column ``start`` on (padding no kept row needs goes)."""
        for layer in self.layers:  # one copy each: the spare room comes along
            layer.adopt(layer.key_room[rows, :, start:], layer.value_room[rows, :, start:], layer.length - start)


def _right_aligned(first: torch.Tensor, second: torch.Tensor, width: int) -> torch.Tensor:
    """A buffer holding ``first``'s rows then ``second``'s, each ending at column ``width`` (zeros before), with
    spare columns after."""
    rows, heads, _, dim = first.shape
    out = first.new_zeros((rows + second.shape[0], heads, width + _spare(width), dim))
    out[:rows, :, width - first.shape[2] : width] = first
    out[rows:, :, width - second.shape[2] : width] = second
    return out
