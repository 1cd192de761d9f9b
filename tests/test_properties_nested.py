"""Properties of the batch ops on deep trees (1-4 levels, each adding 0-2 batch dims), against torch per leaf.

Trees mix dtypes and memory layouts (contiguous, permuted, expanded, sliced); top batch ranks 0-3. Every
property checks the values of every leaf and the batch size of every nested level.
"""
from __future__ import annotations

import tempfile

import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from _deep_trees import (
    assert_levels_consistent,
    assert_per_leaf,
    assert_rearranged,
    leaf_index,
    nested_levels,
    seeds,
    tensor_leaves,
    tree_specs,
)
from _tensor_strategies import advanced_index, basic_index_items
from torchdict import TensorDict

EXAMPLES = settings(max_examples=200)


def _grid(batch: torch.Size) -> torch.Tensor:
    return torch.arange(batch.numel()).view(batch)


def _top_dim(draw, rank: int, extra: int = 0) -> tuple:
    """A dim of the top batch, as given (maybe negative) and normalised."""
    dim = draw(st.integers(-rank - extra, rank - 1 + extra))
    return dim, dim % (rank + extra)


@EXAMPLES
@given(spec=tree_specs(), seed=seeds, data=st.data())
def test_basic_indexing(spec, seed, data):
    td = spec.build(seed)
    index = data.draw(basic_index_items(spec.batch))
    assert_rearranged(td[index], td, _grid(spec.batch)[index])


@EXAMPLES
@given(spec=tree_specs(min_rank=1), seed=seeds, data=st.data())
def test_advanced_indexing(spec, seed, data):
    td = spec.build(seed)
    index = data.draw(advanced_index(spec.batch))
    assert_rearranged(td[index], td, _grid(spec.batch)[index])


@EXAMPLES
@given(spec=tree_specs(min_rank=1), seed=seeds, data=st.data())
def test_setitem_writes_each_leaf(spec, seed, data):
    td = spec.build(seed).clone()  # expanded leaves can't be written in place
    other = spec.build(seed + 1)
    index = data.draw(st.one_of(basic_index_items(spec.batch), advanced_index(spec.batch, unique=True)))
    value = other[index]
    expected = {key: leaf.clone() for key, leaf in tensor_leaves(td).items()}
    for key, leaf in tensor_leaves(value).items():
        expected[key][leaf_index(index, len(spec.batch))] = leaf
    td[index] = value
    assert_levels_consistent(td)
    for key, leaf in tensor_leaves(td).items():
        assert torch.equal(leaf, expected[key]), key


@EXAMPLES
@given(spec=tree_specs(), seed=seeds, data=st.data())
def test_stack(spec, seed, data):
    rank = len(spec.batch)
    dim, positive = _top_dim(data.draw, rank, extra=1)
    first, second = spec.build(seed), spec.build(seed + 1)
    result = torch.stack([first, second], dim)
    n_top = rank

    def batch_of(level):
        return level.batch_size[:positive] + torch.Size([2]) + level.batch_size[positive:n_top] + level.batch_size[
            n_top:]

    assert_per_leaf(result, [first, second], lambda a, b: torch.stack([a, b], positive), batch_of)


@EXAMPLES
@given(spec=tree_specs(min_rank=1), seed=seeds, data=st.data())
def test_cat(spec, seed, data):
    rank = len(spec.batch)
    dim, positive = _top_dim(data.draw, rank)
    first, second = spec.build(seed), spec.build(seed + 1)
    result = torch.cat([first, second], dim)

    def batch_of(level):
        size = list(level.batch_size)
        size[positive] *= 2
        return torch.Size(size)

    assert_per_leaf(result, [first, second], lambda a, b: torch.cat([a, b], positive), batch_of)


@EXAMPLES
@given(spec=tree_specs(), seed=seeds, data=st.data())
def test_reshape_and_view(spec, seed, data):
    td = spec.build(seed)
    grid = _grid(spec.batch)
    shape = data.draw(st.sampled_from([(-1,), (1, -1), (-1, 1), tuple(reversed(spec.batch))]))
    assume(grid.numel() > 0 or -1 not in shape)
    assert_rearranged(td.reshape(*shape), td, grid.reshape(shape))
    assert_rearranged(td.contiguous().view(*shape), td, grid.view(shape))


@EXAMPLES
@given(spec=tree_specs(), seed=seeds, data=st.data())
def test_permute_unsqueeze_squeeze(spec, seed, data):
    td = spec.build(seed)
    grid = _grid(spec.batch)
    order = data.draw(st.permutations(range(len(spec.batch))))
    assert_rearranged(td.permute(order), td, grid.permute(order))
    dim, _ = _top_dim(data.draw, len(spec.batch), extra=1)
    unsqueezed = td.unsqueeze(dim)
    assert_rearranged(unsqueezed, td, grid.unsqueeze(dim))
    assert_rearranged(unsqueezed.squeeze(dim), td, grid)


@EXAMPLES
@given(spec=tree_specs(), seed=seeds, data=st.data())
def test_expand(spec, seed, data):
    td = spec.build(seed)
    grid = _grid(spec.batch)
    new = tuple(data.draw(st.lists(st.integers(1, 3), max_size=2)))
    # size-1 top dims may grow as well
    grown = tuple(data.draw(st.integers(1, 2)) if size == 1 else size for size in spec.batch)
    shape = new + grown
    assert_rearranged(td.expand(*shape), td, grid.expand(shape))


@EXAMPLES
@given(spec=tree_specs(min_rank=1), seed=seeds, data=st.data())
def test_split_and_unbind(spec, seed, data):
    td = spec.build(seed)
    grid = _grid(spec.batch)
    dim, positive = _top_dim(data.draw, len(spec.batch))
    size = data.draw(st.integers(1, 3))
    for piece, expected in zip(td.split(size, dim), grid.split(size, positive), strict=True):
        assert_rearranged(piece, td, expected)
    for piece, expected in zip(td.unbind(dim), grid.unbind(positive), strict=True):
        assert_rearranged(piece, td, expected)


@EXAMPLES
@given(spec=tree_specs(), seed=seeds)
def test_add_two_trees(spec, seed):
    first, second = spec.build(seed), spec.build(seed + 1)
    assert_per_leaf(first + second, [first, second], lambda a, b: a + b, lambda level: level.batch_size)


def _double(tensor: torch.Tensor) -> torch.Tensor:
    return ~tensor if tensor.dtype is torch.bool else tensor * 2


@EXAMPLES
@given(spec=tree_specs(), seed=seeds)
def test_apply(spec, seed):
    td = spec.build(seed)
    assert_per_leaf(td.apply(_double), [td], _double, lambda level: level.batch_size)
    as_float = td.apply(lambda t: t.to(torch.float64))
    assert_per_leaf(as_float, [td], lambda t: t.to(torch.float64), lambda level: level.batch_size)


@EXAMPLES
@given(spec=tree_specs(), seed=seeds)
def test_apply_in_place(spec, seed):
    td = spec.build(seed).clone()
    before = {key: leaf.clone() for key, leaf in tensor_leaves(td).items()}
    identities = {key: id(leaf) for key, leaf in tensor_leaves(td).items()}
    td.apply_(_double)
    assert_levels_consistent(td)
    for key, leaf in tensor_leaves(td).items():
        assert id(leaf) == identities[key], key
        assert torch.equal(leaf, _double(before[key])), key


@EXAMPLES
@given(spec=tree_specs(), seed=seeds, data=st.data())
def test_memmap_round_trip_then_index(spec, seed, data):
    td = spec.build(seed)
    with tempfile.TemporaryDirectory() as folder:
        td.memmap(folder)
        loaded = TensorDict.load_memmap(folder)
        assert_rearranged(loaded, td, _grid(spec.batch))
        for key, level in nested_levels(td):
            assert loaded[key].batch_size == level.batch_size, key
        if spec.batch:
            index = data.draw(basic_index_items(spec.batch))
            assert_rearranged(loaded[index], td, _grid(spec.batch)[index])


@EXAMPLES
@given(spec=tree_specs(max_rank=2), seed=seeds, rows=st.integers(1, 3))
def test_preallocation_row_by_row(spec, seed, rows):
    """Writing rows into an empty TensorDict creates every level with the stacked batch."""
    samples = [spec.build(seed + row) for row in range(rows)]
    td = TensorDict({}, batch_size=[rows, *spec.batch])
    for row, sample in enumerate(samples):
        td[row] = sample
    assert_per_leaf(td, samples, lambda *leaves: torch.stack(leaves), lambda level: torch.Size([rows]) + level.batch_size)
