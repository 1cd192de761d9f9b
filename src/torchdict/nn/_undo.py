"""Taking back writes: what an entry held before a module wrote it, and how to restore it.

Used so that a failed ``TensorDictModule`` / ``TensorDictSequential`` call leaves its input as it found it.
"""
from __future__ import annotations

from typing import Any

from .._keys import NestedKey, key_to_tuple
from ..tensordict import TensorDict

_MISSING = object()


def _undo_record(tensordict: Any, key: NestedKey) -> tuple:
    if type(key) is str:
        return key, tensordict.get(key, _MISSING), None
    previous = tensordict.get(key, _MISSING)
    created_root = None
    if previous is _MISSING and not isinstance(key, str):
        # The first missing level of a nested key: the write creates it, the undo removes it whole.
        parts = key_to_tuple(key)
        for depth in range(1, len(parts)):
            prefix = parts[:depth]
            if tensordict.get(prefix if depth > 1 else prefix[0], _MISSING) is _MISSING:
                created_root = prefix if depth > 1 else prefix[0]
                break
    return key, previous, created_root


def _undo_snapshot(tensordict: Any, keys: Any) -> Any:
    """What ``_undo_restore`` needs to put the entries at ``keys`` back: for a plain TensorDict and str keys
    (the usual sequence), a shallow copy of its storage (one C call); else one ``_undo_record`` per key."""
    if type(tensordict) is TensorDict:
        for key in keys:
            if type(key) is not str:
                break
        else:
            return tensordict._tensordict.copy()
    return [_undo_record(tensordict, key) for key in keys]


def _undo_restore(tensordict: Any, snapshot: Any, keys: Any) -> None:
    """Put back the entries at ``keys`` as ``_undo_snapshot`` saw them."""
    if type(snapshot) is dict:
        storage = tensordict._tensordict
        for key in keys:
            previous = snapshot.get(key, _MISSING)
            if previous is _MISSING:
                storage.pop(key, None)
            else:
                storage[key] = previous
        return
    for record in reversed(snapshot):
        _undo_write(tensordict, record)


def _undo_write(tensordict: Any, record: tuple) -> None:
    key, previous, created_root = record
    try:
        if previous is not _MISSING:
            tensordict.set(key, previous)
        elif created_root is not None:
            if tensordict.get(created_root, _MISSING) is not _MISSING:
                del tensordict[created_root]
        elif tensordict.get(key, _MISSING) is not _MISSING:
            del tensordict[key]
    except Exception:  # the undo is best effort: the original error is the one to report
        pass
