"""What a TensorDict can say about itself without changing: ``depth``, ``dtype``, ``is_floating_point``,
``is_cpu`` / ``is_cuda`` / ``is_meta``, ``get_item_shape`` and ``non_tensor_items`` (``IntrospectionMixin``)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import torch

from ._apply import is_sub_collection as _is_sub_collection, tensor_leaves, unwrap
from ._keys import key_to_tuple
from .nontensor import NonTensorData, NonTensorStack

if TYPE_CHECKING:
    from ._host import TensorDictHost
else:
    TensorDictHost = object

_Tensor = torch.Tensor
_NON_TENSOR = (NonTensorData, NonTensorStack)


def _depth(storage: dict) -> Optional[int]:
    """Levels of nesting above the deepest entry that isn't a sub-TensorDict; None when ``storage``
    holds no such entry at any level (upstream counts leaves, so empty sub-TensorDicts add nothing)."""
    deepest: Optional[int] = None
    for value in storage.values():
        below = _depth(unwrap(value)._tensordict) if _is_sub_collection(value) else -1
        if below is not None:
            deepest = max(below + 1, -1 if deepest is None else deepest)
    return deepest


def _device_type_is(td: Any, device_type: str) -> bool:
    # Like upstream, a TensorDict without a device is on none (even if every leaf is on the CPU).
    device = td.device
    return device is not None and device.type == device_type


class IntrospectionMixin(TensorDictHost):
    __slots__ = ()

    @property
    def depth(self) -> int:
        """Levels of nested TensorDicts: 0 for a flat one; empty sub-TensorDicts don't count.

        >>> import torch
        >>> from torchdict import TensorDict
        >>> TensorDict(a=torch.zeros(2)).depth, TensorDict(a={"b": {"c": torch.zeros(2)}}).depth
        (0, 2)
        """
        return _depth(self._tensordict) or 0

    @property
    def dtype(self) -> Optional[torch.dtype]:
        """The dtype every tensor leaf has, or None when they differ or there is no tensor leaf.

        Non-tensor entries are not looked at.

        >>> TensorDict(a=torch.zeros(2), b={"c": torch.ones(2)}).dtype
        torch.float32
        >>> TensorDict(a=torch.zeros(2), b=torch.zeros(2, dtype=torch.int64)).dtype is None
        True
        """
        dtypes = {leaf.dtype for leaf in tensor_leaves(self)}
        return dtypes.pop() if len(dtypes) == 1 else None

    def is_floating_point(self) -> bool:
        """True when every tensor leaf (nested ones too) is floating point; True when there is none.

        >>> TensorDict(a=torch.zeros(2)).is_floating_point()
        True
        """
        return all(leaf.is_floating_point() for leaf in tensor_leaves(self))

    @property
    def is_cpu(self) -> bool:
        """True when the TensorDict's device is a CPU (False when it has no device)."""
        return _device_type_is(self, "cpu")

    @property
    def is_cuda(self) -> bool:
        """True when the TensorDict's device is a CUDA device (False when it has no device)."""
        return _device_type_is(self, "cuda")

    @property
    def is_meta(self) -> bool:
        """True when the TensorDict's device is the meta device (False when it has no device)."""
        return _device_type_is(self, "meta")

    def get_item_shape(self, key: Any) -> torch.Size:
        """The shape of the entry at ``key``: a tensor's shape, else (sub-TensorDicts, non-tensor
        data) its batch size. A missing key raises ``KeyError``.

        >>> TensorDict(a=torch.zeros(3, 4), b={}, batch_size=[3]).get_item_shape("b")
        torch.Size([3])
        """
        entry = self._get_path(key_to_tuple(key))
        return entry.shape if isinstance(entry, _Tensor) else entry.batch_size

    def non_tensor_items(self, include_nested: bool = False) -> tuple:
        """``(key, NonTensorData or NonTensorStack)`` pairs, top level only unless ``include_nested``.

        >>> TensorDict(a=torch.zeros(2), s="text").non_tensor_items()[0][0]
        's'
        """
        return tuple((key, value) for key, value in self.items(include_nested=include_nested)
                     if isinstance(value, _NON_TENSOR))
