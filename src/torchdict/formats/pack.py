"""``td.pack()`` / :class:`PackLayout`: all the leaves of a collection as one tensor of features, and back.

Packing flattens every leaf after the batch dims and concatenates them (in sorted key order, or in the
order of a given layout) along one new dim: a feature matrix for a model, one buffer to send or store. The
layout records what ``unpack`` needs to rebuild the collection as views of that tensor: keys, feature shapes,
the nested collections and their classes.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

__all__ = ["PackLayout", "pack"]


@dataclasses.dataclass(frozen=True)
class PackLayout:
    """Where each leaf of a packed collection lies in the packed tensor (see ``TensorDict.pack``).

    Frozen and compared by value, so it can be cached, used as a dict key, or treated as a constant by
    ``torch.compile``. ``keys`` are the leaf keys in column order, ``shapes`` their feature shapes (after the
    batch dims), ``dim`` the packed dim (negative: counted from the end), ``nested`` one
    ``(key, batch_shape, cls)`` per nested collection (``cls`` is its tensorclass, or None), ``device`` and
    ``cls`` those of the packed collection; ``offsets`` (first column of each leaf) and ``numel`` (number of
    columns) are derived.

    >>> import torch
    >>> from torchdict import TensorDict
    >>> td = TensorDict(p=torch.zeros(5), v=torch.ones(5, 3), batch_size=[5])
    >>> flat, layout = td.pack()
    >>> layout.offsets, layout.numel, layout.unpack(flat[:2])["v"].shape
    ((0, 1), 4, torch.Size([2, 3]))
    """

    keys: tuple
    shapes: tuple
    dim: int = -1
    nested: tuple = ()
    device: Any = None
    cls: Any = None
    offsets: tuple = dataclasses.field(init=False)
    numel: int = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        shapes = tuple(torch.Size(shape) for shape in self.shapes)
        nested = tuple((key, torch.Size(batch), cls) for key, batch, cls in self.nested)
        offsets = []
        total = 0
        for shape in shapes:
            offsets.append(total)
            total += math.prod(shape)
        for name, value in (("shapes", shapes), ("nested", nested), ("offsets", tuple(offsets)), ("numel", total)):
            object.__setattr__(self, name, value)

    def unpack(self, flat: torch.Tensor) -> Any:
        """The collection packed into ``flat``; its leaves are views of ``flat``.

        The batch size is ``flat``'s shape without the packed dim, so ``flat`` may have been indexed or
        reshaped along the other dims since it was packed.
        """
        from ..tensordict import TensorDict

        ndim = flat.dim()
        dim = self.dim + ndim if self.dim < 0 else self.dim
        if not 0 <= dim < ndim:
            raise IndexError(f"dim {self.dim} is out of range for a tensor with {ndim} dimensions.")
        if flat.shape[dim] != self.numel:
            raise ValueError(f"Expected {self.numel} entries along dim {self.dim} of the packed tensor, got "
                             f"{flat.shape[dim]}.")
        flat = flat.movedim(dim, -1)
        batch = flat.shape[:-1]
        device = flat.device if self.device is not None else None
        out = TensorDict(batch_size=batch, device=device)
        for key, nested_batch, _ in self.nested:
            out.set(key, TensorDict(batch_size=batch + nested_batch, device=device))
        for key, shape, start in zip(self.keys, self.shapes, self.offsets):
            columns = flat.narrow(-1, start, math.prod(shape))
            out.set(key, columns.unflatten(-1, shape) if len(shape) else columns.squeeze(-1))
        for key, _, cls in reversed(self.nested):  # the deepest first: parents are rebuilt around them
            if cls is not None:
                out.set(key, cls.from_tensordict(out.get(key)))
        return out if self.cls is None else self.cls.from_tensordict(out)


def _has_exclusive_keys(collection: Any) -> bool:
    from .._loading import _as_td

    td = _as_td(collection)
    members = getattr(td, "tensordicts", None)
    if members is None:
        return False
    first = set(members[0].keys(True, True)) if members else set()
    return any(set(member.keys(True, True)) != first for member in members[1:])


def pack(collection: Any, dim: int = -1, *, layout: PackLayout | None = None) -> tuple:
    """``collection.pack(dim, layout=layout)``: (the packed tensor, its :class:`PackLayout`)."""
    from .._base import is_tensor_collection
    from ..nontensor import NonTensorData, NonTensorStack
    from ..tensorclass import is_tensorclass

    batch = collection.batch_size
    batch_dims = len(batch)
    if not -batch_dims - 1 <= dim <= batch_dims:
        raise IndexError(f"dim {dim} is out of range for packing a tensordict with {batch_dims} batch dimensions.")
    position = dim + batch_dims + 1 if dim < 0 else dim
    if _has_exclusive_keys(collection):
        raise RuntimeError("Cannot pack a lazy stack whose members have different keys.")
    leaves: dict = {}
    nested: list = []
    non_tensor = (NonTensorData, NonTensorStack)
    for key, value in collection.items(True, False, is_leaf=lambda kind: issubclass(kind, non_tensor), sort=True):
        if isinstance(value, non_tensor):
            raise TypeError(f"Cannot pack the non-tensor entry {key!r}. Drop the non-tensor entries with "
                            "filter_non_tensor_data() first.")
        if is_tensor_collection(value):
            if _has_exclusive_keys(value):
                raise RuntimeError(f"Cannot pack the lazy stack at {key!r}: its members have different keys.")
            nested.append((key, value.batch_size[batch_dims:], type(value) if is_tensorclass(value) else None))
        else:
            leaves[key] = value
    if layout is not None:
        layout_position = layout.dim + batch_dims + 1 if layout.dim < 0 else layout.dim
        if layout_position != position:
            raise ValueError(f"Cannot pack along dim {dim} with a layout packed along dim {layout.dim}.")
        if set(leaves) != set(layout.keys):
            raise KeyError(f"The leaves of the tensordict differ from the keys of the layout: "
                           f"{sorted(leaves, key=str)} vs {sorted(layout.keys, key=str)}.")
        leaves = {key: leaves[key] for key in layout.keys}
    shapes = tuple(value.shape[batch_dims:] for value in leaves.values())
    if layout is not None and shapes != layout.shapes:
        raise ValueError(f"The feature shapes of the leaves differ from those of the layout: {shapes} vs "
                         f"{layout.shapes}.")
    columns = []
    dtype = device = None
    for key, value in leaves.items():
        if dtype is None:
            dtype, device = value.dtype, value.device
        elif value.dtype != dtype:
            raise TypeError(f"Cannot pack leaves of different dtypes: {dtype} and {value.dtype} at {key!r}. Cast the "
                            "tensordict first, e.g. with float().")
        elif value.device != device:
            raise RuntimeError(f"Cannot pack leaves on different devices: {device} and {value.device} at {key!r}.")
        column = value.flatten(batch_dims) if value.dim() > batch_dims else value.unsqueeze(-1)
        columns.append(column if position == batch_dims else column.movedim(-1, position))
    if columns:
        flat = torch.cat(columns, position).contiguous()
    else:
        flat = torch.empty((*batch[:position], 0, *batch[position:]), device=collection.device)
    cls = type(collection) if is_tensorclass(collection) else None
    return flat, PackLayout(keys=tuple(leaves), shapes=shapes, dim=position - batch_dims - 1, nested=tuple(nested),
                            device=collection.device, cls=cls)
