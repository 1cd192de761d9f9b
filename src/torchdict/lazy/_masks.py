"""Indexing a lazy stack with a boolean mask that spans the stack dim and other batch dims.

The members can't be indexed by such a mask one by one (it mixes them), so, as upstream
tensordict 0.15.3 does, the result is a lazy stack of the selected *elements*: one member slice
per true entry of the mask, in row-major order, stacked along the dim where the mask's
dims were. This is what ``masked_select`` of a lazy stack builds on.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import torch

if TYPE_CHECKING:
    from ._host import LazyHost
else:
    LazyHost = object

_Tensor = torch.Tensor


def _spanning_mask_position(items: list) -> Optional[int]:
    positions = [position for position, item in enumerate(items)
                 if isinstance(item, _Tensor) and item.dtype is torch.bool and item.dim() > 1]
    return positions[0] if len(positions) == 1 else None


def index_with_spanning_mask(td: Any, index: Any) -> Any:
    """``td[index]`` when ``index`` holds one multi-dim boolean mask covering the stack dim (the other
    items ints, slices or ``...``); None when ``index`` is not of that kind."""
    items = list(index) if isinstance(index, tuple) else [index]
    position = _spanning_mask_position(items)
    if position is None:
        return None
    others = items[:position] + items[position + 1:]
    if not all(item is Ellipsis or isinstance(item, (int, slice)) for item in others) or others.count(Ellipsis) > 1:
        return None
    mask = items[position]
    batch = td.batch_size
    if Ellipsis in items:  # the dims the other items leave out
        at = items.index(Ellipsis)
        taken = len(items) - 1 - 1 + mask.dim()
        items[at:at + 1] = [slice(None)] * (len(batch) - taken)
        position = _spanning_mask_position(items)
        assert position is not None  # the same mask, moved by the slices that replaced the ``...``
    first = position  # every item before the mask takes one dim
    if not first <= td.stack_dim < first + mask.dim():
        return None
    if tuple(mask.shape) != tuple(batch[first:first + mask.dim()]):
        raise IndexError(f"The shape of the mask {list(mask.shape)} does not match the shape of the indexed "
                         f"dims {list(batch[first:first + mask.dim()])}.")
    out_dim = sum(isinstance(item, slice) for item in items[:position])
    before, after = tuple(items[:position]), tuple(items[position + 1:])
    elements = [td[before + tuple(coordinates) + after] for coordinates in mask.nonzero().tolist()]
    if not elements:
        raise IndexError("The mask selects no element; a LazyStackedTensorDict needs one.")
    return td._restack(elements, out_dim)


class LazyMaskMixin(LazyHost):
    """``masked_select`` of a lazy stack; the class using it provides ``keys``, ``get``, ``device`` and
    indexing."""

    __slots__ = ()

    def masked_select(self, mask: _Tensor, *, inplace: bool = False) -> Any:
        """A TensorDict of the entries at the true positions of ``mask`` (of the batch shape, or of its
        leading dims): tensors stacked then masked, sub-TensorDicts as lazy stacks of the selected
        elements (as upstream). ``inplace=True`` is refused (``NotImplementedError``, as upstream)."""
        from ..tensordict import TensorDict
        from ._shape import _refuse_inplace

        _refuse_inplace("masked_select", inplace)

        # As upstream: every stacked entry indexed by the mask (a ragged entry raises when stacked).
        entries = {key: self.get(key)[mask] for key in self.keys()}
        batch = torch.Size((int(mask.sum()), *self.batch_size[mask.dim():]))
        return TensorDict(entries, batch_size=batch, device=self.device)
