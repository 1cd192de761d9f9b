"""Smaller pieces of upstream's TensorDict API that no concern module owned (``ExtrasMixin``).

- introspection: ``depth``, ``dtype``, ``is_floating_point``, ``is_cpu`` / ``is_cuda`` / ``is_meta``;
- pointwise ops with two operands (``addcmul``, ``addcdiv`` and their in-place forms) and
  ``softmax`` over a batch dim;
- structure helpers: ``get_item_shape``, ``non_tensor_items``, ``filter_empty_``,
  ``create_nested``, ``replace``;
- lazy stacking entry points: ``to_lazystack`` and the ``lazy_stack`` / ``maybe_dense_stack``
  classmethods (the work is done by :mod:`torchdict.lazy`);
- gradients: the ``grad`` property and ``zero_grad``;
- batch-shape shortcuts ``broadcast_to`` and ``atleast_1d/2d/3d``, and the unsigned casts
  ``uint16`` / ``uint32`` / ``uint64``.

They live apart because each is small and leans on helpers of several modules at once
(``_masking``, ``_operands``, ``_shape``, ``lazy``), so none of those is their natural home,
and the modules they would otherwise join (``_ops``, ``_shape``) are near their size limit.
One-operand pointwise ops (``maximum_``, ``mod``, ``rsub``) are in ``_ops.py`` with the rest.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from ._apply import tensor_leaves, unwrap
from ._base import TensorCollection
from ._context import undo_reshape, write_back
from ._errors import locked_error
from ._keys import key_to_tuple
from ._locking import keep_lock
from ._masking import _distinct_dtypes, _item, finish, leaves_of
from ._moves import _make_cast
from ._operands import check_inplace_shapes, describe, distinct_leaves, empty_like_operand, operand_per_leaf, preflight
from ._shape import batch_dim
from .nontensor import NonTensorData, NonTensorStack

_Tensor = torch.Tensor
_NON_TENSOR = (NonTensorData, NonTensorStack)
_FOREACH_FAILED = (TypeError, RuntimeError, NotImplementedError)


def _is_sub_collection(value: Any) -> bool:
    """A nested TensorDict (or tensorclass), as opposed to a tensor or non-tensor data."""
    return isinstance(value, TensorCollection) and not isinstance(value, _NON_TENSOR)


# --------------------------------------------------------------------------- introspection


def _depth(storage: dict) -> Optional[int]:
    """Levels of nesting above the deepest entry that isn't a sub-TensorDict; None when ``storage``
    holds no such entry at any level (upstream counts leaves, so empty sub-TensorDicts add nothing)."""
    deepest: Optional[int] = None
    for value in storage.values():
        below = _depth(unwrap(value)._tensordict) if _is_sub_collection(value) else -1
        if below is not None:
            deepest = max(below + 1, -1 if deepest is None else deepest)
    return deepest


def _device_type_is(td: Any, device_type: str) -> bool:
    # Like upstream, a TensorDict without a device is on none (even if every leaf is on the CPU).
    device = td.device
    return device is not None and device.type == device_type


# --------------------------------------------------------------------------- addcmul / addcdiv


def _two_operand_op(td: Any, name: str, tensor1: Any, tensor2: Any, value: Any, inplace: bool) -> Any:
    """``torch.<name>(leaf, tensor1, tensor2, value=value)`` on every leaf (``leaf.<name>_`` when ``inplace``).

    The operands are numbers, tensors (from the left over the batch dims) or TensorDicts with the
    same keys, as for ``lerp``; an in-place op checks every leaf before writing to any.
    """
    leaves, flat = leaves_of(td)
    leaves, firsts = operand_per_leaf(td, leaves, tensor1, name)
    leaves, seconds = operand_per_leaf(td, leaves, tensor2, name)
    if inplace:
        return _two_operand_inplace(td, name, leaves, firsts, seconds, value)
    if leaves and isinstance(firsts, list) and isinstance(seconds, list):
        try:
            results = getattr(torch, f"_foreach_{name}")(leaves, firsts, seconds, value)
            return keep_lock(td, finish(td, list(results), flat))
        except _FOREACH_FAILED:
            pass  # the loop below gives torch's own error
    function = getattr(torch, name)
    results = [function(leaf, _item(firsts, position), _item(seconds, position), value=value)
               for position, leaf in enumerate(leaves)]
    return keep_lock(td, finish(td, results, flat))


def _two_operand_inplace(td: Any, name: str, leaves: list, firsts: Any, seconds: Any, value: Any) -> Any:
    check_inplace_shapes(leaves, firsts)
    check_inplace_shapes(leaves, seconds)
    if not isinstance(firsts, list) and not isinstance(seconds, list):
        leaves, _ = distinct_leaves(leaves)  # one tensor under two keys is updated once
    for position, leaf in _distinct_dtypes(leaves, firsts, seconds):
        first, second = _item(firsts, position), _item(seconds, position)
        preflight((f"{name}_", leaf.dtype, leaf.device.type, describe(first), describe(second), describe(value)),
                  lambda: getattr(torch.empty(0, dtype=leaf.dtype, device=leaf.device), f"{name}_")(
                      empty_like_operand(first), empty_like_operand(second), value=value))
    for position, leaf in enumerate(leaves):
        getattr(leaf, f"{name}_")(_item(firsts, position), _item(seconds, position), value=value)
    return td


# --------------------------------------------------------------------------- structure helpers


def _drop_empty_in_place(td: Any) -> None:
    """Delete, at every level, the sub-TensorDicts that end up holding no entry."""
    storage = td._tensordict
    for key, value in list(storage.items()):
        if _is_sub_collection(value):
            inner = unwrap(value)
            _drop_empty_in_place(inner)
            if not inner._tensordict:
                del storage[key]


def _grads_storage(td: Any) -> dict:
    """``td``'s storage with each tensor replaced by its ``.grad``; tensors without one (and
    sub-TensorDicts left empty) are left out, non-tensor entries are kept as they are."""
    storage = {}
    for key, value in td._tensordict.items():
        if isinstance(value, _Tensor):
            if value.grad is not None:
                storage[key] = value.grad
        elif _is_sub_collection(value):
            inner = unwrap(value)
            nested = _grads_storage(inner)
            if nested:
                storage[key] = inner._new_unsafe(nested, inner._batch_size, inner._device, inner._names)
        else:
            storage[key] = value
    return storage


def _at_least(td: Any, ndim: int) -> Any:
    """``td`` with leading batch dims of size 1 added until it has ``ndim`` of them (``td`` if it has)."""
    result = td
    for _ in range(ndim - len(td.batch_size)):
        result = result.unsqueeze(0)
    return result


# --------------------------------------------------------------------------- the mixin


class ExtrasMixin:
    """The pieces of upstream's API listed in the module docstring, as TensorDict methods."""

    __slots__ = ()

    # ------------------------------------------------------------------ introspection

    @property
    def depth(self) -> int:
        """Levels of nested TensorDicts: 0 for a flat one; empty sub-TensorDicts don't count.

        >>> import torch
        >>> from torchdict import TensorDict
        >>> TensorDict(a=torch.zeros(2)).depth, TensorDict(a={"b": {"c": torch.zeros(2)}}).depth
        (0, 2)
        """
        return _depth(self._tensordict) or 0

    @property
    def dtype(self) -> Optional[torch.dtype]:
        """The dtype every tensor leaf has, or None when they differ or there is no tensor leaf.

        Non-tensor entries are not looked at.

        >>> TensorDict(a=torch.zeros(2), b={"c": torch.ones(2)}).dtype
        torch.float32
        >>> TensorDict(a=torch.zeros(2), b=torch.zeros(2, dtype=torch.int64)).dtype is None
        True
        """
        dtypes = {leaf.dtype for leaf in tensor_leaves(self)}
        return dtypes.pop() if len(dtypes) == 1 else None

    def is_floating_point(self) -> bool:
        """True when every tensor leaf (nested ones too) is floating point; True when there is none.

        >>> TensorDict(a=torch.zeros(2)).is_floating_point()
        True
        """
        return all(leaf.is_floating_point() for leaf in tensor_leaves(self))

    @property
    def is_cpu(self) -> bool:
        """True when the TensorDict's device is a CPU (False when it has no device)."""
        return _device_type_is(self, "cpu")

    @property
    def is_cuda(self) -> bool:
        """True when the TensorDict's device is a CUDA device (False when it has no device)."""
        return _device_type_is(self, "cuda")

    @property
    def is_meta(self) -> bool:
        """True when the TensorDict's device is the meta device (False when it has no device)."""
        return _device_type_is(self, "meta")

    # ------------------------------------------------------------------ pointwise

    def addcmul(self, other1: Any, other2: Any, *, value: Any = 1) -> Any:
        """``torch.addcmul(leaf, other1, other2, value=value)``: ``leaf + value * other1 * other2`` per leaf.

        The operands are tensors (broadcast from the left over the batch dims) or TensorDicts
        with the same keys.

        >>> td = TensorDict(a=torch.ones(2))
        >>> td.addcmul(td, td * 3, value=2)["a"]
        tensor([7., 7.])
        """
        return _two_operand_op(self, "addcmul", other1, other2, value, inplace=False)

    def addcmul_(self, other1: Any, other2: Any, *, value: Any = 1) -> Any:
        """``addcmul`` in place (allowed when locked); returns self."""
        return _two_operand_op(self, "addcmul", other1, other2, value, inplace=True)

    def addcdiv(self, other1: Any, other2: Any, value: Any = 1) -> Any:
        """``torch.addcdiv(leaf, other1, other2, value=value)``: ``leaf + value * other1 / other2`` per leaf.

        >>> td = TensorDict(a=torch.ones(2))
        >>> td.addcdiv(td, td * 4, 2)["a"]
        tensor([1.5000, 1.5000])
        """
        return _two_operand_op(self, "addcdiv", other1, other2, value, inplace=False)

    def addcdiv_(self, other1: Any, other2: Any, *, value: Any = 1) -> Any:
        """``addcdiv`` in place (allowed when locked); returns self."""
        return _two_operand_op(self, "addcdiv", other1, other2, value, inplace=True)

    def softmax(self, dim: int, dtype: Optional[torch.dtype] = None) -> Any:
        """``torch.softmax`` of every leaf along **batch** dim ``dim`` (negative: from the last batch dim).

        >>> td = TensorDict(a=torch.zeros(2, 3), batch_size=[2])
        >>> td.softmax(0)["a"][:, 0]
        tensor([0.5000, 0.5000])
        """
        position = batch_dim(dim, self.batch_size)  # a leaf's batch dims come first
        leaves, flat = leaves_of(self)
        return finish(self, [torch.softmax(leaf, position, dtype=dtype) for leaf in leaves], flat)

    # ------------------------------------------------------------------ structure

    def get_item_shape(self, key: Any) -> torch.Size:
        """The shape of the entry at ``key``: a tensor's shape, else (sub-TensorDicts, non-tensor
        data) its batch size. A missing key raises ``KeyError``.

        >>> TensorDict(a=torch.zeros(3, 4), b={}, batch_size=[3]).get_item_shape("b")
        torch.Size([3])
        """
        entry = self._get_path(key_to_tuple(key))
        return entry.shape if isinstance(entry, _Tensor) else entry.batch_size

    def non_tensor_items(self, include_nested: bool = False) -> tuple:
        """``(key, NonTensorData or NonTensorStack)`` pairs, top level only unless ``include_nested``.

        >>> TensorDict(a=torch.zeros(2), s="text").non_tensor_items()[0][0]
        's'
        """
        return tuple((key, value) for key, value in self.items(include_nested=include_nested)
                     if isinstance(value, _NON_TENSOR))

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

    # ------------------------------------------------------------------ lazy stacking

    def to_lazystack(self, dim: int = 0) -> Any:
        """A :class:`~torchdict.LazyStackedTensorDict` of the slices of ``self`` along batch ``dim``.

        >>> TensorDict(a=torch.zeros(3, 2), batch_size=[3, 2]).to_lazystack(1).stack_dim
        1
        """
        from .lazy import lazy_stack

        position = batch_dim(dim, self.batch_size)
        return lazy_stack(list(self.unbind(position)), position)

    @classmethod
    def lazy_stack(cls, input: Any, dim: int = 0, *, out: Any = None, **kwargs: Any) -> Any:
        """:func:`torchdict.lazy_stack`: stack ``input`` without copying (``out`` receives the values)."""
        from .lazy import lazy_stack

        return lazy_stack(input, dim, out=out, **kwargs)

    @classmethod
    def maybe_dense_stack(cls, input: Any, dim: int = 0, *, out: Any = None, **kwargs: Any) -> Any:
        """:func:`torchdict.maybe_dense_stack`: a dense stack when the items share their keys, else a lazy one."""
        from .lazy import maybe_dense_stack

        return maybe_dense_stack(input, dim, out=out, **kwargs)

    # ------------------------------------------------------------------ gradients

    @property
    def grad(self) -> Any:
        """A TensorDict of the leaves' ``.grad`` (leaves without one left out), or None when it would be empty.

        Locked when ``self`` is; assigning ``td.grad = other`` sets (or copies into) each leaf's
        ``.grad`` from the leaf of ``other`` at the same key.

        >>> td = TensorDict(x=torch.ones(2, requires_grad=True), y=torch.ones(2, requires_grad=True))
        >>> (td["x"] * 2).sum().backward()
        >>> td.grad["x"], "y" in td.grad.keys()
        (tensor([2., 2.]), False)
        """
        storage = _grads_storage(self)
        if not storage:  # (non-tensor entries alone still give a TensorDict, as upstream)
            return None
        return keep_lock(self, self._new_unsafe(storage, self._batch_size, self._device, self._names))

    @grad.setter
    def grad(self, grads: Any) -> None:
        for key, leaf in self.items(include_nested=True, leaves_only=True):
            new = grads.get(key)
            if leaf.grad is None:
                leaf.grad = new
            else:
                leaf.grad.copy_(new)

    def zero_grad(self, set_to_none: bool = True) -> Any:
        """Reset the ``.grad`` of every leaf: to None, or zeroed in place with ``set_to_none=False``."""
        for leaf in tensor_leaves(self):
            if leaf.grad is None:
                continue
            if set_to_none:
                leaf.grad = None
            else:
                leaf.grad.zero_()
        return self

    # ------------------------------------------------------------------ batch shape

    def broadcast_to(self, shape: Any) -> Any:
        """``expand(shape)``: the batch broadcast to ``shape`` (``-1`` keeps a dim).

        >>> TensorDict(a=torch.zeros(3, 4), batch_size=[3]).broadcast_to((2, 3))["a"].shape
        torch.Size([2, 3, 4])
        """
        return self.expand(tuple(shape))

    @write_back(undo_reshape)
    def atleast_1d(self) -> Any:
        """``self`` with a leading batch dim of size 1 added when it has none (else ``self``)."""
        return _at_least(self, 1)

    @write_back(undo_reshape)
    def atleast_2d(self) -> Any:
        """``self`` with leading batch dims of size 1 added up to 2 batch dims (else ``self``)."""
        return _at_least(self, 2)

    @write_back(undo_reshape)
    def atleast_3d(self) -> Any:
        """``self`` with leading batch dims of size 1 added up to 3 batch dims (unlike
        ``torch.atleast_3d``, always in front, as upstream)."""
        return _at_least(self, 3)


# Unsigned casts next to MovesMixin's ``float()``, ``int()``, ... (torch has these dtypes since 2.3).
for _name in ("uint16", "uint32", "uint64"):
    if hasattr(torch, _name):
        setattr(ExtrasMixin, _name, _make_cast(getattr(torch, _name), _name))
del _name
