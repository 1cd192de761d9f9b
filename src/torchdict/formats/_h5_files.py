"""Whole files of a ``PersistentTensorDict``: writing one from a collection (``to_h5``, ``to_zarr``,
``PersistentTensorDict.from_dict``; nothing at the target until it is complete) and opening one (``from_h5``,
``from_zarr``), with the batch size each group stores (zarr) or the largest its datasets share (HDF5).
"""
from __future__ import annotations

import warnings
from typing import Any, Optional

import torch

from .._base import TensorCollection
from .._errors import MessageKeyError
from ._h5_rows import _NON_TENSOR, _as_collection
from ._storage import GROUP, STACK, TENSOR, make_backend
from .h5 import PersistentTensorDict, _check_tree, _common_prefix, _names_of

__all__ = ["open_file", "write_file"]


def write_file(source: Any, filename: Any, backend: str, what: str, allow_pickle: Optional[bool],
               options: dict) -> PersistentTensorDict:
    """Write ``source`` to a new file at ``filename`` (nothing there until it is complete) and open it."""
    storage = make_backend(backend, what, PersistentTensorDict.LOCKING)
    _check_tree(storage, source, what, ())
    if backend == "zarr":
        from ._zarr_backend import write_store

        group = write_store(storage, filename, lambda root: _fill(storage, root, source, options))
        storage.allow_pickle = True if allow_pickle is None else allow_pickle  # written by this very call
    else:
        from ._write_target import atomic_target

        with atomic_target(filename) as partial:
            root = storage.open(partial, "w")
            try:
                _fill(storage, root, source, options)
            finally:
                storage.close(root)
        group = storage.open(filename, "r+")
    out = PersistentTensorDict._over(storage, group, source.batch_size, None, False, options, filename, "r+")
    _adopt_layout(out, source)
    return out


def _fill(storage: Any, root: Any, source: Any, options: dict) -> None:
    td = PersistentTensorDict._over(storage, root, source.batch_size, None, False, options)
    td._write_tree(source, fresh=True)
    storage.finish(root)


def _adopt_layout(target: PersistentTensorDict, source: Any) -> None:
    """Give ``target`` (just written from ``source``) the batch sizes and names of ``source``'s levels."""
    source = _as_collection(source)
    target._batch_size = source.batch_size
    target._names = _names_of(source)
    for key in source.keys():
        value = source.get(key) if not isinstance(source, PersistentTensorDict) else None
        if isinstance(source, PersistentTensorDict):
            node = source._node(key)
            if source._kind(node) != GROUP:
                continue
            value = source._child(key, node)
        if isinstance(value, TensorCollection) and not isinstance(value, _NON_TENSOR):
            node = target._node(key)
            if node is not None and target._kind(node) == GROUP:
                # written from ``value`` just now: its datasets fit its batch size, no need to read them
                _adopt_layout(target._child(key, node, check=False), value)


def open_file(filename: Any, backend: str, what: str, mode: str, auto_batch_size: bool,
              batch_dims: Optional[int], batch_size: Any, non_tensor_as_stack: bool,
              allow_pickle: Optional[bool]) -> PersistentTensorDict:
    if auto_batch_size and batch_size is not None:
        raise TypeError(f"Conflicting batch sizes in {what}: batch_size and auto_batch_size cannot be both "
                        "specified.")
    storage = make_backend(backend, what, PersistentTensorDict.LOCKING)
    storage.allow_pickle = allow_pickle
    if allow_pickle is not None and not isinstance(allow_pickle, bool):
        raise TypeError("allow_pickle must be a bool or None.")
    group = storage.open(filename, mode)
    try:
        out = PersistentTensorDict._over(storage, group, torch.Size(batch_size or ()), None, non_tensor_as_stack,
                                         {}, filename, mode)
        if batch_size is not None:
            out._check_batch_size(out._batch_size)
        else:
            _stored_or_inferred(out)
        if auto_batch_size:
            out.auto_batch_size_(batch_dims)
        elif batch_dims is not None:
            _warn_batch_dims_ignored(out, what, batch_dims, batch_size)
    except BaseException:
        storage.close(group)
        raise
    return out


def _stored_or_inferred(td: PersistentTensorDict) -> None:
    """The batch size a zarr group recorded, else the largest its entries share (each group its own)."""
    metadata = td._storage.group_metadata(td._group)
    stored = metadata.get("batch_size") if metadata else None
    if stored is not None:
        td._check_batch_size(torch.Size(stored))
        td._batch_size = torch.Size(stored)
        names = metadata.get("names")
        if names and len(names) == len(stored):
            td._names = list(names)
        for key in td._keys_str():
            node = td._node(key)
            if td._kind(node) == GROUP:
                td._child(key, node)  # its own recorded batch size
        return
    shapes = []
    for key in td._keys_str():  # one look at each node: opening a file with many entries is this loop
        node = td._node(key)
        if node is None:  # a link to nothing (soft or external): upstream's KeyError, on open
            raise MessageKeyError(f"key {key!r} not found in PersistentTensorDict: its link in "
                                  f"{td._storage.describe(td._group)} leads to no object.")
        kind = td._kind(node)
        if kind == GROUP:
            child = td._child(key, node)
            _stored_or_inferred(child)
            shapes.append(child.batch_size)
        elif kind == TENSOR:
            shapes.append(torch.Size(td._storage.shape(node)))
        elif kind == STACK:
            shapes.append(td._storage.stack_shape(node))
    td._batch_size = _common_prefix(shapes, None)


def _warn_batch_dims_ignored(td: PersistentTensorDict, what: str, batch_dims: int, batch_size: Any) -> None:
    if batch_size is None:
        probe = td.clone(recurse=False).auto_batch_size_(batch_dims)
        if _same_layout(probe, td):
            return
    advice = ("Drop batch_dims to keep today's result." if batch_size is not None
              else "Pass auto_batch_size=True to get that result now, or drop batch_dims.")
    warnings.warn(f"{what} ignores batch_dims={batch_dims} without auto_batch_size=True. Starting with TensorDict "
                  "0.17, the default will change to turning auto_batch_size on when batch_dims is given, as "
                  f"from_dict does. {advice}", FutureWarning, stacklevel=4)


def _same_layout(first: PersistentTensorDict, second: PersistentTensorDict) -> bool:
    if first.batch_size != second.batch_size:
        return False
    for key in second._keys_str():
        node = second._node(key)
        if second._kind(node) == GROUP and not _same_layout(first._child(key, first._node(key)),
                                                            second._child(key, node)):
            return False
    return True
