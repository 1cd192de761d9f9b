"""Ops with a number on many small same-shape leaves run on their stack: same results as per leaf.

Each test states the per-leaf torch result and checks the TensorDict op against it,
on TensorDicts that take the stacked path (many small plain tensors of one shape and
dtype) and on each kind that must not (checked through ``stack_small`` directly).
"""
from __future__ import annotations

import operator
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchdict import TensorDict
from torchdict._stacked import MAX_NUMEL, MIN_LEAVES, stack_small

from _helpers import assert_same_snapshot, snapshot

N = MIN_LEAVES + 4


def assert_identical(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Same dtype, shape and bits (NaN where torch gives NaN)."""
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)


def uniform(dtype: torch.dtype = torch.float32, shape: tuple = (5, 3)) -> TensorDict:
    """N leaves of one shape and dtype: the stacked path applies."""
    torch.manual_seed(0)
    leaves = {f"k{i}": (torch.randn(*shape) * 10).to(dtype) for i in range(N)}
    # No zeros: the reflected integer forms (2 // leaf, 2 % leaf) would divide by zero.
    leaves = {key: torch.where(leaf == 0, torch.ones((), dtype=dtype), leaf) for key, leaf in leaves.items()}
    return TensorDict(leaves, batch_size=shape[:1])


# Stacked (exact whatever the kernel's vector width) and not stacked (pow, //, %: per leaf).
BINARY = [operator.add, operator.sub, operator.mul, operator.truediv, operator.eq, operator.lt, operator.ge,
          operator.and_, operator.floordiv, operator.mod, operator.pow]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.int32])
@pytest.mark.parametrize("op", BINARY, ids=lambda op: op.__name__)
@pytest.mark.parametrize("scalar", [2, 0.5, -3])
def test_op_with_a_number_equals_the_op_on_each_leaf(dtype, op, scalar):
    td = uniform(dtype)
    assert stack_small(list(td.values())) is not None  # this TensorDict does take the stacked path
    if op is operator.pow and not dtype.is_floating_point and scalar < 0:
        pytest.skip("torch refuses negative integer powers of integers")
    if op is operator.and_ and (dtype.is_floating_point or isinstance(scalar, float)):
        pytest.skip("bitwise ops take integers")
    result = op(td, scalar)
    for key, leaf in td.items():
        expected = op(leaf, scalar)
        assert_identical(result[key], expected)
    reflected = op(scalar, td) if op not in (operator.eq, operator.lt, operator.ge) else None
    if reflected is not None:
        for key, leaf in td.items():
            assert_identical(reflected[key], op(scalar, leaf))


def test_results_are_independent_tensors():
    td = uniform()
    result = td + 1
    storages = {result[key].untyped_storage().data_ptr() for key in result.keys()}
    assert len(storages) == N  # one storage per leaf, not views of one buffer
    result["k0"].zero_()
    assert torch.equal(result["k1"], td["k1"] + 1) and not torch.equal(td["k0"], torch.zeros(5, 3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
@pytest.mark.parametrize("name, scalar", [("__iadd__", 2), ("__isub__", 1), ("__imul__", 3), ("mul_", -1)])
def test_in_place_op_with_a_number_updates_each_leaf_object(dtype, name, scalar):
    td = uniform(dtype)
    before = {key: (leaf, leaf.clone()) for key, leaf in td.items()}
    returned = getattr(td, name)(scalar)
    assert returned is td
    inplace = getattr(torch.Tensor, name)
    for key, (leaf, old) in before.items():
        assert td[key] is leaf  # the same tensor object, updated in place
        assert torch.equal(leaf, inplace(old.clone(), scalar))


def test_in_place_on_non_contiguous_leaves():
    base = torch.arange(N * 6.0).view(N, 3, 2)
    td = TensorDict({f"k{i}": base[i].t() for i in range(N)}, batch_size=[2])  # (2, 3), non-contiguous
    expected = {key: leaf + 5 for key, leaf in td.items()}
    td += 5
    for key, leaf in td.items():
        assert torch.equal(leaf, expected[key])
    assert torch.equal(base[0].t(), expected["k0"])  # written through the views


def test_a_refused_in_place_op_changes_nothing():
    td = uniform(torch.int64)
    before = snapshot(td)
    with pytest.raises(RuntimeError, match="can't be cast"):
        td += 0.5
    assert_same_snapshot(before, snapshot(td))
    flags = TensorDict({f"k{i}": torch.zeros(4, dtype=torch.bool) for i in range(N)}, batch_size=[4])
    before = snapshot(flags)
    with pytest.raises(RuntimeError):
        flags += 1
    assert_same_snapshot(before, snapshot(flags))


def test_shared_leaf_is_updated_once():
    shared = torch.zeros(4)
    td = TensorDict.fromkeys([f"k{i}" for i in range(N)], shared)
    td.batch_size = [4]
    td += 1
    assert torch.equal(shared, torch.ones(4))


def test_autograd_keeps_working():
    td = TensorDict({f"k{i}": torch.randn(4, requires_grad=True) for i in range(N)}, batch_size=[4])
    assert stack_small(list(td.values())) is None  # falls back: autograd's per-leaf graph stays
    result = td * 2
    result["k0"] += 1  # in place on a result is allowed, as on a per-leaf result
    sum(leaf.sum() for leaf in result.values()).backward()
    assert torch.equal(td["k3"].grad, torch.full((4,), 2.0))


def _leaves(kind: str) -> list:
    leaves = [torch.randn(4, 3) for _ in range(N)]
    if kind == "few":
        return leaves[: MIN_LEAVES - 1]
    if kind == "big":
        return [torch.randn(MAX_NUMEL + 1) for _ in range(N)]
    if kind == "mixed shapes (last)":
        return leaves[:-1] + [torch.randn(4, 2)]
    if kind == "mixed shapes (middle)":
        return leaves[:3] + [torch.randn(4, 2)] + leaves[4:]
    if kind == "mixed dtypes":
        return leaves[:-2] + [torch.randn(4, 3, dtype=torch.float64)] + leaves[-1:]
    if kind == "subclass":
        return leaves[:-2] + [torch.nn.Parameter(torch.randn(4, 3), requires_grad=False)] + leaves[-1:]
    if kind == "sparse":
        return [leaf.to_sparse() for leaf in leaves]
    if kind == "requires grad":
        return leaves[:-1] + [torch.randn(4, 3, requires_grad=True)]
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["few", "big", "mixed shapes (last)", "mixed shapes (middle)", "mixed dtypes",
                                  "subclass", "sparse", "requires grad"])
def test_leaves_that_must_not_be_stacked_fall_back_with_per_leaf_results(kind):
    leaves = _leaves(kind)
    assert stack_small(leaves) is None
    td = TensorDict({f"k{i}": leaf for i, leaf in enumerate(leaves)})
    result = td * 3
    for key, leaf in td.items():
        expected = leaf * 3
        assert type(result[key]) is type(expected) and result[key].dtype == expected.dtype
        assert torch.equal(result[key].to_dense(), expected.to_dense())


def test_uniform_leaves_are_stacked_in_order():
    leaves = [torch.randn(4, 3) for _ in range(N)]
    stacked = stack_small(leaves)
    assert stacked is not None and torch.equal(stacked, torch.stack(leaves))


@settings(max_examples=60, deadline=None)
@given(
    n_leaves=st.integers(MIN_LEAVES, MIN_LEAVES + 8),
    batch=st.integers(1, 6),
    features=st.lists(st.integers(1, 9), max_size=2),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.int32, torch.int64]),
    op=st.sampled_from([operator.add, operator.sub, operator.mul, operator.truediv, operator.eq, operator.gt]),
    scalar=st.one_of(st.integers(-5, 5), st.floats(-4.0, 4.0, allow_nan=False, width=32)),
    reflected=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_stacked_results_are_bitwise_the_per_leaf_results(n_leaves, batch, features, dtype, op, scalar, reflected,
                                                            seed):
    # Whatever the leaf count, shape, dtype and number, the one-kernel path gives the bits an op per leaf gives.
    generator = torch.Generator().manual_seed(seed)
    leaves = {f"k{i}": (torch.randn(batch, *features, generator=generator) * 8).to(dtype) for i in range(n_leaves)}
    td = TensorDict(leaves, batch_size=[batch])
    assert stack_small(list(td.values())) is not None
    if op is operator.truediv and reflected:
        leaves = {key: torch.where(leaf == 0, torch.ones((), dtype=dtype), leaf) for key, leaf in leaves.items()}
        td = TensorDict(leaves, batch_size=[batch])
    result = op(scalar, td) if reflected else op(td, scalar)
    for key, leaf in leaves.items():
        assert_identical(result[key], op(scalar, leaf) if reflected else op(leaf, scalar))


@settings(max_examples=40, deadline=None)
@given(
    n_leaves=st.integers(MIN_LEAVES, MIN_LEAVES + 8),
    batch=st.integers(1, 6),
    features=st.lists(st.integers(1, 9), max_size=2),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.int32, torch.int64]),
    name=st.sampled_from(["__iadd__", "__isub__", "__imul__"]),
    scalar=st.one_of(st.integers(-5, 5), st.floats(-4.0, 4.0, allow_nan=False, width=32)),
    seed=st.integers(0, 2**16),
)
def test_stacked_in_place_results_are_bitwise_the_per_leaf_results(n_leaves, batch, features, dtype, name, scalar,
                                                                     seed):
    generator = torch.Generator().manual_seed(seed)
    leaves = {f"k{i}": (torch.randn(batch, *features, generator=generator) * 8).to(dtype) for i in range(n_leaves)}
    td = TensorDict({key: leaf.clone() for key, leaf in leaves.items()}, batch_size=[batch])
    objects = dict(td.items())
    try:
        expected = {key: getattr(torch.Tensor, name)(leaf.clone(), scalar) for key, leaf in leaves.items()}
    except RuntimeError as error:  # e.g. an int leaf and a float: the TensorDict refuses it too, unchanged
        with pytest.raises(RuntimeError, match=re.escape(str(error)[:40])):
            getattr(td, name)(scalar)
        for key, leaf in leaves.items():
            assert_identical(td[key], leaf)
        return
    getattr(td, name)(scalar)
    for key in leaves:
        assert td[key] is objects[key]
        assert_identical(td[key], expected[key])
