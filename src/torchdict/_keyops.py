"""Operations on the key structure: select, exclude, split, rename, flatten/unflatten keys (update: _update)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import torch
from torch.compiler import is_dynamo_compiling

from ._base import TensorCollection
from ._errors import MessageKeyError, missing_key_error
from ._keys import key_to_tuple
from ._views import iter_items
from .nontensor import NonTensorData

if TYPE_CHECKING:
    from .tensordict import TensorDict

_MISSING: Any = object()
NO_DEFAULT: Any = _MISSING  # split_keys(default=...) not given (the method's own default)
_Tensor = torch.Tensor


def _as_td(value: Any) -> Optional[TensorDict]:
    """The TensorDict behind a collection: itself, or the one a tensorclass (or TensorDictParams) holds; None
    for a collection of another kind (a lazy stack, a file-backed one), which keeps no TensorDict."""
    inner: Any = getattr(value, "_tensordict", None)
    return value if type(inner) is dict else inner


def _tree_keys(tree: dict, prefix: tuple = ()) -> list:
    """The nested keys a tree of :func:`_key_tree` names (the inverse of ``_key_tree``)."""
    keys: list = []
    for key, subtree in tree.items():
        keys.extend([prefix + (key,)] if subtree is True else _tree_keys(subtree, prefix + (key,)))
    return keys


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
    if not inplace and not is_dynamo_compiling():  # (Dynamo can't trace join's TypeError: the general path)
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
            if inner is None:  # another kind of collection: its own select
                result[key] = value.select(*_tree_keys(subtree), strict=strict)
                continue
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
            if inner is None:  # another kind of collection: its own exclude
                value = value.exclude(*_tree_keys(subtree))
            else:
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
            inner = _as_td(value)
            if inner is None:  # another kind of collection: its own exclude
                value.exclude(*_tree_keys(subtree), inplace=True)
            else:
                _exclude_inplace(inner, subtree)


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
        if isinstance(value, TensorCollection) and (td := _as_td(value)) is not None and td is value:
            inner = _drop_empty(td._tensordict)
            if not inner:
                continue
            if len(inner) != len(td._tensordict):
                value = td._new_like(inner)
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
    if isinstance(value, NonTensorData) and value.batch_size != batch_size:
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


def transform_keys(td: Any, key_transform: Callable[[str], str]) -> Any:
    """A TensorDict over the same leaves whose every key (at every level) is ``key_transform(key)``."""
    storage = {}
    for key, value in td._tensordict.items():
        if isinstance(value, TensorCollection) and hasattr(value, "_tensordict") and \
                isinstance(getattr(value, "_tensordict"), dict):
            value = transform_keys(value, key_transform)
        storage[key_transform(key)] = value
    return td._new_like(storage)
