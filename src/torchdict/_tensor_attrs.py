"""``TensorAttrs`` (the device, dtype and shape of one tensor, as a tensorclass) and ``attrs()``, which
describes every tensor leaf of a TensorDict with one."""
from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

from .tensorclass import TensorClass

__all__ = ["TensorAttrs", "attrs"]


class TensorAttrs(TensorClass):
    """The device, dtype and shape of one tensor (``tgt_``-prefixed so they don't hide the tensorclass's own
    ``device`` / ``dtype`` / ``shape``).

    >>> attrs = TensorAttrs.from_tensor(torch.zeros(2, 3), fields=("dtype",))
    >>> attrs.tgt_dtype, attrs.tgt_shape
    (torch.float32, None)
    """

    tgt_device: Any = None
    tgt_dtype: Any = None
    tgt_shape: Any = None

    @classmethod
    def from_tensor(cls, tensor: torch.Tensor, *, fields: Sequence[str] = ("device", "dtype", "shape")) -> "TensorAttrs":
        """The attributes of ``tensor`` named in ``fields`` (the others ``None``)."""
        values: dict = {}
        if "device" in fields:
            values["tgt_device"] = tensor.device
        if "dtype" in fields:
            values["tgt_dtype"] = tensor.dtype
        if "shape" in fields:
            values["tgt_shape"] = torch.Size(tensor.shape)
        return cls(batch_size=(), **values)


def attrs(td: Any, fields: Sequence[str], num_threads: Optional[int]) -> Any:
    """A TensorDict (no batch dims, no device) with a ``TensorAttrs`` per tensor leaf of ``td``, at its key;
    non-tensor entries are kept as they are."""
    from .tensordict import TensorDict

    source: dict = {}
    for key, value in td.items(include_nested=True, leaves_only=True, is_leaf=_leaf_or_non_tensor):
        path = key if isinstance(key, tuple) else (key,)
        level = source
        for part in path[:-1]:
            level = level.setdefault(part, {})
        level[path[-1]] = TensorAttrs.from_tensor(value, fields=fields) if isinstance(value, torch.Tensor) else value
    return TensorDict(source, batch_size=())


def _leaf_or_non_tensor(cls: type) -> bool:
    return issubclass(cls, torch.Tensor) or bool(getattr(cls, "_is_non_tensor", False))
