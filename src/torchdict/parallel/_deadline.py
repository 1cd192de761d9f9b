"""Per-chunk time limits for ``map`` / ``map_iter`` (``timeout=``).

Each worker owns a :class:`ChunkClock`: two numbers in shared memory, the
chunk it is running and when it started it (``time.monotonic``, one clock for
every process of the machine). The worker writes them when a chunk starts and
clears them when its task is done; the parent reads them while it waits for
messages. So only what the chunk itself costs (``fn`` and placing its result)
counts: not a ``spawn`` worker's start-up, not a task waiting in the pipe, not
the caller's loop body between two ``map_iter`` batches.

The parent cannot interrupt ``fn``; it raises ``TimeoutError`` and the usual
failure path kills the workers (SIGKILL works even on a worker stuck in C code).
With ``num_workers=0`` ``fn`` runs in the caller's thread, where nothing can
stop it: :class:`Stopwatch` reports an overlong chunk once it returns.
"""
from __future__ import annotations

import math
import numbers
import time
from typing import Any, Iterable, Optional

_IDLE = -1.0
# The parent wakes up this long after a deadline: waking up exactly on it would
# find the chunk a hair short of the limit and wait again for nothing.
_SLACK_S = 0.005


def check_timeout(timeout: Any) -> Optional[float]:
    """``timeout`` as seconds (None: no limit), or the error for a value that is not a positive number."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError(f"timeout must be a number of seconds or None, got {type(timeout).__name__}.")
    seconds = float(timeout)
    if math.isnan(seconds) or seconds <= 0:
        raise ValueError(f"timeout must be a positive number of seconds or None, got {timeout!r}.")
    return None if math.isinf(seconds) else seconds


def timeout_error(label: str, chunk: int, timeout: float, detail: str) -> TimeoutError:
    """The error for a chunk that ran too long; ``detail`` says where and for how long."""
    return TimeoutError(f"{label}: chunk {chunk} ran longer than timeout={timeout:g} s ({detail}).")


class ChunkClock:
    """One worker's shared record of the chunk it is running (written by the worker, read by the parent)."""

    def __init__(self, context: Any) -> None:
        # Raw: no lock. The worker writes the start time before the chunk number and the
        # parent reads the number first, so it never pairs a new chunk with an old time.
        self._slot = context.RawArray("d", 2)
        self._slot[0] = _IDLE

    def __getstate__(self) -> Any:  # handed to a spawn / forkserver worker with its process arguments
        return self._slot

    def __setstate__(self, slot: Any) -> None:
        self._slot = slot

    def start(self, chunk: int) -> None:
        self._slot[1] = time.monotonic()
        self._slot[0] = chunk

    def stop(self) -> None:
        self._slot[0] = _IDLE

    def running(self) -> Optional[tuple]:
        """``(chunk, started)`` while a chunk runs, else None."""
        chunk = self._slot[0]
        if chunk < 0:
            return None
        return int(chunk), self._slot[1]


def seconds_to_next_check(clocks: Iterable[ChunkClock], timeout: float) -> float:
    """How long the parent may wait before some running chunk could pass ``timeout``.

    Never more than ``timeout``: a chunk that starts after this call ends at
    least ``timeout`` from now, so it is caught by the next check.
    """
    now = time.monotonic()
    wait = timeout
    for clock in clocks:
        running = clock.running()
        if running is not None:
            wait = min(wait, running[1] + timeout - now)
    return max(wait, 0.0) + _SLACK_S


def overdue(clock: ChunkClock, timeout: float) -> Optional[tuple]:
    """``(chunk, elapsed)`` when the clock's chunk has run longer than ``timeout``, else None."""
    running = clock.running()
    if running is None:
        return None
    elapsed = time.monotonic() - running[1]
    return (running[0], elapsed) if elapsed > timeout else None


class Stopwatch:
    """Times chunks run in the caller's process (``num_workers=0``); raises once an overlong one returns."""

    def __init__(self, timeout: Optional[float], label: str) -> None:
        self.timeout = timeout
        self.label = label
        self.chunk: Optional[int] = None
        self.started = 0.0

    def start(self, chunk: int) -> None:
        """Called as ``chunk`` starts: the previous chunk (if any) is over."""
        self.stop()
        self.chunk = chunk
        self.started = time.monotonic()

    def stop(self) -> None:
        chunk, self.chunk = self.chunk, None
        if chunk is None or self.timeout is None:
            return
        elapsed = time.monotonic() - self.started
        if elapsed > self.timeout:
            raise timeout_error(
                self.label, chunk, self.timeout,
                f"it took {elapsed:.2f} s in this process; with num_workers=0 fn cannot be stopped, only "
                "reported when it returns",
            )
