"""Reading and writing only the rows a batch index selects, for collections kept in a file (HDF5, zarr).

``td[index]`` on a file-backed collection must read the selected rows, not whole datasets. A
:class:`RowPlan` turns a torch batch index into what the storage library reads with the same meaning:

- *basic*: integers and positive-step slices (an Ellipsis expanded over the batch dims): handed to the
  library as they are (a hyperslab read);
- *rows*: one integer or boolean index along the first batch dim, the other batch dims sliced: the
  library reads the selected rows in increasing order, once each (h5py and zarr need that), or the
  span between the first and the last when they are dense, and torch puts them back in the asked order;
- *full*: anything else (a negative step, ``None``, several tensors, a mask over several dims): the
  leaf is read whole and indexed by torch. Correct, just not lazy.

The new batch size and torch's own errors (out of range, wrong mask shape) come from indexing a
zero-stride probe of the batch shape, so every path agrees with ``TensorDict`` indexing.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

import numpy as np
import torch

__all__ = ["RowPlan", "plan_rows"]

# A selection this dense (selected rows / span) is read as one slice: one contiguous read beats a point
# selection, which h5py performs row by row.
_DENSE_SPAN = 0.25


class RowPlan:
    """How to read (or write) ``leaf[index]`` for every leaf of a collection with one batch size."""

    __slots__ = ("source_dims", "batch_size", "index", "storage_index", "local_index", "write_order")

    def __init__(self, source_dims: int, batch_size: torch.Size, index: tuple, storage_index: Optional[tuple],
                 local_index: Optional[tuple], write_order: Optional[tuple]) -> None:
        self.source_dims = source_dims  # the batch dims of the collection indexed
        self.batch_size = batch_size  # the batch size of the result
        self.index = index  # the normalised torch index (Ellipsis expanded over the batch dims)
        self.storage_index = storage_index  # given to the library; None: read the leaf whole
        self.local_index = local_index  # applied by torch after the library's read, or None
        # for writes on the rows path: (the rows in increasing order, once each, as numpy; the position in
        # the value of each one's last occurrence, as a tensor), or None
        self.write_order = write_order

    @property
    def is_lazy(self) -> bool:
        return self.storage_index is not None

    def read(self, read_at: Callable[[Any], np.ndarray], read_all: Callable[[], np.ndarray]) -> torch.Tensor:
        """``leaf[index]`` as a tensor, through the library's ``read_at(storage_index)`` when possible."""
        if self.storage_index is None:
            return torch.as_tensor(np.asarray(read_all()))[self.index]
        out = torch.as_tensor(np.asarray(read_at(self.storage_index)))
        return out[self.local_index] if self.local_index is not None else out

    def write(self, value: torch.Tensor, leaf_shape: torch.Size, write_at: Callable[[Any, np.ndarray], None],
              read_all: Callable[[], np.ndarray], write_all: Callable[[np.ndarray], None],
              dtype: torch.dtype) -> None:
        """``leaf[index] = value`` through the library, writing only the selected rows when possible."""
        target_shape = self.batch_size + leaf_shape[self.source_dims:]
        value = value.to(dtype).expand(target_shape)
        if self.storage_index is None:
            full = torch.as_tensor(np.asarray(read_all())).clone()
            full[self.index] = value
            write_all(full.numpy())
            return
        if self.write_order is not None:
            rows, last = self.write_order
            value = value[last]
            write_at((rows,) + self.storage_index[1:], np.ascontiguousarray(value.numpy()))
            return
        write_at(self.storage_index, np.ascontiguousarray(value.numpy()))


def _consumed_dims(index: tuple) -> int:
    """How many batch dims ``index`` (normalised) reads through."""
    count = 0
    for item in index:
        if isinstance(item, torch.Tensor) and item.dtype is torch.bool:
            count += max(item.dim(), 1)
        elif item is not None:
            count += 1
    return count


def _as_index_item(item: Any) -> Any:
    """Lists, ranges and numpy arrays as tensors (torch's meaning); numpy integers as ints."""
    if isinstance(item, (list, range)):
        return torch.as_tensor(item) if len(item) else torch.zeros(0, dtype=torch.long)
    if isinstance(item, np.ndarray):
        return torch.from_numpy(item)
    if isinstance(item, torch.Tensor) and item.device.type != "cpu":
        return item.cpu()
    if isinstance(item, np.integer):
        return int(item)
    if isinstance(item, np.bool_):
        return bool(item)
    return item


def _normalise(index: Any, ndim: int) -> tuple:
    items = index if isinstance(index, tuple) else (index,)
    items = tuple(_as_index_item(item) for item in items)
    if not any(item is Ellipsis for item in items):
        return items
    position = next(i for i, item in enumerate(items) if item is Ellipsis)
    rest = items[:position] + items[position + 1:]
    fill = max(ndim - _consumed_dims(tuple(item for item in rest if item is not Ellipsis)), 0)
    return items[:position] + (slice(None),) * fill + items[position + 1:]


def _is_int(item: Any) -> bool:
    return isinstance(item, int) and not isinstance(item, bool)


def _basic_storage_index(index: tuple, batch_size: torch.Size) -> Optional[tuple]:
    """The library index for integers and positive-step slices, or None."""
    out = []
    for dim, item in enumerate(index):
        if _is_int(item):
            out.append(item + batch_size[dim] if item < 0 else item)
        elif isinstance(item, slice):
            if item.step is not None and (not _is_int(item.step) or item.step <= 0):
                return None
            if not all(bound is None or _is_int(bound) for bound in (item.start, item.stop)):
                return None
            out.append(item)
        else:
            return None
    return tuple(out)


def _row_plan(index: tuple, batch_size: torch.Size) -> Optional[Tuple[tuple, Optional[tuple], tuple]]:
    """(storage index, local index, write order) for one row selection on dim 0 and slices after, or None."""
    first, rest = index[0], index[1:]
    if not isinstance(first, torch.Tensor) or first.dim() != 1:
        return None
    if any(not isinstance(item, slice) for item in rest) or _basic_storage_index(rest, batch_size[1:]) is None:
        return None
    size = batch_size[0]
    if first.dtype is torch.bool:
        rows = first.cpu().nonzero().squeeze(-1)
    elif first.dtype in (torch.uint8,) or first.is_floating_point() or first.is_complex():
        return None  # torch reads uint8 as a mask, floats raise: leave both to torch
    else:
        rows = first.cpu().long()
        rows = torch.where(rows < 0, rows + size, rows)
    if not rows.numel():
        return None  # nothing selected: torch gives the empty result cheaply from a full read's shape
    unique, inverse = torch.unique(rows, sorted=True, return_inverse=True)
    # the last occurrence of each row wins a write, as a sequential loop would do
    last = torch.zeros(unique.numel(), dtype=torch.long).scatter_reduce_(
        0, inverse, torch.arange(rows.numel()), reduce="amax", include_self=False)
    start, stop = int(unique[0]), int(unique[-1]) + 1
    write_order = (unique.numpy(), last)
    if unique.numel() >= _DENSE_SPAN * (stop - start):
        storage = (slice(start, stop),) + rest
        return storage, (rows - start,), write_order
    local = None if unique.numel() == rows.numel() and bool((inverse == torch.arange(rows.numel())).all()) \
        else (inverse,)
    return (unique.numpy(),) + rest, local, write_order


def plan_rows(index: Any, batch_size: torch.Size) -> RowPlan:
    """Plan ``leaf[index]`` for leaves whose shapes start with ``batch_size``; raises as torch does."""
    index = _normalise(index, len(batch_size))
    probe = torch.zeros((), dtype=torch.uint8).expand(batch_size)
    new_batch = probe[index].shape  # torch's errors for a bad index, and the result's batch size
    if any(isinstance(item, torch.Tensor) and item.dim() == 0 and item.dtype is not torch.bool for item in index):
        index = tuple(int(item) if isinstance(item, torch.Tensor) and item.dim() == 0 else item for item in index)
    basic = _basic_storage_index(index, batch_size)
    if basic is not None:
        return RowPlan(len(batch_size), new_batch, index, basic, None, None)
    if index and len(index) <= len(batch_size):
        rows = _row_plan(index, batch_size)
        if rows is not None:
            storage, local, write_order = rows
            return RowPlan(len(batch_size), new_batch, index, storage, local, write_order)
    return RowPlan(len(batch_size), new_batch, index, None, None, None)
