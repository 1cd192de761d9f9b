"""The ``inplace=True`` forms of ops that make a new result (``gather``, ``repeat``, ``roll``, ``masked_select``,
``repeat_interleave``, ``contiguous``): the TensorDict takes the result's leaves and batch size while keeping
its identity, its keys and the identity of its nested TensorDicts (as upstream).

The storage dicts are updated in place, never rebound: a tensorclass instance uses its TensorDict's storage
dict as its ``__dict__``.
"""
from __future__ import annotations

from typing import Any

from ._apply import unwrap
from ._base import TensorCollection


def take_over(td: Any, result: Any, allow_locked: bool = False) -> Any:
    """Make ``td`` hold ``result`` (an op's result over ``td``'s structure); returns ``td``.

    A locked ``td`` is refused (``RuntimeError``, before anything changes) unless ``allow_locked`` (an op that
    changes neither keys nor batch size).
    """
    if not allow_locked:
        td._check_unlocked()
    _take_over(td, unwrap(result))
    return td


def _take_over(td: Any, result: Any) -> None:
    storage = td._tensordict
    new = result._tensordict
    for key, value in new.items():
        current = storage.get(key)
        if isinstance(current, TensorCollection) and isinstance(value, TensorCollection) and \
                type(current) is type(value):
            _take_over(unwrap(current), unwrap(value))
            new[key] = current  # keeps the nested collection's identity
    storage.clear()
    storage.update(new)
    td._batch_size = result._batch_size
    td._batch_len = -1
    td._names = result._names
