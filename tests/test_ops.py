"""Pointwise arithmetic, comparisons, all/any and reductions, stated against plain torch per leaf.

The rule everywhere: an op on a TensorDict equals the same torch op on each leaf
(same dtype, shape and values, or the same exception), non-tensor entries pass
through, and a failing in-place op leaves the TensorDict unchanged.
"""
from __future__ import annotations

import doctest
import operator
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import torchdict._masking
import torchdict._ops
import torchdict._reductions
from torchdict import NonTensorData, NonTensorStack, TensorDict

from _helpers import assert_same_snapshot, snapshot
from _tensor_strategies import leaves, tensordicts

# TORCHDICT_EXAMPLES=500 for a deeper search than the default quick run.
SETTINGS = settings(max_examples=int(os.environ.get("TORCHDICT_EXAMPLES", 40)), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def tensor_leaves(td: TensorDict) -> dict:
    return {key: value for key, value in leaves(td).items() if isinstance(value, torch.Tensor)}


def non_tensor_leaves(td: TensorDict) -> dict:
    return {key: value for key, value in leaves(td).items() if not isinstance(value, torch.Tensor)}


def assert_same_tensor(got: torch.Tensor, expected: torch.Tensor, key: object = None) -> None:
    assert got.dtype == expected.dtype, key
    assert got.shape == expected.shape, key
    torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True, msg=str(key))


def expected_per_leaf(td: TensorDict, fn) -> dict:
    """``{key: fn(leaf)}``, or the exception the first failing leaf raised."""
    result = {}
    for key, leaf in tensor_leaves(td).items():
        try:
            result[key] = fn(leaf)
        except Exception as error:  # noqa: BLE001 - compared with what the TensorDict op raises
            return error
    return result


def check_leafwise(td: TensorDict, td_op, leaf_op) -> None:
    """``td_op(td)`` equals ``leaf_op`` on every leaf, or raises what torch raises."""
    expected = expected_per_leaf(td, leaf_op)
    if isinstance(expected, Exception):
        with pytest.raises(type(expected)):
            td_op(td)
        return
    result = td_op(td)
    assert isinstance(result, TensorDict)
    assert result.batch_size == td.batch_size
    got = tensor_leaves(result)
    assert set(got) == set(expected)
    for key, value in expected.items():
        assert_same_tensor(got[key], value, key)
    for key, value in non_tensor_leaves(td).items():
        assert non_tensor_leaves(result)[key].tolist() == value.tolist()


SCALARS = st.sampled_from([2, 3, -2, 0.5, 1.5, -0.25, True])

BINARY = {
    "add": (operator.add, False),
    "sub": (operator.sub, False),
    "mul": (operator.mul, False),
    "truediv": (operator.truediv, False),
    "floordiv": (operator.floordiv, False),
    "mod": (operator.mod, False),
    "pow": (operator.pow, False),
    "radd": (operator.add, True),
    "rsub": (operator.sub, True),
    "rmul": (operator.mul, True),
    "rtruediv": (operator.truediv, True),
    "rfloordiv": (operator.floordiv, True),
    "rmod": (operator.mod, True),
    "rpow": (operator.pow, True),
    "eq": (operator.eq, False),
    "ne": (operator.ne, False),
    "lt": (operator.lt, False),
    "le": (operator.le, False),
    "gt": (operator.gt, False),
    "ge": (operator.ge, False),
}


# --------------------------------------------------------------------------- scalars


@SETTINGS
@given(td=tensordicts(), name=st.sampled_from(sorted(BINARY)), scalar=SCALARS)
def test_binary_operator_with_a_scalar_is_the_torch_operator_on_every_leaf(td, name, scalar):
    python_operator, reflected = BINARY[name]
    if reflected:
        check_leafwise(td, lambda t: python_operator(scalar, t), lambda leaf: python_operator(scalar, leaf))
    else:
        check_leafwise(td, lambda t: python_operator(t, scalar), lambda leaf: python_operator(leaf, scalar))


METHODS = ["add", "sub", "mul", "div", "pow", "clamp_min", "clamp_max", "remainder", "fmod", "floor_divide",
           "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor"]


@SETTINGS
@given(td=tensordicts(), name=st.sampled_from(METHODS), scalar=SCALARS)
def test_binary_method_with_a_scalar_is_the_torch_function_on_every_leaf(td, name, scalar):
    torch_function = getattr(torch, name)
    check_leafwise(td, lambda t: getattr(t, name)(scalar), lambda leaf: torch_function(leaf, scalar))


@SETTINGS
@given(td=tensordicts(), alpha=st.sampled_from([2, -1, 0.5]), scalar=SCALARS)
def test_add_and_sub_with_alpha(td, alpha, scalar):
    check_leafwise(td, lambda t: t.add(scalar, alpha=alpha), lambda leaf: torch.add(leaf, scalar, alpha=alpha))
    check_leafwise(td, lambda t: t.sub(scalar, alpha=alpha), lambda leaf: torch.sub(leaf, scalar, alpha=alpha))


@SETTINGS
@given(td=tensordicts(), mode=st.sampled_from(["floor", "trunc"]), scalar=st.sampled_from([2, -3, 0.5]))
def test_div_with_rounding_mode(td, mode, scalar):
    check_leafwise(td, lambda t: t.div(scalar, rounding_mode=mode),
                   lambda leaf: torch.div(leaf, scalar, rounding_mode=mode))


UNARY = ["neg", "abs", "exp", "log", "sqrt", "sigmoid", "sign", "floor", "ceil", "round", "trunc", "frac", "erf",
         "reciprocal", "sin", "tanh", "isnan", "isfinite", "isinf", "logical_not", "bitwise_not", "square", "relu",
         "sgn", "rsqrt", "expm1", "log1p"]


@SETTINGS
@given(td=tensordicts(), name=st.sampled_from(UNARY))
def test_unary_method_is_the_torch_function_on_every_leaf(td, name):
    check_leafwise(td, lambda t: getattr(t, name)(), getattr(torch, name))


def test_unary_operators_and_kwargs():
    td = TensorDict(a=torch.tensor([-1.5, 2.25]), b=torch.tensor([1, -2]))
    assert torch.equal((-td)["a"], -td["a"]) and torch.equal(abs(td)["b"], td["b"].abs())
    assert torch.equal((~(td > 0))["a"], ~(td["a"] > 0))
    assert (+td) is td
    floats = td.exclude("b")
    assert torch.equal(floats.round(decimals=1)["a"], td["a"].round(decimals=1))
    assert torch.equal(floats.nan_to_num(0.0)["a"], td["a"])
    with pytest.raises(NotImplementedError):  # as torch: round with decimals is not implemented for int64
        td.round(decimals=1)


def test_every_table_op_has_a_method_and_in_place_form():
    for name, op in torchdict._ops.BINARY_OPS.items():
        assert callable(getattr(TensorDict, name)), name
        assert (op.inplace is not None) == hasattr(TensorDict, f"{name}_"), name
    for name, op in torchdict._ops.UNARY_OPS.items():
        assert callable(getattr(TensorDict, name)), name
        if op.inplace is not None:
            assert callable(getattr(TensorDict, f"{name}_")), name


# --------------------------------------------------------------------------- tensors, broadcast over the batch dims


@st.composite
def td_and_batch_tensor(draw):
    """A TensorDict and a tensor shaped like the trailing dims of its batch (some of them 1)."""
    td = draw(tensordicts())
    batch = td.batch_size
    dims = draw(st.integers(0, len(batch)))
    shape = [size if draw(st.booleans()) else 1 for size in batch[len(batch) - dims:]]
    dtype = draw(st.sampled_from([torch.float32, torch.int64]))
    other = (torch.arange(1, 1 + int(torch.Size(shape).numel())) % 5 + 1).to(dtype).view(shape)
    return td, other


@SETTINGS
@given(case=td_and_batch_tensor(), name=st.sampled_from(["add", "sub", "mul", "truediv", "rsub", "rtruediv", "eq"]))
def test_a_tensor_operand_broadcasts_against_the_batch_then_each_leaf_from_the_left(case, name):
    # As upstream: the tensor meets the batch like two torch shapes (last dim with last batch
    # dim), then each leaf over its batch dims, whatever its feature dims.
    td, other = case
    python_operator, reflected = BINARY[name]
    n_batch = len(td.batch_size)

    def aligned(leaf):
        if other.ndim == 0:  # a 0-dim tensor is used as is (like a scalar)
            return other
        return other.view((1,) * (n_batch - other.ndim) + other.shape + (1,) * (leaf.ndim - n_batch))

    if reflected:
        check_leafwise(td, lambda t: python_operator(other, t), lambda leaf: python_operator(aligned(leaf), leaf))
    else:
        check_leafwise(td, lambda t: python_operator(t, other), lambda leaf: python_operator(leaf, aligned(leaf)))


def test_a_tensor_meets_the_last_batch_dims_of_a_square_batch():
    td = TensorDict(a=torch.zeros(3, 3, 2), batch_size=[3, 3])
    result = td + torch.arange(3.0)
    assert torch.equal(result["a"][..., 0], torch.arange(3.0).expand(3, 3))


def test_a_row_tensor_scales_rows_whatever_the_feature_dims():
    td = TensorDict(a=torch.ones(3, 2), b={"c": torch.ones(3, 4, 5)}, batch_size=[3])
    result = td * torch.tensor([1.0, 2.0, 3.0])
    assert torch.equal(result["a"], torch.tensor([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]))
    assert torch.equal(result["b", "c"][:, 0, 0], torch.tensor([1.0, 2.0, 3.0]))


def test_a_tensor_with_more_dims_grows_the_batch_in_front():
    td = TensorDict(a=torch.arange(3.0), f=torch.ones(3, 2), batch_size=[3])
    other = torch.arange(12.0).view(4, 3)
    result = td + other
    assert result.batch_size == torch.Size([4, 3])
    assert torch.equal(result["a"], td["a"][None, :] + other)
    assert torch.equal(result["f"], td["f"][None, :, :] + other[:, :, None])
    empty_batch = TensorDict(a=torch.ones(3)) * torch.tensor([1.0, 2.0, 3.0])
    assert empty_batch.batch_size == torch.Size([3]) and empty_batch["a"].shape == torch.Size([3, 3])
    td["names"] = NonTensorStack("x", "y", "z")
    td["sub"] = TensorDict(b=torch.zeros(3, 5), batch_size=[3, 5])
    grown = td + torch.ones(2, 3)
    assert grown["names"] == [["x", "y", "z"], ["x", "y", "z"]]
    assert grown["sub"].batch_size == torch.Size([2, 3, 5]) and grown["sub", "b"].shape == torch.Size([2, 3, 5])


def test_a_tensor_that_does_not_broadcast_raises_torch_error():
    td = TensorDict(a=torch.ones(3, 4), batch_size=[3])
    with pytest.raises(RuntimeError):
        td + torch.ones(4)


# --------------------------------------------------------------------------- TensorDict operands


@st.composite
def td_pairs(draw):
    td = draw(tensordicts())
    seed = draw(st.integers(0, 1000))
    generator = torch.Generator().manual_seed(seed)

    def fresh(leaf):
        if leaf.dtype is torch.bool:
            return torch.rand(leaf.shape, generator=generator) > 0.5
        if leaf.dtype.is_floating_point:
            return torch.randn(leaf.shape, generator=generator, dtype=leaf.dtype)
        values = torch.randint(1, 6, leaf.shape, generator=generator, dtype=leaf.dtype)
        return values  # non-zero, so integer division and modulo are defined

    return td, td.apply(fresh)


@SETTINGS
@given(pair=td_pairs(), name=st.sampled_from(["add", "sub", "mul", "truediv", "floordiv", "mod", "eq", "ne", "lt",
                                              "ge"]))
def test_tensordict_operands_pair_leaves_by_key(pair, name):
    td, other = pair
    python_operator, _ = BINARY[name]
    other_leaves = tensor_leaves(other)
    results = {}
    for key, leaf in tensor_leaves(td).items():
        try:
            results[key] = python_operator(leaf, other_leaves[key])
        except Exception as error:  # noqa: BLE001
            with pytest.raises(type(error)):
                python_operator(td, other)
            return
    result = python_operator(td, other)
    for key, value in results.items():
        assert_same_tensor(result.get(key), value, key)


def test_tensordict_operand_order_of_keys_does_not_matter():
    td = TensorDict(a=torch.ones(2), b=torch.zeros(2))
    other = TensorDict(b=torch.ones(2), a=torch.full((2,), 2.0))
    result = td + other
    assert list(result.keys()) == ["a", "b"]
    assert torch.equal(result["a"], torch.full((2,), 3.0)) and torch.equal(result["b"], torch.ones(2))


def test_key_mismatch_names_the_differing_keys_exactly():
    first = TensorDict(a=torch.ones(3), b={"c": torch.ones(3)})
    second = TensorDict(z=torch.ones(3))
    message = ("keys in tensordicts mismatch. The first TD has keys {'a', ('b', 'c')} that the second does not "
               "have. The second TD has keys {'z'} that the first does not have.")
    for operation in (operator.add, operator.eq, operator.mul):
        with pytest.raises(KeyError) as info:
            operation(first, second)
        assert str(info.value) == message
    with pytest.raises(KeyError) as info:
        TensorDict(a=torch.ones(3), b=torch.ones(3)) + TensorDict(a=torch.ones(3))
    assert str(info.value) == "keys in tensordicts mismatch. The first TD has keys {'b'} that the second does not have."


def test_key_mismatch_in_place_leaves_the_tensordict_unchanged():
    td = TensorDict(a=torch.ones(3), b=torch.zeros(3))
    before = snapshot(td)
    with pytest.raises(KeyError, match="mismatch"):
        td += TensorDict(a=torch.ones(3))
    assert_same_snapshot(before, snapshot(td))


def test_batch_sizes_broadcast_like_tensor_shapes():
    wide = TensorDict(a=torch.arange(3.0), batch_size=[3])
    single = TensorDict(a=torch.ones(1), batch_size=[1])
    assert (wide == single).batch_size == torch.Size([3])
    assert torch.equal((wide == single)["a"], torch.tensor([False, True, False]))
    grid = TensorDict(a=torch.ones(3, 4, 5), batch_size=[3, 4]) + TensorDict(a=torch.arange(4.0)[:, None].expand(4, 5),
                                                                             batch_size=[4])
    assert grid.batch_size == torch.Size([3, 4]) and torch.equal(grid["a"][0, :, 0], torch.arange(1.0, 5.0))


def test_leaves_with_different_feature_dims_pair_batch_element_with_batch_element():
    td = TensorDict(a=torch.arange(3.0), batch_size=[3])
    other = TensorDict(a=torch.ones(3, 3), batch_size=[3])
    assert torch.equal((td + other)["a"], td["a"][:, None] + other["a"])


def test_nested_and_non_tensor_entries():
    td = TensorDict(a=torch.ones(2), sub={"x": torch.zeros(2, 3)}, text="hello", batch_size=[2])
    result = td * 2 + td
    assert result["text"] == "hello" and torch.equal(result["sub", "x"], torch.zeros(2, 3))
    assert isinstance(result["sub"], TensorDict) and result["sub"].batch_size == torch.Size([2])
    same = td == td.clone()
    assert same.all() and torch.equal(same["text"], torch.ones(2, dtype=torch.bool))
    other = td.clone()
    other["text"] = "world"
    assert not (td == other).all() and (td != other)["text"].all()


def test_comparison_with_unsupported_types():
    td = TensorDict(a=torch.ones(2))
    assert (td == "x") is False and (td == None) is False  # noqa: E711
    assert (td != "x") is True
    with pytest.raises(TypeError):
        td < "x"
    with pytest.raises(TypeError):
        td + {"a": 1}
    with pytest.raises(TypeError):
        td.add("x")
    with pytest.raises(TypeError, match="unhashable"):
        hash(td)


def test_numpy_operands():
    np = pytest.importorskip("numpy")
    td = TensorDict(a=torch.ones(3), batch_size=[3])
    assert torch.equal((td * np.arange(3.0))["a"], torch.arange(3.0, dtype=torch.float64))
    assert torch.equal((td + np.int64(2))["a"], torch.full((3,), 3.0))


# --------------------------------------------------------------------------- in place


IN_PLACE = {"add": "__iadd__", "sub": "__isub__", "mul": "__imul__", "div": "__itruediv__",
            "floor_divide": "__ifloordiv__", "remainder": "__imod__", "pow": "__ipow__"}


@SETTINGS
@given(td=tensordicts(), name=st.sampled_from(sorted(IN_PLACE)), scalar=SCALARS, method=st.booleans())
def test_in_place_ops_keep_objects_or_leave_the_tensordict_unchanged(td, name, scalar, method):
    leaf_ids = {key: id(value) for key, value in tensor_leaves(td).items()}
    expected = expected_per_leaf(td, lambda leaf: getattr(leaf.clone(), f"{name}_")(scalar))
    before = snapshot(td)
    call = (lambda: getattr(td, f"{name}_")(scalar)) if method else (lambda: getattr(td, IN_PLACE[name])(scalar))
    if isinstance(expected, Exception):
        with pytest.raises(type(expected)):
            call()
        assert_same_snapshot(before, snapshot(td))
        return
    assert call() is td
    for key, value in tensor_leaves(td).items():
        assert id(value) == leaf_ids[key]
        assert_same_tensor(value, expected[key], key)


def test_int_plus_half_in_place_raises_torch_error_and_changes_nothing():
    td = TensorDict(f=torch.ones(3), i=torch.ones(3, dtype=torch.long), batch_size=[3])
    before = snapshot(td)
    with pytest.raises(RuntimeError, match="result type Float can't be cast to the desired output type Long"):
        td += 0.5
    assert_same_snapshot(before, snapshot(td))
    assert (td + 0.5)["i"].dtype == torch.float32


def test_in_place_returns_the_same_tensordict_and_leaves_even_when_locked():
    td = TensorDict(a=torch.zeros(2), sub={"b": torch.zeros(2)}, batch_size=[2]).lock_()
    leaf = td["a"]
    alias = td
    td += 1
    td.mul_(3)
    td.add_(TensorDict(a=torch.ones(2), sub={"b": torch.ones(2)}, batch_size=[2]), alpha=2)
    td.sub_(torch.tensor([1.0, 0.0]))
    assert td is alias and td["a"] is leaf
    assert torch.equal(td["a"], torch.tensor([4.0, 5.0])) and torch.equal(td["sub", "b"], torch.tensor([4.0, 5.0]))


def test_a_tensor_held_under_several_keys_changes_once():
    td = TensorDict.fromkeys(["a", "b", "c"], 0)
    td += 1
    assert (td == 1).all()
    shared = torch.zeros(2)
    other = TensorDict(a=shared, b=shared)
    other.add_(1)
    other.apply_(lambda x: x + 1)
    assert torch.equal(shared, torch.full((2,), 2.0))


def test_in_place_broadcast_that_would_grow_a_leaf_raises_before_writing():
    td = TensorDict(a=torch.zeros(3), b=torch.zeros(3, 2), batch_size=[3])
    before = snapshot(td)
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        td += torch.ones(4, 3)
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        td.add_(TensorDict(a=torch.ones(3, 5), b=torch.ones(3, 2), batch_size=[3]))
    assert_same_snapshot(before, snapshot(td))


@SETTINGS
@given(td=tensordicts(), name=st.sampled_from(["exp", "neg", "abs", "sqrt", "sigmoid", "floor", "reciprocal",
                                              "logical_not", "zero"]))
def test_unary_in_place(td, name):
    expected = expected_per_leaf(td, lambda leaf: getattr(leaf.clone(), f"{name}_")())
    before = snapshot(td)
    if isinstance(expected, Exception):
        with pytest.raises(type(expected)):
            getattr(td, f"{name}_")()
        assert_same_snapshot(before, snapshot(td))
        return
    assert getattr(td, f"{name}_")() is td
    for key, value in tensor_leaves(td).items():
        assert_same_tensor(value, expected[key], key)


# --------------------------------------------------------------------------- clamp, lerp, where, masked_fill, fill


def test_clamp_with_numbers_tensors_and_tensordicts():
    td = TensorDict(a=torch.tensor([[-2.0, 0.5], [3.0, 1.0], [0.0, -1.0]]), batch_size=[3])
    assert torch.equal(td.clamp(-1, 1)["a"], td["a"].clamp(-1, 1))
    assert torch.equal(td.clamp(min=0)["a"], td["a"].clamp(min=0))
    low = torch.tensor([0.0, 2.0, -0.5])
    assert torch.equal(td.clamp(low, 2.5)["a"], torch.clamp_max(torch.clamp_min(td["a"], low[:, None]), 2.5))
    bound = TensorDict(a=torch.zeros(3, 2), batch_size=[3])
    assert torch.equal(td.clamp(max=bound)["a"], td["a"].clamp(max=0))
    assert td.clamp_(-1, 1) is td and td["a"].abs().max() <= 1
    with pytest.raises(RuntimeError, match="At least one"):
        td.clamp()
    assert torch.equal(torch.clamp(td, 0, 0.5)["a"], td["a"].clamp(0, 0.5))


def test_clamp_in_place_on_ints_with_float_bounds_raises_and_changes_nothing():
    td = TensorDict(f=torch.ones(2), i=torch.ones(2, dtype=torch.long))
    before = snapshot(td)
    with pytest.raises(RuntimeError):
        td.clamp_(0.5, 0.7)
    assert_same_snapshot(before, snapshot(td))


def test_lerp_maximum_minimum():
    start = TensorDict(a=torch.zeros(2, 3), batch_size=[2])
    end = TensorDict(a=torch.full((2, 3), 4.0), batch_size=[2])
    assert torch.equal(start.lerp(end, 0.25)["a"], torch.full((2, 3), 1.0))
    weight = torch.tensor([0.0, 0.5])
    assert torch.equal(start.lerp(end, weight)["a"][:, 0], torch.tensor([0.0, 2.0]))
    assert start.lerp_(end, 0.5) is start and torch.equal(start["a"], torch.full((2, 3), 2.0))
    assert torch.equal(start.maximum(end)["a"], end["a"]) and torch.equal(start.minimum(end)["a"], start["a"])
    assert torch.equal(torch.maximum(start, end)["a"], end["a"])


def test_where_and_masked_fill_broadcast_the_condition_from_the_left():
    td = TensorDict(a=torch.arange(6.0).view(3, 2), sub={"b": torch.ones(3, 2, 2)}, text="t", batch_size=[3])
    condition = torch.tensor([True, False, True])
    result = td.where(condition, 0)
    assert torch.equal(result["a"], torch.where(condition[:, None], td["a"], 0.0))
    assert torch.equal(result["sub", "b"], torch.where(condition[:, None, None], td["sub", "b"], 0.0))
    assert result["text"] == "t"
    other = td * 10
    assert torch.equal(torch.where(condition, td, other)["a"], torch.where(condition[:, None], td["a"], other["a"]))
    assert torch.equal(torch.where(condition, 0, td)["a"], torch.where(condition[:, None], 0.0, td["a"]))
    assert torch.equal(td.where(condition, torch.tensor([7.0, 8.0, 9.0]))["a"][:, 0], torch.tensor([0.0, 8.0, 4.0]))
    filled = td.masked_fill(condition, -1)
    assert torch.equal(filled["a"], td["a"].masked_fill(condition[:, None], -1))
    leaf = td["a"]
    assert td.masked_fill_(~condition, 5) is td and td["a"] is leaf
    assert torch.equal(td["a"][1], torch.tensor([5.0, 5.0]))
    positive = td > 2
    assert torch.equal(torch.where(positive, td, 0)["a"], torch.where(td["a"] > 2, td["a"], 0.0))
    with pytest.raises(RuntimeError, match="broadcast"):
        td.where(torch.ones(4, dtype=torch.bool), 0)
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        td[:1].where(torch.ones(3, dtype=torch.bool), 0)  # would grow the batch
    elementwise = td["a"] > 2  # a condition that also covers the feature dims
    assert torch.equal(td.exclude("sub").where(elementwise, 0)["a"], torch.where(elementwise, td["a"], 0.0))


def test_where_pad_fills_missing_keys():
    td = TensorDict(a=torch.ones(2), b=torch.ones(2), batch_size=[2])
    other = TensorDict(a=torch.zeros(2), batch_size=[2])
    result = td.where(torch.tensor([False, True]), other, pad=-1)
    assert torch.equal(result["b"], torch.tensor([-1.0, 1.0]))


def test_fill_and_zero():
    td = TensorDict(a=torch.ones(2), sub={"b": torch.ones(2, dtype=torch.long)}, batch_size=[2]).lock_()
    assert td.fill_("a", 3) is td and torch.equal(td["a"], torch.full((2,), 3.0))
    td.fill_("sub", 7)
    assert torch.equal(td["sub", "b"], torch.full((2,), 7))
    leaf = td["a"]
    assert td.zero_() is td and td["a"] is leaf and not td.any()
    with pytest.raises(KeyError):
        td.fill_("missing", 1)


# --------------------------------------------------------------------------- all / any


def test_all_and_any():
    td = TensorDict(a=torch.tensor([[True, True], [True, False]]), b=torch.ones(2), text="x", batch_size=[2])
    assert td.all() is False and td.any() is True
    assert TensorDict(a=torch.ones(2)).all() is True and TensorDict().all() is True and TensorDict().any() is False
    per_row = td.all(0)
    assert torch.equal(per_row["a"], td["a"].all(0)) and per_row.batch_size == torch.Size([])
    assert torch.equal(td.any(-1)["b"], td["b"].bool().any(-1))
    with pytest.raises(RuntimeError, match="Incompatible dim 1"):
        td.all(1)
    with pytest.raises(IndexError):
        td.any(2)
    assert torch.all(td) is False


# --------------------------------------------------------------------------- reductions

REDUCTIONS = ["sum", "mean", "nansum", "nanmean", "prod", "std", "var", "amax", "amin", "max", "min"]


@st.composite
def reduction_cases(draw):
    td = draw(tensordicts(non_tensor=True))
    n_batch = td.batch_dims
    choice = draw(st.sampled_from(["none", "int", "tuple"])) if n_batch else "none"
    if choice == "none":
        dim = None
    elif choice == "int":
        dim = draw(st.integers(-n_batch, n_batch - 1))
    else:
        dim = tuple(draw(st.lists(st.integers(0, n_batch - 1), min_size=1, max_size=n_batch, unique=True)))
    return td, dim, draw(st.booleans())


def torch_reduction(name, leaf, dims, keepdim):
    """The reference: torch over ``dims`` (None: the whole leaf)."""
    if dims is None:
        result = getattr(torch, name)(leaf)
        return result.reshape((1,) * leaf.ndim) if keepdim else result
    if name in ("max", "min"):
        if len(dims) == 1:
            return getattr(torch, name)(leaf, dims[0], keepdim=keepdim)
        return None  # several dims: checked separately
    if name == "prod":
        for dim in sorted(dims, reverse=True):
            leaf = torch.prod(leaf, dim, keepdim=keepdim)
        return leaf
    return getattr(torch, name)(leaf, dim=dims, keepdim=keepdim)


@pytest.mark.filterwarnings("ignore:std\\(\\)|var\\(\\)")  # one element: torch warns about the degrees of freedom
@SETTINGS
@given(case=reduction_cases(), name=st.sampled_from(REDUCTIONS))
def test_reductions_equal_torch_on_every_leaf(case, name):
    td, dim, keepdim = case
    n_batch = td.batch_dims
    dims = None if dim is None else tuple(sorted(d % n_batch for d in ((dim,) if isinstance(dim, int) else dim)))
    if name in ("max", "min") and dims is not None and len(dims) > 1:
        return
    expected = expected_per_leaf(td, lambda leaf: torch_reduction(name, leaf, dims, keepdim))
    call = (lambda: getattr(td, name)(keepdim=keepdim)) if dim is None else (
        lambda: getattr(td, name)(dim, keepdim=keepdim))
    if isinstance(expected, Exception):
        with pytest.raises(type(expected)):
            call()
        return
    result = call()
    if dims is None:
        batch = torch.Size([1] * n_batch if keepdim else [])
    else:
        batch = torch.Size([1 if d in dims else s for d, s in enumerate(td.batch_size)] if keepdim
                           else [s for d, s in enumerate(td.batch_size) if d not in dims])
    if name in ("max", "min") and dims is not None:
        assert isinstance(result, getattr(torch.return_types, name))
        for key, value in expected.items():
            assert_same_tensor(result.values.get(key), value.values, key)
            assert_same_tensor(result.indices.get(key), value.indices, key)
        assert result.values.batch_size == batch
        return
    assert result.batch_size == batch
    for key, value in expected.items():
        assert_same_tensor(result.get(key), value, key)
    for key, leaf in non_tensor_leaves(td).items():
        if isinstance(leaf, NonTensorData):
            assert result.get(key).data == leaf.data and result.get(key).batch_size == batch
        else:
            assert key not in result.keys(include_nested=True)


def test_max_over_several_dims_gives_flat_indices():
    leaf = torch.tensor([[1.0, 9.0, 3.0], [4.0, 5.0, 6.0]])
    result = TensorDict(a=leaf, batch_size=[2, 3]).max((0, 1))
    assert result.values["a"] == 9.0 and result.indices["a"] == 1
    kept = TensorDict(a=leaf, batch_size=[2, 3]).min((0, 1), keepdim=True)
    assert kept.values.batch_size == torch.Size([1, 1]) and kept.indices["a"].item() == 0


def test_reductions_accept_dtype_correction_feature_and_reduce():
    td = TensorDict(a=torch.arange(6.0).view(3, 2), i=torch.arange(3), batch_size=[3])
    assert td.sum(0, dtype=torch.float64)["i"].dtype == torch.float64
    assert torch.equal(td.float().std(0, correction=0)["a"], td["a"].std(0, correction=0))
    assert torch.equal(td.sum(dim="feature")["a"], td["a"].sum(-1))
    assert torch.equal(td.sum(dim="feature")["i"], td["i"])
    assert td.sum(reduce=True) == td["a"].sum() + td["i"].sum()
    pooled = torch.cat([td["a"], td["i"][:, None].float()], dim=-1)
    assert torch.equal(td.float().mean(0, reduce=True), pooled.mean())
    with pytest.raises(IndexError, match="Incompatible dim 1 for tensordict with batch dims 1."):
        td.sum(1)
    with pytest.raises(RuntimeError, match="Incompatible dim -2"):
        td.mean(-2)
    with pytest.raises(ValueError):
        td.sum(dim="features")


def test_reductions_of_nested_tensordicts_follow_their_batch():
    td = TensorDict(a=torch.ones(3, 4), sub=TensorDict(x=torch.ones(3, 4, 2), batch_size=[3, 4]), batch_size=[3])
    assert td.sum(0)["sub"].batch_size == torch.Size([4])
    assert td.sum()["sub"].batch_size == torch.Size([])
    assert torch.equal(td.sum()["sub", "x"], torch.tensor(24.0))
    assert torch.sum(td, 0)["a"].shape == torch.Size([4])


# --------------------------------------------------------------------------- torch functions, autograd, docs


def test_torch_functions_dispatch_to_the_methods():
    td = TensorDict(a=torch.tensor([1.0, -2.0]), batch_size=[2])
    assert torch.equal(torch.add(td, 1)["a"], td["a"] + 1)
    assert torch.equal(torch.sub(torch.ones(2), td, alpha=2)["a"], torch.sub(torch.ones(2), td["a"], alpha=2))
    assert torch.equal(torch.exp(td)["a"], td["a"].exp())
    assert torch.equal(torch.mean(td)["a"], td["a"].mean())
    assert torch.equal(torch.eq(td, 1)["a"], td["a"] == 1)
    assert torch.equal((torch.ones(2) - td)["a"], torch.ones(2) - td["a"])


def test_gradients_flow_through_foreach_ops():
    weight = torch.ones(3, requires_grad=True)
    td = TensorDict(w=weight, v={"u": weight * 2})
    ((td * 3 + 1).sum()["w"] + (td * 3).sum()["v", "u"]).backward()
    assert torch.equal(weight.grad, torch.full((3,), 9.0))


def test_docstring_examples_run():
    for module in (torchdict._ops, torchdict._masking, torchdict._reductions):
        failures, _ = doctest.testmod(module, extraglobs={"torch": torch, "TensorDict": TensorDict},
                                      optionflags=doctest.ELLIPSIS)
        assert failures == 0, module.__name__


def test_where_chooses_non_tensor_entries_element_by_element():
    first = TensorDict(x=torch.zeros(3), s="a", n={"t": "p"}, batch_size=[3])
    second = TensorDict(x=torch.ones(3), s="b", n={"t": "q"}, batch_size=[3])
    condition = torch.tensor([True, False, True])
    before = (snapshot(first), snapshot(second))
    result = torch.where(condition, first, second)
    assert result["s"] == ["a", "b", "a"] and result["n", "t"] == ["p", "q", "p"]
    assert torch.equal(result["x"], torch.where(condition, first["x"], second["x"]))
    assert torch.where(condition, second, first)["s"] == ["b", "a", "b"]
    same = TensorDict(x=torch.ones(3), s="a", n={"t": "p"}, batch_size=[3])
    assert torch.where(condition, first, same)["s"] == "a"  # one value everywhere stays one value
    assert_same_snapshot(before[0], snapshot(first))
    assert_same_snapshot(before[1], snapshot(second))


def test_comparing_with_a_dict_compares_with_the_tensordict_it_makes():
    # As upstream: a dict operand of a comparison becomes a TensorDict (with the batch when its
    # values have it, else none, broadcasting like a number); different keys are upstream's KeyError.
    td = TensorDict({"a": torch.arange(12.0).view(4, 3), "n": {"b": torch.ones(4)}}, batch_size=[4])
    same = (td == {"a": torch.arange(12.0).view(4, 3), "n": {"b": torch.ones(4)}})
    assert same.batch_size == td.batch_size and same.all()
    below = td < {"a": 6, "n": {"b": 2}}
    assert torch.equal(below["a"], td["a"] < 6) and below["n", "b"].all()
    with pytest.raises(KeyError, match="keys in tensordicts mismatch"):
        td == {"z": 1}
