"""The smaller upstream methods of ``_extras.py`` (and maximum_/minimum_/mod/rsub of ``_ops.py``).

Each test states a behaviour against plain torch applied to each leaf, or against the
equivalent existing TensorDict op; failing calls must raise upstream's exception type
and leave the TensorDict unchanged.
"""
from __future__ import annotations

import pytest
import torch

from torchdict import LazyStackedTensorDict, NonTensorData, TensorDict, tensorclass

from _helpers import assert_same_snapshot, snapshot


def sample() -> TensorDict:
    return TensorDict(
        a=torch.arange(6.0).view(3, 2),
        b={"c": torch.arange(3.0) + 1, "s": "nested text"},
        s2="top text",
        batch_size=[3],
    )


def assert_leaves(result: TensorDict, expected: dict) -> None:
    for key, value in expected.items():
        assert torch.equal(result[key], value), key


# --------------------------------------------------------------------------- introspection


@pytest.mark.parametrize(
    "td, depth",
    [
        (TensorDict(a=torch.zeros(2)), 0),
        (TensorDict(a={"b": {"c": torch.zeros(2)}}), 2),
        (TensorDict(a={"b": "text"}), 1),  # non-tensor data counts as a leaf
        (TensorDict(a={"b": {}}, c=torch.zeros(1)), 0),  # an empty sub-TensorDict doesn't count
        (TensorDict(), 0),
    ],
)
def test_depth_counts_levels_above_the_deepest_leaf(td, depth):
    assert td.depth == depth


def test_dtype_is_the_common_leaf_dtype_or_none():
    assert sample().dtype == torch.float32  # non-tensor entries are ignored
    assert TensorDict(a=torch.zeros(2), b={"c": torch.zeros(2, dtype=torch.int64)}).dtype is None
    assert TensorDict().dtype is None
    assert TensorDict(s="text").dtype is None


def test_is_floating_point_needs_every_leaf_floating():
    assert sample().is_floating_point()
    assert not TensorDict(a=torch.zeros(2), b={"c": torch.zeros(2, dtype=torch.int64)}).is_floating_point()
    assert TensorDict().is_floating_point()


def test_device_type_properties_follow_the_tensordict_device():
    assert TensorDict(a=torch.zeros(2), device="cpu").is_cpu
    assert not TensorDict(a=torch.zeros(2)).is_cpu  # no device: on none, as upstream
    assert not TensorDict(a=torch.zeros(2), device="cpu").is_cuda
    meta = TensorDict(a=torch.zeros(2, device="meta"), device="meta")
    assert meta.is_meta and not meta.is_cpu


# --------------------------------------------------------------------------- addcmul / addcdiv


@pytest.mark.parametrize("name", ["addcmul", "addcdiv"])
def test_addc_ops_equal_the_torch_op_per_leaf(name):
    td, first, second = sample(), sample() * 2, sample() + 1
    result = getattr(td, name)(first, second, value=0.5)
    function = getattr(torch, name)
    assert_leaves(result, {key: function(td[key], first[key], second[key], value=0.5)
                           for key in ("a", ("b", "c"))})
    assert result["s2"] == "top text"


def test_addcmul_tensor_operands_broadcast_from_the_left_over_the_batch():
    td = sample()
    result = td.addcmul(torch.arange(3.0), torch.ones(3))
    assert torch.equal(result["a"], td["a"] + torch.arange(3.0)[:, None])


def test_addcdiv_value_is_positional_like_upstream():
    td = sample()
    assert torch.equal(td.addcdiv(td, td + 1, 2)["a"], torch.addcdiv(td["a"], td["a"], td["a"] + 1, value=2))


def test_addc_ops_keep_the_lock():
    assert sample().lock_().addcmul(sample(), sample()).is_locked


@pytest.mark.parametrize("name", ["addcmul", "addcdiv"])
def test_addc_ops_in_place_write_into_the_same_leaves(name):
    td, first, second = sample(), sample() * 2, sample() + 1
    expected = getattr(td, name)(first, second, value=3)
    leaf = td["a"]
    assert getattr(td, f"{name}_")(first, second, value=3) is td
    assert td["a"] is leaf
    assert_leaves(td, {key: expected[key] for key in ("a", ("b", "c"))})


def test_addcdiv_in_place_on_integers_raises_and_changes_nothing():
    td = TensorDict(a=torch.zeros(3), b=torch.arange(3))  # the float leaf comes first
    before = snapshot(td)
    with pytest.raises(RuntimeError, match="Integer division"):
        td.addcdiv_(td, td + 1)
    assert_same_snapshot(before, snapshot(td))


def test_addcmul_with_mismatched_keys_is_a_key_error():
    with pytest.raises(KeyError, match="keys in tensordicts mismatch"):
        sample().addcmul(TensorDict(a=torch.ones(3, 2), batch_size=[3]), sample())


# --------------------------------------------------------------------------- maximum_ / minimum_ / mod / rsub


def test_maximum_and_minimum_in_place_equal_the_out_of_place_ops():
    td, other = sample(), sample().mul(0).add(2.5)
    expected_max, expected_min = td.maximum(other), td.minimum(other)
    leaf = td["a"]
    assert td.maximum_(other) is td and td["a"] is leaf
    assert_leaves(td, {key: expected_max[key] for key in ("a", ("b", "c"))})
    assert_leaves(sample().minimum_(2.5), {"a": torch.clamp_max(sample()["a"], 2.5)})
    assert_leaves(sample().minimum_(torch.tensor(2.5)), {"a": expected_min["a"]})


def test_maximum_in_place_that_cannot_cast_changes_nothing():
    td = TensorDict(a=torch.zeros(3), b=torch.arange(3))
    before = snapshot(td)
    with pytest.raises(RuntimeError, match="can't be cast"):
        td.maximum_(1.5)
    assert_same_snapshot(before, snapshot(td))


def test_mod_is_remainder_with_no_in_place_form():
    td = TensorDict(a=torch.tensor([-3.0, 3.0]))
    assert torch.equal(td.mod(2)["a"], torch.remainder(td["a"], 2))
    assert not hasattr(TensorDict, "mod_")


def test_rsub_subtracts_self_from_other():
    td = sample()
    assert torch.equal(td.rsub(10, alpha=2)["a"], torch.rsub(td["a"], 10, alpha=2))
    assert torch.equal(td.rsub(td * 3)["a"], td["a"] * 2)
    assert torch.equal(torch.rsub(td, 1)["a"], 1 - td["a"])


# --------------------------------------------------------------------------- softmax


def test_softmax_runs_along_a_batch_dim():
    td = TensorDict(a=torch.randn(3, 4), b=torch.randn(3, 4, 5), batch_size=[3, 4])
    result = td.softmax(-1)  # the last *batch* dim, not the last dim of each leaf
    assert torch.allclose(result["a"], td["a"].softmax(1))
    assert torch.allclose(result["b"], td["b"].softmax(1))
    assert td.softmax(0, dtype=torch.float64)["a"].dtype == torch.float64


def test_softmax_past_the_batch_is_an_index_error():
    with pytest.raises(IndexError, match="Incompatible dim 2 for tensordict"):
        TensorDict(a=torch.zeros(3, 4), batch_size=[3, 4]).softmax(2)


# --------------------------------------------------------------------------- structure helpers


def test_get_item_shape_is_the_tensor_shape_or_the_batch_size():
    td = sample()
    assert td.get_item_shape("a") == td["a"].shape
    assert td.get_item_shape("b") == td["b"].batch_size
    assert td.get_item_shape(("b", "s")) == torch.Size([3])


def test_get_item_shape_of_a_missing_key_is_a_key_error():
    with pytest.raises(KeyError, match="not found"):
        sample().get_item_shape("missing")


def test_non_tensor_items_lists_the_non_tensor_entries():
    td = sample()
    top = td.non_tensor_items()
    assert [key for key, _ in top] == ["s2"] and isinstance(top[0][1], NonTensorData)
    assert [key for key, _ in td.non_tensor_items(include_nested=True)] == [("b", "s"), "s2"]


def test_filter_empty_deletes_empty_sub_tensordicts_at_every_level():
    td = TensorDict(a=torch.zeros(3), e={}, f={"g": {}}, h={"i": {}, "j": torch.zeros(3)}, batch_size=[3])
    assert td.filter_empty_() is td
    assert list(td.keys(include_nested=True)) == ["a", ("h", "j"), "h"]


def test_filter_empty_on_a_locked_tensordict_raises_and_changes_nothing():
    td = TensorDict(a=torch.zeros(3), e={}, batch_size=[3]).lock_()
    with pytest.raises(RuntimeError, match="Cannot modify locked TensorDict"):
        td.filter_empty_()
    assert "e" in td.keys()


def test_create_nested_puts_an_empty_tensordict_like_its_parent():
    td = TensorDict(a=torch.zeros(3, 4), batch_size=[3, 4], names=["x", "y"])
    assert td.create_nested(("n", "m")) is td
    assert td["n", "m"].batch_size == td.batch_size and td["n", "m"].is_empty()
    assert td["n"].names == ["x", "y"]


def test_create_nested_replaces_what_is_at_the_key():
    td = sample().create_nested("a").create_nested(("b", "c", "d"))
    assert td["a"].is_empty() and list(td["b", "c"].keys()) == ["d"]


def test_create_nested_on_a_locked_tensordict_raises():
    td = sample().lock_()
    with pytest.raises(RuntimeError, match="Cannot modify locked TensorDict"):
        td.create_nested("x")
    assert "x" not in td.keys()


def test_replace_gives_an_updated_shallow_copy():
    td = sample().lock_()
    new = td.replace({"a": torch.ones(3, 2)}, b={"x": torch.zeros(3)})
    assert torch.equal(new["a"], torch.ones(3, 2)) and torch.equal(td["a"], sample()["a"])
    assert new["b", "c"] is td["b", "c"] and "x" not in td["b"].keys()  # merged as update() merges
    assert not new.is_locked
    assert (new == td.copy().update({"a": torch.ones(3, 2), "b": {"x": torch.zeros(3)}})).all()


def test_replace_takes_one_positional_mapping():
    with pytest.raises(RuntimeError, match="Only a single argument"):
        sample().replace({}, {})


# --------------------------------------------------------------------------- lazy stacking


def test_to_lazystack_stacks_the_slices_lazily():
    td = TensorDict(a=torch.arange(12.0).view(3, 4), batch_size=[3, 4])
    lazy = td.to_lazystack(1)
    assert isinstance(lazy, LazyStackedTensorDict) and lazy.stack_dim == 1 and len(lazy.tensordicts) == 4
    assert torch.equal(lazy.contiguous()["a"], td["a"])


def test_to_lazystack_without_batch_dims_is_an_index_error():
    with pytest.raises(IndexError, match="Incompatible dim 0 for tensordict"):  # upstream: "with batch dims 0"
        TensorDict(a=torch.zeros(3)).to_lazystack()


def test_stack_classmethods_delegate_to_the_lazy_module():
    stacked = TensorDict.lazy_stack([sample(), sample()])
    assert isinstance(stacked, LazyStackedTensorDict) and stacked.batch_size == torch.Size([2, 3])
    assert type(TensorDict.maybe_dense_stack([sample(), sample()], 1)) is TensorDict
    exclusive = [TensorDict(a=torch.zeros(2)), TensorDict(b=torch.zeros(2))]
    assert isinstance(TensorDict.maybe_dense_stack(exclusive), LazyStackedTensorDict)


# --------------------------------------------------------------------------- gradients


def with_grads() -> TensorDict:
    td = TensorDict(x=torch.ones(3, requires_grad=True), n={"z": torch.ones(3, requires_grad=True)},
                    i=torch.zeros(3, dtype=torch.int64), batch_size=[3])
    (td["x"] * 2).sum().backward()
    return td


def test_grad_holds_the_leaves_that_have_one():
    td = with_grads()
    grad = td.grad
    assert list(grad.keys(include_nested=True)) == ["x"]  # no "n": its only leaf has no grad
    assert grad["x"] is td["x"].grad
    assert TensorDict(x=torch.ones(3, requires_grad=True)).grad is None


def test_grad_of_a_locked_tensordict_is_locked():
    assert with_grads().lock_().grad.is_locked


def test_grad_setter_sets_or_copies_into_each_leaf_grad():
    td = TensorDict(x=torch.ones(3, requires_grad=True), batch_size=[3])
    td.grad = TensorDict(x=torch.full((3,), 5.0), batch_size=[3])
    kept = td["x"].grad
    td.grad = TensorDict(x=torch.full((3,), 7.0), batch_size=[3])
    assert td["x"].grad is kept and torch.equal(kept, torch.full((3,), 7.0))


def test_zero_grad_zeroes_or_drops_the_grads():
    td = with_grads()
    assert td.zero_grad(set_to_none=False) is td
    assert torch.equal(td["x"].grad, torch.zeros(3))
    td.zero_grad()
    assert td["x"].grad is None and td.grad is None


# --------------------------------------------------------------------------- batch shape and casts


def test_broadcast_to_equals_expand():
    td = sample()
    assert (td.broadcast_to((2, 3)) == td.expand(2, 3)).all()
    assert td.broadcast_to((-1,)).batch_size == td.batch_size
    with pytest.raises(RuntimeError):
        td.broadcast_to((4,))


@pytest.mark.parametrize("ndim", [1, 2, 3])
def test_atleast_adds_leading_batch_dims(ndim):
    method = f"atleast_{ndim}d"
    scalar = TensorDict(a=torch.zeros(()))
    assert getattr(scalar, method)().batch_size == torch.Size([1] * ndim)
    td = sample()
    result = getattr(td, method)()
    assert result.batch_size == torch.Size([1] * (ndim - 1) + [3])
    assert torch.equal(result["a"], td["a"].reshape(result.batch_size + (2,)))


def test_atleast_returns_self_when_there_are_enough_batch_dims():
    td = sample()
    assert td.atleast_1d() is td


def test_atleast_writes_back_in_a_with_block():
    td = TensorDict(a=torch.zeros(3), batch_size=[3])
    with td.atleast_2d() as wide:
        wide["b"] = torch.ones(1, 3)
    assert torch.equal(td["b"], torch.ones(3))


@pytest.mark.parametrize("name", ["uint16", "uint32", "uint64"])
def test_unsigned_casts_equal_to(name):
    td = TensorDict(a=torch.arange(3), b={"c": torch.ones(3)})
    cast, expected = getattr(td, name)(), td.to(getattr(torch, name))
    assert cast.dtype == expected.dtype == getattr(torch, name)
    assert (cast.to(torch.int64) == expected.to(torch.int64)).all()


# --------------------------------------------------------------------------- tensorclasses


@tensorclass
class Point:
    xy: torch.Tensor
    label: str


def test_tensorclasses_get_the_new_methods():
    point = Point(xy=torch.ones(3, 2), label="p", batch_size=[3])
    assert point.depth == 0 and point.dtype == torch.float32
    assert type(point.addcmul(point, point)) is Point
    assert point.get_item_shape("xy") == torch.Size([3, 2])  # a shape, not rewrapped
    assert type(point.atleast_2d()) is Point and point.atleast_2d().batch_size == torch.Size([1, 3])
