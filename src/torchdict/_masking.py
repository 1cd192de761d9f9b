"""Leaf-wise ops with extra operands that keep the batch size: clamp, lerp, where, masked_fill.

Bounds, ends, weights and ``where``'s other operand are numbers, tensors
(broadcast from the left over the batch dims) or TensorDicts with the same
keys (see :mod:`torchdict._operands`). Conditions and masks are boolean
tensors broadcast from the left: a ``(3,)`` mask picks rows of a batch-``[3]``
TensorDict whatever the leaves' feature dims.
"""
from __future__ import annotations

from typing import Any

import torch

from ._apply import flat_tensors, rebuild, tensor_leaves, unwrap
from ._base import TensorCollection
from ._operands import (
    TdOperands,
    check_inplace_shapes,
    describe,
    distinct_leaves,
    empty_like_operand,
    grow_error,
    operand_per_leaf,
    padded,
    preflight,
)
from .nontensor import NonTensorData, NonTensorStack

_Tensor = torch.Tensor
_FAILED = (TypeError, RuntimeError, NotImplementedError)


def leaves_of(td: Any) -> tuple:
    """``(tensor leaves, flat)``: ``flat`` when ``td`` holds only tensors, at one level."""
    leaves = flat_tensors(td._tensordict)
    if leaves is not None:
        return leaves, True
    return tensor_leaves(td), False


def finish(td: Any, results: list, flat: bool) -> Any:
    """A TensorDict like ``td`` (same batch) whose tensor leaves are ``results``."""
    if flat:
        return td._new_like(dict(zip(td._tensordict, results)))
    return rebuild(td, iter(results), td._batch_size)


def _item(operand: Any, position: int) -> Any:
    return operand[position] if isinstance(operand, list) else operand


def _is_number(value: Any) -> bool:
    return value is None or not isinstance(value, (_Tensor, list))


# --------------------------------------------------------------------------- clamp


def _clamp_leaf(leaf: torch.Tensor, low: Any, high: Any, inplace: bool) -> torch.Tensor:
    if low is not None and high is not None and isinstance(low, _Tensor) != isinstance(high, _Tensor):
        # torch.clamp takes two numbers or two tensors; clamp(x, lo, hi) is min(max(x, lo), hi).
        if inplace:
            return leaf.clamp_min_(low).clamp_max_(high)
        return torch.clamp_max(torch.clamp_min(leaf, low), high)
    return leaf.clamp_(low, high) if inplace else torch.clamp(leaf, low, high)


def clamp(td: Any, min: Any = None, max: Any = None, inplace: bool = False) -> Any:
    """``torch.clamp(leaf, min, max)`` on every leaf; ``inplace`` writes into the leaves and returns ``td``."""
    if min is None and max is None:
        raise RuntimeError("torch.clamp: At least one of 'min' or 'max' must not be None")
    leaves, flat = leaves_of(td)
    leaves, low = operand_per_leaf(td, leaves, min, "clamp")
    leaves, high = operand_per_leaf(td, leaves, max, "clamp")
    if inplace:
        check_inplace_shapes(leaves, low)
        check_inplace_shapes(leaves, high)
        for position, leaf in _distinct_dtypes(leaves, low, high):
            low_item, high_item = _item(low, position), _item(high, position)
            preflight(("clamp_", leaf.dtype, leaf.device.type, describe(low_item), describe(high_item)),
                      lambda: _clamp_leaf(torch.empty(0, dtype=leaf.dtype, device=leaf.device),
                                          empty_like_operand(low_item), empty_like_operand(high_item), True))
        if leaves and _is_number(low) and _is_number(high):
            if low is not None:
                torch._foreach_clamp_min_(leaves, low)
            if high is not None:
                torch._foreach_clamp_max_(leaves, high)
            return td
        for position, leaf in enumerate(leaves):
            _clamp_leaf(leaf, _item(low, position), _item(high, position), True)
        return td
    if leaves and _is_number(low) and _is_number(high):
        try:
            results = leaves
            if low is not None:
                results = torch._foreach_clamp_min(results, low)
            if high is not None:
                results = torch._foreach_clamp_max(results, high)
            return finish(td, list(results), flat)
        except _FAILED:
            pass  # the loop below gives torch's own error
    results = [_clamp_leaf(leaf, _item(low, position), _item(high, position), False)
               for position, leaf in enumerate(leaves)]
    return finish(td, results, flat)


def _distinct_dtypes(leaves: list, *operands: Any) -> list:
    """``(position, leaf)`` for the first leaf of each distinct (leaf dtype, operand dtypes) combination."""
    seen: dict = {}
    for position, leaf in enumerate(leaves):
        signature = (leaf.dtype,) + tuple(
            item.dtype if isinstance(item, _Tensor) else type(item)
            for item in (_item(operand, position) for operand in operands)
        )
        seen.setdefault(signature, (position, leaf))
    return list(seen.values())


# --------------------------------------------------------------------------- lerp


def lerp(td: Any, end: Any, weight: Any, inplace: bool = False) -> Any:
    """``torch.lerp(leaf, end, weight)`` on every leaf (``end`` and ``weight``: number, tensor or TensorDict)."""
    leaves, flat = leaves_of(td)
    leaves, ends = operand_per_leaf(td, leaves, end, "lerp")
    leaves, weights = operand_per_leaf(td, leaves, weight, "lerp")
    if not isinstance(ends, list):  # torch.lerp wants a tensor end
        ends = [torch.as_tensor(ends, dtype=leaf.dtype, device=leaf.device) for leaf in leaves]
    if inplace:
        check_inplace_shapes(leaves, ends)
        check_inplace_shapes(leaves, weights)
        if not isinstance(weights, list):
            leaves, ends = distinct_leaves(leaves, ends)
        for position, leaf in _distinct_dtypes(leaves, ends, weights):
            end_item, weight_item = ends[position], _item(weights, position)
            preflight(("lerp_", leaf.dtype, leaf.device.type, describe(end_item), describe(weight_item)),
                      lambda: torch.empty(0, dtype=leaf.dtype, device=leaf.device).lerp_(
                          empty_like_operand(end_item), empty_like_operand(weight_item)))
        for position, (leaf, end_item) in enumerate(zip(leaves, ends)):
            leaf.lerp_(end_item, _item(weights, position))
        return td
    if leaves and not isinstance(weights, (list, _Tensor)):
        try:
            return finish(td, list(torch._foreach_lerp(leaves, ends, weights)), flat)
        except _FAILED:
            pass  # the loop below gives torch's own error
    results = [torch.lerp(leaf, end_item, _item(weights, position))
               for position, (leaf, end_item) in enumerate(zip(leaves, ends))]
    return finish(td, results, flat)


# --------------------------------------------------------------------------- where / masked_fill


def _condition_per_leaf(td: Any, leaves: list, condition: Any, name: str) -> tuple:
    """``(leaves, one condition view per leaf)``: a boolean tensor broadcast from the left over the
    batch dims, or a TensorDict of booleans with the same keys (paired by key)."""
    batch_size = td._batch_size
    if isinstance(condition, TensorCollection):
        pairs = TdOperands(td, unwrap(condition))
        if pairs.batch_size != batch_size:
            raise grow_error(batch_size, pairs.batch_size)
        return pairs.leaves, pairs.others
    if not isinstance(condition, _Tensor):
        raise TypeError(f"{name}(): the condition must be a tensor or a TensorDict, got {type(condition).__name__}.")
    n_batch = len(batch_size)
    batch_part = condition.shape[:n_batch] + (1,) * max(n_batch - condition.ndim, 0)
    new_batch = torch.broadcast_shapes(batch_size, batch_part)
    if new_batch != batch_size:
        raise grow_error(batch_size, new_batch)
    cache: dict = {}
    return leaves, [padded(condition, leaf.ndim, cache) for leaf in leaves]


def where(td: Any, condition: torch.Tensor, other: Any, swap: bool = False) -> Any:
    """``torch.where(condition, leaf, other)`` per leaf (``torch.where(condition, other, leaf)`` when ``swap``)."""
    leaves, flat = leaves_of(td)
    leaves, conditions = _condition_per_leaf(td, leaves, condition, "where")
    leaves, others = operand_per_leaf(td, leaves, other, "where")
    results = []
    for position, (leaf, leaf_condition) in enumerate(zip(leaves, conditions)):
        item = _item(others, position)
        results.append(torch.where(leaf_condition, item, leaf) if swap else torch.where(leaf_condition, leaf, item))
    result = finish(td, results, flat)
    if isinstance(other, TensorCollection):
        _where_non_tensors(result, td, unwrap(other), condition, swap)
    return result


def _per_element(entry: Any, batch_size: torch.Size) -> list:
    """The value of a non-tensor entry at each element of ``batch_size``, flat (row-major)."""
    if type(entry) is NonTensorStack:
        return list(entry._values)
    return [entry.data] * batch_size.numel()


def _where_non_tensors(result: Any, td: Any, other: Any, condition: torch.Tensor, swap: bool) -> None:
    """The non-tensor entries both sides hold, chosen element by element as the tensors are (the leaf
    loop keeps ``td``'s). A condition that covers feature dims has no say over them: they are kept."""
    for key in td.keys(True):  # (leaves_only would leave the non-tensor entries out)
        mine = td.get(key)
        if type(mine) not in (NonTensorData, NonTensorStack):
            continue
        theirs = other.get(key, None)
        if type(theirs) not in (NonTensorData, NonTensorStack) or theirs.batch_size != mine.batch_size:
            continue
        batch_size = mine.batch_size
        if condition.ndim > len(batch_size):
            continue
        picks = condition.view(condition.shape + (1,) * (len(batch_size) - condition.ndim)).expand(batch_size)
        first, second = (theirs, mine) if swap else (mine, theirs)
        values = [a if pick else b for pick, a, b in zip(picks.reshape(-1).tolist(), _per_element(first, batch_size),
                                                          _per_element(second, batch_size))]
        if values != _per_element(mine, batch_size):
            result.set(key, NonTensorStack(values, batch_size, mine.device))


def masked_fill(td: Any, mask: torch.Tensor, value: Any, inplace: bool = False) -> Any:
    """``leaf.masked_fill(mask, value)`` per leaf, the mask broadcast from the left over the batch dims."""
    leaves, flat = leaves_of(td)
    leaves, masks = _condition_per_leaf(td, leaves, mask, "masked_fill")
    if not inplace:
        return finish(td, [leaf.masked_fill(leaf_mask, value) for leaf, leaf_mask in zip(leaves, masks)], flat)
    check_inplace_shapes(leaves, masks)
    for _, leaf in _distinct_dtypes(leaves):
        preflight(("masked_fill_", leaf.dtype, leaf.device.type, describe(value)),
                  lambda: torch.empty(0, dtype=leaf.dtype, device=leaf.device).masked_fill_(
                      torch.empty(0, dtype=torch.bool, device=leaf.device), empty_like_operand(value)))
    for leaf, leaf_mask in zip(leaves, masks):
        leaf.masked_fill_(leaf_mask, value)
    return td
