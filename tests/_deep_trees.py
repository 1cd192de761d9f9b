"""Hypothesis strategies for deep TensorDicts whose levels add batch dims, and a per-leaf torch reference.

A drawn :class:`TreeSpec` is a structure only (batch dims, keys, dtypes, feature shapes, memory layouts);
:meth:`TreeSpec.build` turns it into a TensorDict filled from a seed, so two-operand properties (stack,
cat, ``td + td``, setitem) get two trees of the same structure and different values.

The reference for an op that rearranges the top batch dims is the same op on an *index grid* of the top
batch (``arange(numel).view(batch)``): each leaf is expected to be ``leaf.reshape(numel, *rest)[grid]``
and each nested level's batch ``grid.shape + the level's own extra dims``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
from hypothesis import strategies as st

from torchdict import TensorDict

DTYPES = [torch.float32, torch.float64, torch.int64, torch.bool]
LAYOUTS = ["contiguous", "permuted", "expanded", "sliced"]


@dataclass
class LeafSpec:
    name: str
    feature: tuple
    dtype: torch.dtype
    layout: str


@dataclass
class LevelSpec:
    extra: tuple  # batch dims this level adds to its parent's
    leaves: list
    children: dict = field(default_factory=dict)  # name -> LevelSpec


@dataclass
class TreeSpec:
    batch: torch.Size
    root: LevelSpec

    def build(self, seed: int) -> TensorDict:
        generator = torch.Generator().manual_seed(seed)
        return _build_level(self.root, tuple(self.batch), generator)

    @property
    def depth(self) -> int:
        return _depth(self.root)


def _depth(level: LevelSpec) -> int:
    return 1 + max((_depth(child) for child in level.children.values()), default=0)


def _random(shape: tuple, dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    if dtype is torch.bool:
        return torch.rand(shape, generator=generator) > 0.5
    if dtype.is_floating_point:
        return torch.randn(shape, generator=generator, dtype=dtype)
    return torch.randint(-50, 50, shape, generator=generator, dtype=dtype)


def _leaf(shape: tuple, dtype: torch.dtype, layout: str, generator: torch.Generator) -> torch.Tensor:
    """A tensor of ``shape`` with the given memory layout (the values are random either way)."""
    if layout == "permuted" and len(shape) > 1:
        order = list(reversed(range(len(shape))))
        return _random(tuple(shape[i] for i in order), dtype, generator).permute(order)
    if layout == "expanded" and shape:
        return _random((1,) + shape[1:], dtype, generator).expand(shape)
    if layout == "sliced" and shape:
        return _random(shape[:-1] + (2 * shape[-1],), dtype, generator)[..., ::2]
    return _random(shape, dtype, generator)


def _build_level(level: LevelSpec, batch: tuple, generator: torch.Generator) -> TensorDict:
    batch = batch + level.extra
    source: dict = {leaf.name: _leaf(batch + leaf.feature, leaf.dtype, leaf.layout, generator)
                    for leaf in level.leaves}
    for name, child in level.children.items():
        source[name] = _build_level(child, batch, generator)
    return TensorDict(source, batch_size=batch)


@st.composite
def _level(draw: Any, depth_left: int, dims_left: int) -> LevelSpec:
    extra_dims = draw(st.integers(0, min(2, dims_left)))
    extra = tuple(draw(st.lists(st.integers(1, 3), min_size=extra_dims, max_size=extra_dims)))
    leaves = [
        LeafSpec(f"leaf{i}", tuple(draw(st.lists(st.integers(1, 2), max_size=1))), draw(st.sampled_from(DTYPES)),
                 draw(st.sampled_from(LAYOUTS)))
        for i in range(draw(st.integers(1, 2)))
    ]
    children = {}
    if depth_left > 1:
        for i in range(draw(st.integers(0 if depth_left < 4 else 1, 2))):
            children[f"sub{i}"] = draw(_level(depth_left - 1, dims_left - extra_dims))
    return LevelSpec(extra, leaves, children)


@st.composite
def tree_specs(draw: Any, min_rank: int = 0, max_rank: int = 3) -> TreeSpec:
    """A tree 1-4 levels deep: a top batch of rank ``min_rank``-``max_rank``, levels that add 0-2 batch dims."""
    rank = draw(st.integers(min_rank, max_rank))
    batch = torch.Size(draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank)))
    depth = draw(st.integers(1, 4))
    root = draw(_level(depth, 5 - rank))
    return TreeSpec(batch, LevelSpec((), root.leaves, root.children))


seeds = st.integers(0, 2**31 - 1)


def nested_levels(td: TensorDict, prefix: tuple = ()) -> Iterator[tuple]:
    """``(key, sub-TensorDict)`` for every nested level, depth first."""
    for key, value in td.items():
        if isinstance(value, TensorDict):
            yield prefix + (key,), value
            yield from nested_levels(value, prefix + (key,))


def tensor_leaves(td: TensorDict) -> dict:
    return dict(td.items(include_nested=True, leaves_only=True))


def assert_levels_consistent(td: TensorDict) -> None:
    """The invariant: a level's batch starts with its parent's, and its leaves' shapes start with its batch."""
    for key, value in td.items():
        if isinstance(value, TensorDict):
            assert value.batch_size[: td.batch_dims] == td.batch_size, key
            assert_levels_consistent(value)
        else:
            assert value.shape[: td.batch_dims] == td.batch_size, key


def assert_rearranged(result: TensorDict, source: TensorDict, grid_result: torch.Tensor) -> None:
    """``result`` is ``source`` with its top batch dims rearranged as ``grid_result`` says, at every depth."""
    n_top = source.batch_dims
    assert result.batch_size == grid_result.shape
    assert_levels_consistent(result)
    source_levels = dict(nested_levels(source))
    result_levels = dict(nested_levels(result))
    assert set(source_levels) == set(result_levels)
    for key, level in source_levels.items():
        assert result_levels[key].batch_size == grid_result.shape + level.batch_size[n_top:], key
    flat = grid_result.reshape(-1)
    expected_leaves = tensor_leaves(source)
    got_leaves = tensor_leaves(result)
    assert set(expected_leaves) == set(got_leaves)
    for key, leaf in expected_leaves.items():
        rest = leaf.shape[n_top:]
        expected = leaf.reshape((-1,) + rest)[flat].reshape(grid_result.shape + rest)
        got = got_leaves[key]
        assert got.dtype == expected.dtype, key
        assert torch.equal(got, expected), key


def assert_per_leaf(result: TensorDict, sources: list, leaf_op: Any, batch_of: Any) -> None:
    """``result`` holds ``leaf_op(*same-key leaves of sources)`` and each level has batch ``batch_of(level)``."""
    assert_levels_consistent(result)
    first = sources[0]
    assert result.batch_size == batch_of(first)
    result_levels = dict(nested_levels(result))
    for key, level in nested_levels(first):
        assert result_levels[key].batch_size == batch_of(level), key
    got_leaves = tensor_leaves(result)
    all_leaves = [tensor_leaves(source) for source in sources]
    assert set(got_leaves) == set(all_leaves[0])
    for key in all_leaves[0]:
        expected = leaf_op(*(leaves[key] for leaves in all_leaves))
        assert got_leaves[key].dtype == expected.dtype, key
        assert torch.equal(got_leaves[key], expected), key


def leaf_index(index: Any, rank: int) -> Any:
    """``index`` on a batch of ``rank`` dims, spelled so that it means the same on a leaf with more dims.

    A TensorDict's ``...`` stands for the batch dims it leaves out; on a leaf it would also swallow the
    feature dims, so it is written out as full slices.
    """
    items = index if isinstance(index, tuple) else (index,)
    if not any(item is Ellipsis for item in items):
        return index
    consumed = sum(item.ndim if isinstance(item, torch.Tensor) and item.dtype is torch.bool else
                   0 if item is None or item is True or item is False or item is Ellipsis else 1
                   for item in items)
    spelled: list = []
    for item in items:
        spelled.extend([slice(None)] * (rank - consumed) if item is Ellipsis else [item])
    return tuple(spelled)
