"""Exception types and the wording of recurring errors.

Upstream tensordict's exception types and message fragments are kept so that
code catching them keeps working; the wording lives here once.
"""
from __future__ import annotations

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


def inplace_error(key: object, td: object) -> InplaceWriteError:
    return InplaceWriteError(f"Failed to update {key!r} in tensordict {td}")
