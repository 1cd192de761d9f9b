"""Pointwise ops with two operands, ``addcmul`` / ``addcdiv`` (and their in-place forms), and ``softmax``
over a batch dim (``FusedOpsMixin``): one fused torch call per leaf, ``torch._foreach_*`` where it exists."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import torch

from ._masking import _distinct_dtypes, _item, finish, leaves_of
from ._locking import keep_lock
from ._operands import check_inplace_shapes, describe, distinct_leaves, empty_like_operand, operand_per_leaf, preflight
from ._shape import batch_dim

if TYPE_CHECKING:
    from ._host import TensorDictHost
else:
    TensorDictHost = object

_FOREACH_FAILED = (TypeError, RuntimeError, NotImplementedError)


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


class FusedOpsMixin(TensorDictHost):
    __slots__ = ()

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
