"""What runs inside a ``map`` / ``map_iter`` worker process (and in-process with ``num_workers=0``).

A worker receives a :class:`Job` once (the function, the source TensorDict as
file names / shared-memory handles, the chunk plan, the output when known),
then only small *task* messages: ranges of chunk numbers. For each chunk it
builds the view itself, calls ``fn``, and either writes the result into the
shared output (``map``) or sends it back (``map_iter``, or a result that does
not fit the output).

Messages, parent -> worker (tuples over a duplex Pipe):
    ("job", job) | ("task", task_id, first_chunk, stop_chunk) | ("output", out_or_None)
    | ("end",) | ("stop",)
Worker -> parent:
    ("done", task_id, kinds, sent) | ("structure", skeleton) | ("error", task_id, chunk, exc_bytes, traceback_text)
where ``kinds`` has one letter per chunk of the task: ``n`` (fn returned None), ``w``
(written into the output) or ``s`` (sent back: ``sent[position]`` is the result).
"""
from __future__ import annotations

import os
import pickle
import traceback
from collections import deque
from typing import Any, Callable, Optional

import torch

from .._apply import unwrap
from .._base import TensorCollection
from ._channel import Link
from ._chunks import plain_leaves
from ._deadline import ChunkClock
from ._gather import fits, skeleton_of, slot_writer, structure_of, write_slot
from ._sharing import for_transport, prefault, tensor_leaves

MAP = "map"
ITER = "iter"
NONE = ("n",)
WRITTEN = ("w",)

# How often an idle worker checks that its parent is still alive.
_PARENT_POLL_S = 1.0


class Job:
    """Everything a worker needs for one ``map`` / ``map_iter`` call (sent once per worker)."""

    __slots__ = ("fn", "source", "plan", "mode", "out", "user_out", "lock_views")

    def __init__(self, fn: Callable, source: Any, plan: Any, mode: str, out: Any = None,
                 user_out: bool = False, lock_views: bool = False) -> None:
        self.fn = fn
        self.source = source
        self.plan = plan
        self.mode = mode
        self.out = out
        self.user_out = user_out
        self.lock_views = lock_views

    def __getstate__(self) -> tuple:
        return (self.fn, self.source, self.plan, self.mode, self.out, self.user_out, self.lock_views)

    def __setstate__(self, state: tuple) -> None:
        self.fn, self.source, self.plan, self.mode, self.out, self.user_out, self.lock_views = state


class ChunkRunner:
    """Runs chunks of a job: build the view, call ``fn``, place the result.

    ``request_output(skeleton)`` is called once, with the first result that
    could define the output; it returns the shared output (or None: send every
    result back).
    """

    def __init__(self, job: Job, request_output: Callable[[Any], Any]) -> None:
        self.job = job
        self.request_output = request_output
        self.out: Any = None
        self.out_structure: Any = None
        self.out_known = False
        self.source = plain_leaves(job.source)
        self.source_leaves = tensor_leaves(self.source)
        self.out_leaves: list = []
        if job.out is not None:
            self.set_output(job.out)

    def set_output(self, out: Any) -> None:
        self.out = out
        self.out_known = True
        if out is not None:
            self.out_structure = structure_of(out, self.job.plan.dim)
            self.out_leaves = tensor_leaves(out)

    def _prefault(self, first: int, stop: int) -> None:
        """Map the task's pages of the source (to read) and of the output (to write) in bulk."""
        plan = self.job.plan
        if plan.permutation is not None:
            return
        dim = plan.dim
        start, end = plan.bounds(first)[0], plan.bounds(stop - 1)[1]
        for leaf in self.source_leaves:
            prefault(leaf.narrow(dim, start, end - start), write=False)
        if self.out is not None and plan.length == self.out.batch_size[dim]:
            for leaf in self.out_leaves:
                prefault(leaf.narrow(dim, start, end - start), write=True)

    def run(self, first: int, stop: int, on_chunk: Optional[Callable[[int], None]] = None) -> list:
        """Process chunks ``first .. stop - 1``; returns one outcome per chunk."""
        job = self.job
        plan, fn, source = job.plan, job.fn, self.source
        outcomes = []
        self._prefault(first, stop)
        for chunk in range(first, stop):
            if on_chunk is not None:
                on_chunk(chunk)
            piece = plan.view(source, chunk)
            if job.lock_views:
                unwrap(piece)._lock_tree()
            outcomes.append(self._place(chunk, fn(piece)))
        return outcomes

    def _place(self, chunk: int, result: Any) -> tuple:
        if result is None:
            return NONE
        job = self.job
        if job.mode == ITER:
            return ("s", for_transport(result) if isinstance(result, TensorCollection) else result)
        if not isinstance(result, (TensorCollection, torch.Tensor)):
            # Caught here, with the chunk's number, rather than as torch.cat's
            # "expected Tensor as element 0" once every chunk has run.
            raise TypeError(
                f"map: fn returned {_preview(result)} for chunk {chunk}; map gathers what fn returns with "
                "torch.cat / torch.stack, so fn must return a TensorDict (or tensorclass), a tensor, or None "
                "(map_iter yields any value)."
            )
        plan = job.plan
        dim, unbound = plan.dim, plan.unbound
        start, stop = plan.bounds(chunk)
        if not self.out_known and fits_some_output(result, dim, stop - start, unbound):
            self.set_output(self.request_output(skeleton_of(result, dim, unbound)))
        if self.out is not None and fits(result, self.out_structure, dim, stop - start, unbound):
            write_slot(self.out, result, slot_writer(dim, start, stop, unbound))
            return WRITTEN
        if job.user_out:
            raise RuntimeError(
                f"map: the result of chunk {chunk} does not fit its place in out: out is "
                f"{_describe(self.out)}, the result is {_describe(result)}. With out=, fn must return, "
                f"for each chunk, a tensordict with the chunk's length along dim ({stop - start}) and out's "
                "keys, dtypes and shapes."
            )
        return ("s", for_transport(result) if isinstance(result, TensorCollection) else result)


def fits_some_output(result: Any, dim: int, length: int, unbound: bool) -> bool:
    """True when ``result`` could define a preallocated output (tensor leaves, right length)."""
    if not isinstance(result, TensorCollection):
        return False
    if unbound:
        return structure_of(result, None) is not None
    batch_size = unwrap(result)._batch_size
    return len(batch_size) > dim and batch_size[dim] == length and structure_of(result, dim) is not None


def _preview(value: Any) -> str:
    """``value``'s type and a short repr, for an error message."""
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} (of type {type(value).__name__})"


def _describe(result: Any) -> str:
    if not isinstance(result, TensorCollection):
        return f"a {type(result).__name__}"
    leaves = {}
    for key, leaf in unwrap(result).items(True, True):
        if hasattr(leaf, "dtype"):
            leaves[key] = f"{str(leaf.dtype).replace('torch.', '')}{list(leaf.shape)}"
        else:
            leaves[key] = type(leaf).__name__
    return f"a {type(result).__name__} with batch size {list(unwrap(result)._batch_size)} and leaves {leaves}"


def seed_worker(seed: int) -> None:
    """Seed torch and ``random`` (and NumPy when already imported) for one worker."""
    import random
    import sys

    torch.manual_seed(seed)
    random.seed(seed)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(seed % (2**32))


def error_message(task_id: int, chunk: int, error: BaseException) -> tuple:
    """The ``("error", ...)`` message for an exception raised while running a chunk."""
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    payload: Optional[bytes] = None
    try:
        payload = pickle.dumps(error)
        pickle.loads(payload)  # an exception that cannot be rebuilt is sent as text only
    except Exception:
        payload = None
    return ("error", task_id, chunk, payload, text)


def _exit_now() -> None:
    """Leave at once: skip interpreter teardown (tens of ms for a process holding torch), nothing is pending."""
    import sys

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(0)


def _die_with_parent(parent_pid: Optional[int]) -> None:
    """On Linux, have the kernel kill us if the parent dies, even while ``fn`` runs.

    Without it a worker notices only between tasks (its pipe reads end-of-file,
    or its parent id changes). The signal is tied to the parent *thread* that
    started us; a pool started by a thread that then exits sees its workers die,
    and reports it on its next use.
    """
    import sys

    if sys.platform.startswith("linux"):
        try:
            import ctypes
            import signal

            ctypes.CDLL(None).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if parent_pid is not None and os.getppid() != parent_pid:
        _exit_now()  # the parent died before we got here


def worker_main(conn: Any, parent_pid: Optional[int], seed: int, threads: int, job: Optional[Job],
                inherited_fds: tuple = (), clock: Optional[ChunkClock] = None) -> None:
    """Entry point of a worker process: serve tasks until told to stop or the parent is gone.

    ``inherited_fds`` are the parent's ends of the other workers' pipes, which a
    forked child inherits: closing them lets each worker see end-of-file when
    the parent dies, instead of being kept alive by a sibling holding its pipe.
    ``clock`` records the running chunk for the parent's ``timeout`` checks.
    ``parent_pid`` is None when our parent process is not the caller (a
    ``forkserver`` worker is the server's child): then only the pipe's
    end-of-file tells that the caller is gone.
    """
    import signal

    for fd in inherited_fds:
        try:
            os.close(fd)
        except OSError:
            pass
    _die_with_parent(parent_pid)
    # Ctrl-C reaches the whole process group: the parent handles it and stops us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(threads)
    seed_worker(seed)
    backlog: deque = deque()
    link = Link(conn)

    def next_message() -> tuple:
        while not conn.poll(_PARENT_POLL_S):
            if parent_pid is not None and os.getppid() != parent_pid:
                _exit_now()  # orphaned: the parent died without stopping us
        return link.receive()

    def request_output(skeleton: Any) -> Any:
        link.send(("structure", skeleton))
        while True:
            message = next_message()
            if message[0] == "output":
                return message[1]
            backlog.append(message)

    runner = None if job is None else ChunkRunner(job, request_output)
    current = [-1]  # the chunk being run, for error reports

    def on_chunk(chunk: int) -> None:
        current[0] = chunk
        if clock is not None:
            clock.start(chunk)

    try:
        while True:
            message = backlog.popleft() if backlog else next_message()
            kind = message[0]
            if kind == "task":
                task_id, first, stop = message[1], message[2], message[3]
                try:
                    outcomes = runner.run(first, stop, on_chunk)  # type: ignore[union-attr]
                except Exception as error:
                    _stop_clock(clock)
                    link.send(error_message(task_id, current[0], error))
                    continue
                # Stopped before sending: a send held up by a slow reader is not the chunk's time.
                _stop_clock(clock)
                link.send(("done", task_id) + pack_outcomes(outcomes))
            elif kind == "output":
                if runner is not None and not runner.out_known:
                    runner.set_output(message[1])
            elif kind == "job":
                runner = ChunkRunner(message[1], request_output)
            elif kind == "end":
                runner = None
                link.drop_free_segments()
            elif kind == "stop":
                _exit_now()
    except (EOFError, BrokenPipeError, ConnectionResetError):
        _exit_now()  # the parent closed our pipe: nothing left to do


def _stop_clock(clock: Optional[ChunkClock]) -> None:
    if clock is not None:
        clock.stop()


def pack_outcomes(outcomes: list) -> tuple:
    """``(kinds, sent)``: one letter per chunk (n / w / s) and ``{position: result}`` for the sent ones.

    A task may hold thousands of one-element chunks: a string of letters is
    much cheaper to pickle than a tuple per chunk.
    """
    kinds = "".join(outcome[0] for outcome in outcomes)
    sent = {position: outcome[1] for position, outcome in enumerate(outcomes) if outcome[0] == "s"}
    return kinds, sent


def unpack_outcomes(kinds: str, sent: dict) -> list:
    """The inverse of :func:`pack_outcomes`."""
    return [("s", sent[position]) if kind == "s" else (kind,) for position, kind in enumerate(kinds)]
