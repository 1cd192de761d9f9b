"""From a batch index to the byte ranges of the rows it picks, so ``store[idx]`` moves only those rows.

An entry of shape ``[*batch, *rest]`` is stored C-ordered, so fixing the first ``depth`` batch dims picks
one contiguous *cell* of ``prod(shape[depth:])`` elements. An index is applied (by torch, with torch's
errors) to the grid of cell numbers; consecutive cells are merged into runs, one GETRANGE/SETRANGE each.
Reads turn the runs into byte ranges on the server (``_client.READ_ROWS``), from the metadata as it is at
that moment; writes turn them into byte ranges here (:meth:`Selection.write_ranges`).
"""
from __future__ import annotations

import math
from typing import Any, List, Optional, Sequence, Tuple

import torch

# Reading a whole entry and picking the rows locally beats many small ranges once the ranges would cover
# most of it anyway: each range costs about this many bytes of protocol and server work.
RANGE_OVERHEAD_BYTES = 64


def _is_first_dim_index(index: Any) -> bool:
    """Whether ``index`` only picks along the first batch dim (then the grid is one dim long)."""
    if isinstance(index, tuple):
        if len(index) != 1:
            return False
        index = index[0]
    if isinstance(index, bool):
        return False  # td[True] adds a dim, as tensor[True] does
    if isinstance(index, (int, slice, range)):
        return True
    if isinstance(index, torch.Tensor):
        return index.ndim <= 1 and (index.dtype is not torch.bool or index.ndim == 1)
    if isinstance(index, list):
        return all(isinstance(item, int) and not isinstance(item, bool) for item in index)
    return False


# Up to this many picked cells, positions and runs are worked out on Python ints: for the few rows of a
# sample, a handful of small torch ops would cost more than the server's work.
_SMALL = 4096


class Selection:
    """The cells that an index picks, in result order (duplicates kept).

    ``positions``: a tensor of cell numbers shaped as the result's leading dims, or (for a first-dim
    index) a list of cell numbers with ``lead`` giving that shape.
    """

    def __init__(self, positions: Any, depth: int, lead: Optional[Sequence[int]] = None) -> None:
        self.depth = depth  # how many leading batch dims the index consumed
        self._flat: Optional[torch.Tensor] = None
        self._list: Optional[List[int]] = None
        if isinstance(positions, torch.Tensor):
            self.lead = positions.shape if lead is None else torch.Size(lead)  # in place of those dims
            self._flat = positions.reshape(-1)
            self.count = self._flat.numel()
            if self.count <= _SMALL:
                self._list = self._flat.tolist()
        else:
            self.lead = torch.Size((len(positions),) if lead is None else lead)
            self._list, self.count = list(positions), len(positions)
        self.runs = _list_runs(self._list) if self._list is not None else _tensor_runs(self.flat)

    @property
    def flat(self) -> torch.Tensor:
        if self._flat is None:
            self._flat = torch.tensor(self._list, dtype=torch.long)
        return self._flat

    def positions(self) -> List[int]:
        return self._list if self._list is not None else self.flat.tolist()

    def result_shape(self, shape: Sequence[int]) -> torch.Size:
        return torch.Size(self.lead) + torch.Size(shape[self.depth:])

    def cell_elements(self, shape: Sequence[int]) -> int:
        return math.prod(shape[self.depth:])

    def from_whole(self, whole: torch.Tensor) -> torch.Tensor:
        """The picked cells of a whole entry."""
        cell = self.cell_elements(whole.shape)
        cells = whole.reshape(-1, cell) if cell else whole.reshape(math.prod(whole.shape[:self.depth]), 0)
        return cells[self.flat].reshape(self.result_shape(whole.shape))

    def write_ranges(self, shape: Sequence[int], itemsize: int, payload: memoryview) -> List[Tuple[int, memoryview]]:
        """``(byte offset, bytes)`` per run: ``payload`` is the value of the picked cells, in result order."""
        cell = self.cell_elements(shape) * itemsize
        if cell == 0:
            return []
        ranges, taken = [], 0
        for start, length in self.runs:
            size = length * cell
            ranges.append((start * cell, payload[taken:taken + size]))
            taken += size
        return ranges


def _list_runs(positions: List[int]) -> List[Tuple[int, int]]:
    """``(first cell, count)`` of each stretch of consecutive cells, in order."""
    runs: List[Tuple[int, int]] = []
    start = previous = -2
    for position in positions:
        if position == previous + 1:
            previous = position
            continue
        if previous >= 0:
            runs.append((start, previous - start + 1))
        start = previous = position
    if previous >= 0:
        runs.append((start, previous - start + 1))
    return runs


def _tensor_runs(flat: torch.Tensor) -> List[Tuple[int, int]]:
    """:func:`_list_runs` for many cells, with torch."""
    count = flat.numel()
    if count == 0:
        return []
    breaks = torch.ones(count, dtype=torch.bool)
    breaks[1:] = flat[1:] != flat[:-1] + 1
    starts = breaks.nonzero().reshape(-1)
    lengths = torch.diff(starts, append=torch.tensor([count]))
    return list(zip(flat[starts].tolist(), lengths.tolist()))


def _first_dim_cells(size: int, index: Any) -> Any:
    """``(cells, lead)`` that a first-dim index picks, without a grid of the whole dim; None to leave it to
    torch's indexing of the grid (for its exact result and errors)."""
    if isinstance(index, tuple):
        index = index[0]
    if isinstance(index, int):
        if not -size <= index < size:
            raise IndexError(f"index {index} is out of bounds for dimension 0 with size {size}")
        return [index % size], ()
    if isinstance(index, slice):
        if index.step is not None and index.step <= 0:
            return None
        picked = range(*index.indices(size))
        if len(picked) <= _SMALL:
            return list(picked), None
        return torch.arange(picked.start, picked.stop, picked.step), None
    if isinstance(index, (list, range)):
        if len(index) > _SMALL:
            return _first_dim_cells(size, torch.as_tensor(index))
        if all(-size <= item < size for item in index):
            return [item % size for item in index], None
        return None
    if not isinstance(index, torch.Tensor) or index.ndim != 1:
        return None
    if index.dtype is torch.bool:
        return (index.nonzero().reshape(-1), None) if index.shape[0] == size else None
    if index.dtype.is_floating_point or index.dtype.is_complex or index.dtype is torch.uint8:
        return None
    if index.numel() <= _SMALL:
        return _first_dim_cells(size, index.tolist())
    if not (bool((index >= -size).all()) and bool((index < size).all())):
        return None
    return torch.where(index < 0, index + size, index).long(), None


def select(batch_size: torch.Size, index: Any) -> Selection:
    """The cells of a store of ``batch_size`` that ``store[index]`` picks (IndexError etc. from torch)."""
    if isinstance(index, torch.Tensor) and index.device.type != "cpu":
        index = index.cpu()
    if len(batch_size) and _is_first_dim_index(index):
        found = _first_dim_cells(batch_size[0], index)
        if found is None:
            return Selection(torch.arange(batch_size[0])[index], 1)
        cells, lead = found
        return Selection(cells, 1, lead)
    grid = torch.arange(batch_size.numel()).reshape(batch_size)
    return Selection(grid[index], len(batch_size))
