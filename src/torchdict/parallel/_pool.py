"""Worker processes for ``map`` / ``map_iter``: start, feed, watch, stop.

Each worker is a ``multiprocessing.Process`` with its own duplex Pipe. The
parent waits on every pipe *and* every process sentinel at once
(``multiprocessing.connection.wait``), so a worker that dies (a signal, the
OOM killer, ``os._exit``) is noticed at once and turned into an exception
instead of a hang; ``multiprocessing.Pool`` would silently replace it and wait
forever for the lost task. After a failure every worker is terminated and
joined: no orphan processes are left, and no shared-memory segment either
(torch's default ``file_descriptor`` sharing unlinks segments as soon as they
are created, so they vanish with the last process that maps them). A chunk
that runs longer than the call's ``timeout`` is such a failure too: each
worker's :class:`~torchdict.parallel._deadline.ChunkClock` tells the parent which
chunk it runs and since when.
"""
from __future__ import annotations

import os
import pickle
import signal
import sys
from collections import deque
from typing import Any, Iterator, Optional

import torch

from ._channel import Link
from ._deadline import ChunkClock, overdue, seconds_to_next_check, timeout_error

__all__ = ["WorkerPool", "WorkerError", "RemoteTraceback"]

# Tasks queued on one worker at a time: one running, one waiting, so the worker
# never idles while its next task crosses the pipe.
_PER_WORKER_QUEUE = 2
# How long close() waits for a worker to exit by itself before terminating it.
_JOIN_TIMEOUT_S = 5.0
# How long a worker whose pipe broke may take to be reported dead.
_EXIT_REPORT_S = 1.0


class WorkerError(RuntimeError):
    """A worker process died (killed by a signal, or exited) while a job was running."""


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a worker process (set as ``__cause__``)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return "\n\n" + self.text


def default_start_method() -> str:
    """``fork`` on Linux (cheap starts, lambdas work) unless CUDA is initialised; ``spawn`` elsewhere."""
    if sys.platform.startswith("linux") and not torch.cuda.is_initialized():
        return "fork"
    return "spawn"


def resolve_num_workers(num_workers: Optional[int]) -> int:
    if num_workers is None:
        try:
            return len(os.sched_getaffinity(0))
        except AttributeError:  # not on Linux
            return os.cpu_count() or 1
    if not isinstance(num_workers, int) or isinstance(num_workers, bool) or num_workers < 0:
        raise ValueError(f"num_workers must be a non-negative int or None, got {num_workers!r}.")
    return num_workers


class _Worker:
    __slots__ = ("process", "conn", "clock", "tasks", "chunks_given", "stopping")

    def __init__(self, process: Any, conn: Any, clock: ChunkClock) -> None:
        self.process = process
        self.conn = conn
        self.clock = clock  # the chunk it runs and since when (for timeout=)
        self.tasks: deque = deque()  # task ids sent and not yet answered, in order
        self.chunks_given = 0
        self.stopping = False


class WorkerPool:
    """A persistent set of worker processes for ``TensorDict.map`` / ``map_iter`` (``pool=``).

    Starting workers costs ~10 ms with ``fork`` but 1-2 s with ``spawn`` (each
    re-imports torch); a pool pays it once for many calls. Workers are started
    on first use; ``close()`` (or leaving the ``with`` block) stops them. If a
    call fails (an exception in ``fn``, a worker killed), the workers are
    terminated and the next call starts fresh ones.

    Args:
        num_workers: the number of processes (default: the CPUs this process may use).
        mp_start_method: ``"fork"``, ``"spawn"`` or ``"forkserver"`` (default: ``fork``
            on Linux when CUDA is not initialised, else ``spawn``).
        worker_threads: ``torch.set_num_threads`` in each worker (default 1).
        generator: draws the workers' base seed; worker ``i`` seeds torch and
            ``random`` with ``base + i`` (default: the global torch RNG).

    With a pool, ``fn`` always crosses a pipe, so it must be picklable (a
    module-level function, not a lambda), whatever the start method.

    Example:
        >>> import torch
        >>> from torchdict import TensorDict
        >>> from torchdict.parallel import WorkerPool
        >>> td = TensorDict(x=torch.arange(8.0), batch_size=[8])
        >>> with WorkerPool(2) as pool:
        ...     first = td.map(TensorDict.clone, pool=pool, chunksize=4)
        ...     second = td.map(TensorDict.clone, pool=pool, chunksize=2)  # the same two processes
        >>> torch.equal(second["x"], td["x"])
        True
    """

    def __init__(self, num_workers: Optional[int] = None, *, mp_start_method: Optional[str] = None,
                 worker_threads: int = 1, generator: Optional[torch.Generator] = None) -> None:
        import multiprocessing

        self.num_workers = max(resolve_num_workers(num_workers), 1)
        self.start_method = mp_start_method or default_start_method()
        self._context: Any = multiprocessing.get_context(self.start_method)
        self.worker_threads = int(worker_threads)
        self._base_seed = int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())
        self._started = 0
        self._workers: list = []

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if exc_info[0] is None:
            self.close()
        else:
            self.terminate()

    def __del__(self) -> None:
        try:
            self.terminate()
        except Exception:
            pass

    def _start_worker(self, job: Any) -> _Worker:
        from ._workers import worker_main

        parent_conn, child_conn = self._context.Pipe(duplex=True)
        # Only a forked child holds copies of our ends of the other workers' pipes
        # (spawn and forkserver children inherit nothing): it closes them first thing.
        inherited: tuple = ()
        if self.start_method == "fork":
            inherited = (parent_conn.fileno(),) + tuple(worker.conn.fileno() for worker in self._workers)
        seed = (self._base_seed + self._started) % (2**63)
        self._started += 1
        clock = ChunkClock(self._context)
        # A forkserver worker's parent is the server, not us: it must not take that for our death.
        parent_pid = None if self.start_method == "forkserver" else os.getpid()
        process = self._context.Process(
            target=worker_main,
            args=(child_conn, parent_pid, seed, self.worker_threads, job, inherited, clock),
            name=f"torchdict-map-{self._started}",
            daemon=True,
        )
        import gc

        # Objects frozen before fork are not scanned by the child's garbage
        # collector, so the child does not write to (and copy) the parent's pages.
        gc.freeze()
        try:
            process.start()
        finally:
            gc.unfreeze()
            child_conn.close()  # the child holds its end; ours would keep the pipe open after it dies
        worker = _Worker(process, Link(parent_conn), clock)
        self._workers.append(worker)
        return worker

    def _prepare(self, job: Any, count: int) -> list:
        """Hand ``job`` to ``count`` workers (``<= num_workers``), starting the missing ones.

        A new worker gets the job as a process argument: with ``fork`` it is
        inherited, not pickled (so ``fn`` may be a lambda); with ``spawn`` it is
        pickled once, shared-memory handles included.
        """
        for worker in [worker for worker in self._workers if not worker.process.is_alive()]:
            # died between calls (killed from outside): replace it rather than fail the job
            worker.process.join()
            worker.conn.close()
            self._workers.remove(worker)
        count = min(count, self.num_workers)
        workers = self._workers[:count]
        for worker in workers:
            _send(worker, ("job", job))
        while len(workers) < count:
            workers.append(self._start_worker(job))
        return workers

    def _replace(self, worker: _Worker, job: Any) -> _Worker:
        """Join a worker that stopped (``max_tasks_per_child``) and start a new one in its place."""
        worker.process.join()
        worker.conn.close()
        self._workers.remove(worker)
        return self._start_worker(job)

    def _end_job(self, workers: list) -> None:
        for worker in workers:
            _send(worker, ("end",))

    def close(self) -> None:
        """Stop the workers gracefully (they finish their current message), then join them."""
        workers, self._workers = self._workers, []
        for worker in workers:
            _send(worker, ("stop",))
        for worker in workers:
            worker.process.join(_JOIN_TIMEOUT_S)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join()
            worker.conn.close()

    def terminate(self) -> None:
        """Kill the workers now (SIGKILL: a worker stuck in ``fn`` cannot block it) and join them."""
        workers, self._workers = self._workers, []
        for worker in workers:
            if worker.process.is_alive():
                worker.process.kill()
        for worker in workers:
            worker.process.join()
            worker.conn.close()


class Execution:
    """One job running on a pool: dispatches tasks in order and yields the workers' messages.

    ``window`` bounds the tasks dispatched but not yet released by the caller
    (``release``): ``map_iter`` uses it as its prefetch. ``chunks_per_worker``
    (``max_tasks_per_child``) replaces a worker after that many chunks.
    ``timeout`` (seconds) bounds each chunk; ``label`` names the call in errors.
    """

    def __init__(self, pool: WorkerPool, job: Any, tasks: list, *, window: Optional[int] = None,
                 chunks_per_worker: Optional[int] = None, timeout: Optional[float] = None,
                 label: str = "map") -> None:
        self.pool = pool
        self.job = job
        self.tasks = tasks
        self.next_task = 0
        self.released = 0
        self.window = window
        self.chunks_per_worker = chunks_per_worker
        self.timeout = timeout
        self.label = label
        self.workers = pool._prepare(job, len(tasks))
        self.unanswered = 0
        self.per_worker = _PER_WORKER_QUEUE
        if window is not None:
            self.per_worker = max(_PER_WORKER_QUEUE, -(window // -len(self.workers)))

    def release(self, count: int = 1) -> None:
        """The caller is done with ``count`` more tasks' results: more may be dispatched."""
        self.released += count

    def broadcast(self, message: tuple) -> None:
        for worker in self.workers:
            if not worker.stopping:
                _send(worker, message)

    def _dispatch(self) -> None:
        tasks = self.tasks
        for worker in self.workers:
            while (
                self.next_task < len(tasks)
                and len(worker.tasks) < self.per_worker
                and not worker.stopping
                and (self.window is None or self.next_task - self.released < self.window)
            ):
                first, stop = tasks[self.next_task]
                if self.chunks_per_worker is not None and worker.chunks_given >= self.chunks_per_worker:
                    if not worker.tasks:
                        worker.stopping = True
                        _send(worker, ("stop",))
                    break
                _send(worker, ("task", self.next_task, first, stop))
                worker.tasks.append(self.next_task)
                worker.chunks_given += stop - first
                self.next_task += 1
                self.unanswered += 1

    def events(self) -> Iterator[tuple]:
        """Yield ``("done", task_id, outcomes)`` and ``("structure", skeleton)`` until every task is answered.

        ``outcomes`` has one entry per chunk of the task (see ``_workers``).

        Raises the worker's exception (with its traceback as ``__cause__``),
        :class:`WorkerError` when a worker dies, or ``TimeoutError`` when a chunk
        runs longer than ``timeout``. The caller then terminates the pool.
        """
        from multiprocessing.connection import wait

        self._dispatch()
        while self.unanswered or self.next_task < len(self.tasks):
            by_handle = {}
            for worker in self.workers:
                by_handle[worker.conn] = worker
                by_handle[worker.process.sentinel] = worker
            ready = wait(list(by_handle), self._wait_limit())
            # Read every pipe before looking at deaths: a worker may answer, then die.
            for handle in ready:
                worker = by_handle[handle]
                if handle is worker.conn:
                    yield from self._read(worker)
            for handle in ready:
                worker = by_handle[handle]
                if handle is not worker.conn:
                    self._on_exit(worker)
            self._check_deadlines()
            self._dispatch()

    def _wait_limit(self) -> Optional[float]:
        if self.timeout is None:
            return None
        return seconds_to_next_check([worker.clock for worker in self.workers], self.timeout)

    def _check_deadlines(self) -> None:
        if self.timeout is None:
            return
        for worker in self.workers:
            late = overdue(worker.clock, self.timeout)
            if late is not None:
                chunk, elapsed = late
                raise timeout_error(self.label, chunk, self.timeout,
                                    f"still running after {elapsed:.2f} s in worker process {worker.process.pid}; "
                                    "the job was aborted and the workers stopped")

    def _read(self, worker: _Worker) -> Iterator[tuple]:
        from ._workers import unpack_outcomes

        while worker.conn.poll():
            try:
                message = worker.conn.receive()
            except (EOFError, OSError, RuntimeError):
                # A broken pipe means a dying worker; a forkserver worker's exit is
                # reported by the server a moment later, so give it that moment.
                worker.process.join(_EXIT_REPORT_S)
                if worker.process.is_alive():
                    raise
                return  # the worker died mid-message; its sentinel reports it
            kind = message[0]
            if kind == "done":
                worker.tasks.remove(message[1])
                self.unanswered -= 1
                yield ("done", message[1], unpack_outcomes(message[2], message[3]))
            elif kind == "structure":
                yield message
            elif kind == "error":
                raise _remote_error(message, worker)

    def _on_exit(self, worker: _Worker) -> None:
        process = worker.process
        process.join(0.1)
        if worker.stopping and not worker.tasks and process.exitcode == 0:
            position = self.workers.index(worker)
            if self.next_task < len(self.tasks):
                self.workers[position] = self.pool._replace(worker, self.job)
            else:
                self.pool._workers.remove(worker)
                worker.conn.close()
                del self.workers[position]
            return
        raise WorkerError(_death_message(worker))


def _send(worker: _Worker, message: tuple) -> None:
    """Send to a worker; if it is dead, its sentinel reports that on the next wait."""
    try:
        worker.conn.send(message)
    except (BrokenPipeError, ConnectionResetError):
        pass


def _death_message(worker: _Worker) -> str:
    code = worker.process.exitcode
    if code is not None and code < 0:
        try:
            how = f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            how = f"was killed by signal {-code}"
    else:
        how = f"exited with code {code}"
    doing = f"while running task(s) {list(worker.tasks)}" if worker.tasks else "while idle"
    message = (
        f"map worker process {worker.process.pid} {how} {doing}. The job was aborted and the other "
        "workers stopped."
    )
    if code == -signal.SIGKILL:
        message += " (SIGKILL often comes from the out-of-memory killer: try smaller chunks or fewer workers.)"
    elif code == 1:
        message += " (See the worker's traceback above: with spawn, fn and its module must be importable.)"
    return message


def _remote_error(message: tuple, worker: _Worker) -> BaseException:
    _, task_id, chunk, payload, text = message
    error: Optional[BaseException] = None
    if payload is not None:
        try:
            error = pickle.loads(payload)
        except Exception:
            error = None
    if not isinstance(error, BaseException):
        first_line = text.strip().splitlines()[-1] if text.strip() else "unknown error"
        error = RuntimeError(f"fn raised in a worker process: {first_line}")
    note = f"raised in map worker process {worker.process.pid}, on chunk {chunk}"
    if hasattr(error, "add_note"):
        error.add_note(note)
    error.__cause__ = RemoteTraceback(text)
    return error
