"""Hypothesis strategies and torch references shared by the tensor-semantics tests.

The reference for any op on the batch dims is torch itself applied to an
*index grid*: ``grid = arange(numel).view(batch)``. Whatever torch does to a
tensor of the batch shape, it does to the grid; the expected leaf is then
``leaf.reshape(numel, *rest)[result_grid]``, with ``rest`` the dims after the
batch (a nested TensorDict's extra batch dims and the feature dims).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from hypothesis import strategies as st

from torchdict import NonTensorStack, TensorDict

DTYPES = [torch.float32, torch.float64, torch.int64, torch.int32, torch.bool]


def grid_of(batch: torch.Size) -> torch.Tensor:
    return torch.arange(batch.numel()).view(batch)


def expected_leaf(leaf: torch.Tensor, n_batch: int, grid_result: torch.Tensor) -> torch.Tensor:
    """``leaf`` rearranged along its first ``n_batch`` dims as ``grid_result`` says."""
    rest = leaf.shape[n_batch:]
    return leaf.reshape((-1,) + rest)[grid_result]


def leaves(td: TensorDict) -> dict:
    """Every tensor leaf by full key, and every non-tensor leaf (its wrapper) by full key."""
    return {key: value for key, value in td.items(include_nested=True, leaves_only=True)} | {
        key: td.get(key) for key in td.keys(include_nested=True) if td.is_non_tensor(key)
    }


def assert_matches_grid(result: TensorDict, source: TensorDict, grid_result: torch.Tensor) -> None:
    """``result`` is ``source`` rearranged along its batch dims as ``grid_result`` says."""
    n_batch = source.batch_dims
    assert result.batch_size == grid_result.shape
    source_leaves = leaves(source)
    result_leaves = leaves(result)
    assert set(source_leaves) == set(result_leaves)
    for key, leaf in source_leaves.items():
        got = result_leaves[key]
        if isinstance(leaf, torch.Tensor):
            expected = expected_leaf(leaf, n_batch, grid_result)
            assert got.shape == expected.shape, key
            assert got.dtype == expected.dtype, key
            assert torch.equal(got, expected), key
        else:
            flat = np.empty(len(leaf._flat_values()), dtype=object)
            flat[:] = leaf._flat_values()
            expected_values = flat.reshape((-1,) + tuple(leaf.batch_size[n_batch:]))[grid_result.numpy()]
            assert got.batch_size == grid_result.shape + leaf.batch_size[n_batch:], key
            expected_flat = np.array(expected_values, dtype=object).reshape(-1)
            assert list(got._flat_values()) == list(expected_flat), key


@st.composite
def batch_sizes(draw: Any, min_dims: int = 0, max_dims: int = 3, min_size: int = 1, max_size: int = 4) -> torch.Size:
    dims = draw(st.integers(min_dims, max_dims))
    return torch.Size(draw(st.lists(st.integers(min_size, max_size), min_size=dims, max_size=dims)))


def _random_leaf(generator: torch.Generator, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    if dtype is torch.bool:
        return torch.rand(shape, generator=generator) > 0.5
    if dtype.is_floating_point:
        return torch.randn(shape, generator=generator, dtype=dtype)
    return torch.randint(-50, 50, shape, generator=generator, dtype=dtype)


@st.composite
def tensordicts(draw: Any, batch: Any = None, non_tensor: bool = True, nested: bool = True) -> TensorDict:
    """A TensorDict with 1-3 leaves of random dtypes and feature shapes, maybe a nested
    TensorDict with an extra batch dim, and maybe a non-tensor entry (shared or per element)."""
    batch = draw(batch_sizes()) if batch is None else torch.Size(batch)
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    source: dict = {}
    for position in range(draw(st.integers(1, 3))):
        feature = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
        source[f"leaf{position}"] = _random_leaf(generator, tuple(batch) + feature, draw(st.sampled_from(DTYPES)))
    td = TensorDict(source, batch_size=batch)
    if nested and draw(st.booleans()):
        extra = tuple(draw(st.lists(st.integers(1, 3), max_size=1)))
        inner_batch = tuple(batch) + extra
        inner = TensorDict({"x": _random_leaf(generator, inner_batch + (2,), torch.float32)}, batch_size=inner_batch)
        td["nested"] = inner
    if non_tensor and draw(st.booleans()):
        if draw(st.booleans()) or not batch.numel():
            td["text"] = "shared"
        else:
            values = [f"v{i}" for i in range(batch.numel())]
            td["text"] = NonTensorStack(values, batch)
    return td


@st.composite
def basic_index_items(draw: Any, batch: torch.Size) -> tuple:
    """Ints (negative too), slices with steps, None, ``...`` and True: a view index."""
    items: list = []
    used = 0
    ellipsis = False
    for _ in range(draw(st.integers(0, len(batch) + 1))):
        choice = draw(st.sampled_from(["int", "slice", "none", "ellipsis", "true"]))
        if choice in ("int", "slice") and used >= len(batch):
            continue
        if choice == "int":
            if ellipsis:
                continue  # keep the dim bookkeeping simple: ints before the ellipsis only
            size = batch[used]
            items.append(draw(st.integers(-size, size - 1)))
            used += 1
        elif choice == "slice":
            if ellipsis:
                continue
            size = batch[used]
            start = draw(st.one_of(st.none(), st.integers(-size - 1, size + 1)))
            stop = draw(st.one_of(st.none(), st.integers(-size - 1, size + 1)))
            step = draw(st.one_of(st.none(), st.integers(1, 3)))
            items.append(slice(start, stop, step))
            used += 1
        elif choice == "none":
            items.append(None)
        elif choice == "true":
            items.append(True)
        elif not ellipsis:
            items.append(Ellipsis)
            ellipsis = True
    return tuple(items)


@st.composite
def advanced_index(draw: Any, batch: torch.Size, unique: bool = False) -> Any:
    """A long tensor, list, numpy array or bool mask on the leading dim(s), maybe in a tuple."""
    kind = draw(st.sampled_from(["tensor", "list", "numpy", "mask", "mask_nd", "pair"]))
    size = batch[0]
    if kind in ("tensor", "list", "numpy"):
        if unique:
            rows = draw(st.lists(st.integers(0, size - 1), min_size=1, max_size=size, unique=True))
        else:
            rows = draw(st.lists(st.integers(-size, size - 1), min_size=0, max_size=5))
        if kind == "tensor":
            return torch.tensor(rows, dtype=torch.long)
        if kind == "numpy":
            return np.array(rows, dtype=np.int64)
        return rows
    if kind == "mask":
        return torch.tensor(draw(st.lists(st.booleans(), min_size=size, max_size=size)))
    if kind == "mask_nd":
        dims = draw(st.integers(1, len(batch)))
        shape = tuple(batch[:dims])
        flags = draw(st.lists(st.booleans(), min_size=int(np.prod(shape)), max_size=int(np.prod(shape))))
        return torch.tensor(flags).view(shape)
    rows = draw(st.lists(st.integers(0, size - 1), min_size=1, max_size=3, unique=unique))
    if len(batch) == 1:
        return (torch.tensor(rows),)
    rest: Any = slice(None)
    # Unique pairs need as many distinct values on dim 1 as there are rows.
    if len(batch) > 1 and (not unique or batch[1] >= len(rows)) and draw(st.booleans()):
        rest = torch.tensor(draw(st.lists(st.integers(0, batch[1] - 1), min_size=len(rows), max_size=len(rows),
                                          unique=unique)))
    return (torch.tensor(rows), rest)
