"""Operations used as context managers write what the block did back to their parent.

Every op in OPS is checked against the same edits done by hand on the parent
with plain torch: for an op whose result lays the batch out differently, the
hand-made value is the child's value mapped back with the torch op that undoes
the layout change (e.g. ``t.transpose(0, 1)`` for ``permute(1, 0)``).
"""
from __future__ import annotations

import gc
import math
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import pytest
import torch

from torchdict import TensorDict
from torchdict._context import write_back

from _helpers import assert_same_snapshot, snapshot

LOCKED = "Cannot modify locked TensorDict"


def make_parent(batch: tuple) -> TensorDict:
    """Leaves of several kinds: float and int tensors, a nested TensorDict (two levels), a sub-TensorDict
    with an extra batch dim, and non-tensor data."""
    n = math.prod(batch)

    def ramp(*feature: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.arange(n * math.prod(feature), dtype=torch.float32) * scale).reshape(*batch, *feature)

    return TensorDict(
        {
            "x": ramp(4),
            "y": ramp(scale=10.0),
            "i": torch.arange(n).reshape(batch),
            "n": {"z": ramp(5, scale=-1.0), "deep": {"w": ramp(2, scale=0.5)}},
            "m": TensorDict({"u": ramp(2, 3)}, batch_size=(*batch, 2)),
            "s": "hello",
        },
        batch_size=batch,
    )


def make_flat_parent(batch: tuple) -> TensorDict:
    """For unflatten_keys: dotted keys, plus one real sub-TensorDict that itself holds a dotted key."""
    n = math.prod(batch)
    ramp = torch.arange(n * 3, dtype=torch.float32).reshape(*batch, 3)
    return TensorDict(
        {"x": ramp.clone(), "n.z": ramp * 2, "n.deep.w": ramp * 3, "r": {"p.q": ramp * 4}, "s": "hello"},
        batch_size=batch,
    )


def _keep_trailing(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[..., torch.Tensor]:
    return lambda tensor, new=False: fn(tensor)


@dataclass
class Op:
    """An op used as a context manager, and how to express the child's edits on the parent by hand."""

    name: str
    apply: Callable[[TensorDict], TensorDict]
    batch: tuple = (2, 3)
    parent: Callable[[tuple], TensorDict] = make_parent
    back: Callable[..., torch.Tensor] = _keep_trailing(lambda t: t)  # child-layout tensor -> parent layout
    key: Callable[[Any], Any] = lambda key: key  # child key -> parent key
    existing: Any = "x"  # a tensor leaf of the child to edit / replace
    new: Any = ("n", "new")  # a key to add in the child
    delete: Any = "y"  # a key to delete in the child
    delete_nested: Any = "n"  # a sub-TensorDict to delete in the child (None: the op's child has none)

    def __repr__(self) -> str:
        return self.name


def _untranspose(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(0, 1)


def _cast_back(t: torch.Tensor, new: bool = False) -> torch.Tensor:
    return t if new else t.to(torch.float32)


OPS = [
    Op("flatten_keys", lambda td: td.flatten_keys(), key=lambda key: tuple(key.split(".")),
       existing="n.z", new="n.new", delete="n.deep.w", delete_nested=None),
    Op("flatten_keys(sep)", lambda td: td.flatten_keys("/"), key=lambda key: tuple(key.split("/")),
       existing="n.deep.w".replace(".", "/"), new="n/deep/new", delete="x", delete_nested=None),
    Op("unflatten_keys", lambda td: td.unflatten_keys(), parent=make_flat_parent,
       key=lambda key: ".".join(key) if isinstance(key, tuple) else key,
       existing=("n", "z"), new=("n", "new"), delete=("n", "deep", "w"), delete_nested=("n", "deep")),
    Op("permute", lambda td: td.permute(1, 0), back=_keep_trailing(_untranspose)),
    Op("permute(list)", lambda td: td.permute([-1, 0]), back=_keep_trailing(_untranspose)),
    Op("transpose", lambda td: td.transpose(0, 1), back=_keep_trailing(_untranspose)),
    Op("swapaxes", lambda td: td.swapaxes(1, 0), back=_keep_trailing(_untranspose)),
    Op("movedim", lambda td: td.movedim(0, 2), batch=(2, 3, 4),
       back=_keep_trailing(lambda t: t.movedim(2, 0))),
    Op("view", lambda td: td.view(-1), back=_keep_trailing(lambda t: t.reshape(2, 3, *t.shape[1:]))),
    Op("view(3, 2)", lambda td: td.view(3, 2), back=_keep_trailing(lambda t: t.reshape(2, 3, *t.shape[2:]))),
    Op("flatten", lambda td: td.flatten(0, 1), back=_keep_trailing(lambda t: t.reshape(2, 3, *t.shape[1:]))),
    Op("unflatten", lambda td: td.unflatten(1, (3, 1)), back=_keep_trailing(lambda t: t.flatten(1, 2))),
    Op("squeeze", lambda td: td.squeeze(1), batch=(2, 1, 3), back=_keep_trailing(lambda t: t.unsqueeze(1))),
    Op("squeeze()", lambda td: td.squeeze(), batch=(2, 1, 3), back=_keep_trailing(lambda t: t.unsqueeze(1))),
    Op("unsqueeze", lambda td: td.unsqueeze(-1), back=_keep_trailing(lambda t: t.squeeze(2))),
    Op("flip", lambda td: td.flip(1), back=_keep_trailing(lambda t: t.flip(1))),
    Op("swapdims", lambda td: td.swapdims(0, 1), back=_keep_trailing(_untranspose)),
    Op("moveaxis", lambda td: td.moveaxis(2, 0), batch=(2, 3, 4),
       back=_keep_trailing(lambda t: t.moveaxis(0, 2))),
    Op("roll", lambda td: td.roll(1, 0), back=_keep_trailing(lambda t: t.roll(-1, 0))),
    Op("roll(dims=None)", lambda td: td.roll(2), back=_keep_trailing(
        lambda t: t.reshape(6, *t.shape[2:]).roll(-2, 0).reshape(t.shape))),
    Op("roll(tuple)", lambda td: td.roll((1, 2), (0, 1)),
       back=_keep_trailing(lambda t: t.roll((-1, -2), (0, 1)))),
    Op("to(float64)", lambda td: td.to(torch.float64), back=_cast_back),
]

# Ops whose leaves are copies, not views: an in-place edit reaches the parent only through write-back.
COPYING = {"to(float64)", "flip", "roll", "roll(dims=None)", "roll(tuple)"}


def _value(shape: torch.Size, dtype: torch.dtype, offset: float = 100.0) -> torch.Tensor:
    return (torch.arange(math.prod(shape), dtype=torch.float64) + offset).reshape(shape).to(dtype)


def assert_same_td(actual: TensorDict, expected: TensorDict) -> None:
    """Same keys (in every sub-TensorDict), batch sizes, and equal leaves of the same dtype and shape."""
    assert actual.batch_size == expected.batch_size
    assert sorted(actual.keys()) == sorted(expected.keys())
    for key in expected.keys():
        got, want = actual.get(key), expected.get(key)
        assert type(got) is type(want), key
        if isinstance(want, torch.Tensor):
            assert got.dtype == want.dtype and got.shape == want.shape, key
            assert torch.equal(got, want), key
        elif isinstance(want, TensorDict):
            assert_same_td(got, want)
        else:
            assert got.data == want.data and got.batch_size == want.batch_size, key


def _twins(op: Op) -> tuple:
    return op.parent(op.batch), op.parent(op.batch)


# --------------------------------------------------------------------------- every op x every edit


@pytest.mark.parametrize("op", OPS, ids=repr)
def test_edit_in_place_reaches_parent(op: Op) -> None:
    td, by_hand = _twins(op)
    leaf = td.get(op.key(op.existing))
    with op.apply(td) as child:
        delta = _value(child[op.existing].shape, child[op.existing].dtype, offset=1.0)
        child[op.existing].add_(delta)
        if op.name in COPYING:
            assert torch.equal(td.get(op.key(op.existing)), by_hand.get(op.key(op.existing)))  # not yet
    by_hand.get(op.key(op.existing)).add_(op.back(delta))
    assert_same_td(td, by_hand)
    assert td.get(op.key(op.existing)) is leaf  # written into the parent's own tensor


@pytest.mark.parametrize("op", OPS, ids=repr)
def test_replaced_value_reaches_parent(op: Op) -> None:
    td, by_hand = _twins(op)
    with op.apply(td) as child:
        value = _value(child[op.existing].shape, child[op.existing].dtype)
        child[op.existing] = value
    by_hand[op.key(op.existing)] = op.back(value)
    assert_same_td(td, by_hand)


@pytest.mark.parametrize("op", OPS, ids=repr)
def test_new_key_reaches_parent_in_its_layout(op: Op) -> None:
    td, by_hand = _twins(op)
    with op.apply(td) as child:
        value = _value(child.batch_size + (2,), torch.float64)
        child[op.new] = value
        child["top"] = value[..., 0]
    by_hand[op.key(op.new)] = op.back(value, new=True)
    by_hand["top"] = op.back(value[..., 0], new=True)
    assert_same_td(td, by_hand)


@pytest.mark.parametrize("op", OPS, ids=repr)
def test_deleted_key_is_deleted_in_parent(op: Op) -> None:
    td, by_hand = _twins(op)
    with op.apply(td) as child:
        del child[op.delete]
    del by_hand[op.key(op.delete)]
    assert_same_td(td, by_hand)


@pytest.mark.parametrize("op", [op for op in OPS if op.delete_nested is not None], ids=repr)
def test_deleted_sub_tensordict_is_deleted_in_parent(op: Op) -> None:
    td, by_hand = _twins(op)
    with op.apply(td) as child:
        del child[op.delete_nested]
    if op.name == "unflatten_keys":
        # The child's sub-TensorDict ("n", "deep") stands for the parent's dotted keys below it.
        del by_hand["n.deep.w"]
    else:
        del by_hand[op.key(op.delete_nested)]
    assert_same_td(td, by_hand)


@pytest.mark.parametrize("op", OPS, ids=repr)
def test_replaced_sub_tensordict_replaces_parent_entry(op: Op) -> None:
    td, by_hand = _twins(op)
    with op.apply(td) as child:
        value = _value(child.batch_size + (2,), torch.float32)
        child["m"] = TensorDict({"only": value}, batch_size=child.batch_size)
    by_hand["m"] = TensorDict({"only": op.back(value, new=True)}, batch_size=op.batch)
    if op.name.startswith("flatten_keys"):
        # The flat child still holds the parent's "m.u", so the new "m" entries join it.
        by_hand = op.parent(op.batch)
        by_hand["m", "only"] = value
    elif op.name == "unflatten_keys":
        by_hand["m.only"] = by_hand.pop("m")["only"]  # a new sub-TensorDict comes back flat
    assert_same_td(td, by_hand)


@pytest.mark.parametrize("op", OPS, ids=repr)
def test_nested_manager_propagates_to_root(op: Op) -> None:
    td, by_hand = _twins(op)
    with op.apply(td) as child:
        with child.unsqueeze(0) as inner:
            delta = _value(inner[op.existing].shape, inner[op.existing].dtype, offset=1.0)
            inner[op.existing].add_(delta)
            value = _value(inner.batch_size + (2,), torch.float64)
            inner[op.new] = value
            del inner[op.delete]
    by_hand.get(op.key(op.existing)).add_(op.back(delta.squeeze(0)))
    by_hand[op.key(op.new)] = op.back(value.squeeze(0), new=True)
    del by_hand[op.key(op.delete)]
    assert_same_td(td, by_hand)


@pytest.mark.parametrize("op", OPS, ids=repr)
def test_exception_writes_nothing_back_and_propagates(op: Op) -> None:
    td, pristine = _twins(op)
    before = snapshot(td)
    error = ValueError("from the block")
    with pytest.raises(ValueError) as caught:
        with op.apply(td) as child:
            child[op.existing] = _value(child[op.existing].shape, child[op.existing].dtype)
            child[op.new] = _value(child.batch_size, torch.float32)
            del child[op.delete]
            if op.name in COPYING:
                child[op.existing].add_(1)  # a copy: this edit must not reach the parent either
            raise error
    assert caught.value is error
    assert_same_snapshot(before, snapshot(td))
    assert_same_td(td, pristine)


@pytest.mark.parametrize("op", OPS, ids=repr)
def test_nested_exception_writes_nothing_at_any_level(op: Op) -> None:
    td, pristine = _twins(op)
    with pytest.raises(KeyError, match="inner"):
        with op.apply(td) as child:
            with child.unsqueeze(0) as inner:
                inner[op.new] = _value(inner.batch_size, torch.float32)
                raise KeyError("inner")
    assert_same_td(td, pristine)


@pytest.mark.parametrize("op", OPS, ids=repr)
def test_untouched_block_changes_nothing(op: Op) -> None:
    td, pristine = _twins(op)
    leaves = {key: td.get(key) for key in td.keys(True, True)}
    with op.apply(td):
        pass
    assert_same_td(td, pristine)
    assert all(td.get(key) is leaf for key, leaf in leaves.items())


# --------------------------------------------------------------------------- the seed and the spec rows


def test_seed_example() -> None:
    td = TensorDict({"a": {"b": 0}})
    with td.flatten_keys() as tdflat:
        tdflat["a.b"] += 1
        tdflat["a.c"] = 0
    assert td["a", "b"] == 1 and td["a", "c"] == 0


def test_permute_then_flatten_keys_propagates_to_root() -> None:
    td = make_parent((2, 3))
    expected = td["n", "z"].clone()
    with td.permute(1, 0) as permuted:
        with permuted.flatten_keys() as flat:
            flat["n.z"] = flat["n.z"] * 2
            flat["n.t"] = torch.arange(6.0).view(3, 2)
    assert torch.equal(td["n", "z"], expected * 2)
    assert torch.equal(td["n", "t"], torch.arange(6.0).view(3, 2).T)


def test_new_key_under_permute_comes_back_transposed_as_a_view() -> None:
    td = TensorDict({"x": torch.zeros(2, 3)}, batch_size=[2, 3])
    value = torch.arange(6.0).view(3, 2)
    with td.permute(1, 0) as permuted:
        permuted["new"] = value
    assert td["new"].shape == (2, 3) and torch.equal(td["new"], value.T)
    assert td["new"].data_ptr() == value.data_ptr()  # no copy, like the transposed view upstream writes


def test_unflatten_keys_new_key_comes_back_flat() -> None:
    td = TensorDict({"a.b": torch.zeros(())})
    with td.unflatten_keys() as nested:
        nested["a", "z"] = torch.ones(())
    assert set(td.keys()) == {"a.b", "a.z"}


def test_flatten_keys_keeps_literal_separators_and_empty_sub_tensordicts() -> None:
    td = TensorDict({"a.b": torch.zeros(()), "a": {"c": torch.zeros(())}, "empty": {}})
    with td.flatten_keys() as flat:
        flat["a.b"] = torch.ones(())  # the parent's own key "a.b", not ("a", "b")
        flat["a.c"] += 2
    assert set(td.keys(True, True)) == {"a.b", ("a", "c")}
    assert td["a.b"] == 1 and td["a", "c"] == 2
    assert "empty" in td.keys()  # dropped by flatten_keys, but not deleted by the write-back


def test_flatten_keys_keeps_sub_tensordict_batch_dims() -> None:
    td = make_parent((2, 3))
    with td.flatten_keys() as flat:
        flat["m.v"] = torch.zeros(2, 3, 2)
    assert td["m"].batch_size == (2, 3, 2) and td["m", "v"].shape == (2, 3, 2)


def test_new_key_through_a_leaf_raises_like_a_set_by_hand() -> None:
    td = TensorDict({"a": torch.zeros(())})
    before = snapshot(td)
    with pytest.raises(KeyError, match="already present in tensordict and is a Tensor"):
        with td.flatten_keys() as flat:
            flat["a.x"] = torch.ones(())
    with pytest.raises(KeyError, match="already present in tensordict and is a Tensor"):
        td["a", "x"] = torch.ones(())
    assert_same_snapshot(before, snapshot(td))


def test_to_dtype_casts_each_leaf_back_to_its_own_dtype() -> None:
    td = TensorDict({"f": torch.zeros(2), "h": torch.zeros(2, dtype=torch.float16)}, batch_size=[2])
    with td.to(torch.float64) as wide:
        assert wide["f"].dtype == wide["h"].dtype == torch.float64
        wide["f"] += 0.5
        wide["h"] += 0.25
        wide["new"] = torch.ones(2, dtype=torch.float64)
    assert td["f"].dtype == torch.float32 and torch.equal(td["f"], torch.full((2,), 0.5))
    assert td["h"].dtype == torch.float16 and torch.equal(td["h"], torch.full((2,), 0.25, dtype=torch.float16))
    assert td["new"].dtype == torch.float64  # a new key keeps the dtype it was given


def test_dtype_and_device_shortcuts_write_back_like_to() -> None:
    td = TensorDict({"a": torch.zeros(2)}, batch_size=[2])
    with td.double() as wide:
        assert wide["a"].dtype == torch.float64
        wide["a"] += 1
    with td.cpu() as moved:
        moved["b"] = torch.ones(2)
    assert td["a"].dtype == torch.float32 and torch.equal(td["a"], torch.ones(2)) and "b" in td.keys()


def test_new_keys_follow_parent_keys_that_contain_the_separator() -> None:
    td = TensorDict({"x.y": {"z": torch.zeros(())}, "r": {"p.q": torch.zeros(())}})
    with td.flatten_keys() as flat:
        flat["x.y.new"] = torch.ones(())
    assert set(td["x.y"].keys()) == {"z", "new"}
    with td.unflatten_keys() as nested:
        nested["r", "p", "new"] = torch.ones(())
        nested["x", "y", "other"] = torch.ones(())
    assert set(td["r"].keys()) == {"p.q", "p.new"} and set(td["x.y"].keys()) == {"z", "new", "other"}


def test_view_dtype_reinterprets_back() -> None:
    td = TensorDict({"x": torch.zeros(2, 3), "n": {"y": torch.ones(2, 3)}}, batch_size=[2, 3])
    leaf = td["x"]
    with td.view(torch.int32) as bits:
        assert bits["x"].dtype == torch.int32
        bits["x"] += torch.ones((), dtype=torch.float32).view(torch.int32)  # the bits of 1.0
        bits["n", "y"] = torch.full((2, 3), 2.0).view(torch.int32)
    assert td["x"] is leaf and torch.equal(leaf, torch.ones(2, 3))
    assert td["n", "y"].dtype == torch.float32 and torch.equal(td["n", "y"], torch.full((2, 3), 2.0))


def test_non_tensor_values_are_written_back() -> None:
    td = make_parent((2, 3))
    with td.permute(1, 0) as permuted:
        permuted["s"] = "bye"
        permuted["n", "label"] = "new"
    assert td["s"] == "bye" and td["n", "label"] == "new"
    assert td.get("s").batch_size == (2, 3) and td["n"].get("label").batch_size == (2, 3)


def test_to_device_writes_back_and_moves_new_keys_home() -> None:
    td = TensorDict({"a": torch.zeros(2)}, batch_size=[2])  # no device: to("cpu") gives a new TensorDict
    child = td.to("cpu")
    assert child is not td
    with child:
        child["a"] += 1
        child["b"] = torch.ones(2)
    assert torch.equal(td["a"], torch.ones(2)) and td["b"].device == torch.device("cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_to_cuda_writes_back_to_cpu() -> None:
    td = TensorDict({"a": torch.zeros(2), "n": {"b": torch.zeros(2)}}, batch_size=[2])
    leaf = td["a"]
    with td.to("cuda") as moved:
        assert moved["a"].is_cuda
        moved["a"] += 1
        moved["n", "c"] = torch.ones(2, device="cuda")
    assert td["a"] is leaf and torch.equal(leaf, torch.ones(2))
    assert td["n", "c"].device == torch.device("cpu")


# --------------------------------------------------------------------------- locks


def test_lock_restores_only_what_it_changed() -> None:
    td = TensorDict(a=0)
    with td.lock_():
        assert td.is_locked
    assert not td.is_locked
    td.lock_()
    with td.lock_():
        assert td.is_locked
    assert td.is_locked  # it was locked before the block


def test_unlock_restores_only_what_it_changed() -> None:
    td = TensorDict(a=0, lock=True)
    with td.unlock_():
        assert not td.is_locked
        td["b"] = 1
    assert td.is_locked
    td.unlock_()
    with td.unlock_():
        pass
    assert not td.is_locked


@pytest.mark.parametrize("locked_before", [False, True])
def test_lock_and_unlock_are_restored_when_the_block_raises(locked_before: bool) -> None:
    td = TensorDict(a=0)
    if locked_before:
        td.lock_()
    with pytest.raises(ZeroDivisionError):
        with (td.unlock_() if locked_before else td.lock_()):
            assert td.is_locked is not locked_before
            1 / 0
    assert td.is_locked is locked_before


def test_nested_lock_blocks_on_the_same_object_unwind_in_order() -> None:
    td = TensorDict({"n": {"a": 0}})
    with td.lock_():
        with td.unlock_():
            assert not td.is_locked and not td["n"].is_locked
        assert td.is_locked and td["n"].is_locked
    assert not td.is_locked and not td["n"].is_locked


def test_op_returning_self_clears_a_stale_exit_action() -> None:
    td = TensorDict({"a": torch.zeros(2, 3)}, batch_size=[2, 3])
    td.lock_()  # used without `with`: its exit action (unlock) stays pending on td
    with td.view(2, 3) as same:  # the same shape: view returns td itself, with nothing to undo
        assert same is td
    assert td.is_locked


@pytest.mark.parametrize("op", OPS, ids=repr)
def test_write_back_into_locked_parent_raises_and_changes_nothing(op: Op) -> None:
    td = op.parent(op.batch).lock_()
    before = snapshot(td)
    with pytest.raises(RuntimeError, match=LOCKED):
        with op.apply(td) as child:
            if child.is_locked:
                child.unlock_()  # get past the child's own lock: the parent's must still hold
            child[op.existing] = _value(child[op.existing].shape, child[op.existing].dtype)
            child["fresh"] = _value(child.batch_size, torch.float32)
    assert td.is_locked
    assert_same_snapshot(before, snapshot(td))


@pytest.mark.parametrize("op", OPS, ids=repr)
def test_in_place_edit_reaches_locked_parent(op: Op) -> None:
    td, by_hand = _twins(op)
    td.lock_()
    with op.apply(td) as child:
        delta = _value(child[op.existing].shape, child[op.existing].dtype, offset=1.0)
        child.get(op.existing).add_(delta)
    by_hand.get(op.key(op.existing)).add_(op.back(delta))
    assert td.is_locked
    assert_same_td(td, by_hand)


def test_to_child_of_locked_parent_is_locked_like_upstream() -> None:
    td = TensorDict({"x": torch.zeros(2)}, batch_size=[2], lock=True)
    with pytest.raises(RuntimeError, match=LOCKED):
        with td.to(torch.float64) as wide:
            wide["x"] += 1  # __setitem__ of an existing key on a locked TensorDict
    assert torch.equal(td["x"], torch.zeros(2))


# --------------------------------------------------------------------------- failures during write-back


def test_failed_write_back_applies_nothing() -> None:
    td = make_parent((2, 3))
    before = snapshot(td)
    with pytest.raises(RuntimeError, match="batch dimension mismatch"):
        with td.flatten_keys() as flat:
            flat["good"] = torch.zeros(2, 3)
            del flat["y"]
            flat["m.bad"] = torch.zeros(2, 3)  # "m" has batch (2, 3, 2)
    assert_same_snapshot(before, snapshot(td))


def test_parent_collected_before_exit_is_not_an_error() -> None:
    with TensorDict({"a": torch.zeros(2, 3)}, batch_size=[2, 3]).permute(1, 0) as child:
        gc.collect()
        child["b"] = torch.zeros(3, 2)
    assert "b" in child.keys()


def test_parameters_keep_identity_and_module_sees_the_edit() -> None:
    module = torch.nn.Linear(2, 2)
    params = TensorDict({"weight": module.weight, "bias": module.bias})
    with params.to(torch.float64) as wide:
        assert wide["weight"].dtype == torch.float64
        with torch.no_grad():
            wide["weight"].zero_()
    assert params["weight"] is module.weight and isinstance(module.weight, torch.nn.Parameter)
    assert torch.equal(module.weight, torch.zeros(2, 2)) and module.weight.requires_grad


def test_to_module_exit_action_is_compatible() -> None:
    module = torch.nn.Linear(2, 2)
    weight = module.weight
    zeros = TensorDict({"weight": torch.zeros(2, 2), "bias": torch.zeros(2)})
    with zeros.to_module(module):
        assert torch.equal(module.weight, torch.zeros(2, 2))
    assert module.weight is weight
    with pytest.raises(ValueError):
        with zeros.to_module(module):
            raise ValueError
    assert module.weight is weight


# --------------------------------------------------------------------------- cost off the `with` path


def test_child_used_without_with_does_not_keep_parent_alive() -> None:
    td = TensorDict({"a": torch.zeros(2, 3)}, batch_size=[2, 3])
    parent = weakref.ref(td)
    for _ in range(3):
        td = td.permute(1, 0).flatten_keys().to(torch.float64)
    gc.collect()
    assert parent() is None


def test_decorator_declares_the_inverse_and_records_nothing_heavy() -> None:
    class Doubling(TensorDict):
        __slots__ = ()

        @write_back(lambda td, parent, factor: td.apply(lambda leaf: leaf / factor))
        def scaled(self, factor: float) -> TensorDict:
            return self.apply(lambda leaf: leaf * factor)

    td = Doubling({"a": torch.ones(2)}, batch_size=[2])
    child = td.scaled(2.0)
    assert type(child._cm) is tuple  # one tuple: no snapshot, no state object until `with`
    with child:
        child["a"] += 2.0  # 2 + 2 in the child's scale is 2 in the parent's
    assert torch.equal(td["a"], torch.full((2,), 2.0))


def test_tensorclass_parent_and_tensorclass_entries() -> None:
    from torchdict import tensorclass

    @tensorclass
    class Obs:
        x: torch.Tensor
        y: torch.Tensor

    obs = Obs(x=torch.zeros(2, 3), y=torch.zeros(2, 3), batch_size=[2, 3])
    with obs.permute(1, 0) as permuted:
        assert type(permuted) is Obs
        permuted.x = torch.arange(6.0).view(3, 2)
        permuted.y += 1
    assert torch.equal(obs.x, torch.arange(6.0).view(3, 2).T) and torch.equal(obs.y, torch.ones(2, 3))

    td = TensorDict({"obs": obs}, batch_size=[2, 3])
    with td.permute(1, 0) as permuted:
        permuted["obs", "x"] = torch.full((3, 2), 7.0)
    assert type(td["obs"]) is Obs and torch.equal(td["obs"].x, torch.full((2, 3), 7.0))


def test_docstring_examples() -> None:
    import doctest

    import torchdict._context

    failures, tried = doctest.testmod(torchdict._context, extraglobs={"torch": torch, "TensorDict": TensorDict})
    assert tried and not failures


def test_doc_page_examples_run() -> None:
    import re
    from pathlib import Path

    page = Path(__file__).resolve().parents[1] / "docs" / "context_managers.md"
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), re.S)
    assert len(blocks) >= 3
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(page), "exec"), namespace)


def test_objects_locked_at_creation_stay_locked_after_a_bare_with_block():
    import pickle

    created = [TensorDict(a=torch.zeros(2), lock=True), TensorDict(a=torch.zeros(2)).share_memory_(),
               pickle.loads(pickle.dumps(TensorDict(a=torch.zeros(2), lock=True)))]
    for td in created:
        with td:
            pass
        assert td.is_locked


def test_clear_refs_for_compile_forgets_pending_records_and_returns_self_as_upstream():
    tensordict = pytest.importorskip("tensordict")
    for lib in (torchdict_module(), tensordict):
        td = lib.TensorDict({"a": torch.zeros(2), "n": {"b": torch.ones(2)}}, batch_size=[2])
        child = td.unsqueeze(0)  # an op whose result can write back in a ``with`` block
        assert child.clear_refs_for_compile_() is child
        assert torch.equal(child["n", "b"], torch.ones(1, 2)) and list(child.keys()) == ["a", "n"]
    child = torchdict_module().TensorDict({"a": torch.zeros(2), "n": {"b": torch.ones(2)}}, batch_size=[2]).unsqueeze(0)
    assert child._cm is not None
    child.clear_refs_for_compile_()
    assert child._cm is None and child["n"]._cm is None


def torchdict_module():
    import torchdict

    return torchdict
