"""One mechanism for every "operation as a context manager".

An operation that can be undone records, on the object it returns, what to
do when a ``with`` block around that object ends (its *exit action*). The
action is pending until ``__enter__`` takes it; it is then pushed on a
per-object stack so nested blocks on the same object unwind in order.
Objects used without ``with`` simply keep (and later overwrite) a pending
action, which costs nothing.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

ExitAction = Callable[[bool], None]  # called with raised=True when the block raised


class _ContextState:
    __slots__ = ("pending", "stack")

    def __init__(self) -> None:
        self.pending: Optional[ExitAction] = None
        self.stack: list = []


def _state(td: Any) -> _ContextState:
    state = td._cm
    if state is None:
        state = td._cm = _ContextState()
    return state


def set_exit_action(td: Any, action: Optional[ExitAction]) -> None:
    """Record what leaving a ``with`` block around ``td`` must do."""
    if action is None and td._cm is None:
        return
    _state(td).pending = action


def remember_state_change(td: Any, restore: Optional[Callable[[], None]]) -> None:
    """For ``lock_``/``unlock_``: undo the change on exit, also when the block raises.

    ``restore`` is None when the call changed nothing (then exit does nothing).
    """
    set_exit_action(td, None if restore is None else (lambda raised: restore()))


class ContextMixin:
    __slots__ = ()

    def __enter__(self) -> Any:
        state = _state(self)
        state.stack.append(state.pending)
        state.pending = None
        return self

    def __exit__(self, exc_type: Any, exc: Any, traceback: Any) -> bool:
        action = self._cm.stack.pop()
        if action is not None:
            action(exc_type is not None)
        return False
