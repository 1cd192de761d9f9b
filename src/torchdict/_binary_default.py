"""``default=`` of the binary ops (``add``, ``mul``, ``maximum``, ...) with a TensorDict operand whose keys differ.

- ``default=None`` (the ops' own path): both must hold the same keys (``KeyError`` otherwise);
- ``default="intersection"``: the op on the tensor leaves both hold; the others are dropped;
- ``default=<tensor>``: the tensor stands in for the entry a side lacks (broadcast as torch does), and the
  result holds the tensor leaves of both.

As upstream, the result keeps the first operand's non-tensor entries, batch size and device, and is locked
when the first operand is; an intersection with no common tensor leaf is refused (``RuntimeError``).
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from ._apply import unwrap


def _tensor_leaves(td: Any) -> dict:
    return {key: leaf for key, leaf in td.items(include_nested=True, leaves_only=True)
            if isinstance(leaf, torch.Tensor)}


def _stops_at_non_tensor(cls: type) -> bool:
    return not hasattr(cls, "_tensordict") or bool(getattr(cls, "_is_non_tensor", False))


def binary_with_default(td: Any, other: Any, function: Callable, kwargs: dict, default: Any) -> Any:
    """``function(leaf, other_leaf, **kwargs)`` key by key, with ``default`` for the missing side."""
    mine = _tensor_leaves(td)
    theirs = _tensor_leaves(unwrap(other))
    if mine and not theirs:
        raise RuntimeError("default=...: the other tensordict holds no tensor entry to pair with.")
    if isinstance(default, str):
        if default != "intersection":
            raise TypeError(f"default must be 'intersection', a tensor or None, got {default!r}.")
        keys = [key for key in mine if key in theirs]
        if mine and not keys:
            raise RuntimeError("default='intersection': the two tensordicts have no tensor entry in common.")
    else:
        keys = list(mine) + [key for key in theirs if key not in mine]
    results = {key: function(mine.get(key, default), theirs.get(key, default), **kwargs) for key in keys}
    result = td._new_unsafe({}, td._batch_size, td._device)
    for key, value in td.items(include_nested=True, leaves_only=True, is_leaf=_stops_at_non_tensor):
        if key in results:
            result.set(key, results.pop(key))
        elif not isinstance(value, torch.Tensor):
            result.set(key, value)  # non-tensor data, kept where it was
    for key, value in results.items():
        result.set(key, value)
    if td._is_locked:
        result._lock_tree()
    return result
