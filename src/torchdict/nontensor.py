"""Non-tensor leaves: Python values carried along the batch dimensions.

``NonTensorData`` holds one value shared by every element of its batch.
``NonTensorStack`` holds one value per element (the result of stacking or
concatenating non-tensor leaves, or of writing different values at
different indices). Batch operations are applied to an *index grid*
(``arange(numel).view(batch_size)``), so any op that works on a tensor of
the batch shape (indexing, permute, reshape, stack, ...) works here too,
with no per-op code.

A stack also remembers, per element, which written value it came from (its
*origin*: one token per ``NonTensorData`` stacked, concatenated or written at an
index). A batch op whose elements all come from one such value gives that value
back as a ``NonTensorData``: ``torch.stack(tds)[i]["s"]`` is ``tds[i]["s"]``, not
a list repeating it.
"""
from __future__ import annotations

from itertools import count
from typing import Any, Callable, List, Optional, Sequence

import torch

__all__ = ["NonTensorData", "NonTensorStack", "is_non_tensor"]

# Origin tokens: a fresh one for each value written as a whole (next() on a count is atomic),
# with the number of batch dims that value spans: a selection of elements that all come from one
# value reads back as that value only when it has no more dims than the value had (as upstream,
# where a slice of a stack stays a stack, ``stack[0:1]`` a one-row list).
_next_token = count().__next__


def _new_origin(ndim: int) -> tuple:
    return (_next_token(), ndim)


def _shape_probe(batch_size: torch.Size) -> torch.Tensor:
    # A zero-stride tensor of the batch shape: costs no memory whatever the batch.
    return torch.zeros((), dtype=torch.uint8).expand(batch_size)


def _nest(values: Sequence[Any], shape: Sequence[int]) -> Any:
    if len(shape) == 0:
        return values[0]
    if len(shape) == 1:
        return list(values)
    step = len(values) // shape[0] if shape[0] else 0
    return [_nest(values[i * step:(i + 1) * step], shape[1:]) for i in range(shape[0])]


class NonTensorData:
    """A Python value stored in a TensorDict, shared across its batch.

    >>> from torchdict import TensorDict
    >>> td = TensorDict(batch_size=[2])
    >>> td["name"] = "hello"
    >>> td["name"], td[0]["name"]
    ('hello', 'hello')
    """

    __slots__ = ("data", "batch_size", "device")

    def __init__(self, data: Any, batch_size: Sequence[int] = (), device: Any = None) -> None:
        self.data = data
        self.batch_size = torch.Size(batch_size)
        self.device = None if device is None else torch.device(device)

    @property
    def shape(self) -> torch.Size:
        return self.batch_size

    def tolist(self) -> Any:
        numel = self.batch_size.numel()
        return _nest([self.data] * numel, self.batch_size)

    def _batch_op(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "NonTensorData":
        return NonTensorData(self.data, fn(_shape_probe(self.batch_size)).shape, self.device)

    def _with_batch_size(self, batch_size: torch.Size) -> "NonTensorData":
        return NonTensorData(self.data, batch_size, self.device)

    def _to_device(self, device: Any) -> "NonTensorData":
        return NonTensorData(self.data, self.batch_size, device)

    def _flat_values(self) -> List[Any]:
        return [self.data] * self.batch_size.numel()

    def _flat_origins(self) -> List[Any]:
        return [_new_origin(len(self.batch_size))] * self.batch_size.numel()

    def clone(self) -> "NonTensorData":
        return NonTensorData(self.data, self.batch_size, self.device)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, NonTensorData):
            return self.data == other.data and self.batch_size == other.batch_size
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"NonTensorData(data={self.data}, batch_size={self.batch_size}, device={self.device})"


class NonTensorStack:
    """One Python value per batch element.

    ``data`` (and ``tolist()``) give the values as nested lists of the batch shape.

    >>> import torch
    >>> from torchdict import TensorDict
    >>> td = torch.stack([TensorDict(s="a"), TensorDict(s="b")])
    >>> td["s"]
    ['a', 'b']
    """

    __slots__ = ("_values", "_origins", "batch_size", "device")

    def __init__(self, values: Sequence[Any], batch_size: Sequence[int], device: Any = None,
                 origins: Optional[Sequence[Any]] = None) -> None:
        batch_size = torch.Size(batch_size)
        if len(values) != batch_size.numel():
            raise ValueError(
                f"NonTensorStack got {len(values)} values for a batch of {batch_size.numel()} elements."
            )
        self._values = list(values)
        # One origin token per value (None: a value of its own), or None when no value has one.
        self._origins = None if origins is None or not any(o is not None for o in origins) else list(origins)
        self.batch_size = batch_size
        self.device = None if device is None else torch.device(device)

    @classmethod
    def from_nested_list(cls, values: list, batch_size: Sequence[int] | None = None) -> "NonTensorStack":
        shape: list = []
        probe: Any = values
        while isinstance(probe, list) and (batch_size is None or len(shape) < len(batch_size)):
            shape.append(len(probe))
            if not probe:
                break
            probe = probe[0]
        flat: list = []

        def walk(item: Any, depth: int) -> None:
            if depth == len(shape):
                flat.append(item)
                return
            if not isinstance(item, list) or len(item) != shape[depth]:
                raise ValueError("A list of non-tensor values must be rectangular to be stacked.")
            for sub in item:
                walk(sub, depth + 1)

        walk(values, 0)
        return cls(flat, shape)

    @property
    def shape(self) -> torch.Size:
        return self.batch_size

    @property
    def data(self) -> Any:
        return self.tolist()

    def tolist(self) -> Any:
        return _nest(self._values, self.batch_size)

    def _flat_values(self) -> List[Any]:
        return list(self._values)

    def _flat_origins(self) -> List[Any]:
        return [None] * len(self._values) if self._origins is None else list(self._origins)

    def _index_grid(self) -> torch.Tensor:
        return torch.arange(len(self._values)).view(self.batch_size)

    def _batch_op(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "NonTensorData | NonTensorStack":
        grid = fn(self._index_grid())
        return _from_grid(grid, self._values, self._origins, self.device)

    def _with_batch_size(self, batch_size: torch.Size) -> "NonTensorStack":
        return NonTensorStack(self._values, batch_size, self.device, self._origins)

    def _to_device(self, device: Any) -> "NonTensorStack":
        return NonTensorStack(self._values, self.batch_size, device, self._origins)

    def _set_at(self, index: Any, value: Any) -> None:
        """Write ``value`` at ``index`` in place; a value written as a whole gets a fresh origin."""
        positions = self._index_grid()[index].reshape(-1).tolist()
        if isinstance(value, (NonTensorData, NonTensorStack)):
            new_values, new_origins = value._flat_values(), value._flat_origins()
            if len(new_values) == 1:  # one value written over the whole selection
                new_values, new_origins = new_values * len(positions), [_new_origin(len(self.batch_size))] * len(positions)
        else:
            new_values, new_origins = [value] * len(positions), [_new_origin(len(self.batch_size))] * len(positions)
        if len(new_values) != len(positions):
            raise RuntimeError(
                f"Cannot write {len(new_values)} non-tensor values into {len(positions)} positions."
            )
        origins = self._flat_origins()
        for position, item, origin in zip(positions, new_values, new_origins):
            self._values[position] = item
            origins[position] = origin
        self._origins = origins

    def _as_one_value(self) -> "Optional[NonTensorData]":
        """This stack as a NonTensorData when every element comes from one written value, else None."""
        return _one_value(self._values, self._origins, self.batch_size, self.device)

    def clone(self) -> "NonTensorStack":
        return NonTensorStack(self._values, self.batch_size, self.device, self._origins)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, NonTensorStack):
            return self._values == other._values and self.batch_size == other.batch_size
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"NonTensorStack({self.tolist()!r}, batch_size={self.batch_size}, device={self.device})"


def _one_value(values: list, origins: Optional[list], batch_size: torch.Size,
               device: Any) -> Optional[NonTensorData]:
    if not values or origins is None:
        return None
    first = origins[0]
    if first is None or first[1] < len(batch_size) or origins.count(first) != len(origins):
        return None
    return NonTensorData(values[0], batch_size, device)


def _from_grid(grid: torch.Tensor, values: Sequence[Any], origins: Optional[Sequence[Any]],
               device: Any) -> "NonTensorData | NonTensorStack":
    """The elements of ``values`` that ``grid`` (a batch op's result on the index grid) picks."""
    flat = grid.reshape(-1).tolist()
    picked = [values[i] for i in flat]
    if grid.dim() == 0:
        return NonTensorData(picked[0], (), device)
    picked_origins = None if origins is None else [origins[i] for i in flat]
    one = _one_value(picked, picked_origins, grid.shape, device)
    return one if one is not None else NonTensorStack(picked, grid.shape, device, picked_origins)


def is_non_tensor(leaf: object) -> bool:
    return type(leaf) in (NonTensorData, NonTensorStack)


def combine_non_tensor(
    leaves: Sequence["NonTensorData | NonTensorStack"],
    combine: Callable[[List[torch.Tensor]], torch.Tensor],
) -> "NonTensorData | NonTensorStack":
    """Stack or concatenate non-tensor leaves with the same ``combine`` torch uses for tensors.

    ``combine`` receives one index grid per leaf (offset so the grids are disjoint)
    and returns the combined grid, e.g. ``lambda grids: torch.stack(grids, dim)``.
    Each ``NonTensorData`` is a value of its own (an origin), so indexing the result
    back to one of them gives that value.
    """
    values: list = []
    origins: list = []
    grids = []
    for leaf in leaves:
        flat = leaf._flat_values()
        grids.append(torch.arange(len(values), len(values) + len(flat)).view(leaf.batch_size))
        values.extend(flat)
        origins.extend(leaf._flat_origins())
    grid = combine(grids)
    device = leaves[0].device if leaves else None
    if leaves and grid.dim() == len(leaves[0].batch_size) and len(set(origins)) > 1:
        # A cat of different values: one flat list whose slices stay lists (as upstream, which
        # keeps its elements' values only along a stack dim).
        origins = None
    return _from_grid(grid, values, origins, device)
