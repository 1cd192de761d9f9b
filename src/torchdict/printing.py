"""The repr of a TensorDict: the seed's multi-line form (GETTING_STARTED.md) by default,

::

    TensorDict(
        fields={
            a: Tensor(shape=torch.Size([]), device=cpu, dtype=torch.int64, is_shared=False)},
        batch_size=torch.Size([]),
        device=None,
        is_shared=False)

shaped by ``set_printoptions`` (``_options.PRINT_OPTIONS``): which attributes each entry and the header show,
the order of the fields, a value summary (``plain``), or upstream's one-line compact form (``compact=True``,
built in ``_compact_repr``). Nested collections are indented by four spaces per level.
"""
from __future__ import annotations

from typing import Any

import torch

from ._base import TensorCollection
from ._options import PRINT_OPTIONS
from .nontensor import NonTensorData, NonTensorStack

_INDENT = "    "


def format_tensor(tensor: torch.Tensor) -> str:
    name = "Tensor" if type(tensor) is torch.Tensor else type(tensor).__name__
    return f"{name}({', '.join(tensor_parts(tensor))})"


def tensor_parts(tensor: torch.Tensor) -> list:
    """The ``name=value`` parts of one tensor's entry, as the print options choose them."""
    options = PRINT_OPTIONS
    parts = []
    if options["show_shape"]:
        parts.append(f"shape={tensor.shape}")
    if options["show_field_device"]:
        parts.append(f"device={tensor.device}")
    if options["show_dtype"]:
        parts.append(f"dtype={tensor.dtype}")
    if options["show_field_is_shared"]:
        parts.append(f"is_shared={_is_shared(tensor)}")
    if options["show_grad"]:
        parts.append(f"requires_grad={tensor.requires_grad}")
    if options["show_is_contiguous"]:
        parts.append(f"is_contiguous={tensor.is_contiguous()}")
    if options["show_is_view"]:
        parts.append(f"is_view={tensor._base is not None}")
    if options["show_storage_size"]:
        parts.append(f"storage_size={tensor.untyped_storage().nbytes()}")
    if options["plain"]:
        parts.append(_value_summary(tensor))
    return parts


def _value_summary(tensor: torch.Tensor) -> str:
    """``plain=True``: mean and std of floating / complex values, min and max of the others."""
    tensor = tensor.detach()
    if tensor.numel() == 0:
        return "[]"
    if tensor.is_floating_point() or tensor.is_complex():
        wide = tensor.to(torch.complex128 if tensor.is_complex() else torch.float64)
        std = wide.std().item() if wide.numel() > 1 else float("nan")  # std of one value warns in torch
        return f"mean={wide.mean().item():.4g}, std={std:.4g}"
    return f"min={tensor.min().item()}, max={tensor.max().item()}"


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


def sort_entries(lines: list) -> list:
    """The ``key: ...`` lines in the order ``sort_keys`` asks for (alphabetical, insertion, or a key function)."""
    order = PRINT_OPTIONS["sort_keys"]
    if order == "alphabetical":
        return sorted(lines)
    if callable(order):
        return sorted(lines, key=order)
    return lines


def format_fields(entries: dict) -> list:
    """``key: <leaf>`` lines, sorted as the print options say (nested reprs already multi-line)."""
    return sort_entries([f"{key}: {format_leaf(entries[key])}" for key in entries])


def td_is_shared(td: Any) -> bool:
    for leaf in td.values(True, True):
        return _is_shared(leaf)
    return False


def header_lines(td: Any) -> list:
    """The ``batch_size=`` / ``device=`` / ``is_shared=`` lines the print options keep."""
    options = PRINT_OPTIONS
    lines = []
    if options["show_batch_size"]:
        lines.append(f"batch_size={td.batch_size}")
    if options["show_device"]:
        lines.append(f"device={td.device}")
    if options["show_is_shared"]:
        lines.append(f"is_shared={td_is_shared(td)}")
    return lines


def format_tensordict(td: Any, class_name: str | None = None) -> str:
    if PRINT_OPTIONS["compact"]:
        from ._compact_repr import compact_repr

        return compact_repr(td, class_name)
    fields = format_fields(td._tensordict)
    if fields:
        body = indent(",\n".join(fields))
        fields_text = f"fields={{\n{body}}}"
    else:
        fields_text = "fields={\n}"
    name = class_name or type(td).__name__
    lines = [fields_text] + header_lines(td)
    return f"{name}(\n" + indent(",\n".join(lines)) + ")"
