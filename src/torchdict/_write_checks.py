"""Checks of an in-place copy made before the first write, so that a refused call writes nothing.

``existing.copy_(value)`` and ``existing[index] = value`` check their arguments only when they run;
a call writing many leaves checks them all with these first, then writes (``set_``, ``update_``,
``update(inplace=True)``, ``apply_``, ``td[index] = value``).
"""
from __future__ import annotations

from typing import Any

import torch

from ._errors import entry_shape_error

_is_grad_enabled = torch.is_grad_enabled


def broadcasts_into(shape: torch.Size, target: torch.Size) -> bool:
    """Whether ``copy_`` takes a value of ``shape`` into a tensor of shape ``target`` (torch's broadcasting)."""
    if len(shape) > len(target):
        return False
    for size, target_size in zip(reversed(shape), reversed(target)):
        if size != target_size and size != 1:
            return False
    return True


def check_copy(key: Any, td: Any, existing: torch.Tensor, value: torch.Tensor) -> None:
    """Raise, before anything is written, what ``existing.copy_(value)`` would raise: a shape that doesn't
    broadcast (``InplaceWriteError`` naming the key and both shapes, as upstream), or a leaf that requires grad."""
    if value.shape != existing.shape and not broadcasts_into(value.shape, existing.shape):
        raise entry_shape_error(key, td, value.shape, existing.shape)
    if existing.requires_grad:
        check_grad_writable(existing)


def check_grad_writable(existing: torch.Tensor) -> None:
    """Torch refuses an in-place write into a leaf that requires grad (or a view of one) while grad mode is
    on; refuse it before the first write of the call rather than half-way (torch's own message)."""
    if not _is_grad_enabled():
        return
    if existing.is_leaf:
        raise RuntimeError("a leaf Variable that requires grad is being used in an in-place operation.")
    base = existing._base
    if base is not None and base.is_leaf and base.requires_grad:
        raise RuntimeError("a view of a leaf Variable that requires grad is being used in an in-place operation.")
