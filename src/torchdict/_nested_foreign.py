"""A lazy stack held as a value of a dense TensorDict (``TensorDict({"lz": lazy_stack(...)})``).

The dense core walks nested values through their storage dict (``unwrap(value)._tensordict``);
a lazy stack has none. The few choke points of the core (``tensor_leaves`` / ``rebuild``,
``map_batch``, apply's per-entry step, stacking, update) send such a value here, on their rare
branch, so that it stays a lazy stack through the op, as upstream keeps it:

- leaf-wise ops (clone, to, detach, zero_, comparisons...) see its members' tensor leaves, in
  member order (:func:`foreign_leaves`), and get a new stack of rebuilt members back
  (:func:`rebuild_foreign`): ragged members stay ragged;
- batch ops (indexing, reshape, unbind, permute...) give their per-leaf function an index grid
  of the parent's batch dims; where each result position comes from tells which members (or
  elements of members) form the result (:func:`map_foreign_batch`): an intact stack dim stays the
  stack dim, a single member is taken as it is (``td[:, 1]`` is member 1), and any other layout
  becomes a lazy stack of the picked elements.

A tensorclass wrapping a lazy stack goes the same way (it is rewrapped); any other non-dense
collection is refused with a ``TypeError`` naming it.
"""
from __future__ import annotations

from typing import Any, Callable, List

import torch

from ._apply import rebuild, tensor_leaves, unwrap


def dense_inner(value: Any) -> Any:
    """The dense TensorDict behind a collection, or None when it has none (a lazy stack)."""
    inner = unwrap(value)
    return inner if type(getattr(inner, "_tensordict", None)) is dict else None


def _stack_of(value: Any) -> Any:
    from .lazy import LazyStackedTensorDict

    if isinstance(value, LazyStackedTensorDict):
        return value
    inner = unwrap(value)
    if isinstance(inner, LazyStackedTensorDict):
        return inner
    raise TypeError(f"A TensorDict holding a {type(value).__name__} supports this op only for a nested "
                    f"LazyStackedTensorDict; call to_tensordict() on the nested value first.")


def _rewrapped(value: Any, stack: Any, result: Any) -> Any:
    return result if value is stack else value._rewrap(result)


def _new_stack(stack: Any, members: List[Any], stack_dim: int) -> Any:
    result = type(stack)._from_members(members, stack_dim)
    return result


def foreign_leaves(value: Any, out: list) -> None:
    """Append the tensor leaves of a nested lazy stack to ``out``, member by member."""
    for member in _stack_of(value)._tds:
        inner = dense_inner(member)
        if inner is None:
            foreign_leaves(member, out)
        else:
            tensor_leaves(inner, out)


def rebuild_foreign(value: Any, results: Any, batch_of: Callable, non_tensor: Callable, device: Any) -> Any:
    """A nested lazy stack whose members' tensor leaves are taken, in :func:`foreign_leaves`'s order,
    from ``results``. The op must keep the stack's batch size (its members' leaves lack the stack
    dim, so a result laid out over the parent's batch can't be put back into them)."""
    stack = _stack_of(value)
    if batch_of(stack.batch_size) != stack.batch_size:
        raise RuntimeError(f"This op changes the batch size of the nested {type(stack).__name__} (batch size "
                           f"{list(stack.batch_size)}), which it can only do on the stack itself.")
    members = []
    for member in stack._tds:
        inner = dense_inner(member)
        if inner is None:
            members.append(rebuild_foreign(member, results, batch_of, non_tensor, device))
        else:
            kwargs = {} if device is _missing() else {"device": device}
            rebuilt = rebuild(inner, results, inner._batch_size, non_tensor=non_tensor, **kwargs)
            members.append(rebuilt if inner is member else member._rewrap(rebuilt))
    result = _new_stack(stack, members, stack._stack_dim)
    result._stack_name = stack._stack_name
    return _rewrapped(value, stack, result)


def _missing() -> Any:
    from ._apply import _MISSING

    return _MISSING


# ------------------------------------------------------------------ batch ops


def map_foreign_batch(value: Any, fn: Callable, old_dims: int, batch_size: torch.Size) -> Any:
    """``value`` after a batch op of its parent: ``fn`` maps the parent's ``old_dims`` leading batch
    dims to ``batch_size``; the result keeps ``value``'s other batch dims."""
    lead = value.batch_size[:old_dims]
    count = lead.numel()
    grid = torch.arange(count).reshape(lead)
    picks = fn(grid)
    # A rearrangement of batch positions (indexing, reshaping, repeating...) commutes with adding a constant to
    # them; an op that makes new values (new_zeros, a *_like function) does not, and would be read as picks.
    if picks.dtype != grid.dtype or not torch.equal(fn(grid + count), picks + count):
        raise RuntimeError(f"This op makes new values for the nested {type(value).__name__}, which it can only do "
                           "on the stack itself (or after to_tensordict()).")
    return regroup_foreign(value, picks, old_dims, batch_size)


def regroup_foreign(value: Any, picks: torch.Tensor, old_dims: int, batch_size: torch.Size) -> Any:
    """``value`` regrouped by ``picks``: for each result position, the flat index of the element of ``value``'s
    ``old_dims`` leading batch dims it comes from."""
    if tuple(picks.shape) != tuple(batch_size):
        raise RuntimeError(f"A batch op gave the nested {type(value).__name__} the batch size "
                           f"{list(picks.shape)}, where {list(batch_size)} was expected.")
    return _regroup(value, picks, old_dims)


def _unravel(flat: torch.Tensor, shape: torch.Size) -> List[torch.Tensor]:
    coords = []
    for size in reversed(shape):
        coords.append(flat % size)
        flat = flat // size
    return coords[::-1]


def _ravel(coords: List[torch.Tensor], shape: Any, like: torch.Tensor) -> torch.Tensor:
    flat = torch.zeros_like(like)
    for coord, size in zip(coords, shape):
        flat = flat * size + coord
    return flat


def _regroup(value: Any, picks: torch.Tensor, k: int) -> Any:
    """The collection whose element at each position ``p`` of ``picks`` is ``value``'s element at the flat
    position ``picks[p]`` of its ``k`` leading batch dims."""
    from .lazy import LazyStackedTensorDict

    stack = unwrap(value) if not isinstance(value, LazyStackedTensorDict) else value
    if isinstance(stack, LazyStackedTensorDict):
        members, dim = stack._tds, stack._stack_dim
        if dim >= k:  # the op doesn't reach the stack dim: every member gets it
            picked = [_pick(member, picks, k) for member in members]
            return _rewrapped(value, stack, LazyStackedTensorDict(*picked, stack_dim=dim - k + picks.dim()))
        lead = stack.batch_size[:k]
        coords = _unravel(picks, lead)
        member_ids = coords[dim]
        rest_coords = coords[:dim] + coords[dim + 1:]
        rest = _ravel(rest_coords, lead[:dim] + lead[dim + 1:], picks)
        if picks.numel() and bool((member_ids == member_ids.reshape(-1)[0]).all()):
            return _pick(members[int(member_ids.reshape(-1)[0])], rest, k - 1)  # one member: itself
        for new_dim in range(picks.dim()):
            if picks.shape[new_dim] != len(members):
                continue
            expected = torch.arange(len(members)).view([-1 if i == new_dim else 1 for i in range(picks.dim())])
            if bool((member_ids == expected).all()):  # the stack dim survives, at new_dim
                picked = [_pick(member, rest.select(new_dim, i), k - 1) for i, member in enumerate(members)]
                return _rewrapped(value, stack, LazyStackedTensorDict(*picked, stack_dim=new_dim))
    return _elements(value, picks, k)


def _pick(member: Any, rest: torch.Tensor, k: int) -> Any:
    """A member (batch dims ``k`` leading ones + its own) at the flat positions ``rest`` of its leading dims."""
    if k == 0:
        return member if rest.dim() == 0 else member.expand(*rest.shape, *member.batch_size)
    lead = member.batch_size[:k]
    if tuple(rest.shape) == tuple(lead) and torch.equal(rest, torch.arange(lead.numel()).reshape(lead)):
        return member  # every element in place: the member itself, as upstream's indexing gives it
    if dense_inner(member) is None:
        return _regroup(member, rest, k)
    coords = _unravel(rest, lead)
    if rest.dim() == 0:
        return member[tuple(int(coord) for coord in coords)]
    return member[tuple(coords)]


def _elements(value: Any, picks: torch.Tensor, k: int) -> Any:
    """A (nested) lazy stack over ``picks``'s dims of the picked elements of ``value``."""
    from .lazy import LazyStackedTensorDict

    if picks.numel() == 0:
        raise RuntimeError(f"This batch op leaves no element of the nested {type(value).__name__}, and a lazy "
                           f"stack can't be empty.")
    lead = value.batch_size[:k]

    def build(positions: torch.Tensor) -> Any:
        if positions.dim() == 0:
            return value[tuple(int(coord) for coord in _unravel(positions, lead))] if k else value
        return LazyStackedTensorDict(*[build(row) for row in positions.unbind(0)], stack_dim=0)

    return build(picks)


# ------------------------------------------------------------------ stacking


def stack_foreign(values: List[Any], dim: int) -> Any:
    """``torch.stack`` of TensorDicts holding lazy stacks under one key: a lazy stack of them (as upstream)."""
    from .lazy import LazyStackedTensorDict

    stacks: List[LazyStackedTensorDict] = [value for value in values if isinstance(value, LazyStackedTensorDict)]
    first = stacks[0] if stacks else None
    if first is not None and len(stacks) == len(values) and all(
            stack._stack_dim == first._stack_dim and len(stack._tds) == len(first._tds) for stack in stacks):
        # Stacks of the same layout: their members are stacked pairwise and the stack dim is kept
        # (shifted when the new dim comes before it), as upstream.
        own = first._stack_dim
        member_dim = dim if dim <= own else dim - 1
        members: List[Any] = [torch.stack([stack._tds[i] for stack in stacks], member_dim)  # type: ignore[misc]
                              for i in range(len(first._tds))]  # (torch.stack's stub takes tensors only)
        return LazyStackedTensorDict(*members, stack_dim=own + 1 if dim <= own else own)
    return LazyStackedTensorDict(*values, stack_dim=dim)
