"""Members that move entries between keys: ``rename_keys`` (many renames at once), ``cat_tensors`` /
``stack_tensors`` (several entries combined into one), and ``entry_class`` (the class stored at a key).

Every check (missing keys, the combined value fitting the batch, the lock) runs before the first change,
so a failing call leaves the TensorDict as it was.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Callable

import torch

from ._apply import is_sub_collection as _is_sub_collection, unwrap
from ._convert import to_leaf
from ._errors import locked_error
from ._keys import key_to_tuple
from .nontensor import NonTensorData, NonTensorStack

if TYPE_CHECKING:
    from ._host import TensorDictHost
else:
    TensorDictHost = object

_NON_TENSOR = (NonTensorData, NonTensorStack)


def _drop_empty_in_place(td: Any) -> None:
    """Delete, at every level, the sub-TensorDicts that end up holding no entry."""
    storage = td._tensordict
    for key, value in list(storage.items()):
        if _is_sub_collection(value):
            inner = unwrap(value)
            _drop_empty_in_place(inner)
            if not inner._tensordict:
                del storage[key]


def _combine(td: Any, keys: tuple, out_key: Any, keep_entries: bool, combine: Callable) -> Any:
    values = [td[key] for key in keys]  # KeyError for a missing one, before anything changes
    combined = combine(values)
    out_path = key_to_tuple(out_key)
    parent = td._parent_of(out_path, create=False) if len(out_path) > 1 and out_path[:-1] in td else td
    to_leaf(combined, out_key, parent.batch_size, parent.device)  # the write's own check, before any change
    removed = [] if keep_entries else [key_to_tuple(key) for key in keys if key_to_tuple(key) != out_path]
    if removed or out_path not in td:
        td._check_unlocked()
    for path in removed:
        del td[path if len(path) > 1 else path[0]]
    td.set(out_key, combined)
    return td


class KeyMembersMixin(TensorDictHost):
    __slots__ = ()

    def rename_keys(self, mapping: Mapping, *, strict: bool = True) -> Any:
        """A new TensorDict (same leaves, new structure) with each key of ``mapping`` renamed to its value,
        all at once (swaps and chains work); a nested TensorDict the renames empty is removed.

        >>> from torchdict import TensorDict
        >>> sorted(TensorDict(a=0, b=1).rename_keys({"a": "b", "b": "a"}).keys())
        ['a', 'b']
        """
        from ._rename_keys import rename_keys

        return rename_keys(self, mapping, strict=strict)

    def cat_tensors(self, *keys: Any, out_key: Any, dim: int = 0, keep_entries: bool = False) -> Any:
        """``torch.cat`` of the entries at ``keys`` (``dim`` counts the leaves' dims) written at ``out_key``;
        the entries are removed unless ``keep_entries``. Returns self.

        >>> from torchdict import TensorDict
        >>> td = TensorDict(a=torch.zeros(2, 3), b=torch.ones(2, 1), batch_size=[2])
        >>> td.cat_tensors("a", "b", out_key="ab", dim=1)["ab"].shape, sorted(td.keys())
        (torch.Size([2, 4]), ['ab'])
        """
        return _combine(self, keys, out_key, keep_entries, lambda values: torch.cat(values, dim))

    def stack_tensors(self, *keys: Any, out_key: Any, dim: int = 0, keep_entries: bool = False) -> Any:
        """``torch.stack`` of the entries at ``keys`` written at ``out_key`` (see :meth:`cat_tensors`).

        >>> from torchdict import TensorDict
        >>> td = TensorDict(a=torch.zeros(2, 3), b=torch.ones(2, 3), batch_size=[2])
        >>> td.stack_tensors("a", "b", out_key="ab", dim=-1)["ab"].shape
        torch.Size([2, 3, 2])
        """
        return _combine(self, keys, out_key, keep_entries, lambda values: torch.stack(values, dim))

    def entry_class(self, key: Any) -> type:
        """The class of the value stored at ``key`` (``NoneType`` when there is none), without building a
        result: ``torch.Tensor``, a TensorDict class, ``NonTensorData``, ...

        >>> from torchdict import TensorDict
        >>> TensorDict(a=torch.zeros(2)).entry_class("a")
        <class 'torch.Tensor'>
        """
        return type(self.get(key, None))

    def filter_empty_(self) -> Any:
        """Delete in place the sub-TensorDicts holding no entry (at every level); returns self.

        >>> td = TensorDict(a=torch.zeros(2), b={"c": {}})
        >>> list(td.filter_empty_().keys())
        ['a']
        """
        if self.is_locked:
            raise locked_error()
        _drop_empty_in_place(self)
        return self

    def create_nested(self, key: Any) -> Any:
        """Put an empty TensorDict (batch size, device and names of its parent) at ``key``; returns self.

        As upstream, an entry already at ``key`` (or at a level on the way that isn't a
        TensorDict) is replaced.

        >>> td = TensorDict(batch_size=[2]).create_nested(("a", "b"))
        >>> td["a", "b"].batch_size
        torch.Size([2])
        """
        keys = key_to_tuple(key)
        node = self
        for part in keys[:-1]:
            if not _is_sub_collection(node._tensordict.get(part)):
                node.set(part, node.empty())  # a leaf on the way is replaced too, as upstream
            node = node.get(part)
        node.set(keys[-1], node.empty())
        return self

    def replace(self, *args: Any, **kwargs: Any) -> Any:
        """A shallow copy with the given entries set (merged into sub-TensorDicts, as ``update``).

        ``args`` is at most one dict-like of entries; ``kwargs`` are more entries. ``self`` is not
        changed; the result is unlocked.

        >>> td = TensorDict(a=torch.zeros(2), b=torch.zeros(2))
        >>> new = td.replace(a=torch.ones(2))
        >>> new["a"], td["a"], new["b"] is td["b"]
        (tensor([1., 1.]), tensor([0., 0.]), True)
        """
        if len(args) > 1:
            raise RuntimeError("Only a single argument containing a dictionary-like structure of entries to "
                               f"replace can be passed to replace. Received {len(args)} arguments instead.")
        result = self.copy()
        for entries in args + (kwargs,):
            result.update(entries)
        return result
