"""Parallel preprocessing: ``TensorDict.map`` and ``TensorDict.map_iter``.

The TensorDict is cut along ``dim`` into chunks; worker processes call ``fn``
on them. Nothing big is pickled: each worker receives, once, the source as
file names (memory-mapped leaves) or shared-memory handles, then only ranges
of chunk numbers; it builds each chunk as a view of the source, so edits made
by ``fn`` through ``set_`` / ``update_`` land in the caller's data. ``map``
gathers returned TensorDicts in one preallocated output that the workers write
into directly (memory-mapped when the input is, so it may exceed RAM);
``map_iter`` sends each result back and yields them in order, with the
workers running ahead by a bounded number of chunks.

The machinery lives in private modules: ``_chunks`` (cutting),
``_sharing`` (crossing processes without copies), ``_gather`` (the output),
``_scratch`` (the output's temporary folders), ``_workers`` (the worker loop),
``_pool`` (processes, liveness, failures), ``_deadline`` (``timeout=``) and
``_termination`` (cleaning up on SIGTERM). See docs/parallel.md.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional

import torch

if TYPE_CHECKING:
    from .._host import TensorDictHost
else:
    TensorDictHost = object

__all__ = ["ParallelMixin", "WorkerPool", "WorkerError", "RemoteTraceback"]


def __getattr__(name: str) -> Any:
    # The process machinery is imported on first use: ``import torchdict`` stays cheap.
    if name in ("WorkerPool", "WorkerError", "RemoteTraceback"):
        from . import _pool

        return getattr(_pool, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class ParallelMixin(TensorDictHost):
    __slots__ = ()

    def map(self, fn: Callable[[Any], Any], dim: int = 0, num_workers: Optional[int] = None, *,
            chunksize: Optional[int] = None, num_chunks: Optional[int] = None, pool: Any = None,
            generator: Optional[torch.Generator] = None, max_tasks_per_child: Optional[int] = None,
            worker_threads: int = 1, index_with_generator: bool = False, pbar: bool = False,
            mp_start_method: Optional[str] = None, out: Any = None, timeout: Optional[float] = None) -> Any:
        """Call ``fn`` on chunks along ``dim`` in worker processes and gather what it returns.

        ``chunksize=0`` passes one element at a time (its batch drops ``dim``);
        otherwise chunks hold ``chunksize`` elements, or there are ``num_chunks``
        of them, or (neither given) one per worker. Chunks are views: ``fn`` may
        edit them in place with ``set_`` / ``update_``, and the edits are seen by
        the caller. Returned TensorDicts are joined in order (``torch.cat``, or
        ``torch.stack`` for ``chunksize=0``) into a shared-memory result, or a
        memory-mapped one when this TensorDict is memory-mapped; ``out=`` is
        written and returned instead. If ``fn`` returns None for every chunk,
        ``map`` returns None (or ``out``).

        ``num_workers=None`` uses every CPU available, ``0`` runs in this
        process; ``pool`` is a :class:`torchdict.parallel.WorkerPool` reused
        across calls, or (as upstream) a ``multiprocessing.Pool`` or a ``concurrent.futures`` executor, which
        receive pickled copies of the chunks (see ``torchdict.parallel._foreign_pool`` for what a dead worker does
        there). Workers start with ``fork`` on Linux (``mp_start_method``
        to change it: under ``spawn``, ``fn`` must be importable, as in the
        ``if __name__ == "__main__"`` idiom). A plain (not shared, not
        memory-mapped) TensorDict is moved to shared memory first, in place
        (one copy). An exception in ``fn`` is re-raised here with the worker's
        traceback as ``__cause__``; a worker that dies raises
        :class:`torchdict.parallel.WorkerError`. ``timeout`` (seconds, not in
        upstream) bounds each chunk: a chunk running longer raises
        ``TimeoutError`` and the workers are killed. On any failure, Ctrl-C or
        SIGTERM the workers are stopped and the output's temporary folder removed.

        Example:
            >>> import torch
            >>> from torchdict import TensorDict
            >>> td = TensorDict(x=torch.arange(6.0), batch_size=[6])
            >>> td.map(lambda chunk: chunk.set("y", chunk["x"] * 2), num_workers=2, chunksize=2)["y"]
            tensor([ 0.,  2.,  4.,  6.,  8., 10.])
        """
        if pool is not None and _is_foreign_pool(pool):
            # A multiprocessing.Pool or a concurrent.futures executor, as upstream accepts (see _foreign_pool).
            from ._foreign_pool import map_with_pool

            return map_with_pool(self, fn, dim, pool, chunksize=chunksize, num_chunks=num_chunks, out=out,
                                 timeout=timeout)
        return run_map(self, fn, dim, num_workers, chunksize=chunksize, num_chunks=num_chunks, pool=pool,
                       generator=generator, max_tasks_per_child=max_tasks_per_child,
                       worker_threads=worker_threads, pbar=pbar, mp_start_method=mp_start_method, out=out,
                       timeout=timeout)

    def map_iter(self, fn: Callable[[Any], Any], dim: int = 0, num_workers: Optional[int] = None, *,
                 shuffle: bool = False, chunksize: Optional[int] = None, num_chunks: Optional[int] = None,
                 pool: Any = None, generator: Optional[torch.Generator] = None,
                 max_tasks_per_child: Optional[int] = None, worker_threads: int = 1,
                 index_with_generator: bool = True, pbar: bool = False, mp_start_method: Optional[str] = None,
                 prefetch: Optional[int] = None, timeout: Optional[float] = None) -> Iterator[Any]:
        """Yield ``fn(chunk)`` for each chunk along ``dim``, computed by worker processes.

        Results come in chunk order; with ``shuffle=True`` the chunks take their
        elements from a random permutation drawn from ``generator`` (every
        element exactly once). Workers run ahead by at most ``prefetch`` chunks
        (default: two per worker). Other arguments, ``timeout`` included, are as
        in :meth:`map` (the time the loop's body takes does not count).
        Leaving the loop early stops the workers.

        Example:
            >>> import torch
            >>> from torchdict import TensorDict
            >>> td = TensorDict(x=torch.arange(6.0), batch_size=[6])
            >>> [chunk["x"].tolist() for chunk in td.map_iter(lambda c: c, num_workers=2, chunksize=4)]
            [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0]]
        """
        if pool is not None and _is_foreign_pool(pool):
            from ._foreign_pool import map_iter_with_pool

            return map_iter_with_pool(self, fn, dim, pool, shuffle=shuffle, chunksize=chunksize,
                                      num_chunks=num_chunks, generator=generator, timeout=timeout)
        return run_map_iter(self, fn, dim, num_workers, shuffle=shuffle, chunksize=chunksize,
                            num_chunks=num_chunks, pool=pool, generator=generator,
                            max_tasks_per_child=max_tasks_per_child, worker_threads=worker_threads,
                            pbar=pbar, mp_start_method=mp_start_method, prefetch=prefetch, timeout=timeout)


# ---------------------------------------------------------------------- shared set-up
def _is_foreign_pool(pool: Any) -> bool:
    from ._foreign_pool import is_foreign_pool

    return is_foreign_pool(pool)


class _NoProgress:
    def update(self, count: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def _tqdm() -> Any:
    """tqdm's bar class (imported only when a bar is asked for), or a clear ImportError."""
    try:
        from tqdm import tqdm
    except ImportError:
        raise ImportError(
            "pbar=True draws a progress bar with tqdm, which is not installed: "
            "`pip install tqdm`, or call map/map_iter with pbar=False."
        ) from None
    return tqdm


def _progress(enabled: bool, total: int) -> Any:
    """A tqdm bar over ``total`` chunks, or a stand-in that does nothing."""
    return _tqdm()(total=total, unit="chunk") if enabled else _NoProgress()


def _check_common(fn: Any, pool: Any, worker_threads: Any, max_tasks_per_child: Any, timeout: Any) -> Optional[float]:
    """Validate the arguments map and map_iter share (before anything starts); returns the timeout in seconds."""
    from ._deadline import check_timeout
    from ._pool import WorkerPool

    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}.")
    if pool is not None and not isinstance(pool, WorkerPool):
        raise TypeError(
            f"pool must be a torchdict.parallel.WorkerPool, got {type(pool).__module__}.{type(pool).__name__}. "
            "A multiprocessing.Pool cannot be used: it silently replaces dead workers (a lost chunk would "
            "hang the call) and cannot give each worker the data once."
        )
    if not isinstance(worker_threads, int) or worker_threads < 1:
        raise ValueError(f"worker_threads must be a positive int, got {worker_threads!r}.")
    if max_tasks_per_child is not None and (not isinstance(max_tasks_per_child, int) or max_tasks_per_child < 1):
        raise ValueError(f"max_tasks_per_child must be a positive int or None, got {max_tasks_per_child!r}.")
    return check_timeout(timeout)


def _plan(td: Any, dim: int, workers: int, chunksize: Any, num_chunks: Any) -> Any:
    from ._chunks import ChunkPlan, chunk_length, normalize_dim

    dim = normalize_dim(dim, td.batch_size)
    length = td.batch_size[dim]
    size = chunk_length(length, chunksize, num_chunks, workers)
    return ChunkPlan(dim, length, size)


class _Teardown:
    """What a job that does not finish must undo: kill its workers, remove its output folders.

    Called on an exception (KeyboardInterrupt included) and, through
    ``_termination``, on SIGTERM; it may run twice (both are idempotent).
    """

    def __init__(self, pool: Any = None) -> None:
        from ._scratch import ScratchFolders

        self.pool = pool  # set while workers run for the job; None once they are done with it
        self.folders = ScratchFolders()

    def __call__(self) -> None:
        pool, self.pool = self.pool, None
        if pool is not None:
            pool.terminate()  # first: no worker writes into a folder being removed
        self.folders.remove_all()


class _Output:
    """``map``'s shared output: the caller's ``out=``, or allocated from the first result's structure."""

    def __init__(self, out: Any, plan: Any, on_disk: bool, teardown: _Teardown) -> None:
        self.td = out
        self.plan = plan
        self.on_disk = on_disk
        self.folders = teardown.folders

    def allocate(self, skeleton: Any) -> Any:
        """Shaped after ``skeleton``, in shared memory, or in files when the input is memory-mapped."""
        from ._gather import allocate_output

        folder = self.folders.make() if self.on_disk else None
        self.td = self.folders.tie(allocate_output(skeleton, self.plan.dim, self.plan.length, folder), folder)
        return self.td


# ---------------------------------------------------------------------- map
def run_map(td: Any, fn: Callable, dim: int, num_workers: Optional[int], *, chunksize: Any, num_chunks: Any,
            pool: Any, generator: Any, max_tasks_per_child: Any, worker_threads: int, pbar: bool,
            mp_start_method: Any, out: Any, timeout: Any) -> Any:
    from .._apply import unwrap
    from .._base import TensorCollection
    from ._pool import resolve_num_workers
    from ._sharing import is_on_disk
    from ._termination import cleanup_on_sigterm

    timeout = _check_common(fn, pool, worker_threads, max_tasks_per_child, timeout)
    workers = pool.num_workers if pool is not None else resolve_num_workers(num_workers)
    plan = _plan(td, dim, workers, chunksize, num_chunks)
    if out is not None:
        if not isinstance(out, TensorCollection):
            raise TypeError(f"out must be a TensorDict (or tensorclass), got {type(out).__name__}.")
        out_batch = unwrap(out)._batch_size
        if len(out_batch) <= plan.dim or out_batch[plan.dim] != plan.length:
            raise ValueError(
                f"out must hold the gathered result: {plan.length} elements along dim {plan.dim}, "
                f"got batch size {list(out_batch)}."
            )
    if plan.num_chunks == 0:
        return out
    progress = _progress(pbar, plan.num_chunks)
    teardown = _Teardown()
    on_disk = is_on_disk(td)
    output = _Output(out, plan, on_disk, teardown)
    try:
        with cleanup_on_sigterm(teardown):
            if workers == 0 and pool is None:
                outcomes = _map_here(td, fn, plan, output, progress, timeout)
            else:
                outcomes = _map_in_workers(
                    td, fn, plan, output, progress, teardown, workers=workers, pool=pool, generator=generator,
                    max_tasks_per_child=max_tasks_per_child, worker_threads=worker_threads,
                    mp_start_method=mp_start_method, timeout=timeout)
            return _finish(outcomes, plan, output.td, out is not None, on_disk, teardown.folders)
    except BaseException:
        teardown()
        raise
    finally:
        progress.close()


def _map_here(td: Any, fn: Callable, plan: Any, output: _Output, progress: Any, timeout: Optional[float]) -> list:
    """``num_workers=0``: the same cutting and placing, in this process."""
    from ._chunks import group_tasks
    from ._deadline import Stopwatch
    from ._workers import MAP, ChunkRunner, Job

    out = output.td
    job = Job(fn, td, plan, MAP, out=out, user_out=out is not None, lock_views=td.is_locked)
    runner = ChunkRunner(job, output.allocate)
    stopwatch = Stopwatch(timeout, "map") if timeout is not None else None
    outcomes: list = []
    for first, stop in group_tasks(plan.num_chunks, 1):
        outcomes.extend(runner.run(first, stop, None if stopwatch is None else stopwatch.start))
        if stopwatch is not None:
            stopwatch.stop()
        progress.update(stop - first)
    return outcomes


def _map_in_workers(td: Any, fn: Callable, plan: Any, output: _Output, progress: Any, teardown: _Teardown, *,
                    workers: int, pool: Any, generator: Any, max_tasks_per_child: Any, worker_threads: int,
                    mp_start_method: Any, timeout: Optional[float]) -> list:
    """Run the chunks on worker processes; one outcome per chunk, in order."""
    from ._chunks import group_tasks
    from ._pool import Execution, WorkerPool
    from ._sharing import for_transport, share_in_place
    from ._workers import MAP, Job

    out = output.td
    share_in_place(td)
    if out is not None:
        share_in_place(out)
    job = Job(fn, for_transport(td), plan, MAP, out=None if out is None else for_transport(out),
              user_out=out is not None, lock_views=td.is_locked)
    tasks = group_tasks(plan.num_chunks, workers, per_task=1 if max_tasks_per_child else None)
    outcomes: list = [None] * plan.num_chunks
    own_pool = pool is None
    if own_pool:
        pool = WorkerPool(min(workers, len(tasks)), mp_start_method=mp_start_method,
                          worker_threads=worker_threads, generator=generator)
    teardown.pool = pool  # from here on, a failure kills these workers
    execution = Execution(pool, job, tasks, chunks_per_worker=max_tasks_per_child, timeout=timeout, label="map")
    for event in execution.events():
        if event[0] == "structure":
            if output.td is None:
                job.out = for_transport(output.allocate(event[1]))
                execution.broadcast(("output", job.out))
            continue
        first = tasks[event[1]][0]
        results = event[2]
        outcomes[first:first + len(results)] = results
        progress.update(len(results))
    _release(pool, own_pool, execution)
    teardown.pool = None  # done with the workers: a later failure (gathering) leaves them be
    return outcomes


def _finish(outcomes: list, plan: Any, output: Any, user_out: bool, on_disk: bool, folders: Any) -> Any:
    """The gathered result: the output itself when every chunk was written into it."""
    from .._apply import map_batch
    from ._gather import assemble, slot_writer

    kinds = {outcome[0] for outcome in outcomes}
    if user_out or kinds <= {"n"}:
        return output
    if kinds == {"w"}:
        return output
    dim, unbound = plan.dim, plan.unbound
    parts = []
    for chunk, outcome in enumerate(outcomes):
        if outcome[0] == "w":
            start, stop = plan.bounds(chunk)
            select = slot_writer(dim, start, stop, unbound)
            batch_size = output.batch_size
            part_batch = batch_size[:dim] + batch_size[dim + 1:] if unbound else (
                batch_size[:dim] + torch.Size([stop - start]) + batch_size[dim + 1:])
            parts.append(map_batch(output, select, part_batch))
        elif outcome[0] == "s":
            parts.append(outcome[1])
    folder = folders.make() if on_disk else None
    return folders.tie(assemble(parts, dim, unbound, folder), folder)


# ---------------------------------------------------------------------- map_iter
def run_map_iter(td: Any, fn: Callable, dim: int, num_workers: Optional[int], *, shuffle: bool, chunksize: Any,
                 num_chunks: Any, pool: Any, generator: Any, max_tasks_per_child: Any, worker_threads: int,
                 pbar: bool, mp_start_method: Any, prefetch: Optional[int], timeout: Any) -> Iterator[Any]:
    """Validate now, then return the generator that runs the job (so bad arguments fail at the call)."""
    from ._pool import resolve_num_workers

    timeout = _check_common(fn, pool, worker_threads, max_tasks_per_child, timeout)
    if prefetch is not None and (not isinstance(prefetch, int) or prefetch < 1):
        raise ValueError(f"prefetch must be a positive int or None, got {prefetch!r}.")
    workers = pool.num_workers if pool is not None else resolve_num_workers(num_workers)
    plan = _plan(td, dim, workers, chunksize, num_chunks)
    if shuffle:
        plan.permutation = torch.randperm(plan.length, generator=generator)
    if pbar:
        _tqdm()  # fail now, not at the first iteration
    return _iterate(td, fn, plan, workers, pool, generator, max_tasks_per_child, worker_threads,
                    mp_start_method, prefetch, pbar, timeout)


def _iterate(td: Any, fn: Callable, plan: Any, workers: int, pool: Any, generator: Any, max_tasks_per_child: Any,
             worker_threads: int, mp_start_method: Any, prefetch: Optional[int], pbar: bool,
             timeout: Optional[float]) -> Iterator[Any]:
    progress = _progress(pbar, plan.num_chunks)
    try:
        if plan.num_chunks == 0:
            return
        if workers == 0 and pool is None:
            yield from _iterate_here(td, fn, plan, progress, timeout)
        else:
            yield from _iterate_in_workers(td, fn, plan, progress, workers=workers, pool=pool, generator=generator,
                                           max_tasks_per_child=max_tasks_per_child, worker_threads=worker_threads,
                                           mp_start_method=mp_start_method, prefetch=prefetch, timeout=timeout)
    finally:
        progress.close()


def _iterate_here(td: Any, fn: Callable, plan: Any, progress: Any, timeout: Optional[float]) -> Iterator[Any]:
    """``num_workers=0``: each chunk computed in this process when the loop asks for it."""
    from ._deadline import Stopwatch
    from ._workers import ITER, ChunkRunner, Job

    runner = ChunkRunner(Job(fn, td, plan, ITER, lock_views=td.is_locked), lambda skeleton: None)
    stopwatch = Stopwatch(timeout, "map_iter")
    for chunk in range(plan.num_chunks):
        stopwatch.start(chunk)
        outcome = runner.run(chunk, chunk + 1)[0]
        stopwatch.stop()  # before yielding: the loop's body is not the chunk's time
        progress.update(1)
        yield None if outcome[0] == "n" else outcome[1]


def _iterate_in_workers(td: Any, fn: Callable, plan: Any, progress: Any, *, workers: int, pool: Any,
                        generator: Any, max_tasks_per_child: Any, worker_threads: int, mp_start_method: Any,
                        prefetch: Optional[int], timeout: Optional[float]) -> Iterator[Any]:
    """Results of worker processes, yielded in chunk order; the workers run up to ``prefetch`` chunks ahead."""
    from ._pool import Execution, WorkerPool
    from ._sharing import for_transport, share_in_place
    from ._termination import cleanup_on_sigterm
    from ._workers import ITER, Job

    share_in_place(td)
    if plan.permutation is not None:
        plan.permutation.share_memory_()
    job = Job(fn, for_transport(td), plan, ITER, lock_views=td.is_locked)
    tasks = [(chunk, chunk + 1) for chunk in range(plan.num_chunks)]
    window = prefetch if prefetch is not None else 2 * workers
    own_pool = pool is None
    if own_pool:
        pool = WorkerPool(min(workers, len(tasks)), mp_start_method=mp_start_method,
                          worker_threads=worker_threads, generator=generator)
    teardown = _Teardown(pool)
    # Registered for the whole iteration, the caller's loop body included: the
    # workers keep computing chunks ahead while it runs.
    with cleanup_on_sigterm(teardown):
        try:
            execution = Execution(pool, job, tasks, window=max(window, 1), chunks_per_worker=max_tasks_per_child,
                                  timeout=timeout, label="map_iter")
            ready: dict = {}
            next_chunk = 0
            for event in execution.events():
                ready[event[1]] = event[2][0]
                while next_chunk in ready:
                    outcome = ready.pop(next_chunk)
                    next_chunk += 1
                    execution.release()
                    progress.update(1)
                    yield None if outcome[0] == "n" else outcome[1]
        except BaseException:
            # An error, or the caller left the loop early (GeneratorExit): the
            # workers may be busy with chunks nobody will read; stop them now.
            teardown()
            raise
        _release(pool, own_pool, execution)


def _release(pool: Any, own_pool: bool, execution: Any) -> None:
    """After a job that ran to the end: close a pool made for it, or hand a caller's pool back."""
    if own_pool:
        pool.close()
    else:
        pool._end_job(execution.workers)
