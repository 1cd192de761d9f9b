"""How ``map`` / ``map_iter`` cut a TensorDict into the pieces ``fn`` receives.

A :class:`ChunkPlan` is a small, picklable description (dim, length, chunk
size, optional permutation) that the parent sends once per worker. From it,
the worker builds chunk ``c`` of the source itself, as a view through
:func:`torchdict._apply.map_batch`: no chunk data crosses a process boundary.

Chunk ``c`` covers positions ``[c * size, min((c + 1) * size, length))`` of the
(possibly permuted) order along ``dim``; with ``chunksize=0`` the chunk is the
single element ``c``, unbound (its batch drops ``dim``).
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from .._apply import map_batch, rewrap, unwrap


def normalize_dim(dim: int, batch_size: torch.Size) -> int:
    """``dim`` as a non-negative batch dimension, with upstream's error when it is out of range."""
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise TypeError(f"dim must be an int, got {type(dim).__name__}.")
    n_batch = len(batch_size)
    if not -n_batch <= dim < n_batch:
        raise IndexError(f"Incompatible dim {dim} for tensordict with shape {batch_size}.")
    return dim + n_batch if dim < 0 else dim


def chunk_length(length: int, chunksize: Optional[int], num_chunks: Optional[int], num_workers: int) -> int:
    """The number of elements per chunk (``0``: one unbound element at a time).

    Same splitting as upstream: ``chunksize`` gives ``td.split(chunksize)``,
    ``num_chunks`` gives ``td.chunk(num_chunks)`` (chunks of ``ceil(length /
    num_chunks)``, so there may be fewer), and neither gives one chunk per worker.
    """
    if chunksize is not None and num_chunks is not None:
        raise ValueError("Either chunksize or num_chunks must be provided, but not both.")
    if chunksize is not None:
        if not isinstance(chunksize, int) or chunksize < 0:
            raise ValueError(f"chunksize must be a non-negative int, got {chunksize!r}.")
        return chunksize
    if num_chunks is None:
        num_chunks = max(num_workers, 1)
    elif not isinstance(num_chunks, int) or num_chunks < 1:
        raise ValueError(f"num_chunks must be a positive int, got {num_chunks!r}.")
    num_chunks = min(num_chunks, max(length, 1))
    return max(-(length // -num_chunks), 1)


class ChunkPlan:
    """Which elements of the source each chunk holds, and how to build it.

    >>> plan = ChunkPlan(dim=0, length=10, chunksize=4)
    >>> plan.num_chunks, plan.bounds(2)
    (3, (8, 10))
    """

    __slots__ = ("dim", "length", "chunksize", "num_chunks", "permutation")

    def __init__(self, dim: int, length: int, chunksize: int, permutation: Optional[torch.Tensor] = None) -> None:
        self.dim = dim
        self.length = length
        self.chunksize = chunksize
        self.num_chunks = length if chunksize == 0 else -(length // -chunksize)
        self.permutation = permutation

    def __getstate__(self) -> tuple:
        return (self.dim, self.length, self.chunksize, self.num_chunks, self.permutation)

    def __setstate__(self, state: tuple) -> None:
        self.dim, self.length, self.chunksize, self.num_chunks, self.permutation = state

    @property
    def unbound(self) -> bool:
        """True when ``fn`` receives single elements (``chunksize=0``)."""
        return self.chunksize == 0

    def bounds(self, chunk: int) -> tuple:
        """Positions ``(start, stop)`` of ``chunk`` in the (permuted) order along ``dim``."""
        if self.chunksize == 0:
            return chunk, chunk + 1
        start = chunk * self.chunksize
        return start, min(start + self.chunksize, self.length)

    def view(self, source: Any, chunk: int) -> Any:
        """The piece of ``source`` that ``fn`` receives for ``chunk``.

        Without a permutation it is a view (edits through ``set_`` reach the
        source); with one (``shuffle``) it is gathered with ``index_select``.
        """
        if unwrap(source) is not source:  # a tensorclass: cut its TensorDict, keep its class
            return rewrap(source, self.view(unwrap(source), chunk))
        dim = self.dim
        batch_size = source._batch_size
        start, stop = self.bounds(chunk)
        permutation = self.permutation
        if self.chunksize == 0:
            position = chunk if permutation is None else int(permutation[chunk])
            return map_batch(source, lambda leaf: leaf.select(dim, position), batch_size[:dim] + batch_size[dim + 1:])
        new_batch = batch_size[:dim] + torch.Size([stop - start]) + batch_size[dim + 1:]
        if permutation is None:
            length = stop - start
            return map_batch(source, lambda leaf: leaf.narrow(dim, start, length), new_batch)
        positions = permutation[start:stop]
        return map_batch(source, lambda leaf: leaf.index_select(dim, positions), new_batch)


def plain_leaves(source: Any) -> Any:
    """``source`` with MemoryMappedTensor leaves seen as plain tensors (same memory).

    Cutting a plain tensor is several times cheaper than cutting the subclass,
    which matters when ``fn`` gets one element at a time.
    """
    inner = unwrap(source)
    plain = map_batch(inner, lambda leaf: leaf.as_subclass(torch.Tensor), inner._batch_size)
    return rewrap(source, plain)


def group_tasks(num_chunks: int, num_workers: int, *, per_task: Optional[int] = None) -> list:
    """Consecutive chunk ranges ``(first, stop)``: the unit of work sent to a worker.

    Grouping chunks amortises the round trip of a message (tens of
    microseconds) over many small chunks, while keeping about 16 tasks per
    worker so that the load stays balanced and the progress bar moves.
    """
    if per_task is None:
        per_task = max(1, num_chunks // (max(num_workers, 1) * 16))
    return [(first, min(first + per_task, num_chunks)) for first in range(0, num_chunks, per_task)]
