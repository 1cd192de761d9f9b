"""Live views over a TensorDict's keys, values and items."""
from __future__ import annotations

from collections.abc import Set
from typing import Any, Callable, Iterator, Optional, Tuple

import torch

from ._base import TensorCollection
from ._keys import key_to_tuple
from .nontensor import NON_TENSOR_TYPES

_Tensor = torch.Tensor


def default_is_leaf(cls: type) -> bool:
    """Tensors are leaves; collections and non-tensor data are not (for ``leaves_only``)."""
    return not issubclass(cls, TensorCollection) and cls not in NON_TENSOR_TYPES  # (a MetaData class too)


def entries_of(value: Any) -> dict:
    """The entries of a nested collection as a dict: a TensorDict's (or a tensorclass's) own storage, else
    (a lazy stack, a file- or server-backed collection) read through its primitives."""
    inner = getattr(value, "_tensordict", None)
    if type(inner) is dict:
        return inner
    inner_storage = getattr(inner, "_tensordict", None)  # a tensorclass keeps its fields in a TensorDict
    if type(inner_storage) is dict:
        return inner_storage
    return {key: value._get_str(key, None) for key in value._keys_str()}


def iter_items(storage: dict, include_nested: bool, leaves_only: bool,
               is_leaf: Optional[Callable[[type], bool]], prefix: Tuple[str, ...] = ()) -> Iterator[tuple]:
    """``(key, value)`` pairs in insertion order, post-order for nested entries."""
    if is_leaf is None:
        # The common case: one list built by a plain recursion (much cheaper than nested generators).
        items: list = []
        _collect_default(storage, include_nested, leaves_only, prefix, items)
        return iter(items)
    return _iter_items_custom(storage, include_nested, leaves_only, is_leaf, prefix)


def _iter_items_custom(storage: dict, include_nested: bool, leaves_only: bool,
                       is_leaf: Callable[[type], bool], prefix: Tuple[str, ...]) -> Iterator[tuple]:
    for key, value in storage.items():
        full_key = prefix + (key,) if prefix else key
        leaf = is_leaf(type(value))
        if include_nested and not leaf and isinstance(value, TensorCollection):
            nested_prefix = full_key if prefix else (key,)
            yield from _iter_items_custom(entries_of(value), True, leaves_only, is_leaf, nested_prefix)
        if not leaves_only or leaf:
            yield full_key, value


def _collect_default(storage: dict, include_nested: bool, leaves_only: bool, prefix: Tuple[str, ...],
                     out: list) -> None:
    # Default is_leaf: isinstance checks instead of a per-item call.
    append = out.append
    for key, value in storage.items():
        if isinstance(value, _Tensor):
            append(((prefix + (key,) if prefix else key), value))
        elif isinstance(value, TensorCollection):
            nested_prefix = prefix + (key,)
            if include_nested:
                _collect_default(entries_of(value), True, leaves_only, nested_prefix, out)
            if not leaves_only:
                append(((nested_prefix if prefix else key), value))
        elif not leaves_only:
            append(((prefix + (key,) if prefix else key), value))


def _sort_key(key: Any) -> tuple:
    return key if isinstance(key, tuple) else (key,)


class _View:
    __slots__ = ("_td", "include_nested", "leaves_only", "is_leaf", "sort")

    def __init__(self, td: Any, include_nested: bool = False, leaves_only: bool = False,
                 is_leaf: Optional[Callable[[type], bool]] = None, sort: bool = False) -> None:
        self._td = td
        self.include_nested = include_nested
        self.leaves_only = leaves_only
        self.is_leaf = is_leaf
        self.sort = sort

    def _items(self) -> Iterator[tuple]:
        items = iter_items(self._td._tensordict, self.include_nested, self.leaves_only, self.is_leaf)
        if self.sort:
            return iter(sorted(items, key=lambda item: _sort_key(item[0])))
        return items

    def __len__(self) -> int:
        if not self.include_nested and not self.leaves_only:
            return len(self._td._tensordict)
        return len(list(self._items()))


class KeysView(_View, Set):
    """Live view of the keys; ``in`` accepts nested tuple keys."""

    __slots__ = ()

    def __iter__(self) -> Iterator[Any]:
        if not self.include_nested and not self.leaves_only and not self.sort:
            return iter(self._td._tensordict)
        try:
            return iter([key for key, _ in self._items()])
        except RuntimeError:
            # A nested lazy stack with ragged leaves can't give its values (as upstream), but its keys:
            # the walk again, asking such a collection for its own keys.
            keys = self._keys_of(self._td._tensordict, ())
            return iter(sorted(keys, key=_sort_key) if self.sort else keys)

    def __len__(self) -> int:
        if not self.include_nested and not self.leaves_only:
            return len(self._td._tensordict)
        return len(list(iter(self)))

    def _keys_of(self, storage: dict, prefix: tuple) -> list:
        out: list = []
        is_leaf = self.is_leaf or default_is_leaf
        for key, value in storage.items():
            full_key = prefix + (key,)
            leaf = is_leaf(type(value))
            if not leaf and isinstance(value, TensorCollection):
                inner = getattr(value, "_tensordict", None)
                if type(inner) is dict or type(getattr(inner, "_tensordict", None)) is dict:
                    out.extend(self._keys_of(entries_of(value), full_key))
                else:
                    out.extend(full_key + key_to_tuple(nested) for nested in
                               value.keys(True, self.leaves_only, is_leaf=self.is_leaf))
            if not self.leaves_only or leaf:
                out.append(full_key)
        return [key[0] if len(key) == 1 else key for key in out]

    def __contains__(self, key: object) -> bool:
        if type(key) is str and not self.leaves_only:  # the commonest question first
            return key in self._td._tensordict
        if type(key) is not str:
            if not isinstance(key, (str, tuple)) or not key:
                raise TypeError(
                    "TensorDict keys are always strings. Membership checks are only supported for "
                    "strings or non-empty tuples of strings (for nested TensorDicts)"
                )
            try:
                key = key_to_tuple(key)
            except KeyError:
                raise TypeError(
                    "TensorDict keys are always strings. Membership checks are only supported for "
                    "strings or non-empty tuples of strings (for nested TensorDicts)"
                ) from None
            if len(key) == 1:
                key = key[0]
            elif not self.include_nested:
                return False
            else:
                return self._contains_nested(key)
        storage = self._td._tensordict
        if key not in storage:
            return False
        if self.leaves_only:
            is_leaf = self.is_leaf or default_is_leaf
            return is_leaf(type(storage[key]))
        return True

    def _contains_nested(self, key: tuple) -> bool:
        storage = self._td._tensordict
        for depth, part in enumerate(key[:-1]):
            value = storage.get(part)
            if not isinstance(value, TensorCollection):
                return False
            if self.is_leaf is not None and self.is_leaf(type(value)):
                return False
            inner = getattr(value, "_tensordict", None)
            if type(inner) is not dict and type(getattr(inner, "_tensordict", None)) is not dict:
                # A nested lazy stack (ragged leaves can't be read): it answers for the rest of the key.
                rest = key[depth + 1:]
                return (rest[0] if len(rest) == 1 else rest) in value.keys(True, self.leaves_only,
                                                                           is_leaf=self.is_leaf)
            storage = entries_of(value)
        if key[-1] not in storage:
            return False
        if self.leaves_only:
            return (self.is_leaf or default_is_leaf)(type(storage[key[-1]]))
        return True

    @classmethod
    def _from_iterable(cls, iterable: Any) -> set:
        return set(iterable)

    def __repr__(self) -> str:
        return (f"_TensorDictKeysView({list(self)},\n    include_nested={self.include_nested},\n"
                f"    leaves_only={self.leaves_only})")


class ValuesView(_View):
    """Live view of the values (non-tensor entries as their wrappers)."""

    __slots__ = ()

    def __iter__(self) -> Iterator[Any]:
        if not self.include_nested and not self.leaves_only and not self.sort:
            return iter(self._td._tensordict.values())
        return (value for _, value in self._items())


class ItemsView(_View):
    """Live view of ``(key, value)`` pairs."""

    __slots__ = ()

    def __iter__(self) -> Iterator[tuple]:
        if not self.include_nested and not self.leaves_only and not self.sort:
            return iter(self._td._tensordict.items())
        return self._items()
