"""The multi-line repr of the seed (GETTING_STARTED.md).

::

    TensorDict(
        fields={
            a: Tensor(shape=torch.Size([]), device=cpu, dtype=torch.int64, is_shared=False)},
        batch_size=torch.Size([]),
        device=None,
        is_shared=False)

Fields are sorted by key; nested collections are indented by four spaces per level.
"""
from __future__ import annotations

from typing import Any

import torch

from ._base import TensorCollection
from .nontensor import NonTensorData, NonTensorStack

_INDENT = "    "


def format_tensor(tensor: torch.Tensor) -> str:
    name = "Tensor" if type(tensor) is torch.Tensor else type(tensor).__name__
    return (f"{name}(shape={tensor.shape}, device={tensor.device}, dtype={tensor.dtype}, "
            f"is_shared={_is_shared(tensor)})")


def _is_shared(tensor: torch.Tensor) -> bool:
    try:
        return tensor.is_shared() and tensor.device.type == "cpu"
    except RuntimeError:  # e.g. tensors without storage (meta, functorch wrappers)
        return False


def format_leaf(leaf: Any) -> str:
    if isinstance(leaf, torch.Tensor):
        return format_tensor(leaf)
    if isinstance(leaf, TensorCollection):
        return repr(leaf)
    if type(leaf) is NonTensorData:
        return f"NonTensorData(data={leaf.data}, batch_size={leaf.batch_size}, device={leaf.device})"
    if type(leaf) is NonTensorStack:
        return f"NonTensorStack({leaf.tolist()!r}, batch_size={leaf.batch_size}, device={leaf.device})"
    return repr(leaf)


def indent(text: str, prefix: str = _INDENT) -> str:
    return "\n".join(prefix + line if line else line for line in text.split("\n"))


def format_fields(entries: dict) -> list:
    """``key: <leaf>`` lines, sorted by key (nested reprs already multi-line)."""
    return [f"{key}: {format_leaf(entries[key])}" for key in sorted(entries)]


def td_is_shared(td: Any) -> bool:
    for leaf in td.values(True, True):
        return _is_shared(leaf)
    return False


def format_tensordict(td: Any, class_name: str | None = None) -> str:
    fields = format_fields(td._tensordict)
    if fields:
        body = indent(",\n".join(fields), _INDENT * 2)
        fields_text = f"{_INDENT}fields={{\n{body}}},"
    else:
        fields_text = f"{_INDENT}fields={{\n{_INDENT}}},"
    name = class_name or type(td).__name__
    return (f"{name}(\n{fields_text}\n{_INDENT}batch_size={td.batch_size},\n{_INDENT}device={td.device},\n"
            f"{_INDENT}is_shared={td_is_shared(td)})")
