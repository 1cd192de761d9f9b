"""Members that move entries between keys: ``rename_keys`` (many renames at once), ``cat_tensors`` /
``stack_tensors`` (several entries combined into one), and ``entry_class`` (the class stored at a key).

Every check (missing keys, the combined value fitting the batch, the lock) runs before the first change,
so a failing call leaves the TensorDict as it was.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable

import torch

from ._convert import to_leaf
from ._keys import key_to_tuple


class KeyMembersMixin:
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
