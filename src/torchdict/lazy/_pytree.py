"""A lazy stack as a ``torch.utils._pytree`` node, so ``torch.vmap``, ``torch.func`` and ``tree_map`` take it.

The node's children are the tensors of its *dense stack* (``contiguous()``: the keys every
member has; a ragged entry raises the ragged-read error), flattened as the dense TensorDict's
own pytree node flattens them. Rebuilding makes that TensorDict again and, when the stack dim
is still there, turns it back into a lazy stack along that dim:

- the leaves kept their shape (``tree_map``, ``torch.func.grad``...): a lazy stack with the same
  stack dim;
- the leaves gained one dim (a lazy stack returned from a vmapped function): a lazy stack whose
  stack dim moved right when the new dim came before it;
- the leaves lost one dim (a vmapped input): a lazy stack along the stack dim when another dim
  was mapped over; a dense TensorDict when the stack dim itself was (its members are gone).

Where the dim was inserted or removed is read off the first tensor leaf's shape (when neighbouring
dims have the same size, either reading gives the same values).
"""
from __future__ import annotations

from typing import Any, List, Tuple

import torch
from torch.utils import _pytree as pytree

_Tensor = torch.Tensor


def _flatten(lazy: Any) -> Tuple[List[Any], tuple]:
    dense = lazy.contiguous()
    leaves, spec = pytree.tree_flatten(dense)
    probe = next((position for position, leaf in enumerate(leaves) if isinstance(leaf, _Tensor)), None)
    shape = None if probe is None else tuple(leaves[probe].shape)
    return leaves, (spec, lazy.stack_dim, probe, shape)


def _changed_dims(old: tuple, new: tuple) -> List[int]:
    """The positions where ``new`` may have gained (or lost) its one extra dim relative to ``old``; several
    when neighbouring dims have the same size (any of them gives the same leaf values)."""
    longer, shorter = (new, old) if len(new) > len(old) else (old, new)
    if len(longer) != len(shorter) + 1:
        return []
    return [position for position in range(len(longer))
            if longer[:position] == shorter[:position] and longer[position + 1:] == shorter[position:]]


def _unflatten(values: Any, context: tuple) -> Any:
    spec, stack_dim, probe, old_shape = context
    dense = pytree.tree_unflatten(list(values), spec)
    if probe is None or not all(isinstance(value, _Tensor) for value in values) or not hasattr(dense, "to_lazystack"):
        return dense  # placeholder leaves (vmap's in_dims broadcasting): a shell, as the dense node gives
    new_shape = tuple(values[probe].shape)
    if new_shape == old_shape:
        new_stack_dim = stack_dim
    else:
        candidates = _changed_dims(old_shape, new_shape)
        if not candidates:
            return dense
        if len(new_shape) > len(old_shape):
            changed = candidates[0]
            new_stack_dim = stack_dim + 1 if changed <= stack_dim else stack_dim
        else:
            # Equal neighbouring sizes can't tell which dim went: keep the stack when that is possible.
            kept = [position for position in candidates if position != stack_dim]
            if not kept:
                return dense  # vmapped over the stack dim: the members are gone
            new_stack_dim = stack_dim - 1 if kept[-1] < stack_dim else stack_dim
    if not 0 <= new_stack_dim < dense.batch_dims:
        return dense
    return dense.to_lazystack(new_stack_dim)


def register() -> None:
    """Register :class:`~torchdict.LazyStackedTensorDict` with pytree (once)."""
    from ..lazy import LazyStackedTensorDict

    if LazyStackedTensorDict in pytree.SUPPORTED_NODES:
        return
    pytree.register_pytree_node(LazyStackedTensorDict, _flatten, _unflatten,
                                serialized_type_name="torchdict.lazy.LazyStackedTensorDict")
