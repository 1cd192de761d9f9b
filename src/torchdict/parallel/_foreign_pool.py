"""``map`` / ``map_iter`` with the caller's own pool: a ``multiprocessing.Pool`` or a
``concurrent.futures`` executor (process or thread), as upstream accepts.

The chunks are cut as with torchdict's own pool (``_chunks.ChunkPlan``) and handed to the pool's ``map``;
a process pool pickles each chunk to its worker (torch's reducers send the tensors through shared
memory), ``fn`` must be picklable, and an edit ``fn`` makes in place reaches the caller only through the
returned chunk (the worker's chunk is a copy, unlike with torchdict's pool, whose chunks are views of
shared memory). Results are joined as torchdict's pool joins them.

What a dead worker does (documented in docs/parallel.md):

- ``multiprocessing.Pool``: the pool starts a replacement and the chunk the worker held is lost, so the call
  waits for it forever, unless ``timeout=`` bounds the wait (``multiprocessing.TimeoutError``);
- ``concurrent.futures.ProcessPoolExecutor``: the executor breaks and the call raises
  ``concurrent.futures.process.BrokenProcessPool``.

torchdict's own :class:`~torchdict.parallel.WorkerPool` (the default) raises ``WorkerError`` instead.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator, Optional

import torch

from ._chunks import ChunkPlan, chunk_length, normalize_dim


def is_foreign_pool(pool: Any) -> bool:
    """A pool torchdict does not run itself: a ``multiprocessing`` pool or a ``concurrent.futures`` executor."""
    import concurrent.futures
    import multiprocessing.pool

    return isinstance(pool, (multiprocessing.pool.Pool, concurrent.futures.Executor))


def _worker_count(pool: Any) -> int:
    count = getattr(pool, "_processes", None) or getattr(pool, "_max_workers", None)
    return int(count) if count else 1


def _chunks(td: Any, dim: int, pool: Any, chunksize: Optional[int], num_chunks: Optional[int]) -> tuple:
    dim = normalize_dim(dim, td.batch_size)
    length = td.batch_size[dim]
    plan = ChunkPlan(dim, length, chunk_length(length, chunksize, num_chunks, _worker_count(pool)))
    return plan, [plan.view(td, chunk) for chunk in range(plan.num_chunks)]


class _Call:
    """``fn(chunk)`` as a picklable callable (the pool sends it with each chunk)."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable) -> None:
        self.fn = fn

    def __call__(self, chunk: Any) -> Any:
        return self.fn(chunk)

    def __getstate__(self) -> Any:
        return self.fn

    def __setstate__(self, fn: Any) -> None:
        self.fn = fn


def _results(pool: Any, fn: Callable, chunks: list, timeout: Optional[float]) -> Iterator[Any]:
    import concurrent.futures

    call = _Call(fn)
    if isinstance(pool, concurrent.futures.Executor):
        return iter(pool.map(call, chunks, timeout=timeout))
    return iter(pool.map_async(call, chunks, chunksize=1).get(timeout))


def map_with_pool(td: Any, fn: Callable, dim: int, pool: Any, *, chunksize: Optional[int], num_chunks: Optional[int],
                  out: Any, timeout: Optional[float]) -> Any:
    """``td.map(fn, ..., pool=pool)`` on a foreign pool: the results joined in chunk order (or written into
    ``out``); None when ``fn`` returns None for every chunk."""
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}.")
    plan, chunks = _chunks(td, dim, pool, chunksize, num_chunks)
    results = [result for result in _results(pool, fn, chunks, timeout) if result is not None]
    if not results:
        return out
    joined = torch.stack(results, plan.dim) if plan.unbound else torch.cat(results, plan.dim)
    if out is None:
        return joined
    out.update_(joined)
    return out


def map_iter_with_pool(td: Any, fn: Callable, dim: int, pool: Any, *, shuffle: bool, chunksize: Optional[int],
                       num_chunks: Optional[int], generator: Optional[torch.Generator],
                       timeout: Optional[float]) -> Iterator[Any]:
    """``td.map_iter(fn, ..., pool=pool)`` on a foreign pool: ``fn(chunk)`` for each chunk, in chunk order."""
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}.")
    if shuffle:
        dim = normalize_dim(dim, td.batch_size)
        length = td.batch_size[dim]
        permutation = torch.randperm(length, generator=generator)
        plan = ChunkPlan(dim, length, chunk_length(length, chunksize, num_chunks, _worker_count(pool)), permutation)
        chunks = [plan.view(td, chunk) for chunk in range(plan.num_chunks)]
    else:
        _, chunks = _chunks(td, dim, pool, chunksize, num_chunks)
    return _results(pool, fn, chunks, timeout)
