"""Gathering ``map``'s results: one preallocated output written in place by the workers.

The output is allocated once, from the structure of the first result (its
*skeleton*: the same keys, classes and dtypes with a zero-length ``dim``), in
shared memory or, when the input is memory-mapped, in files; each worker then
copies the result of chunk ``c`` into the output's slot for ``c``. A result
that does not fit its slot (another structure, another length, non-tensor
leaves) is sent back instead, and :func:`assemble` joins everything with the
semantics of ``torch.cat`` / ``torch.stack``.
"""
from __future__ import annotations

import itertools
import os
from typing import Any, Callable, Optional

import torch

from .._apply import map_batch, rewrap, unwrap
from .._base import TensorCollection
from ._sharing import shared_empty

_Tensor = torch.Tensor


def _drop(shape: torch.Size, dim: Optional[int]) -> tuple:
    return tuple(shape) if dim is None else tuple(shape[:dim]) + tuple(shape[dim + 1:])


def structure_of(collection: Any, dim: Optional[int]) -> Any:
    """A hashable description of ``collection`` with ``dim`` left out of every shape.

    Two results can share one output exactly when their structures are equal
    (``dim=None`` describes an unbound element, to compare with an output
    described without its ``dim``). Returns None for what no preallocated
    output can hold: non-tensor leaves, or fewer batch dims than ``dim + 1``.
    """
    td = unwrap(collection)
    batch_size = td._batch_size
    if dim is not None and len(batch_size) <= dim:
        return None
    entries: list = []
    storage = td._tensordict
    for key in sorted(storage):
        leaf = storage[key]
        if isinstance(leaf, _Tensor):
            entries.append((key, leaf.dtype, leaf.device.type, _drop(leaf.shape, dim)))
        elif isinstance(leaf, TensorCollection):
            inner = structure_of(leaf, dim)
            if inner is None:
                return None
            entries.append((key, inner))
        else:
            return None
    return (type(collection), str(td._device), _drop(batch_size, dim), tuple(entries))


def skeleton_of(result: Any, dim: int, unbound: bool) -> Any:
    """``result``'s structure with a zero-length ``dim`` (inserted when ``unbound``): tiny to send."""
    batch_size = result.batch_size
    if unbound:
        new_batch = batch_size[:dim] + torch.Size([0]) + batch_size[dim:]

        def empty(leaf: torch.Tensor) -> torch.Tensor:
            return torch.empty(leaf.shape[:dim] + (0,) + leaf.shape[dim:], dtype=leaf.dtype)
    else:
        new_batch = batch_size[:dim] + torch.Size([0]) + batch_size[dim + 1:]

        def empty(leaf: torch.Tensor) -> torch.Tensor:
            return torch.empty(leaf.shape[:dim] + (0,) + leaf.shape[dim + 1:], dtype=leaf.dtype)

    return rewrap(result, map_batch(unwrap(result), empty, new_batch))


def allocate_output(skeleton: Any, dim: int, length: int, directory: Optional[str]) -> Any:
    """An output like ``skeleton`` with ``length`` along ``dim``.

    In files under ``directory`` (sparse, nothing written) when it is given,
    otherwise in shared memory; either way every process can write into it.
    """
    numbers = itertools.count()
    if directory is None:
        def allocate(leaf: torch.Tensor) -> torch.Tensor:
            return shared_empty(leaf.shape[:dim] + (length,) + leaf.shape[dim + 1:], leaf.dtype)
    else:
        from ..memmap import MemoryMappedTensor

        def allocate(leaf: torch.Tensor) -> torch.Tensor:
            shape = leaf.shape[:dim] + (length,) + leaf.shape[dim + 1:]
            path = os.path.join(directory, f"{next(numbers)}.memmap")
            return MemoryMappedTensor.empty(shape, dtype=leaf.dtype, filename=path)

    batch_size = skeleton.batch_size
    new_batch = batch_size[:dim] + torch.Size([length]) + batch_size[dim + 1:]
    return rewrap(skeleton, map_batch(unwrap(skeleton), allocate, new_batch))


def slot_writer(dim: int, start: int, stop: int, unbound: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    """The function selecting one slot of an output leaf."""
    if unbound:
        return lambda leaf: leaf.select(dim, start)
    return lambda leaf: leaf.narrow(dim, start, stop - start)


def write_slot(out: Any, result: Any, select: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Copy ``result``'s leaves into ``select(leaf)`` of ``out``'s (same structure, checked by the caller)."""
    _write_storage(unwrap(out)._tensordict, unwrap(result)._tensordict, select)


def _write_storage(out_storage: dict, storage: dict, select: Callable) -> None:
    for key, leaf in storage.items():
        target = out_storage[key]
        if isinstance(leaf, _Tensor):
            select(target).copy_(leaf)
        else:
            _write_storage(unwrap(target)._tensordict, unwrap(leaf)._tensordict, select)


def fits(result: Any, out_structure: Any, dim: int, length: int, unbound: bool) -> bool:
    """True when ``result`` can be written into an output slot of ``length`` elements."""
    if not isinstance(result, TensorCollection):
        return False
    if unbound:
        return structure_of(result, None) == out_structure
    batch_size = unwrap(result)._batch_size
    return len(batch_size) > dim and batch_size[dim] == length and structure_of(result, dim) == out_structure


def assemble(parts: list, dim: int, unbound: bool, directory: Optional[str]) -> Any:
    """Join results in order, like ``torch.stack`` (unbound) or ``torch.cat`` along ``dim``.

    Collections of one structure are copied into a new output allocated like
    the workers' one; anything else (non-tensor leaves, tensors, mismatched
    structures) is left to ``torch.stack`` / ``torch.cat``, which also raise
    the errors for results that cannot be joined.
    """
    first = parts[0]
    if isinstance(first, TensorCollection):
        drop = None if unbound else dim
        structure = structure_of(first, drop)
        if structure is not None and all(
            isinstance(part, TensorCollection) and structure_of(part, drop) == structure for part in parts
        ):
            lengths = [1 if unbound else part.batch_size[dim] for part in parts]
            out = allocate_output(skeleton_of(first, dim, unbound), dim, sum(lengths), directory)
            start = 0
            for part, length in zip(parts, lengths):
                write_slot(out, part, slot_writer(dim, start, start + length, unbound))
                start += length
            return out
    if unbound:
        return torch.stack(parts, dim)
    return torch.cat(parts, dim)
