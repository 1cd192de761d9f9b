"""Exception types and the wording of recurring errors.

Upstream tensordict's exception types and message fragments are kept so that
code catching them keeps working; the wording lives here once.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

LOCKED_MESSAGE = (
    "Cannot modify locked TensorDict. For in-place modification, consider using the "
    "`set_()` method and make sure the key is present."
)

SCALAR_HINT = (
    " Python scalars are stored as 0-dim tensors: to store a scalar in a tensordict with a "
    "non-empty batch size, expand it to the batch size or wrap it in NonTensorData (in a "
    "tensorclass, the nocast option stores scalars as they are)."
)


class MessageKeyError(KeyError):
    """A KeyError whose message reads as a sentence (plain KeyError shows its argument's repr)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class KeyThroughLeafError(ValueError):
    """A nested key tried to walk through a leaf that is not a TensorDict."""


class InplaceWriteError(ValueError, RuntimeError):
    """An in-place write could not be carried out."""


# Upstream's names, for code that catches them by name.
_KeyThroughLeafError = KeyThroughLeafError
_InplaceWriteError = InplaceWriteError


def locked_error() -> RuntimeError:
    return RuntimeError(LOCKED_MESSAGE)


def format_key(key: object) -> str:
    return repr(key)


def batch_mismatch_error(batch_size: torch.Size, shape: torch.Size, key: object) -> RuntimeError:
    message = (
        f"batch dimension mismatch, got self.batch_size={batch_size} and value.shape={shape} "
        f"for key {format_key(key)}. The leading dimensions of a value must match the batch size."
    )
    if len(shape) == 0 and len(batch_size) > 0:
        message += SCALAR_HINT
    return RuntimeError(message)


def incompatible_batch_error(name: object, shape: torch.Size, batch_size: torch.Size) -> RuntimeError:
    return RuntimeError(
        f"the Tensor {name} has shape {shape} which is incompatible with the batch-size {batch_size}."
    )


def missing_key_error(key: object, keys) -> KeyError:
    shown = sorted(keys, key=str)
    return MessageKeyError(f'key "{key}" not found in TensorDict with keys {shown}')


def through_leaf_error(leaf_key: str, leaf: object, next_key: str) -> KeyThroughLeafError:
    kind = type(leaf).__name__
    if isinstance(leaf, torch.Tensor):
        kind = "Tensor"
    return KeyThroughLeafError(
        f"{leaf_key!r} is a {kind}, not a tensordict, so it has no entry {next_key!r}."
    )


def inplace_error(key: object, td: object, cause: Optional[object] = None) -> InplaceWriteError:
    reason = f": {cause}" if cause is not None else ""
    if type(key) is tuple and len(key) == 1:
        key = key[0]
    return InplaceWriteError(f"Failed to update {key!r} in tensordict {_summary(td)}{reason}")


def _summary(td: Any) -> str:
    """A one-line description of a TensorDict for an error message (the full repr spans many lines and would
    bury the reason that follows it)."""
    try:
        keys = sorted(map(str, td.keys()))
        return f"{type(td).__name__}(batch_size={list(td.batch_size)}, keys={keys})"
    except Exception:  # an error message must not fail on an unusual object
        return f"{type(td).__name__}"


def entry_shape_error(key: object, td: object, shape: torch.Size, entry_shape: torch.Size) -> InplaceWriteError:
    """An in-place write whose value doesn't broadcast to the entry (``set_``, ``apply_``): upstream's type and
    wording, naming the key and both shapes (torch's own message names neither the key nor the entry)."""
    return inplace_error(key, td, f"the value of shape {shape} does not fit the entry of shape {entry_shape}")


def slot_shape_error(key: object, shape: torch.Size, slot_shape: torch.Size, entry_shape: torch.Size) -> RuntimeError:
    """``td[index] = value`` with a leaf that doesn't fit its slot (upstream raises torch's ``expand`` error, a
    RuntimeError, which names no key)."""
    if type(key) is tuple and len(key) == 1:
        key = key[0]
    return RuntimeError(f"td[index] = value: the value at key {key!r} has shape {shape}, which does not fit the "
                        f"indexed slot of shape {slot_shape} (the entry has shape {entry_shape}).")


class NotAMappingError(TypeError, AttributeError):
    """``update(5)``: the source is not a mapping. A TypeError, and an AttributeError too, since upstream
    raises ``AttributeError: 'int' object has no attribute 'items'`` and code may catch that."""


def not_a_mapping_error(method: str, value: object) -> NotAMappingError:
    return NotAMappingError(f"{method}() expects a mapping (a dict or a TensorDict) of entries, got an object of "
                            f"type {type(value).__name__}.")


class SavedShapeError(ValueError, RuntimeError):
    """A ``meta.json`` shape too large for any tensor. A ValueError as every invalid ``meta.json``, and a
    RuntimeError, the type upstream's loader gives for it (torch's size-overflow error)."""


def _format_key_set(keys: set) -> str:
    if not keys:
        return "set()"
    ordered = sorted(keys, key=lambda key: (key,) if isinstance(key, str) else tuple(key))
    return "{" + ", ".join(repr(key) for key in ordered) + "}"


def keys_mismatch_error(only_first: set, only_second: set) -> KeyError:
    """Two TensorDicts combined leaf by leaf (``td + other``) hold different keys."""
    message = "keys in tensordicts mismatch."
    if only_first:
        message += f" The first TD has keys {_format_key_set(only_first)} that the second does not have."
    if only_second:
        message += f" The second TD has keys {_format_key_set(only_second)} that the first does not have."
    return MessageKeyError(message)


class BatchDimError(IndexError, RuntimeError):
    """A dim that is not a batch dim (upstream raises IndexError from reductions, RuntimeError from all/any)."""


def batch_dim_error(dim: object, batch_dims: int) -> BatchDimError:
    return BatchDimError(f"Incompatible dim {dim} for tensordict with batch dims {batch_dims}.")
