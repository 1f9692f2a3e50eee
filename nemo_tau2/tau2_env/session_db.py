"""Per-episode tau2 databases that share one read-only snapshot and copy only what an episode touches.

tau2's airline DB is 7 MB of JSON (27 MB as pydantic objects); deep-copying it per episode costs ~200 ms and
hashing it ~80 ms. An episode reads or writes a handful of entries, so each episode DB is a *fork* of the
domain snapshot: every ``dict`` collection (flights, users, orders, ...) becomes a :class:`CopyOnAccessDict`
that holds the snapshot's objects by reference and deep-copies an entry the first time the episode looks it up
by key. Non-dict fields (telecom's lists, the device model) are small and deep-copied eagerly.

Invariants (tested in tests/unit/tau2_env/test_session_db.py):
- the snapshot is never mutated: tau2's tools mutate only objects reached by key lookup, and lookups copy;
  iteration (``values()``/``items()``) is used by tau2's search tools for reading only;
- :func:`databases_equal` decides exactly what tau2 decides by comparing
  ``sha256(json.dumps(db.model_dump(), sort_keys=True, default=str))``, but looks only at entries that either
  side copied, plus key sets, instead of serialising megabytes.
"""

import copy
import json
from typing import Any

from pydantic import BaseModel

_MISSING = object()


class CopyOnAccessDict(dict):
    """A dict over a shared snapshot whose values are deep-copied on first keyed access.

    The dict physically holds every key (so C-level iteration, ``len`` and pydantic serialisation see the full
    collection); values not yet accessed are the snapshot's own objects. ``owned`` lists keys whose value is
    private to this dict (copied, assigned or deleted), which is all that can differ from the snapshot.
    """

    __slots__ = ("snapshot", "owned")

    def __init__(self, snapshot: dict):
        super().__init__(snapshot)
        self.snapshot = snapshot
        self.owned: set = set()

    def _own(self, key):
        value = dict.__getitem__(self, key)
        if key not in self.owned:
            value = copy.deepcopy(value)
            dict.__setitem__(self, key, value)
            self.owned.add(key)
        return value

    def __getitem__(self, key):
        return self._own(key)

    def get(self, key, default=None):
        return self._own(key) if dict.__contains__(self, key) else default

    def __setitem__(self, key, value):
        dict.__setitem__(self, key, value)
        self.owned.add(key)

    def __delitem__(self, key):
        dict.__delitem__(self, key)
        self.owned.add(key)

    def pop(self, key, default=_MISSING):
        if dict.__contains__(self, key):
            value = self._own(key)
            dict.__delitem__(self, key)
            return value
        if default is _MISSING:
            raise KeyError(key)
        return default

    def setdefault(self, key, default=None):
        if dict.__contains__(self, key):
            return self._own(key)
        self[key] = default
        return default

    def update(self, *args, **kwargs):
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def popitem(self):
        raise NotImplementedError("CopyOnAccessDict does not support popitem(); tau2's tools never call it")

    def clear(self):
        raise NotImplementedError("CopyOnAccessDict does not support clear(); tau2's tools never call it")

    def peek(self, key):
        """The current value without claiming it (no copy): for read-only comparison."""
        return dict.__getitem__(self, key)

    def __deepcopy__(self, memo):
        forked = CopyOnAccessDict(self.snapshot)
        for key in self.owned:
            if dict.__contains__(self, key):
                dict.__setitem__(forked, key, copy.deepcopy(dict.__getitem__(self, key), memo))
            else:
                dict.__delitem__(forked, key)
        forked.owned = set(self.owned)
        return forked

    def __reduce__(self):
        # Pickle as a plain dict: a pickled DB is a standalone copy, no longer tied to the snapshot.
        return (dict, (dict(self),))


def fork_database(snapshot: BaseModel) -> BaseModel:
    """A new DB of the snapshot's type whose dict collections copy on access and whose other fields are copies."""
    fields = {}
    for name in type(snapshot).model_fields:
        value = getattr(snapshot, name)
        fields[name] = CopyOnAccessDict(value) if isinstance(value, dict) else copy.deepcopy(value)
    return type(snapshot).model_construct(**fields)


def canonical_json(value: Any) -> str:
    """tau2's hashing text for one value: ``json.dumps(model_dump(), sort_keys=True, default=str)``."""
    if isinstance(value, BaseModel):
        value = value.model_dump()
    elif isinstance(value, dict | list | tuple):
        value = _plain(value)
    return json.dumps(value, sort_keys=True, default=str)


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump()
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


class SnapshotJsonCache:
    """Canonical JSON of snapshot entries, computed once per entry: the snapshot never changes."""

    def __init__(self):
        self._by_collection: dict[int, dict[Any, str]] = {}

    def entry(self, collection: CopyOnAccessDict, key) -> str:
        cache = self._by_collection.setdefault(id(collection.snapshot), {})
        text = cache.get(key)
        if text is None:
            text = canonical_json(dict.__getitem__(collection.snapshot, key))  # a layer's snapshot: never claimed
            cache[key] = text
        return text


def _entry_json(collection: CopyOnAccessDict, key, cache: SnapshotJsonCache) -> str:
    if key in collection.owned:
        return canonical_json(collection.peek(key))
    return cache.entry(collection, key)


def _collections_equal(left: CopyOnAccessDict, right: CopyOnAccessDict, cache: SnapshotJsonCache) -> bool:
    if left.keys() != right.keys():
        return False
    return all(
        _entry_json(left, key, cache) == _entry_json(right, key, cache)
        for key in (left.owned | right.owned)
        if dict.__contains__(left, key)
    )


def databases_equal(left: BaseModel | None, right: BaseModel | None, cache: SnapshotJsonCache) -> bool:
    """True iff tau2 would hash both databases to the same value (both ``None`` counts as equal)."""
    if left is None or right is None:
        return left is None and right is None
    if type(left) is not type(right):
        return False
    for name in type(left).model_fields:
        left_value, right_value = getattr(left, name), getattr(right, name)
        if (
            isinstance(left_value, CopyOnAccessDict)
            and isinstance(right_value, CopyOnAccessDict)
            and left_value.snapshot is right_value.snapshot
        ):
            if not _collections_equal(left_value, right_value, cache):
                return False
        elif canonical_json(_field_dump(left, name)) != canonical_json(_field_dump(right, name)):
            return False
    return True


def _field_dump(model: BaseModel, name: str) -> Any:
    return model.model_dump(include={name})[name]
