"""SIGTERM while ``map`` / ``map_iter`` run: clean up, then end as SIGTERM would have.

SIGTERM's default action ends the process at once, with no ``finally`` block
run: the temporary folder holding a memory-mapped ``map`` output would stay on
disk for good, and on platforms without a parent-death signal the workers would
outlive us. Exceptions and Ctrl-C (KeyboardInterrupt) unwind through the
callers' ``except`` blocks, which clean up; SIGTERM needs a handler.

While at least one job runs, :func:`cleanup_on_sigterm` keeps a handler on
SIGTERM that runs every running job's cleanup (kill its workers, remove its
folders) and then ends the process *with SIGTERM*, so that the exit status a
supervisor sees is unchanged. The handler never returns into the interrupted
code, so it cannot leave a job half-done behind it. It is installed only:

- from the main thread (Python runs signal handlers there, and only lets that
  thread install them); a job in another thread is still cleaned up when a
  main-thread job holds the handler;
- when SIGTERM has its default action: an ignored SIGTERM, or a handler the
  program installed, is its own choice and is left alone (if that handler
  raises, the jobs' ``except`` blocks clean up as for any exception).

The default action is restored when the last job ends (unless someone replaced
our handler meanwhile). A forked child (a ``fork`` worker) starts with no job
and the default action: it must never kill its parent's workers or delete its
parent's folders, even when ``fn`` runs a ``map`` of its own.
"""
from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager
from typing import Callable, Iterator

# Cleanups of the jobs running now, oldest first. Mutated under the GIL only
# (append / remove), read by the handler in the main thread.
_cleanups: list = []
# The process that installed the handler: a child forked by other means than
# os.fork (no at-fork callbacks) must not run its parent's cleanups either.
_owner_pid = 0


def _on_sigterm(signum: int, frame: object) -> None:
    # A second SIGTERM while we clean up ends us at once, as the default action would.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if os.getpid() == _owner_pid:
        for cleanup in reversed(list(_cleanups)):
            try:
                cleanup()
            except BaseException:  # one failed cleanup must not keep the others from running
                pass
    signal.raise_signal(signal.SIGTERM)
    # Only reached if this thread blocks SIGTERM: end anyway, with the shell's code for it.
    os._exit(128 + signal.SIGTERM)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _install() -> None:
    global _owner_pid
    if not _in_main_thread() or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return
    _owner_pid = os.getpid()
    try:
        signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:  # not the main interpreter: handlers cannot be set here
        pass


def _uninstall() -> None:
    if _in_main_thread() and signal.getsignal(signal.SIGTERM) is _on_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # From another thread it stays; with no job left, it only does what the default would.


def _forget_in_child() -> None:
    """After ``os.fork``, in the child: the parent's jobs are not ours to clean up."""
    _cleanups.clear()
    try:
        if signal.getsignal(signal.SIGTERM) is _on_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
    except ValueError:
        pass


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_forget_in_child)


@contextmanager
def cleanup_on_sigterm(cleanup: Callable[[], None]) -> Iterator[None]:
    """Run ``cleanup`` if SIGTERM ends the process inside this block (see the module's docstring)."""
    _cleanups.append(cleanup)
    try:
        _install()
        yield
    finally:
        if cleanup in _cleanups:  # a forked child that returns through here has none
            _cleanups.remove(cleanup)
        if not _cleanups:
            _uninstall()
