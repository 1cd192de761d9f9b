"""Locking a TensorDict: no new keys, deletions or replacements, recursively (``LockingMixin``).

A lock is a flag on each TensorDict of a tree. ``_lock_parents`` counts the locked
TensorDicts holding this one, so a child can't be unlocked while a parent is locked,
and a TensorDict held by two locked trees unlocks only when both are. In-place writes
(``set_``, ``update_``, ``td[idx] = ...``, ``+=``) stay allowed. ``lock_``/``unlock_``
record how to undo themselves for the operations used as context managers.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional

from ._apply import unwrap
from ._base import TensorCollection
from ._errors import locked_error

if TYPE_CHECKING:
    from typing_extensions import Self
    from ._host import TensorDictHost
    from .tensordict import TensorDict
else:
    TensorDictHost = object


def keep_lock(source: Any, result: Any) -> Any:
    """``result`` locked when ``source`` is: upstream's rule for view-like shape ops and pointwise
    arithmetic (``td.view(...)``, ``td + 1``, ``td.exp()``). Only for results built afresh (no
    sub-TensorDict shared with ``source``, whose lock count the result would then hold)."""
    if source._is_locked and result is not source:
        result._lock_tree()
    return result


def keep_lock_all(source: Any, results: tuple) -> tuple:
    """:func:`keep_lock` for each piece of a split-like op."""
    if source._is_locked:
        for result in results:
            keep_lock(source, result)
    return results


class LockingMixin(TensorDictHost):
    __slots__ = ()

    @property
    def is_locked(self) -> bool:
        return self._is_locked

    @is_locked.setter
    def is_locked(self, value: bool) -> None:
        # As upstream: assigning is lock_() / unlock_() (without their context-manager role).
        if value:
            self._lock_tree()
        else:
            self.unlock_()

    def _check_unlocked(self) -> None:
        if self._is_locked:
            raise locked_error()

    def lock_(self) -> Self:
        """Forbid new keys, deletions and replacements, recursively; returns self."""
        was_locked = self._is_locked
        self._lock_tree()
        self._remember_exit(None if was_locked else self._unlock_tree)
        return self

    def _lock_tree(self) -> None:
        if self._is_locked:
            return
        self._is_locked = True
        for leaf in self._tensordict.values():
            if isinstance(leaf, TensorCollection):
                child = unwrap(leaf)
                child._lock_parents += 1
                child._lock_tree()

    def unlock_(self) -> Self:
        """Allow modifications again (not on a td held by a locked parent); returns self."""
        if self._lock_parents:
            raise RuntimeError(
                "Cannot unlock a tensordict that is part of a locked graph. Unlock the root tensordict "
                "first. If the tensordict is part of multiple graphs, group the graphs under a common "
                "tensordict an unlock this root."
            )
        was_locked = self._is_locked
        self._unlock_tree()
        self._remember_exit(self._lock_tree if was_locked else None)
        return self

    def _unlock_tree(self) -> None:
        if not self._is_locked:
            return
        self._is_locked = False
        self._is_memmap = False
        for leaf in self._tensordict.values():
            if isinstance(leaf, TensorCollection):
                child = unwrap(leaf)
                child._lock_parents -= 1
                if not child._lock_parents:
                    child._unlock_tree()

    def _remember_exit(self, restore: Optional[Callable[[], None]]) -> None:
        from ._context import remember_state_change

        remember_state_change(self, restore)
