"""update / update_ / update_at_: entries merged into a TensorDict, every one checked before the first write.

``update`` plans its writes (:class:`_UpdatePlan`) and carries them out only once all are checked, so a
refused call leaves the TensorDict as it was; ``update_`` and ``update_at_`` check every key and shape,
then copy. A source whose entries are all tensors that fit is checked in C-level passes and written with
one ``dict.update``.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable, Optional, Sequence

import torch

from ._accel import leaves_fit, leaves_fit_batch, tensor_len
from ._base import TensorCollection
from ._convert import fits_batch, quick_batch_len, to_leaf
from ._errors import MessageKeyError, locked_error, not_a_mapping_error
from ._keyops import _as_td, _key_tree
from ._keys import key_to_tuple
from ._rebatch import restore_batches, snapshot_batches
from ._unbatched import UnbatchedTensor as _Unbatched
from ._write_checks import broadcasts_into, check_copy, check_grad_writable

_MISSING: Any = object()
_Tensor = torch.Tensor


def _storage(collection: Any) -> dict:
    """A collection's entries by key: the storage dict of its TensorDict, or (a lazy stack, a file-backed
    collection: no TensorDict inside) its items."""
    inner = _as_td(collection)
    return dict(collection.items()) if inner is None else inner._tensordict


def _entries(source: Any, method: str) -> Any:
    if isinstance(source, TensorCollection):
        return _storage(source).items()
    items = getattr(source, "items", None)  # a Mapping, or anything with items() (duck-typed, as upstream)
    if items is None:
        raise not_a_mapping_error(method, source)
    return items()


def update(td: Any, source: Any, *, clone: bool, inplace: bool, non_blocking: bool,
           keys_to_update: Optional[Sequence[Any]], is_leaf: Optional[Callable[[type], bool]],
           update_batch_size: bool, ignore_lock: bool, kwargs: dict) -> Any:
    if (type(source) is type(td) and source is not td and not kwargs and not clone and not inplace
            and keys_to_update is None and not update_batch_size and not td._is_locked):
        # The commonest call: another TensorDict whose entries are all tensors that fit: one C-level
        # pass and one dict.update, none of the planning below.
        entries = source._tensordict
        if entries and _collection_fits(source, entries, td._batch_size, td._device):
            td._tensordict.update(entries)
            return td
    # Every entry is checked (and the writes planned) before the first write: see _UpdatePlan.
    plan = _UpdatePlan()
    if source is None:
        source = kwargs
    elif kwargs:
        _plan_update(plan, td, kwargs, clone, inplace, non_blocking, None, ignore_lock)
    levels = None
    if update_batch_size and isinstance(source, TensorCollection) and source.batch_size != td.batch_size:
        inner = _as_td(source)
        _check_batch_adoption(td, source if inner is None else inner, inplace, keys_to_update)
        levels = snapshot_batches(td)  # the adoption changes batch sizes before the entries are checked
        _adopt_batch(td, _storage(source), source.batch_size)
    tree = _key_tree(keys_to_update) if keys_to_update is not None else None
    try:
        _plan_update(plan, td, source, clone, inplace, non_blocking, tree, ignore_lock)
    except BaseException:
        if levels is not None:
            restore_batches(levels)
        raise
    plan.commit()
    return td


class _NestedUpdate:
    """A queued ``update`` of a nested lazy stack, run by :meth:`_UpdatePlan.commit` like a copy (``copy_``)."""

    __slots__ = ("target", "clone", "inplace")

    def __init__(self, target: Any, clone: bool, inplace: bool) -> None:
        self.target = target
        self.clone = clone
        self.inplace = inplace

    def copy_(self, value: Any, non_blocking: bool = False) -> None:
        self.target.update(value, clone=self.clone, inplace=self.inplace, non_blocking=non_blocking)


class _UpdatePlan:
    """The writes of one ``update``, all checked before the first is made.

    Replaced and new entries go into an overlay per destination storage dict, which later entries of
    the same call look up before the storage (a tuple key that creates a level, then another that
    writes into it); in-place copies are queued. :meth:`commit` then writes everything, with no check
    left that could fail half-way. A level whose source entries are all tensors that fit (the common
    case) borrows the source's own dict as its overlay: no copy, one ``dict.update`` at commit.
    """

    __slots__ = ("levels", "copies")

    def __init__(self) -> None:
        # id(storage) -> (storage, overlay, owned); the storage is kept alive, so ids stay unique.
        self.levels: dict = {}
        self.copies: list = []  # (existing tensor, value, non_blocking)

    def overlay(self, storage: dict) -> dict:
        """The overlay of ``storage`` to write into (a borrowed one is copied first: it is the caller's dict)."""
        level = self.levels.get(id(storage))
        if level is not None and level[2]:
            return level[1]
        overlay = {} if level is None else dict(level[1])
        self.levels[id(storage)] = (storage, overlay, True)
        return overlay

    def replace_all(self, storage: dict, entries: dict) -> None:
        """Write every entry of ``entries`` (checked tensors under str keys) into ``storage`` at commit."""
        if id(storage) in self.levels:
            self.overlay(storage).update(entries)
        else:
            self.levels[id(storage)] = (storage, entries, False)

    def commit(self) -> None:
        for storage, overlay, _ in self.levels.values():
            if overlay:
                storage.update(overlay)
        for existing, value, non_blocking in self.copies:
            existing.copy_(value, non_blocking=non_blocking)


def _all_fit(entries: dict, batch_size: torch.Size) -> bool:
    """True when every entry is a tensor under a str key whose leading dims are ``batch_size`` (C-level
    passes: first sizes only for a one-dim batch, the commonest; shapes for more dims)."""
    if len(batch_size) == 1:
        return leaves_fit(entries, batch_size[0])
    return leaves_fit_batch(entries, batch_size)


def _collection_fits(source: Any, entries: dict, batch_size: torch.Size, device: Any) -> bool:
    """True when every entry of a TensorDict's storage can be taken as is: tensors only, on ``device``.

    A TensorDict already guarantees that its leaves' shapes start with its batch size, so when that
    starts with ``batch_size`` only the kinds of the values are left to check (one C-level pass), not
    each leaf's dims again.
    """
    source_batch = getattr(source, "_batch_size", None)
    if source_batch is None or source_batch[:len(batch_size)] != batch_size or (device is not None and source._device != device):
        return _all_fit(entries, batch_size) if device is None else False
    if batch_size:
        return leaves_fit(entries, batch_size[0])
    # (an UnbatchedTensor is not taken as is: to_leaf gives it the batch size it is stored under)
    return all(isinstance(value, _Tensor) and not isinstance(value, _Unbatched) for value in entries.values())


def _check_batch_adoption(td: Any, source: Any, inplace: bool, keys_to_update: Any) -> None:
    """Refuse ``update(update_batch_size=True)`` from a source of another batch size unless the
    source replaces every leaf (the destination's old leaves would not fit the new batch).

    Upstream 0.15 keeps the destination's batch (with a FutureWarning) when the source's
    batch merely extends it; torchdict adopts it, as the flag asks and as upstream announces
    for 0.17, under the same conditions as any other mismatch.
    """
    if inplace:
        raise RuntimeError("Source and destination tensor collection shapes mismatch, but update was called "
                           "with inplace=True, which cannot be achieved.")
    if keys_to_update is not None:
        raise RuntimeError("Updating tensordicts of different batch-size with keys_to_update is currently not "
                           "supported.")
    if td._is_locked or any(value.is_locked for value in td.values(True) if isinstance(value, TensorCollection)):
        raise locked_error()
    missing = _entry_keys(td) - _entry_keys(source)
    if missing:
        raise RuntimeError(
            "Some keys of the dest tensordict are not present in the source during update with mismatching "
            f"batch-size. batch_size of source={source.batch_size}, batch_size of dest={td.batch_size}, keys in "
            f"dest but not in source: {sorted(missing, key=str)}.")


def _entry_keys(td: Any) -> set:
    """The nested keys of every tensor and non-tensor entry (what a new batch size must replace)."""
    return {key for key, value in td.items(True) if not isinstance(value, TensorCollection)}


def _adopt_batch(td: Any, source_storage: Any, batch_size: torch.Size) -> None:
    """Give ``td`` and its sub-collections the batch sizes of their counterparts in the source
    (a sub-collection the source lacks holds no leaf: it takes ``batch_size``)."""
    td._batch_size = batch_size
    td._batch_len = -1
    td._names = None
    for key, value in td._tensordict.items():
        if isinstance(value, TensorCollection):
            counterpart = source_storage.get(key) if source_storage is not None else None
            if isinstance(counterpart, TensorCollection):
                _adopt_batch(_as_td(value), _storage(counterpart), counterpart.batch_size)
            else:
                _adopt_batch(_as_td(value), None, batch_size)


def _plan_update(plan: _UpdatePlan, td: Any, source: Any, clone: bool, inplace: bool, non_blocking: bool,
                 tree: Optional[dict], ignore_lock: bool) -> None:
    """Check every entry of ``source`` against ``td`` and record its write in ``plan`` (nothing is written)."""
    storage = td._tensordict
    batch_size = td._batch_size
    device = td._device
    locked = td._is_locked
    quick = tree is None and not clone
    # The source's dict of entries (a dict, a TensorDict's storage), or None (a tensorclass, another mapping).
    entries = source if type(source) is dict else getattr(source, "_tensordict", None)
    if type(entries) is not dict:
        entries = None
    elif entries and quick and not inplace and not locked and (
            # The last value first: a level holding a sub-collection (usually last) skips the full pass.
            isinstance(next(reversed(entries.values())), _Tensor)) and (
            _collection_fits(source, entries, batch_size, device) if entries is not source
            else device is None and _all_fit(entries, batch_size)):
        # Only tensors that fit, under str keys: each replaces whatever the key holds (or adds it).
        plan.replace_all(storage, entries)
        return
    # plan.overlay(storage), inlined for the commonest case: a level not seen yet in this call.
    levels = plan.levels
    level = levels.get(id(storage))
    if level is None:
        overlay: dict = {}
        levels[id(storage)] = (storage, overlay, True)
    else:
        overlay = level[1] if level[2] else plan.overlay(storage)
    copies = plan.copies
    # The first-size test of a write (see quick_batch_len): 0 for no batch, n for [n], -1: the full test.
    batch_len = td._batch_len
    if batch_len < 0:
        batch_len = quick_batch_len(batch_size)
    for raw_key, value in entries.items() if entries is not None else _entries(source, "update"):
        if quick and type(raw_key) is str and isinstance(value, _Tensor) and (
                type(value) is _Tensor or not isinstance(value, _Unbatched)):
            # Fast paths: a tensor under a str key replacing a tensor (or adding a key), or copied into a
            # tensor of its very shape. The storage is read without the overlay: what the overlay holds
            # under this key is a tensor (a tensor or a missing key in the storage), replaced either way.
            existing = storage.get(raw_key, _MISSING)
            if inplace and isinstance(existing, _Tensor):
                if value.shape == existing.shape and not existing.requires_grad:
                    copies.append((existing, value, non_blocking))
                    continue
            elif (existing is _MISSING and not locked) or (
                    isinstance(existing, _Tensor) and (not locked or ignore_lock)):
                if (not batch_len or (tensor_len(value) == batch_len if batch_len > 0
                                      else fits_batch(value.shape, batch_size))) and (
                        device is None or value.device == device):
                    overlay[raw_key] = value
                    continue
        keys = key_to_tuple(raw_key)
        if len(keys) > 1:
            # A tuple key in a plain mapping: route it through the nested path.
            nested: dict = value
            for part in reversed(keys[1:]):
                nested = {part: nested}
            raw_key, value = keys[0], nested
        key = keys[0]
        subtree = None
        if tree is not None:
            subtree = tree.get(key)
            if subtree is None:
                continue
            subtree = None if subtree is True else subtree
        existing = overlay.get(key, _MISSING)
        if existing is _MISSING:
            existing = storage.get(key, _MISSING)
        if len(keys) > 1 and existing is not _MISSING and not isinstance(existing, TensorCollection):
            # A tuple key walking through a leaf: refused (as upstream), not a silent replacement.
            raise MessageKeyError(f"The entry {key} is already present in tensordict and is not a tensordict, "
                                  f"so the key {keys} can't be written through it.")
        if value is td:
            raise self_insertion_error(keys if len(keys) > 1 else key)
        if isinstance(existing, TensorCollection) and (
                isinstance(value, TensorCollection) or (not isinstance(value, _Tensor) and isinstance(value, Mapping))):
            # Sub-collections merge rather than replace.
            nested_td = _as_td(existing)
            if nested_td is None:  # a nested lazy stack: its own update, made at commit (as upstream, it stays one)
                copies.append((_NestedUpdate(existing, clone, inplace), value, non_blocking))
                continue
            _plan_update(plan, nested_td, value, clone, inplace, non_blocking, subtree, ignore_lock)
            continue
        if existing is _MISSING:
            if locked:
                raise locked_error()
        elif inplace and isinstance(existing, _Tensor) and isinstance(value, _Tensor):
            if not fits_batch(value.shape, batch_size):
                to_leaf(value, key, batch_size, None)  # raises the batch error
            check_copy(key, td, existing, value)
            copies.append((existing, value.clone() if clone else value, non_blocking))
            continue
        elif locked and not ignore_lock:
            raise locked_error()
        if clone and isinstance(value, (_Tensor, TensorCollection)):
            value = value.clone()
        if isinstance(value, _Tensor) and fits_batch(value.shape, batch_size) and (
            device is None or value.device == device
        ) and not isinstance(value, _Unbatched):
            overlay[key] = value
        else:
            overlay[key] = to_leaf(value, key, batch_size, device, non_blocking)


def self_insertion_error(key: Any) -> ValueError:
    return ValueError(f"Cannot set a tensordict inside itself (key {key!r}): tensordicts that contain themselves "
                      "are not supported.")


def update_(td: Any, source: Any, *, clone: bool, non_blocking: bool,
            keys_to_update: Optional[Sequence[Any]], kwargs: dict) -> Any:
    if source is None:
        source = kwargs
        kwargs = {}
    elif not isinstance(source, TensorCollection) and getattr(source, "items", None) is None:
        source = dict(source)  # as upstream: pairs are accepted; anything else raises dict()'s TypeError/ValueError
    tree = _key_tree(keys_to_update) if keys_to_update is not None else None
    # Check every key first so that a failed update leaves td unchanged.
    plan: list = []
    if kwargs:
        _plan_inplace(td, kwargs, None, (), plan)
    _plan_inplace(td, source, tree, (), plan)
    for existing, value, key in plan:
        if isinstance(existing, _Tensor):
            existing.copy_(value.clone() if clone else value, non_blocking=non_blocking)
        elif not existing[0]._tensordict[existing[1]]._write_shared_leaf(value):  # shared: written to its folder
            existing[0]._tensordict[existing[1]] = value
    return td


def _plan_inplace(td: Any, source: Any, tree: Optional[dict], prefix: tuple, plan: list) -> None:
    for raw_key, value in _entries(source, "update_"):
        keys = key_to_tuple(raw_key)
        target, key = (td._parent_of(keys, create=False), keys[-1]) if len(keys) > 1 else (td, keys[0])
        subtree = None
        if tree is not None:
            subtree = tree.get(keys[0])
            if subtree is None:
                continue
            subtree = None if subtree is True else subtree
        full_key = prefix + keys
        existing = target._tensordict.get(key, _MISSING)
        if existing is _MISSING:
            shown = full_key if len(full_key) > 1 else full_key[0]
            raise MessageKeyError(f"The key {shown} was not found in the dest tensordict.")
        if isinstance(existing, TensorCollection):
            if not (isinstance(value, TensorCollection) or isinstance(value, Mapping)):
                raise RuntimeError(f"update_() cannot copy a {type(value).__name__} into the "
                                   f"sub-tensordict under the key {full_key}.")
            _plan_inplace(_as_td(existing), value, subtree, full_key, plan)
        elif isinstance(existing, _Tensor):
            if not isinstance(value, _Tensor):
                value = to_leaf(value, full_key, torch.Size(()), None)
            if value.shape != existing.shape and not broadcasts_into(value.shape, existing.shape):
                raise _update_shape_error(full_key, value.shape, existing.shape)
            if existing.requires_grad:
                check_grad_writable(existing)
            plan.append((existing, value, key))
        else:
            leaf = to_leaf(value, full_key, target._batch_size, target._device)
            existing._check_shared_leaf(leaf)  # a shared leaf's refusals, before the first write
            plan.append(((target, key), leaf, key))


def _update_shape_error(full_key: tuple, shape: torch.Size, entry_shape: torch.Size) -> RuntimeError:
    """update_()'s refusal of a value that doesn't broadcast to its entry: the key, both shapes and
    torch's reason (upstream's wording)."""
    try:
        torch.broadcast_shapes(shape, entry_shape)
        reason = f"The size of tensor a ({tuple(shape)}) must match the size of tensor b ({tuple(entry_shape)})"
    except RuntimeError as error:
        reason = str(error)
    shown = full_key if len(full_key) > 1 else full_key[0]
    return RuntimeError(f"update_() cannot copy the value of shape {shape} under the key {shown!r} into the "
                        f"entry of shape {entry_shape}: {reason}")


def update_at_(td: Any, source: Any, index: Any, *, clone: bool, keys_to_update: Optional[Sequence[Any]]) -> Any:
    # Every key is resolved and every slot checked before the first write (a refused call writes nothing).
    tree = _key_tree(keys_to_update) if keys_to_update is not None else None
    writes: list = []
    _plan_at(td, source, index, tree, writes)
    for existing, value in writes:
        existing[index] = value.clone() if clone and isinstance(value, _Tensor) else value
    return td


class _WholeWrite:
    """``target[index] = value`` that writes all of ``target`` (an UnbatchedTensor has no batch dims to index)."""

    __slots__ = ("target",)

    def __init__(self, target: torch.Tensor) -> None:
        self.target = target

    def __setitem__(self, index: Any, value: torch.Tensor) -> None:
        self.target.copy_(value)


def _plan_at(td: Any, source: Any, index: Any, tree: Optional[dict], writes: list) -> None:
    for raw_key, value in _entries(source, "update_at_"):
        keys = key_to_tuple(raw_key)
        if tree is not None and keys[0] not in tree:
            continue
        existing = td._get_path(keys)
        if isinstance(existing, TensorCollection):
            _plan_at(_as_td(existing), value, index, None, writes)
            continue
        if isinstance(existing, _Unbatched) and isinstance(value, _Tensor):
            # The whole batch shares it: an UnbatchedTensor of its shape is written whole (as upstream).
            shown = keys if len(keys) > 1 else keys[0]
            if not isinstance(value, _Unbatched) or value.shape != existing.shape:
                raise RuntimeError(f"update_at_(): the UnbatchedTensor entry {shown!r} of shape {existing.shape} "
                                   f"can only take an UnbatchedTensor of its shape, got a {type(value).__name__} "
                                   f"of shape {value.shape}.")
            writes.append((_WholeWrite(existing), value))
            continue
        if isinstance(existing, _Tensor) and isinstance(value, _Tensor):
            slot = existing[index]  # raises torch's error for a bad index
            if value.shape != slot.shape and not broadcasts_into(value.shape, slot.shape):
                shown = keys if len(keys) > 1 else keys[0]
                raise RuntimeError(f"update_at_(): the value at key {shown!r} has shape {value.shape}, which does "
                                   f"not fit the indexed slot of shape {slot.shape} (the entry has shape "
                                   f"{existing.shape}).")
            if value.dtype != existing.dtype:
                value = value.to(existing.dtype)  # an advanced index writes through index_put_, which won't cast
            if existing.requires_grad:
                check_grad_writable(existing)
        writes.append((existing, value))


_FAST_COPY_REFUSED = ("copy_at_(..., fast=True) requires the optimized tensor-only copy path, but the source, "
                      "destination, or index is not compatible. Use fast=False or update_at_ for the general update "
                      "semantics.")


def check_fast_copy(td: Any, source: Any, index: Any) -> None:
    """What ``copy_at_(..., fast=True)`` (upstream's default) accepts: a TensorDict source of tensors whose
    every key ``td`` holds with exactly the shape ``td[key][index]`` has (no broadcasting), at an index that is
    not a tensor. Anything else raises upstream's ``RuntimeError`` before any write."""
    from .tensordict import TensorDict

    if type(source) is not TensorDict or isinstance(index, torch.Tensor) or (
            isinstance(index, tuple) and any(isinstance(part, torch.Tensor) for part in index)):
        raise RuntimeError(_FAST_COPY_REFUSED)
    for key, value in source.items(include_nested=True, leaves_only=True):
        target = td.get(key, None)
        if not isinstance(value, torch.Tensor) or not isinstance(target, torch.Tensor):
            raise RuntimeError(_FAST_COPY_REFUSED)
        try:
            if target[index].shape != value.shape:
                raise RuntimeError(_FAST_COPY_REFUSED)
        except IndexError as error:
            raise RuntimeError(_FAST_COPY_REFUSED) from error


def entries_to_update(input_dict_or_td: Any, kwargs: dict) -> Any:
    """What an ``update`` writes: ``input_dict_or_td`` and the entries given as keywords, as ``TensorDict.update``
    takes them (for the collections that implement ``update`` themselves: files, stores)."""
    if not kwargs:
        return {} if input_dict_or_td is None else input_dict_or_td
    if input_dict_or_td is None:
        return dict(kwargs)
    if isinstance(input_dict_or_td, Mapping):
        return {**input_dict_or_td, **kwargs}
    merged = input_dict_or_td.copy()
    merged.update(kwargs)
    return merged

