"""A failed call changes nothing: every write is checked in full before the first one.

For each writing method (update / update_ / apply_ / set_ / set / ``td[key] = v`` / ``td[index] = v``),
on flat and nested trees with 0 to 3 batch dims: a failing call raises the expected type and leaves
the TensorDict exactly as it was (keys, leaf objects, values, batch sizes, names, locks). Then: a lock
freezes the metadata (``batch_size``, ``names``), the messages name the key and the shapes, and the
exception types are those upstream tensordict raises for the same call.
"""
from __future__ import annotations

import json
import os
from typing import Any, Callable

import pytest
import torch

from torchdict import InplaceWriteError, NonTensorData, NonTensorStack, TensorDict, tensorclass
from torchdict._base import TensorCollection

BATCHES = [(), (3,), (3, 4), (3, 4, 2)]
BATCH_IDS = ["rank0", "rank1", "rank2", "rank3"]


def build(lib: Any, batch: tuple, nested: bool) -> Any:
    """A tree of ``lib.TensorDict`` (torchdict or upstream) with distinct values in every leaf."""
    source: dict = {
        "a": torch.arange(float(torch.Size(batch).numel() * 5)).reshape(*batch, 5),
        "b": torch.full((*batch, 2), 7.0),
    }
    if nested:
        source["n"] = {"c": torch.full(batch, 3.0), "m": {"d": torch.full((*batch, 1), -1.0)}}
    return lib.TensorDict(source, batch_size=list(batch))


def make(batch: tuple, nested: bool) -> TensorDict:
    td = build(__import__("torchdict"), batch, nested)
    td.set_non_tensor("s", "text")
    return td


def deep_snapshot(td: Any) -> Any:
    """Everything observable about every level: identities, values, batch sizes, names, device, lock."""
    entries = []
    for key, value in td._tensordict.items():
        if isinstance(value, torch.Tensor):
            entries.append((key, id(value), "tensor", value.detach().clone()))
        elif isinstance(value, (NonTensorData, NonTensorStack)):
            entries.append((key, id(value), "data", value.tolist()))
        else:
            entries.append((key, id(value), "level", deep_snapshot(value if isinstance(value, TensorDict)
                                                                   else value._tensordict)))
    return (id(td._tensordict), td.batch_size, td.names, td.device, td.is_locked, entries)


def assert_unchanged(before: Any, after: Any) -> None:
    assert before[:5] == after[:5]
    assert [entry[:3] for entry in before[5]] == [entry[:3] for entry in after[5]]  # keys, order, objects
    for old, new in zip(before[5], after[5]):
        if old[2] == "tensor":
            assert old[3].dtype == new[3].dtype and torch.equal(old[3], new[3]), old[0]
        elif old[2] == "level":
            assert_unchanged(old[3], new[3])
        else:
            assert old[3] == new[3]


def fails_unchanged(td: TensorDict, call: Callable[[TensorDict], Any], error: Any, match: Any = None) -> Any:
    before = deep_snapshot(td)
    with pytest.raises(error, match=match) as info:
        call(td)
    assert_unchanged(before, deep_snapshot(td))
    return info.value


def ones_like_leaf(td: TensorDict, key: Any) -> torch.Tensor:
    """A value that fits the entry ``key`` (a write of it alone would succeed)."""
    return torch.ones_like(td.get(key))


def wrong_features(td: TensorDict, key: Any) -> torch.Tensor:
    """Right batch dims, feature dims that don't broadcast to the entry ``key``."""
    leaf = td.get(key)
    return torch.ones(*td.batch_size, leaf.shape[-1] + 2 if leaf.dim() > td.batch_dims else 4)


def wrong_batch(td: TensorDict) -> torch.Tensor:
    return torch.ones(td.batch_size[0] + 1, *td.batch_size[1:])


parametrize_trees = pytest.mark.parametrize("nested", [False, True], ids=["flat", "nested"])
parametrize_batches = pytest.mark.parametrize("batch", BATCHES, ids=BATCH_IDS)
parametrize_batched = pytest.mark.parametrize("batch", BATCHES[1:], ids=BATCH_IDS[1:])


# ----------------------------------------------------------------------------------------- update
@parametrize_trees
@parametrize_batches
def test_update_with_a_bad_key_after_good_entries(batch, nested):
    td = make(batch, nested)
    fails_unchanged(td, lambda t: t.update({"a": ones_like_leaf(t, "a"), "new": torch.ones(batch), 1: 2}),
                    KeyError, "Only NestedKeys are supported")


@parametrize_trees
@parametrize_batched
def test_update_with_a_wrong_batch_after_good_entries(batch, nested):
    td = make(batch, nested)
    fails_unchanged(td, lambda t: t.update({"a": ones_like_leaf(t, "a"), "new": torch.ones(batch),
                                            "b": wrong_batch(t)}),
                    RuntimeError, "batch dimension mismatch")


@parametrize_batched
def test_update_nested_dict_fails_deep(batch):
    td = make(batch, True)
    value = {"a": ones_like_leaf(td, "a"), "n": {"c": ones_like_leaf(td, ("n", "c")), "q": torch.ones(batch),
                                                 "m": {"d": wrong_batch(td)}}}
    fails_unchanged(td, lambda t: t.update(value), RuntimeError, "batch dimension mismatch")


@parametrize_batches
def test_update_tuple_key_through_a_leaf_after_a_new_level(batch):
    td = make(batch, True)
    value = {("x", "y"): torch.ones(batch), ("n", "q"): torch.ones(batch), ("a", "z"): torch.ones(batch)}
    fails_unchanged(td, lambda t: t.update(value), KeyError, "already present in tensordict")


@parametrize_trees
@parametrize_batches
def test_update_inplace_restores_nothing_written(batch, nested):
    td = make(batch, nested)
    value = {"a": ones_like_leaf(td, "a"), "b": wrong_features(td, "b")}
    error = fails_unchanged(td, lambda t: t.update(value, inplace=True), InplaceWriteError)
    assert "'b'" in str(error) and f"{torch.Size([*batch, 4])}" in str(error)


@parametrize_batches
def test_update_from_a_tensordict_into_a_locked_level(batch):
    td = make(batch, True)
    td["n"].lock_()  # the root stays unlocked
    source = TensorDict({"a": torch.ones(*batch, 5), "n": {"c": torch.ones(batch), "new": torch.ones(batch)}}, batch)
    fails_unchanged(td, lambda t: t.update(source), RuntimeError, "Cannot modify locked TensorDict")


@parametrize_batches
def test_update_of_a_locked_tensordict_with_a_new_key_last(batch):
    td = make(batch, True).lock_()
    value = {"a": ones_like_leaf(td, "a"), "new": torch.ones(batch)}
    fails_unchanged(td, lambda t: t.update(value, inplace=True), RuntimeError, "Cannot modify locked TensorDict")


@parametrize_batched
def test_update_batch_size_adoption_is_undone_when_an_entry_fails(batch):
    td = make(batch, True)
    # The source replaces every leaf (so its batch size is adopted first), then holds td itself.
    source = TensorDict({"a": torch.ones(5), "b": torch.ones(2), "s": "x", "n": {"c": torch.ones(()),
                         "m": {"d": torch.ones(1)}}, "self": td}, [])
    fails_unchanged(td, lambda t: t.update(source, update_batch_size=True), ValueError,
                    "Cannot set a tensordict inside itself")


def test_update_of_a_non_mapping_is_a_type_error():
    td = make((3,), True)
    error = fails_unchanged(td, lambda t: t.update(5), TypeError, r"update\(\) expects a mapping")
    assert isinstance(error, AttributeError)  # upstream raises AttributeError: code catching it still works
    fails_unchanged(td, lambda t: t.update([("a", torch.ones(3, 5))]), TypeError, "got an object of type list")
    fails_unchanged(td, lambda t: t.update_(5), TypeError)  # upstream: dict()'s TypeError
    fails_unchanged(td, lambda t: t.update_at_(5, 0), TypeError)


def test_update_still_merges_and_replaces():
    td = make((3,), True)
    new_a = torch.ones(3, 5)
    td.update({"a": new_a, ("n", "m", "e"): torch.ones(3), "n": {"c": torch.zeros(3)}, "t": {"u": torch.ones(3)}})
    assert td["a"] is new_a and torch.equal(td["n", "m", "e"], torch.ones(3))
    assert torch.equal(td["n", "c"], torch.zeros(3)) and td["t", "u"].shape == (3,)
    # A tuple key creating a level, then another entry writing into it: both land.
    td.update({("p", "q"): torch.ones(3), ("p", "r"): torch.zeros(3)})
    assert set(td["p"].keys()) == {"q", "r"}
    td.update(TensorDict({"a": torch.zeros(3, 5)}, [3]), inplace=True)
    assert td["a"] is new_a and not new_a.any()


# ----------------------------------------------------------------------------------------- update_
@parametrize_trees
@parametrize_batches
def test_update__checks_every_shape_first(batch, nested):
    td = make(batch, nested)
    value = {"a": ones_like_leaf(td, "a"), "b": wrong_features(td, "b")}
    fails_unchanged(td, lambda t: t.update_(value), RuntimeError, r"update_\(\) cannot copy the value of shape")


@parametrize_batches
def test_update__missing_nested_key(batch):
    td = make(batch, True)
    value = {"a": ones_like_leaf(td, "a"), "n": {"c": ones_like_leaf(td, ("n", "c")), "zz": torch.ones(batch)}}
    fails_unchanged(td, lambda t: t.update_(value), KeyError, "not found in the dest tensordict")


def test_update__accepts_pairs_as_upstream():
    td = make((3,), False)
    td.update_([("a", torch.ones(3, 5))])
    assert torch.equal(td["a"], torch.ones(3, 5))


# ----------------------------------------------------------------------------------------- apply_
@parametrize_trees
@parametrize_batches
def test_apply__fn_raising_on_a_later_leaf(batch, nested):
    td = make(batch, nested)
    seen = []

    def fn(leaf: torch.Tensor) -> torch.Tensor:
        seen.append(leaf)
        if len(seen) == 2:
            raise ValueError("boom")
        return leaf + 1

    fails_unchanged(td, lambda t: t.apply_(fn), ValueError, "boom")


@parametrize_trees
@parametrize_batches
def test_apply__result_of_a_wrong_shape(batch, nested):
    td = make(batch, nested)

    def fn(leaf: torch.Tensor) -> torch.Tensor:
        if leaf.dim() > len(batch) and leaf.shape[-1] == 2:  # "b", the second leaf
            return torch.ones(*batch, 9)
        return leaf + 1

    error = fails_unchanged(td, lambda t: t.apply_(fn), InplaceWriteError, "does not fit the entry")
    assert "'b'" in str(error) and str(torch.Size([*batch, 9])) in str(error)


@parametrize_trees
@parametrize_batched
def test_apply__result_of_a_wrong_batch(batch, nested):
    td = make(batch, nested)
    fails_unchanged(td, lambda t: t.apply_(lambda x: x + 1 if x.shape[-1:] != (2,) else torch.ones(2)),
                    RuntimeError, "batch dimension mismatch")


def test_apply__result_that_is_not_a_tensor():
    td = make((3,), True)
    fails_unchanged(td, lambda t: t.apply_(lambda x: "text"), InplaceWriteError, "not a tensor")


def test_apply__named_and_with_others():
    td = make((3,), True)
    other = td.clone()
    fails_unchanged(td, lambda t: t.named_apply(lambda key, x: x + 1 if key != "d" else torch.ones(3, 9),
                                                inplace=True), InplaceWriteError)
    fails_unchanged(td, lambda t: t.apply_(lambda x, y: x + y if x.shape[-1:] != (1,) else torch.ones(3, 9), other),
                    InplaceWriteError)
    td.apply_(lambda x, y: x + y, other)  # and a good call writes
    assert torch.equal(td["b"], torch.full((3, 2), 14.0))


def test_apply__keeps_broadcasting_and_shared_leaves():
    shared = torch.zeros(3, 2)
    td = TensorDict({"a": shared, "b": shared, "c": torch.zeros(3, 2)}, [3])
    td.apply_(lambda x: x + torch.ones(3, 1))
    assert torch.equal(shared, torch.ones(3, 2)) and torch.equal(td["c"], torch.ones(3, 2))


# ----------------------------------------------------------------------------------------- set_ / set
@parametrize_trees
@parametrize_batches
def test_set__with_a_wrong_feature_shape(batch, nested):
    td = make(batch, nested)
    key = ("n", "m", "d") if nested else "b"
    error = fails_unchanged(td, lambda t: t.set_(key, wrong_features(t, key)), InplaceWriteError)
    leaf_shape = td.get(key).shape
    assert repr(key if nested else "b") in str(error)
    assert str(torch.Size([*batch, leaf_shape[-1] + 2])) in str(error) and str(leaf_shape) in str(error)


@parametrize_batched
def test_set__with_a_wrong_batch(batch):
    td = make(batch, True)
    fails_unchanged(td, lambda t: t.set_("a", wrong_batch(t)), RuntimeError, "batch dimension mismatch")


@parametrize_batches
def test_set__into_a_leaf_that_requires_grad(batch):
    td = make(batch, False)
    td["p"] = torch.nn.Parameter(torch.zeros(*batch, 2))
    fails_unchanged(td, lambda t: t.set_("p", torch.ones(*batch, 2)), RuntimeError, "requires grad")
    fails_unchanged(td, lambda t: t.update_({"a": ones_like_leaf(t, "a"), "p": torch.ones(*batch, 2)}),
                    RuntimeError, "requires grad")
    fails_unchanged(td, lambda t: t.update({"a": ones_like_leaf(t, "a"), "p": torch.ones(*batch, 2)}, inplace=True),
                    RuntimeError, "requires grad")
    fails_unchanged(td, lambda t: t.apply_(lambda x: x + 1), RuntimeError, "requires grad")
    with torch.no_grad():
        td.set_("p", torch.ones(*batch, 2))  # allowed without grad mode, as in torch
    assert td["p"].all()


@parametrize_trees
@parametrize_batches
def test_set_inplace_with_a_wrong_feature_shape(batch, nested):
    td = make(batch, nested)
    fails_unchanged(td, lambda t: t.set("b", wrong_features(t, "b"), inplace=True), InplaceWriteError)


@parametrize_batched
def test_set_of_a_new_nested_key_creates_no_level_when_refused(batch):
    td = make(batch, True)
    fails_unchanged(td, lambda t: t.set(("x", "y", "z"), wrong_batch(t)), RuntimeError, "batch dimension mismatch")
    fails_unchanged(td, lambda t: t.set(("n", "x", "y"), wrong_batch(t)), RuntimeError, "batch dimension mismatch")
    fails_unchanged(td, lambda t: t.set(("n", "x", "y"), {"z": wrong_batch(t)}), RuntimeError)


def test_set_of_a_new_nested_key_in_a_locked_level():
    td = make((3,), True)
    td["n"].lock_()
    fails_unchanged(td, lambda t: t.set(("n", "x", "y"), torch.ones(3)), RuntimeError, "Cannot modify locked")


# ----------------------------------------------------------------------------------------- td[key] = v
@parametrize_trees
@parametrize_batched
def test_setitem_of_a_key_with_a_wrong_batch(batch, nested):
    td = make(batch, nested)
    fails_unchanged(td, lambda t: t.__setitem__("a", wrong_batch(t)), RuntimeError, "for key 'a'")
    fails_unchanged(td, lambda t: t.__setitem__("new", wrong_batch(t)), RuntimeError, "for key 'new'")
    fails_unchanged(td, lambda t: t.__setitem__(("x", "y"), wrong_batch(t)), RuntimeError, "batch dimension")
    fails_unchanged(td, lambda t: t.__setitem__(("x", "y", "z", "w"), {"v": wrong_batch(t)}), RuntimeError)
    if nested:
        fails_unchanged(td, lambda t: t.__setitem__(("n", "m", "d"), wrong_batch(t)), RuntimeError)
        fails_unchanged(td, lambda t: t.__setitem__(("n", "m", "new", "e"), wrong_batch(t)), RuntimeError)


@parametrize_trees
@parametrize_batches
def test_setitem_of_a_key_on_a_locked_tensordict(batch, nested):
    td = make(batch, nested).lock_()
    fails_unchanged(td, lambda t: t.__setitem__("a", ones_like_leaf(t, "a")), RuntimeError, "Cannot modify locked")
    fails_unchanged(td, lambda t: t.__setitem__(("x", "y"), torch.ones(batch)), RuntimeError, "Cannot modify locked")


# ----------------------------------------------------------------------------------------- td[index] = v
@parametrize_trees
@parametrize_batched
def test_setitem_of_a_row_with_a_wrong_leaf_shape(batch, nested):
    td = make(batch, nested)
    row_batch = batch[1:]
    good = {"a": torch.ones(*row_batch, 5), "new": torch.ones(row_batch)}
    bad = {**good, "b": torch.ones(*row_batch, 9)}
    error = fails_unchanged(td, lambda t: t.__setitem__(0, bad), RuntimeError, "does not fit the indexed slot")
    assert "'b'" in str(error) and str(torch.Size([*row_batch, 9])) in str(error)
    assert str(torch.Size([*row_batch, 2])) in str(error) and str(torch.Size([*batch, 2])) in str(error)
    fails_unchanged(td, lambda t: t.__setitem__(0, TensorDict(bad, row_batch)), RuntimeError, "key 'b'")
    if nested:
        deep = {**good, "n": {"c": torch.ones(row_batch), "m": {"d": torch.ones(*row_batch, 3)}}}
        error = fails_unchanged(td, lambda t: t.__setitem__(0, TensorDict(deep, row_batch)), RuntimeError)
        assert "('n', 'm', 'd')" in str(error)


@parametrize_trees
@parametrize_batched
def test_setitem_of_a_slice_mask_and_rows(batch, nested):
    td = make(batch, nested)
    part = td[1:3].clone().apply(lambda x: x + 1)
    part["b"] = torch.ones(2, *batch[1:], 3)
    fails_unchanged(td, lambda t: t.__setitem__(slice(1, 3), part), RuntimeError, "key 'b'")
    mask = torch.tensor([True, False, True])
    fails_unchanged(td, lambda t: t.__setitem__(mask, part), RuntimeError, "key 'b'")
    rows = torch.tensor([0, 2])
    fails_unchanged(td, lambda t: t.__setitem__(rows, part), RuntimeError, "key 'b'")
    fails_unchanged(td, lambda t: t.__setitem__(0, torch.ones(7)), RuntimeError, "does not fit the indexed slot")


@parametrize_batched
def test_setitem_at_rows_casts_each_value_before_any_write(batch):
    td = make(batch, False)
    rows = torch.tensor([0, 2])
    value = {"a": torch.ones(2, *batch[1:], 5, dtype=torch.int64), "b": torch.ones(2, *batch[1:], 2)}
    td[rows] = value  # index_put_ would refuse the int64 value: it is cast first (basic indexing casts too)
    assert td["a"].dtype == torch.float32 and torch.equal(td["a"][rows], torch.ones(2, *batch[1:], 5))


@parametrize_batched
def test_setitem_of_a_row_with_a_new_key_on_a_locked_tensordict(batch):
    td = make(batch, True).lock_()
    row = {"a": torch.ones(*batch[1:], 5), "new": torch.ones(batch[1:])}
    fails_unchanged(td, lambda t: t.__setitem__(0, row), RuntimeError, "Cannot modify locked")


@parametrize_batched
def test_setitem_of_a_row_into_a_leaf_that_requires_grad(batch):
    td = make(batch, False)
    td["p"] = torch.nn.Parameter(torch.zeros(*batch, 2))
    row = {"a": torch.ones(*batch[1:], 5), "p": torch.ones(*batch[1:], 2)}
    fails_unchanged(td, lambda t: t.__setitem__(0, row), RuntimeError, "requires grad")
    fails_unchanged(td, lambda t: t.__setitem__(0, 1.0), RuntimeError, "requires grad")


@parametrize_batched
def test_update_at__checks_every_slot_first(batch):
    td = make(batch, True)
    value = {"a": torch.ones(*batch[1:], 5), "b": torch.ones(*batch[1:], 9)}
    fails_unchanged(td, lambda t: t.update_at_(value, 0), RuntimeError, "key 'b'")
    fails_unchanged(td, lambda t: t.update_at_({"a": torch.ones(*batch[1:], 5), "zz": 1}, 0), KeyError)


# ----------------------------------------------------------------------------------------- locks on metadata
def locked_tree() -> TensorDict:
    return TensorDict({"a": torch.zeros(3, 4, 2), "n": {"b": torch.zeros(3, 4, 5)}}, [3, 4], lock=True)


def named_locked_tree() -> TensorDict:
    return locked_tree().unlock_().refine_names("x", "y").lock_()


SETTERS = [
    ("batch_size", locked_tree, lambda td: setattr(td, "batch_size", [3])),
    ("batch_size grows", locked_tree, lambda td: setattr(td, "batch_size", [3, 4, 2])),
    ("names", locked_tree, lambda td: setattr(td, "names", ["x", "y"])),
    ("names None", named_locked_tree, lambda td: setattr(td, "names", None)),
    ("refine_names", locked_tree, lambda td: td.refine_names("x", "y")),
    ("rename_", locked_tree, lambda td: td.rename_("p", "q")),
    ("rename_ map", named_locked_tree, lambda td: td.rename_(x="p")),
    ("auto_batch_size_", locked_tree, lambda td: td.auto_batch_size_()),
    ("to(batch_size=)", locked_tree, lambda td: td.to(batch_size=[3])),
    ("sub-TensorDict batch_size", locked_tree, lambda td: setattr(td["n"], "batch_size", [3, 4, 5])),
]


@pytest.mark.parametrize("prepare, call", [entry[1:] for entry in SETTERS], ids=[entry[0] for entry in SETTERS])
def test_a_locked_tensordict_refuses_every_metadata_change(prepare, call):
    fails_unchanged(prepare(), call, RuntimeError, "Cannot modify locked TensorDict")


def test_assigning_the_current_metadata_to_a_locked_tensordict_changes_nothing():
    td = locked_tree()
    td.batch_size = [3, 4]
    td.names = [None, None]
    td.names = None
    assert td.batch_size == (3, 4) and td.is_locked


def test_a_locked_sub_tensordict_refuses_its_parents_new_batch_size():
    child = TensorDict({"b": torch.zeros(3, 4)}, [3]).lock_()
    td = TensorDict({"a": torch.zeros(3, 4), "n": child}, [3])
    assert td["n"] is child
    fails_unchanged(td, lambda t: setattr(t, "batch_size", [3, 4]), RuntimeError, "Cannot modify locked")
    fails_unchanged(td, lambda t: t.auto_batch_size_(), RuntimeError, "Cannot modify locked")


def test_a_locked_tensordict_set_under_another_batch_is_copied_not_changed():
    child = TensorDict({"b": torch.zeros(3, 4)}, []).lock_()
    parent = TensorDict({}, [3])
    parent["c"] = child
    assert child.batch_size == () and child.is_locked and parent["c"].batch_size == (3,)


def test_a_memmap_result_refuses_a_new_batch_size(tmp_path):
    td = TensorDict({"a": torch.zeros(3, 4)}, [3]).memmap(tmp_path / "saved")
    assert td.is_locked
    fails_unchanged(td, lambda t: setattr(t, "batch_size", [3, 4]), RuntimeError, "Cannot modify locked")


def test_a_locked_tensorclass_refuses_metadata_changes():
    @tensorclass
    class Pair:
        x: torch.Tensor
        y: torch.Tensor

    pair = Pair(x=torch.zeros(3, 4), y=torch.zeros(3, 4), batch_size=[3]).lock_()
    with pytest.raises(RuntimeError, match="Cannot modify locked TensorDict"):
        pair.batch_size = [3, 4]
    with pytest.raises(RuntimeError, match="Cannot modify locked TensorDict"):
        pair.names = ["rows"]
    assert pair.batch_size == (3,) and pair.names == [None]


def test_load_state_dict_of_another_batch_size_into_a_locked_tensordict():
    td = TensorDict({"a": torch.zeros(3, 4)}, [3, 4])
    state = td.state_dict()
    td.batch_size = [3]
    td.lock_()
    fails_unchanged(td, lambda t: t.load_state_dict(state), RuntimeError, "Cannot modify locked TensorDict")


def test_unlocked_metadata_changes_still_work():
    td = locked_tree().unlock_()
    td.batch_size = [3]
    td.names = ["rows"]
    td.rename_(rows="r")
    assert td.names == ["r"] and td["n"].batch_size == (3, 4)
    fails_unchanged(td, lambda t: t.rename_("x", q="z"), ValueError, "not found")


# ----------------------------------------------------------------------------------------- messages
def test_set__message_names_the_key_and_both_shapes():
    td = TensorDict({"obs": torch.zeros(4, 3)}, [4])
    with pytest.raises(InplaceWriteError) as info:
        td.set_("obs", torch.zeros(4, 5))
    message = str(info.value)
    assert message.startswith("Failed to update 'obs' in tensordict TensorDict(batch_size=[4], keys=['obs'])")
    assert message.endswith("the value of shape torch.Size([4, 5]) does not fit the entry of shape "
                            "torch.Size([4, 3])")


def test_row_write_message_names_the_key_and_the_shapes():
    td = TensorDict({"obs": torch.zeros(4, 3), "n": {"r": torch.zeros(4, 2)}}, [4])
    with pytest.raises(RuntimeError) as info:
        td[0] = TensorDict({"obs": torch.zeros(3), "n": {"r": torch.zeros(5)}}, [])
    assert str(info.value) == ("td[index] = value: the value at key ('n', 'r') has shape torch.Size([5]), which "
                               "does not fit the indexed slot of shape torch.Size([2]) (the entry has shape "
                               "torch.Size([4, 2])).")


def test_update_of_a_number_message():
    with pytest.raises(TypeError) as info:
        TensorDict().update(5)
    assert str(info.value) == "update() expects a mapping (a dict or a TensorDict) of entries, got an object of type int."


@pytest.mark.parametrize("shape", [[3, 2**40, 2**40], [3, 2**62], [3, 2**64], [0, 2**64]], ids=str)
def test_an_absurd_shape_in_meta_json_names_the_file_and_the_shape(tmp_path, shape):
    folder = tmp_path / "saved"
    TensorDict({"a": torch.zeros(3, 2)}, [3]).memmap(folder)
    meta_path = folder / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["entries"]["a"]["shape"] = shape
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(ValueError) as info:
        TensorDict.load_memmap(folder)
    assert isinstance(info.value, RuntimeError)  # upstream's type for it (torch's overflow error)
    assert f"{folder} has an invalid meta.json" in str(info.value) and f"shape {shape!r}" in str(info.value)


def test_a_large_shape_that_fits_int64_still_loads_as_truncated(tmp_path):
    folder = tmp_path / "saved"
    TensorDict({"a": torch.zeros(3, 2)}, [3]).memmap(folder)
    meta_path = folder / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["entries"]["a"]["shape"] = [3, 2**40]
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(RuntimeError, match="is truncated"):
        TensorDict.load_memmap(folder)


# ----------------------------------------------------------------------------------------- upstream's types
def _builtin_bases(error: BaseException) -> set:
    return {cls for cls in type(error).__mro__ if cls.__module__ == "builtins"} - {BaseException, Exception, object}


UPSTREAM_CALLS = [
    ("update wrong batch", lambda t: t.update({"a": torch.ones(3, 5), "b": torch.ones(4, 2)})),
    ("update int key", lambda t: t.update({"a": torch.ones(3, 5), 1: torch.ones(3)})),
    ("update inplace wrong features", lambda t: t.update({"a": torch.ones(3, 5), "b": torch.ones(3, 7)},
                                                        inplace=True)),
    ("update nested wrong batch", lambda t: t.update({"n": {"c": torch.ones(3), "q": torch.ones(4)}})),
    ("update of a number", lambda t: t.update(5)),
    ("update of a list", lambda t: t.update([("a", torch.ones(3, 5))])),
    ("update_ of a number", lambda t: t.update_(5)),
    ("update_ wrong shape", lambda t: t.update_({"a": torch.ones(3, 5), "b": torch.ones(3, 7)})),
    ("locked update new key", lambda t: t.lock_().update({"a": torch.ones(3, 5), "zz": torch.ones(3)})),
    ("apply_ raising", lambda t: t.apply_(lambda x: (_ for _ in ()).throw(ValueError("boom")))),
    ("apply_ wrong batch", lambda t: t.apply_(lambda x: torch.ones(2))),
    ("apply_ wrong features", lambda t: t.apply_(lambda x: x + 1 if x.dim() != 2 else torch.ones(3, 9))),
    ("apply_ not a tensor", lambda t: t.apply_(lambda x: "text")),
    ("set_ wrong features", lambda t: t.set_("b", torch.ones(3, 7))),
    ("set_ wrong batch", lambda t: t.set_("b", torch.ones(4, 2))),
    ("set_ nested wrong features", lambda t: t.set_(("n", "c"), torch.ones(3, 7))),
    ("set_ missing", lambda t: t.set_("zz", torch.ones(3))),
    ("set inplace wrong features", lambda t: t.set("b", torch.ones(3, 7), inplace=True)),
    ("setitem wrong batch", lambda t: t.__setitem__("b", torch.ones(4, 2))),
    ("setitem nested wrong batch", lambda t: t.__setitem__(("x", "y"), torch.ones(4))),
    ("setitem row wrong leaf", lambda t: t.__setitem__(0, {"a": torch.ones(5), "b": torch.ones(7)})),
    ("setitem slice wrong leaf", lambda t: t.__setitem__(slice(0, 2), {"a": torch.ones(2, 5), "b": torch.ones(2, 7)})),
    ("setitem row of another batch", lambda t: t.__setitem__(0, t.__class__({"a": torch.ones(2, 5)}, [2]))),
    ("locked setitem", lambda t: t.lock_().__setitem__("a", torch.ones(3, 5))),
]


@pytest.mark.parametrize("call", [call for _, call in UPSTREAM_CALLS], ids=[name for name, _ in UPSTREAM_CALLS])
def test_exception_types_match_upstream(call):
    upstream = pytest.importorskip("tensordict")
    import torchdict

    errors = []
    for lib in (torchdict, upstream):
        td = build(lib, (3,), True)
        with pytest.raises(Exception) as info:
            call(td)
        errors.append(info.value)
    ours, theirs = errors
    # Ours is an instance of every builtin type theirs is (it may be more: a TypeError that is also
    # upstream's AttributeError, an InplaceWriteError that is a ValueError and a RuntimeError).
    assert _builtin_bases(theirs) <= _builtin_bases(ours), (type(ours), type(theirs), ours, theirs)


def test_an_absurd_shape_in_an_upstream_meta_json_raises_upstreams_type(tmp_path):
    upstream = pytest.importorskip("tensordict")
    folder = str(tmp_path / "saved")
    upstream.TensorDict({"a": torch.zeros(3, 2)}, [3]).memmap(folder)
    meta_path = os.path.join(folder, "meta.json")
    with open(meta_path) as handle:
        meta = json.load(handle)
    meta["a"]["shape"] = [3, 2**40, 2**40]
    with open(meta_path, "w") as handle:
        json.dump(meta, handle)
    errors = []
    for load in (TensorDict.load_memmap, upstream.TensorDict.load_memmap):
        with pytest.raises(Exception) as info:
            load(folder)
        errors.append(info.value)
    assert _builtin_bases(errors[1]) <= _builtin_bases(errors[0])
    assert "meta.json" in str(errors[0]) and "[3, 1099511627776, 1099511627776]" in str(errors[0])


def test_tree_helpers_cover_every_kind_of_entry():
    td = make((3, 4), True)
    kinds = {entry[2] for entry in deep_snapshot(td)[5]}
    assert kinds == {"tensor", "level", "data"} and isinstance(td["n"], TensorCollection)


class _Entries(dict):
    """A dict subclass: update takes its general path (entry by entry) rather than the one-pass one."""


@pytest.mark.parametrize("batch", [(), (0,), (3,), (3, 4)], ids=["rank0", "empty", "rank1", "rank2"])
def test_update_in_one_pass_gives_what_the_general_path_gives(batch):
    import enum

    class Key(str, enum.Enum):
        OBS = "obs"

    values = {"a": torch.ones(*batch, 5), "new": torch.zeros(batch), Key.OBS: torch.ones(batch),
              "p": torch.nn.Parameter(torch.ones(*batch, 2))}
    for source in (dict(values), _Entries(values), TensorDict(values, batch)):
        td = make(batch, True)
        td.update(source)
        assert list(td.keys()) == ["a", "b", "n", "s", "new", "obs", "p"]  # replaced keys keep their place
        assert all(td[key] is value for key, value in values.items())
        assert type(next(key for key in td.keys() if key == "obs")) is Key  # stored as given, as upstream


def test_update_with_kwargs_and_a_device():
    td = TensorDict({"a": torch.zeros(3)}, [3], device="cpu")
    td.update({"b": torch.ones(3)}, c=torch.ones(3))
    assert set(td.keys()) == {"a", "b", "c"} and td["b"].device == torch.device("cpu")
    fails_unchanged(td, lambda t: t.update({"d": torch.ones(3)}, e=torch.ones(4)), RuntimeError, "for key 'e'")
