"""Changing batch sizes in place: the ``batch_size`` setter, checked in full before anything changes.

A new batch size reaches every sub-collection whose batch no longer starts with it, so one
assignment can change many levels. Each of them is checked first (its leaves fit, it is not
locked), then all are changed: a refused assignment leaves the whole tree as it was.

:func:`snapshot_batches` / :func:`restore_batches` undo the multi-level changes made one level
at a time (``auto_batch_size_``, ``update(update_batch_size=True)``) when a later step fails.
"""
from __future__ import annotations

from typing import Any

import torch

from ._base import TensorCollection
from ._errors import incompatible_batch_error, locked_error
from .nontensor import NonTensorData
from ._unbatched import UnbatchedTensor as _Unbatched

_Tensor = torch.Tensor


def _as_td(value: Any) -> Any:
    """The TensorDict behind a collection (a tensorclass keeps one in ``_tensordict``)."""
    inner = getattr(value, "_tensordict", None)
    return value if type(inner) is dict else inner


def set_batch_size(td: Any, new_size: torch.Size) -> None:
    """``td.batch_size = new_size``: refused (changing nothing) when a leaf doesn't fit or a level that
    would change is locked."""
    if new_size == td._batch_size:
        return  # assigning the current size changes nothing: allowed even when locked
    changes: list = []
    _plan(td, new_size, (), changes)
    for level, non_tensor_keys in changes:
        storage = level._tensordict
        for key in non_tensor_keys:
            storage[key] = storage[key]._with_batch_size(new_size)
        level._batch_size = new_size
        level._batch_len = -1
        level._names = None


def _plan(td: Any, new_size: torch.Size, prefix: tuple, changes: list) -> None:
    """Check that ``td`` can take ``new_size``; record it (and its non-tensor and unbatched entries to re-batch)
    in ``changes``, then the sub-collections that must follow."""
    if td._is_locked:
        # Stricter than upstream 0.15.3, on purpose: a lock freezes the metadata with the keys (a memmap
        # result's leaves and meta.json were laid out for its batch size).
        raise locked_error()
    n_batch = len(new_size)
    non_tensor_keys = []
    subs = []
    for key, leaf in td._tensordict.items():
        if type(leaf) is not _Tensor and isinstance(leaf, _Unbatched):
            non_tensor_keys.append(key)  # no batch dims: it takes the new batch size
        elif isinstance(leaf, _Tensor):
            if leaf.shape[:n_batch] != new_size:
                raise incompatible_batch_error(prefix + (key,) if prefix else key, leaf.shape, new_size)
        elif isinstance(leaf, TensorCollection):
            if leaf.batch_size[:n_batch] != new_size:
                subs.append((key, _as_td(leaf)))
        elif isinstance(leaf, NonTensorData):
            if leaf.batch_size[:n_batch] != new_size:
                non_tensor_keys.append(key)  # one value for the whole batch: it follows any batch
        elif leaf.batch_size[:n_batch] != new_size:
            raise incompatible_batch_error(prefix + (key,) if prefix else key, leaf.batch_size, new_size)
    changes.append((td, non_tensor_keys))
    for key, sub in subs:
        _plan(sub, new_size, prefix + (key,), changes)


def snapshot_batches(td: Any) -> list:
    """Every level's batch size, names and entries, for :func:`restore_batches`."""
    levels = []
    pending = [td]
    while pending:
        level = pending.pop()
        storage = level._tensordict
        levels.append((level, level._batch_size, level._batch_len, level._names, dict(storage)))
        pending.extend(_as_td(value) for value in storage.values() if isinstance(value, TensorCollection))
    return levels


def restore_batches(levels: list) -> None:
    """Put back what :func:`snapshot_batches` recorded (each storage dict is refilled, never rebound: a
    tensorclass instance uses it as its ``__dict__``)."""
    for level, batch_size, batch_len, names, entries in levels:
        level._batch_size = batch_size
        level._batch_len = batch_len
        level._names = names
        storage = level._tensordict
        storage.clear()
        storage.update(entries)
