"""Writes into a lazy stack: ``td[index] = value``, ``set``, ``set_``: each member gets its piece.

A write checks every member's piece before the first member is written, and a member that refuses part-way
has what was written undone (new keys removed, old values put back), so a failed call changes nothing.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from .._base import TensorCollection
from .._convert import fits_batch, to_leaf
from .._errors import batch_mismatch_error, locked_error
from .._keys import key_to_tuple
from ..base import TensorDictBase
from ..nontensor import NonTensorData
from ..tensordict import TensorDict
from ._ops import _MISSING

if TYPE_CHECKING:
    from typing_extensions import Self

    from . import LazyStackedTensorDict
    from ._host import LazyHost
else:
    LazyHost = object

__all__ = ["LazyWritesMixin", "undo_record"]

_Tensor = torch.Tensor


class LazyWritesMixin(LazyHost):
    """The write members of a lazy stack (the class using it provides ``_tds``, ``_stack_dim``, ``get``...)."""

    __slots__ = ()

    def __setitem__(self, index: Any, value: Any) -> None:
        if isinstance(index, str) or (isinstance(index, tuple) and index and
                                      all(isinstance(item, (str, tuple)) for item in index)):
            self.set(index, value)
            return
        split = self._split_index(index)
        item = split.stack_item
        if isinstance(item, int):  # one member: its own (atomic) write
            self._tds[item][split.member_index] = value
            return
        if isinstance(value, TensorCollection):
            expected = self[index].batch_size
            if value.batch_size != expected:
                raise RuntimeError(f"Cannot write a value of batch size {value.batch_size} at an index of "
                                   f"batch size {expected}.")
            pieces = list(value.unbind(split.new_stack_dim))
        elif isinstance(value, (bool, int, float)):
            pieces = [value] * len(item)
        else:
            raise TypeError(f"Writing at an index of a LazyStackedTensorDict takes a TensorDict or a Python "
                            f"number, not {type(value).__name__}.")
        members = [self._tds[position] for position in item]
        # Each member's write is atomic; the earlier ones are undone if a later one fails.
        backups = [(member, set(member.keys(True)), member[split.member_index].clone())
                   for member in members[:-1]]
        try:
            for member, piece in zip(members, pieces):
                member[split.member_index] = piece
        except BaseException:
            for member, keys_before, backup in backups:
                for key in _new_keys(member, keys_before):
                    del member[key]
                member[split.member_index] = backup
            raise

    def set(self, key: Any, item: Any, inplace: bool = False, *, non_blocking: bool = False,
            **kwargs: Any) -> Self:
        """Split ``item`` (full batch) along the stack dim into the members; returns self.

        A ``list`` with one value per member writes value ``i`` into member ``i``
        (so the members may get different shapes). With ``inplace``, a tensor is copied
        into the tensors every member already has at ``key`` (``set_``).

        >>> import torch
        >>> from torchdict import lazy_stack
        >>> a, b = TensorDict(), TensorDict()
        >>> _ = lazy_stack([a, b]).set("x", torch.tensor([1, 2]))
        >>> a["x"], b["x"]
        (tensor(1), tensor(2))
        """
        keys = key_to_tuple(key)
        if inplace and isinstance(item, _Tensor):
            values = self._member_values(keys)
            if values is not _MISSING and all(isinstance(value, _Tensor) for value in values):
                return self.set_(keys, item)
        if self._is_locked or any(td.is_locked for td in self._tds):
            raise locked_error()
        self._write(keys, self._pieces(keys, item))
        return self

    def _pieces(self, keys: tuple, item: Any) -> list:
        """``item`` split into one value per member."""
        key = keys if len(keys) > 1 else keys[0]
        count, dim = len(self._tds), self._stack_dim
        if type(item) is list:
            if len(item) != count:
                raise ValueError(f"A list written to a LazyStackedTensorDict needs one value per member ({count}), "
                                 f"got {len(item)}.")
            return item
        batch = self.batch_size
        if isinstance(item, TensorCollection):
            if item.batch_size[:len(batch)] != batch:
                raise batch_mismatch_error(batch, item.batch_size, key)
            return list(item.unbind(dim))
        leaf = to_leaf(item, key, batch, self.device)
        if isinstance(leaf, (_Tensor, TensorCollection)):  # a Mapping became a TensorDict
            return list(leaf.unbind(dim))
        if isinstance(leaf, NonTensorData):
            return [leaf._with_batch_size(self._member_batch) for _ in range(count)]
        return [leaf._batch_op(lambda grid, i=i: grid.select(dim, i)) for i in range(count)]  # NonTensorStack

    def _write(self, keys: tuple, pieces: list) -> None:
        """``member.set(keys, piece)`` for each member; undone on the written ones if one fails."""
        undo = []
        try:
            for td, piece in zip(self._tds, pieces):
                undo.append(undo_record(td, keys))
                td.set(keys, piece)
        except BaseException:
            for td, (path, old) in zip(self._tds, undo[:-1]):
                if old is _MISSING:
                    del td[path]
                else:
                    td.set(path, old)
            raise

    def set_(self, key: Any, item: torch.Tensor, *, non_blocking: bool = False) -> Self:
        """Copy the tensor ``item`` (full batch) into the members' existing tensors (allowed when locked).
        ``non_blocking`` is given to the members' copies.

        >>> import torch
        >>> from torchdict import lazy_stack
        >>> a, b = TensorDict(x=torch.zeros(())), TensorDict(x=torch.zeros(()))
        >>> x = a["x"]
        >>> _ = lazy_stack([a, b]).set_("x", torch.tensor([1., 2.]))
        >>> x, a["x"] is x
        (tensor(1.), True)
        """
        keys = key_to_tuple(key)
        values = self._member_values(keys)
        if values is _MISSING:
            raise KeyError("setting a value in-place on a stack of TensorDict is only permitted if all members "
                           "of the stack have this key in their register.")
        if not isinstance(item, _Tensor) or not all(isinstance(value, _Tensor) for value in values):
            raise TypeError("set_ on a LazyStackedTensorDict copies a tensor into tensor entries.")
        if not fits_batch(item.shape, self.batch_size):
            raise batch_mismatch_error(self.batch_size, item.shape, key)
        pieces = item.unbind(self._stack_dim)
        for td, value, piece in zip(self._tds, values, pieces):
            if torch.broadcast_shapes(value.shape, piece.shape) != value.shape:
                td.set_(keys, piece)  # raises the member's own error, before any member is written
        for td, piece in zip(self._tds, pieces):
            td.set_(keys, piece, non_blocking=non_blocking)
        return self


def _new_keys(td: TensorDict, keys_before: set) -> list:
    """The outermost keys of ``td`` that are not in ``keys_before`` (deleting them removes every new key)."""
    new = []
    for path in sorted((key_to_tuple(key) for key in td.keys(True) if key not in keys_before), key=len):
        if not any(path[:depth] in new for depth in range(1, len(path))):
            new.append(path)
    return [path[0] if len(path) == 1 else path for path in new]


def undo_record(td: TensorDictBase, keys: tuple) -> tuple:
    """What undoes ``td.set(keys, ...)``: ``(path, old value)``, or ``(first missing level, _MISSING)``."""
    for depth in range(1, len(keys) + 1):
        value = td.get(keys[:depth], _MISSING)
        if value is _MISSING:
            return keys[:depth], _MISSING
    return keys, value
