"""``torch.stack`` of single values (``NonTensorData`` leaves) without the general palette machinery.

Stacking N one-value leaves is the common case (a tensorclass with a string field, stacked per step). The general
path (``combine_non_tensor``) builds a grid of codes per leaf and stacks them with torch; here the result is
written down directly: element ``i`` along the new dim is value ``i``. The result is the one the general path gives
(the same flat or palette form, the same origins), at O(N) Python work plus, for big batches, one ``arange``.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

from . import _FLAT_RESULT_LIMIT, NonTensorData, NonTensorStack, _new_origin


def stack_single_values(leaves: Sequence[object], dim: int) -> Optional[NonTensorStack]:
    """The stack of ``leaves`` along ``dim`` when each is a ``NonTensorData`` of one batch size, else None."""
    if len(leaves) < 2 or any(type(leaf) is not NonTensorData for leaf in leaves):
        return None
    batch = leaves[0]._batch_size  # type: ignore[attr-defined]
    if any(leaf._batch_size != batch for leaf in leaves):  # type: ignore[attr-defined]
        return None  # the general path raises torch's error
    count = len(leaves)
    sizes = list(batch)
    sizes.insert(dim, count)
    shape = torch.Size(sizes)
    values = [leaf._data for leaf in leaves]  # type: ignore[attr-defined]
    origins = [_new_origin(len(batch)) for _ in leaves]  # each leaf is a value of its own
    device = leaves[0].device  # type: ignore[attr-defined]
    outer, inner = math.prod(batch[:dim]), math.prod(batch[dim:])
    if count * outer * inner > _FLAT_RESULT_LIMIT:
        view = [1] * len(sizes)
        view[dim] = count
        codes = torch.arange(count).view(view).expand(shape)
        return NonTensorStack._from_codes(values, origins, codes, device)
    order = [index for _ in range(outer) for index in range(count) for _ in range(inner)]
    return NonTensorStack._from_flat([values[i] for i in order], shape, device, [origins[i] for i in order])
