"""Operations on the key structure: update, select, exclude, split, rename, flatten/unflatten keys."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable, Optional, Sequence

import torch

from ._base import TensorCollection
from ._convert import fits_batch, to_leaf
from ._errors import MessageKeyError, locked_error, missing_key_error
from ._keys import key_to_tuple
from ._views import iter_items
from .nontensor import NonTensorData

_MISSING: Any = object()
NO_DEFAULT: Any = _MISSING  # split_keys(default=...) not given (the method's own default)
_Tensor = torch.Tensor


def _as_td(value: Any) -> Any:
    inner = getattr(value, "_tensordict", None)
    return value if type(inner) is dict else inner


def _key_tree(keys: Sequence[Any]) -> dict:
    """Group nested keys into a tree: ``{"a": {"b": True}, "c": True}``; ``True`` selects a whole entry."""
    tree: dict = {}
    for key in keys:
        path = key_to_tuple(key)
        node = tree
        for part in path[:-1]:
            child = node.get(part)
            if child is True:
                break
            node = node.setdefault(part, {})
        else:
            node[path[-1]] = True
    return tree


def _entries(source: Any) -> Any:
    if isinstance(source, TensorCollection):
        return _as_td(source)._tensordict.items()
    if isinstance(source, Mapping):
        return source.items()
    return source.items()  # raises AttributeError for non-mappings, like upstream


def update(td: Any, source: Any, *, clone: bool, inplace: bool, non_blocking: bool,
           keys_to_update: Optional[Sequence[Any]], is_leaf: Optional[Callable[[type], bool]],
           update_batch_size: bool, ignore_lock: bool, kwargs: dict) -> Any:
    if source is None:
        source = kwargs
    elif kwargs:
        _update_from(td, kwargs, clone, inplace, non_blocking, None, ignore_lock)
    if update_batch_size and isinstance(source, TensorCollection) and source.batch_size != td.batch_size:
        _check_batch_adoption(td, _as_td(source), inplace, keys_to_update)
        _adopt_batch(td, _as_td(source)._tensordict, source.batch_size)
    tree = _key_tree(keys_to_update) if keys_to_update is not None else None
    _update_from(td, source, clone, inplace, non_blocking, tree, ignore_lock)
    return td


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
    if td._is_locked:
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
                _adopt_batch(_as_td(value), _as_td(counterpart)._tensordict, counterpart.batch_size)
            else:
                _adopt_batch(_as_td(value), None, batch_size)


def _update_from(td: Any, source: Any, clone: bool, inplace: bool, non_blocking: bool,
                 tree: Optional[dict], ignore_lock: bool) -> None:
    storage = td._tensordict
    batch_size = td._batch_size
    device = td._device
    locked = td._is_locked
    for raw_key, value in _entries(source):
        if type(raw_key) is str and tree is None and not clone and isinstance(value, _Tensor):
            # Fast path: a tensor under a str key replacing a tensor (or adding a key).
            existing = storage.get(raw_key, _MISSING)
            if (existing is _MISSING and not locked) or (
                isinstance(existing, _Tensor) and not inplace and (not locked or ignore_lock)
            ):
                if fits_batch(value.shape, batch_size) and (
                        device is None or value.device == device):
                    storage[raw_key] = value
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
            _update_from(_as_td(existing), value, clone, inplace, non_blocking, subtree, ignore_lock)
            continue
        if existing is _MISSING:
            if td._is_locked:
                raise locked_error()
        elif inplace and isinstance(existing, _Tensor) and isinstance(value, _Tensor):
            if not fits_batch(value.shape, batch_size):
                to_leaf(value, key, batch_size, None)  # raises the batch error
            existing.copy_(value, non_blocking=non_blocking)
            continue
        elif td._is_locked and not ignore_lock:
            raise locked_error()
        if clone and isinstance(value, (_Tensor, TensorCollection)):
            value = value.clone()
        if isinstance(value, _Tensor) and fits_batch(value.shape, batch_size) and (
            device is None or value.device == device
        ):
            storage[key] = value
        else:
            storage[key] = to_leaf(value, key, batch_size, device, non_blocking)


def self_insertion_error(key: Any) -> ValueError:
    return ValueError(f"Cannot set a tensordict inside itself (key {key!r}): tensordicts that contain themselves "
                      "are not supported.")


def update_(td: Any, source: Any, *, clone: bool, non_blocking: bool,
            keys_to_update: Optional[Sequence[Any]], kwargs: dict) -> Any:
    if source is None:
        source = kwargs
    tree = _key_tree(keys_to_update) if keys_to_update is not None else None
    # Check every key first so that a failed update leaves td unchanged.
    plan: list = []
    _plan_inplace(td, source, tree, (), plan)
    for existing, value, key in plan:
        if isinstance(existing, _Tensor):
            existing.copy_(value.clone() if clone else value, non_blocking=non_blocking)
        else:
            existing[0]._tensordict[existing[1]] = value
    return td


def _plan_inplace(td: Any, source: Any, tree: Optional[dict], prefix: tuple, plan: list) -> None:
    for raw_key, value in _entries(source):
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
            try:
                torch.broadcast_shapes(value.shape, existing.shape)
                if value.dim() > existing.dim() or torch.broadcast_shapes(value.shape, existing.shape) != existing.shape:
                    raise RuntimeError(f"The size of tensor a ({tuple(value.shape)}) must match the size of "
                                       f"tensor b ({tuple(existing.shape)})")
            except RuntimeError as error:
                shown = full_key if len(full_key) > 1 else full_key[0]
                raise RuntimeError(
                    f"update_() cannot copy the value of shape {value.shape} under the key {shown!r} into the "
                    f"entry of shape {existing.shape}: {error}"
                ) from None
            plan.append((existing, value, key))
        else:
            plan.append(((target, key), to_leaf(value, full_key, target._batch_size, target._device), key))


def update_at_(td: Any, source: Any, index: Any, *, clone: bool, keys_to_update: Optional[Sequence[Any]]) -> Any:
    tree = _key_tree(keys_to_update) if keys_to_update is not None else None
    for raw_key, value in _entries(source):
        keys = key_to_tuple(raw_key)
        if tree is not None and keys[0] not in tree:
            continue
        existing = td._get_path(keys)
        if isinstance(existing, TensorCollection):
            update_at_(_as_td(existing), value, index, clone=clone, keys_to_update=None)
        else:
            existing[index] = value.clone() if clone and isinstance(value, _Tensor) else value
    return td


def rename_key_(td: Any, old_key: Any, new_key: Any, safe: bool) -> Any:
    old = key_to_tuple(old_key)
    new = key_to_tuple(new_key)
    source = td._parent_of(old, create=False) if len(old) > 1 else td
    if old[-1] not in source._tensordict:
        raise missing_key_error(old_key, source._tensordict)
    if safe and td._get_path(new, None) is not None:
        shown = new if len(new) > 1 else new[0]
        raise MessageKeyError(f"key {shown} already present in TensorDict.")
    source._check_unlocked()
    if len(new) > len(old) and new[:len(old)] == old:
        # A path under the key itself (("n",) -> ("n", "x")): the entry moves down into new
        # levels created in its place, so it is taken out before they are made.
        value = source._tensordict.pop(old[-1])
        td._parent_of(new, create=True)._tensordict[new[-1]] = value
        return td
    target = td._parent_of(new, create=True) if len(new) > 1 else td
    target._check_unlocked()
    value = source._tensordict.pop(old[-1])
    target._tensordict[new[-1]] = value
    return td


def select(td: Any, keys: tuple, *, inplace: bool, strict: bool) -> Any:
    if not inplace:
        # The common call, flat str keys: one dict read each, no key tree. join raises TypeError
        # unless every key is a str; those calls, and a missing key, take the general path below
        # (which words the error, or skips the key when not strict).
        storage = td._tensordict
        try:
            "".join(keys)
            return td._new_like({key: storage[key] for key in keys})
        except (TypeError, KeyError):
            pass
    for key in keys:
        if isinstance(key, list):
            raise RuntimeError("key should be a Sequence<NestedKey>")
    tree = _key_tree(keys)
    storage = _select_storage(td, tree, strict)
    if inplace:
        td._check_unlocked()
        td._tensordict.clear()
        td._tensordict.update(storage)
        return td
    return td._new_like(storage)


def _select_storage(td: Any, tree: dict, strict: bool) -> dict:
    storage = td._tensordict
    result: dict = {}
    for key, subtree in tree.items():
        value = storage.get(key, _MISSING)
        if value is _MISSING:
            if strict:
                raise missing_key_error(key, storage)
            continue
        if subtree is True:
            result[key] = value
        elif isinstance(value, TensorCollection):
            inner = _as_td(value)
            selected = inner._new_like(_select_storage(inner, subtree, strict))
            result[key] = selected if inner is value else value._rewrap(selected)
        elif strict:
            from ._errors import through_leaf_error

            # upstream's select words it as E-LEAF but raises a KeyError (a missing key)
            raise MessageKeyError(str(through_leaf_error(key, value, next(iter(subtree)))))
    return result  # in the order the keys were asked for, like upstream


def exclude(td: Any, keys: tuple, *, inplace: bool) -> Any:
    tree = _key_tree(keys)
    if inplace:
        td._check_unlocked()
        _exclude_inplace(td, tree)
        return td
    return td._new_like(_exclude_storage(td, tree))


def _exclude_storage(td: Any, tree: dict) -> dict:
    result: dict = {}
    for key, value in td._tensordict.items():
        if isinstance(value, _Tensor):
            if tree.get(key) is not True:
                result[key] = value
            continue
        subtree = tree.get(key)
        if subtree is True:
            continue
        if subtree is not None and isinstance(value, TensorCollection):
            inner = _as_td(value)
            kept = inner._new_like(_exclude_storage(inner, subtree))
            value = kept if inner is value else value._rewrap(kept)
        elif isinstance(value, TensorCollection):
            value = value.copy()
        result[key] = value
    return result


def _exclude_inplace(td: Any, tree: dict) -> None:
    storage = td._tensordict
    for key, subtree in tree.items():
        value = storage.get(key, _MISSING)
        if value is _MISSING:
            continue
        if subtree is True:
            td._check_unlocked()
            del storage[key]
        elif isinstance(value, TensorCollection):
            _exclude_inplace(_as_td(value), subtree)


def split_keys(td: Any, key_sets: tuple, *, inplace: bool, default: Any, strict: bool,
               reproduce_struct: bool) -> tuple:
    results = []
    taken: list = []
    for key_set in key_sets:
        key_set = [key_set] if isinstance(key_set, (str, tuple)) else list(key_set)
        if default is not _MISSING:
            filled = td._new_like({})
            for key in key_set:
                value = td._get_path(key_to_tuple(key), None)
                filled._set_path(key_to_tuple(key), default if value is None else value)
            results.append(filled)
        else:
            results.append(select(td, tuple(key_set), inplace=False, strict=strict))
        taken.extend(key_set)
    remainder = _exclude_storage(td, _key_tree(taken))
    if not reproduce_struct:
        remainder = _drop_empty(remainder)
    if inplace:
        td._check_unlocked()
        td._tensordict.clear()
        td._tensordict.update(remainder)
        results.append(td)
    else:
        results.append(td._new_like(remainder))
    return tuple(results)


def _drop_empty(storage: dict) -> dict:
    """``storage`` without its sub-TensorDicts that hold no leaf (as upstream's split_keys remainder).

    A level that changes is rebuilt, never edited: it may be the source's own sub-TensorDict.
    """
    result = {}
    for key, value in storage.items():
        if isinstance(value, TensorCollection) and _as_td(value) is value:
            inner = _drop_empty(value._tensordict)
            if not inner:
                continue
            if len(inner) != len(value._tensordict):
                value = value._new_like(inner)
        result[key] = value
    return result


def _flat_items(td: Any, is_leaf: Optional[Callable[[type], bool]]) -> Any:
    if is_leaf is None:
        is_leaf = _not_collection
    return iter_items(td._tensordict, True, True, is_leaf)


def _not_collection(cls: type) -> bool:
    return not issubclass(cls, TensorCollection)


def flatten_keys(td: Any, separator: str, inplace: bool, is_leaf: Optional[Callable[[type], bool]]) -> Any:
    storage: dict = {}
    collided = []
    for key, value in _flat_items(td, is_leaf):
        flat = separator.join(key) if isinstance(key, tuple) else key
        if flat in storage:
            collided.append(key)
        storage[flat] = _rebatch_leaf(value, td._batch_size)
    if collided:
        raise MessageKeyError(f"Flattening keys in tensordict causes keys {collided} to collide.")
    if inplace:
        td._check_unlocked()
        nested = [key for key, value in td._tensordict.items() if isinstance(value, TensorCollection)]
        for key in nested:
            del td._tensordict[key]
        for key, value in storage.items():
            if separator in key or key not in td._tensordict:
                td._tensordict.pop(key, None)
                td._tensordict[key] = value
        return td
    return td._new_like(storage)


def _rebatch_leaf(value: Any, batch_size: torch.Size) -> Any:
    # A non-tensor leaf of a sub-td with a longer batch takes the parent's batch once flattened.
    if type(value) is NonTensorData and value.batch_size != batch_size:
        return value._with_batch_size(batch_size)
    return value


def unflatten_keys(td: Any, separator: str, inplace: bool) -> Any:
    result = td._new_like({})
    storage = result._tensordict
    for key, value in td._tensordict.items():
        if type(value) is type(td) or (isinstance(value, TensorCollection) and _as_td(value) is value):
            value = unflatten_keys(value, separator, False)
        if separator in key:
            parts = tuple(key.split(separator))
            try:
                parent = result._parent_of(parts, create=True)
            except KeyError:  # a level of the key is already a leaf
                raise _unflatten_collision(parts) from None
            target, last = parent._tensordict, parts[-1]
        else:
            parts, target, last = (key,), storage, key
        existing = target.get(last)
        if existing is None:
            target[last] = value
        elif isinstance(existing, TensorCollection) and isinstance(value, TensorCollection):
            _merge_disjoint(_as_td(existing), _as_td(value), parts)
        else:
            raise _unflatten_collision(parts)
    if inplace:
        td._check_unlocked()
        td._tensordict.clear()
        td._tensordict.update(storage)
        return td
    return result


def _unflatten_collision(key: tuple) -> KeyError:
    return MessageKeyError(f"Unflattening key(s) in tensordict will override an existing for unflattened key {key}.")


def _merge_disjoint(target: Any, source: Any, prefix: tuple) -> None:
    for key, value in source._tensordict.items():
        existing = target._tensordict.get(key)
        if existing is None:
            target._tensordict[key] = value
        elif isinstance(existing, TensorCollection) and isinstance(value, TensorCollection):
            _merge_disjoint(_as_td(existing), _as_td(value), prefix + (key,))
        else:
            raise _unflatten_collision(prefix + (key,))
