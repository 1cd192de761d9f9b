"""The dict API and metadata of TensorDict, stated against plain torch / dict behaviour."""
import re
from typing import Any
import numpy as np
import pytest
import torch

from torchdict import NonTensorData, NonTensorStack, TensorDict
from torchdict._errors import KeyThroughLeafError

from _helpers import assert_same_snapshot, snapshot


def make_td():
    return TensorDict(
        {"a": torch.arange(12.0).view(3, 4), "b": torch.zeros(3, 4, 2, dtype=torch.bool),
         "n": {"x": torch.ones(3, 4)}},
        batch_size=[3, 4],
    )


# ---------------------------------------------------------------- construction and casting
def test_kwargs_and_mapping_build_the_same_content():
    from_kwargs = TensorDict(a=0, b=1)
    from_dict = TensorDict({"a": 0, "b": 1})
    assert list(from_kwargs.keys()) == list(from_dict.keys()) == ["a", "b"]
    assert from_kwargs["a"].dtype == torch.int64 and from_kwargs.batch_size == torch.Size([])


def test_tensors_are_stored_without_copy():
    tensor = torch.zeros(3)
    assert TensorDict({"a": tensor})["a"] is tensor


def _flat_source(case: str) -> dict:
    """A flat dict of (4, k) tensors, changed in one way that the construction must notice."""
    source = {f"k{i}": torch.randn(4, i + 1) for i in range(12)}
    if case == "short leaf in the middle":
        source["k5"] = torch.randn(3, 2)
    elif case == "short leaf last":
        source["k11"] = torch.randn(5)
    elif case == "0-dim leaf":
        source["k3"] = torch.tensor(2.0)
    elif case == "parameter":
        source["k2"] = torch.nn.Parameter(torch.randn(4, 2))
    elif case == "tuple key":
        source[("sub", "x")] = torch.randn(4)
    elif case == "nested dict":
        source["sub"] = {"x": torch.randn(4, 2), "deeper": {"y": torch.zeros(4)}}
    elif case == "number":
        source["n"] = 3
    elif case == "string":
        source["s"] = "text"
    elif case == "none":
        source["k7"] = None
    return source


@pytest.mark.parametrize("case", ["plain", "short leaf in the middle", "short leaf last", "0-dim leaf", "parameter",
                                  "tuple key", "nested dict", "number", "string", "none"])
def test_construction_from_a_flat_dict_checks_every_entry(case):
    # Building from a dict equals setting its entries one by one into an empty TensorDict
    # (the same leaves, nesting and casting), and a bad entry raises the same error.
    source = _flat_source(case)
    expected = TensorDict(batch_size=[4])
    try:
        for key, value in source.items():
            expected[key] = value
    except RuntimeError as error:
        with pytest.raises(RuntimeError, match=re.escape(str(error).split(".")[0])):
            TensorDict(source, batch_size=[4])
        return
    td = TensorDict(source, batch_size=[4])
    assert list(td.keys(include_nested=True)) == list(expected.keys(include_nested=True))
    for key, value in expected.items(include_nested=True, leaves_only=True):
        assert type(td[key]) is type(value) and torch.equal(td[key], value)
        if isinstance(source.get(key if isinstance(key, str) else None), torch.Tensor):
            assert td[key] is source[key]  # stored without a copy
    source["late"] = torch.zeros(4)
    assert "late" not in td.keys()  # the storage is the TensorDict's own dict


@pytest.mark.parametrize(
    "value, dtype",
    [(1, torch.int64), (1.5, torch.get_default_dtype()), (True, torch.bool),
     (np.float64(2.0), torch.float64), (np.int32(2), torch.int32), (np.zeros(2, dtype=np.float16), torch.float16),
     ([1, 2, 3], torch.int64), ([1.0, 2.0], torch.float32), ([[1, 2], [3, 4]], torch.int64)],
)
def test_numbers_are_cast_like_torch_tensor(value, dtype):
    leaf = TensorDict(v=value)["v"]
    assert isinstance(leaf, torch.Tensor) and leaf.dtype == dtype
    assert torch.equal(leaf, torch.as_tensor(np.asarray(value)).to(dtype))


@pytest.mark.parametrize("value", ["a string!", b"bytes", None, 1 + 2j, object(), np.array(["x", "y"])])
def test_other_values_become_non_tensor_data(value):
    td = TensorDict(v=value)
    assert isinstance(td.get("v"), NonTensorData)
    assert td["v"] is value
    assert "v" in td


def test_list_of_strings_becomes_a_stack():
    td = TensorDict(batch_size=[2])
    td["s"] = ["a", "b"]
    assert isinstance(td.get("s"), NonTensorStack)
    assert td["s"] == ["a", "b"]


def test_nested_dict_becomes_nested_tensordict_with_parent_batch_and_device():
    td = TensorDict({"a": {"b": torch.zeros(2, 3)}}, batch_size=[2], device="cpu")
    assert isinstance(td["a"], TensorDict)
    assert td["a"].batch_size == torch.Size([2]) and td["a"].device == torch.device("cpu")


def test_tuple_keys_in_the_source_nest():
    td = TensorDict({("a", "b"): 1, "c": 2})
    assert td["a", "b"] == 1 and isinstance(td["a"], TensorDict)


def test_dict_source_may_hold_a_batch_size_key():
    td = TensorDict({"batch_size": torch.zeros(2)}, batch_size=[2])
    assert "batch_size" in td and td.batch_size == torch.Size([2])


def test_batch_size_forms():
    assert TensorDict(batch_size=3).batch_size == torch.Size([3])
    assert TensorDict({}, [2, 3]).batch_size == torch.Size([2, 3])
    assert TensorDict(batch_size=torch.Size([1])).batch_size == torch.Size([1])


def test_sub_td_with_a_longer_batch_is_kept_and_a_shorter_one_is_rebatched():
    longer = TensorDict({"x": torch.zeros(3, 4, 5)}, batch_size=[3, 4, 5])
    td = TensorDict({"sub": longer}, batch_size=[3, 4])
    assert td["sub"].batch_size == torch.Size([3, 4, 5])
    shorter = TensorDict({"x": torch.zeros(3, 4)}, batch_size=[3])
    td = TensorDict({"sub": shorter}, batch_size=[3, 4])
    assert td["sub"].batch_size == torch.Size([3, 4])


def test_fromkeys_shares_one_leaf():
    td = TensorDict.fromkeys(["a", "b", ("c", "d")], 0)
    assert td["a"] is td["b"] is td["c", "d"]
    assert TensorDict.fromkeys(["x"], 1.5)["x"].dtype == torch.float32


def test_from_dict_infers_leading_dims():
    data = {"a": torch.zeros(3, 4), "b": {"c": torch.zeros(3, 4, 5)}}
    assert TensorDict.from_dict(data).batch_size == torch.Size([])
    assert TensorDict.from_dict(data, batch_dims=1).batch_size == torch.Size([3])
    assert TensorDict.from_dict(data, auto_batch_size=True).batch_size == torch.Size([3, 4])


# ---------------------------------------------------------------- metadata
def test_metadata_matches_a_tensor_of_the_batch_shape():
    td = make_td()
    reference = torch.empty(3, 4)
    assert td.shape == td.batch_size == reference.shape
    assert td.batch_dims == td.ndim == td.dim() == reference.dim()
    assert td.numel() == reference.numel()
    assert td.size(1) == reference.size(1) and td.size() == reference.size()
    assert len(td) == 3


def test_batch_size_setter_shrinks_and_grows_when_leaves_allow():
    td = make_td()
    td.batch_size = [3]
    assert td.batch_size == torch.Size([3]) and td["n"].batch_size == torch.Size([3, 4])
    td.batch_size = [3, 4]
    assert td.batch_size == torch.Size([3, 4])
    td = TensorDict({"a": torch.zeros(3, 4)}, batch_size=[3], lock=True)
    with pytest.raises(RuntimeError, match="Cannot modify locked TensorDict"):
        td.batch_size = [3, 4]  # a lock freezes the batch size too (upstream 0.15.3 allows it)
    assert td.batch_size == torch.Size([3])


def test_device_is_read_only_and_casts_writes():
    td = TensorDict(batch_size=[2], device="meta")
    td["a"] = torch.zeros(2)
    td["b", "c"] = torch.zeros(2)
    assert td["a"].device.type == "meta" and td["b"].device == torch.device("meta")
    assert td["b", "c"].device.type == "meta"
    with pytest.raises(RuntimeError, match="device cannot be set"):
        td.device = "cpu"
    assert td.clear_device_() is td and td.device is None and td["b"].device is None
    assert td["a"].device.type == "meta"  # clearing the device moves nothing


def test_names():
    td = TensorDict(batch_size=[2, 3], names=["x", None])
    assert td.names == ["x", None]
    with pytest.raises(ValueError, match="must equate the tensordict batch_dims"):
        td.names = ["x"]
    with pytest.raises(ValueError, match="non-unique"):
        td.names = ["x", "x"]
    assert td.names == ["x", None]
    assert td.rename_(x="y").names == ["y", None]
    assert td.refine_names("a", "b").names == ["a", "b"]


# ---------------------------------------------------------------- get / set
def test_get_returns_none_or_default_and_the_non_tensor_wrapper():
    td = TensorDict(a=1, s="text")
    assert td.get("missing") is None
    assert td.get("missing", "dflt") == "dflt" and td.get("missing", default=3) == 3
    assert isinstance(td.get("s"), NonTensorData) and td["s"] == "text"
    assert td.get_non_tensor("s") == "text"
    assert td.get_at("a", ()) == 1


def test_nested_get_set_create_intermediate_levels():
    td = TensorDict(batch_size=[2], device="cpu")
    td["a", "b", "c"] = torch.zeros(2, 1)
    assert td["a"].batch_size == torch.Size([2]) and td["a", "b"].device == torch.device("cpu")
    assert td[("a", ("b", ("c",)))] is td["a"]["b"]["c"]
    assert td[()] is td


def test_set_replaces_and_set_inplace_copies():
    td = TensorDict(a=torch.zeros(3))
    original = td["a"]
    new = torch.ones(3)
    assert td.set("a", new) is td and td["a"] is new
    td.set("a", torch.full((3,), 2.0), inplace=True)
    assert td["a"] is new and torch.equal(new, torch.full((3,), 2.0))


def test_set_underscore_copies_with_the_existing_dtype_and_ignores_the_lock():
    td = TensorDict(a=torch.zeros(3), lock=True)
    leaf = td["a"]
    td.set_("a", torch.tensor([1, 2, 3]))
    assert td["a"] is leaf and td["a"].dtype == torch.float32
    assert torch.equal(leaf, torch.tensor([1.0, 2.0, 3.0]))


def test_set_at_writes_an_index():
    td = TensorDict(a=torch.zeros(3), lock=True)
    td.set_at_("a", 5.0, 1)
    assert td["a"].tolist() == [0.0, 5.0, 0.0]


def test_setdefault():
    td = TensorDict(a=1)
    assert td.setdefault("a", 5) == 1
    assert td.setdefault(("b", "c"), 5) == 5 and td["b", "c"] == 5


def test_update_merges_sub_tds_recursively_and_replaces_leaves():
    td = TensorDict({"a": 0, "n": {"x": 1, "y": 2}})
    sub = td["n"]
    new_x = torch.tensor(10)
    td.update({"n": {"x": new_x}, "b": 3})
    assert td["n"] is sub and td["n", "x"] is new_x and td["n", "y"] == 2 and td["b"] == 3


def test_update_options():
    td = TensorDict(a=torch.zeros(2), b=torch.zeros(2))
    a = td["a"]
    td.update({"a": torch.ones(2)}, inplace=True)
    assert td["a"] is a and a.sum() == 2
    source = torch.full((2,), 3.0)
    td.update({"a": source, "b": source}, clone=True, keys_to_update=["b"])
    assert td["b"] is not source and torch.equal(td["b"], source) and td["a"] is a
    td.update(c=torch.ones(2))
    assert "c" in td
    bigger = TensorDict({"a": torch.zeros(4, 2)}, batch_size=[4])
    td = TensorDict(batch_size=[])
    td.update(bigger, update_batch_size=True)
    assert td.batch_size == torch.Size([4])


def test_update_underscore_writes_in_place_on_a_locked_td():
    td = TensorDict({"a": torch.zeros(2), "n": {"x": torch.zeros(2)}}, batch_size=[2], lock=True)
    a, x = td["a"], td["n", "x"]
    td.update_({"a": torch.ones(2), ("n", "x"): torch.ones(2)})
    assert td["a"] is a and td["n", "x"] is x and a.sum() == 2 and x.sum() == 2


def test_update_underscore_missing_key_and_bad_shape_leave_td_unchanged():
    td = TensorDict({"a": torch.zeros(3), "n": {"x": torch.zeros(3)}})
    before = snapshot(td)
    with pytest.raises(KeyError, match="The key zz was not found in the dest tensordict."):
        td.update_({"a": torch.ones(3), "zz": torch.ones(3)})
    with pytest.raises(KeyError, match=r"The key \('n', 'c'\) was not found"):
        td.update_({"n": {"c": torch.ones(3)}})
    with pytest.raises(RuntimeError, match="update_\\(\\) cannot copy the value of shape torch.Size\\(\\[4\\]\\)"):
        td.update_({"a": torch.ones(4)})
    assert_same_snapshot(before, snapshot(td))


def test_update_with_a_non_mapping_raises_attribute_error():
    with pytest.raises(AttributeError):
        TensorDict().update(1)


# ---------------------------------------------------------------- removal
def test_del_pop_popitem_clear():
    td = TensorDict({"a": 0, "b": 1, "c": {"d": 2, "e": 3}})
    del td["a"]
    assert "a" not in td
    assert td.del_(("c", "d")) is td and ("c", "d") not in td and "c" in td
    assert td.pop("b") == 1 and td.pop("missing", 3) == 3 and td.pop(("a", "c"), None) is None
    key, value = td.popitem()
    assert key == "c" and isinstance(value, TensorDict)
    with pytest.raises(KeyError, match="popitem\\(\\): dictionary is empty"):
        td.popitem()
    td["x"] = 1
    assert td.clear() is td and len(td.keys()) == 0


def test_del_missing_key_raises_key_error():
    td = TensorDict(a=0)
    with pytest.raises(KeyError, match="missing"):
        del td["missing"]
    with pytest.raises(KeyError, match='key "missing" not found'):
        td.pop("missing")


def test_copy_is_shallow():
    td = TensorDict({"a": 0, "c": {"d": 1}})
    copied = td.copy()
    assert copied["a"] is td["a"] and copied["c"] is not td["c"] and copied["c", "d"] is td["c", "d"]
    copied["new"] = 1
    assert "new" not in td


# ---------------------------------------------------------------- keys views
def test_keys_order_is_insertion_then_post_order_for_nested():
    td = TensorDict({"a": 0, "b": 0, "c": {"d": 0}})
    assert list(td.keys()) == ["a", "b", "c"]
    assert list(td.keys(include_nested=True)) == ["a", "b", ("c", "d"), "c"]
    assert list(td.keys(True, True)) == ["a", "b", ("c", "d")]
    td["c", "e"] = 0
    td["0"] = 0
    assert list(td.keys(True, sort=True)) == ["0", "a", "b", "c", ("c", "d"), ("c", "e")]


def test_keys_view_is_live_and_supports_set_operations():
    td = TensorDict(a=0)
    keys = td.keys()
    td["b"] = 1
    assert list(keys) == ["a", "b"] and len(keys) == 2
    assert keys & {"a", "z"} == {"a"} and keys | {"z"} == {"a", "b", "z"}


def test_membership_with_nested_keys():
    td = TensorDict({"c": {"d": 0}, "s": "text"})
    assert ("c", "d") not in td.keys()
    assert ("c", "d") in td.keys(True) and ("c", "d") in td and "d" not in td
    assert (("c",), ("d",)) in td.keys(include_nested=True)
    assert "s" in td.keys() and "s" not in td.keys(True, True)
    assert "s" in td.keys(True, True, is_leaf=lambda cls: True)
    with pytest.raises(TypeError, match="TensorDict keys are always strings"):
        1 in td.keys()
    with pytest.raises(RuntimeError, match="key must be a NestedKey"):
        torch.zeros(1) in td


def test_values_and_items_follow_keys():
    td = TensorDict({"a": 0, "c": {"d": 1}})
    assert [k for k, _ in td.items(True, True)] == list(td.keys(True, True))
    assert [v for v in td.values(True, True)] == [td["a"], td["c", "d"]]


def test_mutating_during_iteration_raises():
    td = TensorDict(a=0, b=1)
    with pytest.raises(RuntimeError, match="dictionary changed size during iteration"):
        for key in td.keys():
            td[key + "x"] = 0


def test_len_iter_bool():
    td = TensorDict(batch_size=[])
    assert len(td) == 0
    with pytest.raises(TypeError, match="iteration over a 0-d tensordict"):
        iter(td)
    with pytest.raises(RuntimeError, match="Converting a tensordict to boolean value is not permitted"):
        bool(td)


def test_is_empty_and_to_dict():
    assert TensorDict(a={}).is_empty()
    td = TensorDict({"a": 0, "n": {"s": "x"}})
    assert not td.is_empty()
    plain = td.to_dict()
    assert plain["a"] is td["a"] and plain["n"] == {"s": "x"}
    assert dict(td).keys() == {"a", "n"}  # one level deep, like dict(...) of a mapping
    assert td.to_dict(convert_tensors=True) == {"a": 0, "n": {"s": "x"}}


# ---------------------------------------------------------------- select / exclude / split / rename
def test_select_keeps_structure_and_shares_leaves():
    td = TensorDict({"a": 0, "b": 1, "c": {"d": 2, "e": 3}}, lock=True)
    selected = td.select("a", ("c", "d"))
    assert list(selected.keys(True)) == ["a", ("c", "d"), "c"]
    assert selected["a"] is td["a"] and not selected.is_locked
    assert len(td.select().keys()) == 0
    assert list(td.select("zz", strict=False).keys()) == []
    with pytest.raises(KeyError, match='key "zz" not found'):
        td.select("zz")
    with pytest.raises(RuntimeError, match="key should be a Sequence<NestedKey>"):
        td.select(["a", "b"])


def test_exclude():
    td = TensorDict({"a": 0, "b": 1, "c": {"d": 2}})
    assert list(td.exclude("b", "zz").keys()) == ["a", "c"]
    excluded = td.exclude(("c", "d"))
    assert "c" in excluded and len(excluded["c"].keys()) == 0 and ("c", "d") in td
    assert td.exclude("a", inplace=True) is td and "a" not in td
    td.lock_()
    with pytest.raises(RuntimeError, match="Cannot modify locked TensorDict"):
        td.exclude("b", inplace=True)
    assert "b" in td


def test_split_keys():
    td = TensorDict(a=0, b=0, c=0)
    td_ab, td_c = td.split_keys(["a", "b"])
    assert list(td_ab.keys()) == ["a", "b"] and list(td_c.keys()) == ["c"]
    first, rest = td.split_keys(["a", "z"], default=5, strict=False)
    assert first["z"] == 5
    td.split_keys(["a"], inplace=True)
    assert "a" not in td


def test_rename_key():
    td = TensorDict({"a": 0, "b": 1, "n": {"x": 2}})
    value = td["a"]
    assert td.rename_key_("a", "z") is td and td["z"] is value and "a" not in td
    td.rename_key_(("n", "x"), ("m", "y"))
    assert td["m", "y"] == 2 and len(td["n"].keys()) == 0
    with pytest.raises(KeyError, match="key b already present in TensorDict."):
        td.rename_key_("z", "b", safe=True)
    with pytest.raises(KeyError, match='key "missing" not found'):
        td.rename_key_("missing", "q")


# ---------------------------------------------------------------- flatten / unflatten keys
def test_flatten_keys_shares_leaves_and_unflatten_restores():
    data = TensorDict({"key 1": torch.ones(3, 4, 5),
                       "key 2": TensorDict({"sub-key": torch.randn(3, 4, 5, 6)}, batch_size=[3, 4, 5])},
                      batch_size=[3, 4])
    flat = data.flatten_keys(separator=".")
    assert list(flat.keys()) == ["key 1", "key 2.sub-key"]
    assert flat["key 2.sub-key"] is data["key 2", "sub-key"]
    restored = flat.unflatten_keys(".")
    assert restored["key 2", "sub-key"] is data["key 2", "sub-key"]
    assert TensorDict({"a": {}, "b": 0}).flatten_keys().keys() == {"b"}


def test_flatten_keys_inplace_and_multi_level_unflatten():
    td = TensorDict({"a": {"b": {"c": 1}}, "d": 2})
    assert td.flatten_keys("/", inplace=True) is td and list(td.keys()) == ["d", "a/b/c"]
    assert td.unflatten_keys("/")["a", "b", "c"] == 1


def test_flatten_and_unflatten_collisions():
    with pytest.raises(KeyError, match="causes keys .* to collide"):
        TensorDict({"a": {"b": 0}, "a.b": 1}).flatten_keys()
    with pytest.raises(KeyError, match="will override an existing for unflattened key"):
        TensorDict({"a.b": 0, "a": {"b": 1}}).unflatten_keys()


# ---------------------------------------------------------------- lock
def test_lock_is_recursive_and_blocks_structural_changes():
    td = TensorDict({"a": torch.zeros(2), "n": {"x": torch.zeros(2)}}, batch_size=[2])
    assert td.lock_() is td and td.is_locked and td["n"].is_locked
    before = snapshot(td)
    for action in (lambda: td.__setitem__("b", 0), lambda: td.__setitem__("a", torch.ones(2)),
                   lambda: td.__setitem__(("n", "y"), torch.ones(2)), lambda: td.__delitem__("a"),
                   lambda: td.pop("a"), td.popitem, td.clear, lambda: td.rename_key_("a", "q"),
                   lambda: td.set("a", torch.ones(2))):
        with pytest.raises(RuntimeError, match="Cannot modify locked TensorDict"):
            action()
    assert_same_snapshot(before, snapshot(td))
    with pytest.raises(RuntimeError, match="Cannot unlock a tensordict that is part of a locked graph"):
        td["n"].unlock_()
    td.set("a", torch.ones(2), inplace=True)
    td.update({"a": torch.ones(2)}, inplace=True)
    assert td.unlock_() is td and not td.is_locked and not td["n"].is_locked


def test_lock_keyword():
    td = TensorDict(lock=True)
    with pytest.raises(RuntimeError, match=r"Cannot modify locked TensorDict\. For in-place modification, "
                                           r"consider using the `set_\(\)` method and make sure the key is present\."):
        td["a"] = 0


def test_pickle_round_trip_keeps_structure_and_lock():
    import pickle

    td = TensorDict({"a": torch.arange(3), "n": {"s": "x"}}, batch_size=[3], lock=True)
    loaded = pickle.loads(pickle.dumps(td))
    assert loaded.is_locked and loaded.batch_size == td.batch_size
    assert torch.equal(loaded["a"], td["a"]) and loaded["n", "s"] == "x"


def test_select_of_flat_keys_equals_the_general_path():
    # Flat str keys have a fast path: it must give what one-element key tuples give.
    td = TensorDict({"a": torch.zeros(2, 3), "b": torch.ones(2), "c": {"d": torch.ones(2)}, "s": "text"},
                    batch_size=[2], names=["n"])
    for keys in [("b", "a"), ("c", "s"), ("a", "a"), ()]:
        fast, general = td.select(*keys), td.select(*[(key,) for key in keys])
        assert list(fast.keys(True)) == list(general.keys(True))
        assert all(fast[key] is general[key] for key in fast.keys())
        assert fast.batch_size == td.batch_size and fast.names == ["n"] and not fast.is_locked
    assert list(td.select("b", "zz", strict=False).keys()) == ["b"]
    with pytest.raises(KeyError, match='key "zz" not found'):
        td.select("b", "zz")


def test_select_keeps_the_requested_order():
    td = TensorDict({"a": 0, "b": 1, "c": {"d": 2, "e": 3}})
    assert list(td.select("c", "a").keys(True)) == [("c", "d"), ("c", "e"), "c", "a"]
    assert list(td.select(("c", "e"), "b", ("c", "d")).keys(True)) == [("c", "e"), ("c", "d"), "c", "b"]


def test_fits_batch_agrees_with_slicing():
    from itertools import product

    from torchdict._convert import fits_batch

    shapes = [torch.Size(dims) for n in range(4) for dims in product([0, 1, 3], repeat=n)]
    for shape, batch_size in product(shapes, shapes):
        assert fits_batch(shape, batch_size) == (shape[: len(batch_size)] == batch_size)


def _nested_for_writes() -> TensorDict:
    return TensorDict(
        {"leaf": torch.zeros(3), "a": {"b": {"c": torch.zeros(3, 2), "d": {"e": torch.zeros(3)}}},
         "s": "text", "long": TensorDict({"x": torch.zeros(3, 5)}, batch_size=[3, 5])},
        batch_size=[3],
    )


@pytest.mark.parametrize("key, path", [
    (("a", "b", "c"), ("a", "b", "c")), (("a", "b", "d", "e"), ("a", "b", "d", "e")), (("a", "new"), ("a", "new")),
    (("long", "x"), ("long", "x")), (("leaf",), ("leaf",)), (("a", ("b", ("c",))), ("a", "b", "c")),
], ids=repr)
def test_nested_tuple_write_equals_writing_the_innermost_dict(key, path):
    # td[k0, ..., kn] = v is td[k0]...[kn-1][kn] = v, whatever the path's depth or spelling.
    td = _nested_for_writes()
    parent = td
    for part in path[:-1]:
        parent = parent[part]
    value = torch.ones(*parent.batch_size, 7)
    td[key] = value
    assert td[path] is value and parent[path[-1]] is value


@pytest.mark.parametrize("key, value, error, match", [
    (("leaf", "x"), torch.ones(3), KeyError, "is a Tensor"),
    (("a", "b", "c", "x"), torch.ones(3), KeyError, "is a Tensor"),
    (("s", "x"), torch.ones(3), KeyError, "NonTensorData"),
    (("a", "b", "c"), torch.ones(4), RuntimeError, "batch dimension mismatch"),
    (("long", "x"), torch.ones(3, 4), RuntimeError, "batch dimension mismatch"),
    (("a", "b", "c"), torch.ones(()), RuntimeError, "batch dimension mismatch"),
], ids=lambda item: repr(item) if isinstance(item, tuple) else None)
def test_bad_nested_tuple_writes_raise_and_change_nothing(key, value, error, match):
    td = _nested_for_writes()
    before = snapshot(td)
    with pytest.raises(error, match=match):
        td[key] = value
    assert_same_snapshot(before, snapshot(td))


def test_nested_tuple_write_respects_locks_and_casts_to_the_device():
    td = _nested_for_writes()
    td["a", "b"].lock_()
    before = snapshot(td)
    with pytest.raises(RuntimeError, match="locked"):
        td["a", "b", "c"] = torch.ones(3, 2)
    assert_same_snapshot(before, snapshot(td))
    on_meta = TensorDict({"a": {"b": torch.zeros(2)}}, batch_size=[2], device="meta")
    on_meta["a", "b"] = torch.ones(2)
    assert on_meta["a", "b"].device == torch.device("meta")
    assert td[()] is td
    td[()] = 0.5  # an empty tuple is a batch index (every leaf), not a key
    assert td["leaf"].eq(0.5).all() and td["a", "b", "c"].eq(0.5).all()


def _write_checks(td: TensorDict, key, fitting: torch.Tensor, misfit: torch.Tensor) -> None:
    """A write of ``misfit`` is refused with E-BATCH and changes nothing; ``fitting`` is stored."""
    before = snapshot(td)
    with pytest.raises(RuntimeError, match="batch dimension mismatch"):
        td[key] = misfit
    assert_same_snapshot(before, snapshot(td))
    td[key] = fitting
    assert td[key] is fitting


@pytest.mark.parametrize("key", ["x", ("sub", "x")], ids=["flat", "nested"])
@pytest.mark.parametrize("change", ["setter", "flatten inplace", "unflatten inplace", "update batch",
                                    "pytree", "op result"])
def test_writes_check_the_batch_size_after_it_changes(change, key):
    # A write's quick check (the tensor's first size against a recorded one) must follow
    # every way a batch size changes, and an op result's first writes must check in full.
    td = TensorDict({"a": torch.zeros(4, 6, 2), "sub": {"b": torch.zeros(4, 6)}}, batch_size=[4])
    td["a"] = torch.ones(4, 6, 2)  # records the quick check for [4]
    td["sub", "b"] = torch.ones(4, 6)
    if change == "setter":
        td.batch_size = [4, 6]
        td["sub"].batch_size = [4, 6]
        fitting, misfit = torch.zeros(4, 6), torch.zeros(4, 5)
    elif change == "flatten inplace":
        td.batch_size = [4, 6]
        td["a"] = torch.ones(4, 6, 2)
        td.flatten(0, 1, inplace=True)
        fitting, misfit = torch.zeros(24), torch.zeros(4)
    elif change == "unflatten inplace":
        td.unflatten(0, (2, 2), inplace=True)
        fitting, misfit = torch.zeros(2, 2), torch.zeros(4)
    elif change == "update batch":
        source = {"a": torch.zeros(4, 6, 2), "sub": {"b": torch.zeros(4, 6)}, "c": torch.zeros(4, 6)}
        td.update(TensorDict(source, batch_size=[4, 6]), update_batch_size=True)
        fitting, misfit = torch.zeros(4, 6), torch.zeros(4, 5)
    elif change == "pytree":
        leaves, spec = torch.utils._pytree.tree_flatten(td)
        td = torch.utils._pytree.tree_unflatten([leaf[:2] for leaf in leaves], spec)
        fitting, misfit = torch.zeros(2), torch.zeros(4)
    else:
        td = td[1:3]
        fitting, misfit = torch.zeros(2), torch.zeros(4)
    parent = td if key == "x" else td["sub"]
    assert parent.batch_size[:len(td.batch_size)] == td.batch_size
    _write_checks(td, key, fitting, misfit)
    _write_checks(td, key, fitting, misfit)  # again, once the quick check is recorded


def test_update_batch_size_adopts_the_source_batch_at_every_level():
    td = TensorDict({"a": torch.zeros(4), "s": TensorDict({"x": torch.zeros(4, 2)}, [4, 2]), "e": {}}, [4])
    source = TensorDict({"a": torch.ones(3), "s": TensorDict({"x": torch.ones(3, 2)}, [3, 2])}, [3])
    td.update(source, update_batch_size=True)
    assert td.batch_size == torch.Size([3]) and td["s"].batch_size == torch.Size([3, 2])
    assert td["e"].batch_size == torch.Size([3])  # holds no leaf: takes the new batch
    assert td["a"] is source["a"] and td["s", "x"] is source["s", "x"]
    for sub in td.values(include_nested=True):
        if isinstance(sub, TensorDict):
            assert sub.batch_size[:1] == td.batch_size


@pytest.mark.parametrize("case", ["dest key the source lacks", "nested dest key", "dest non-tensor entry",
                                  "inplace", "keys_to_update", "locked", "source batch extends the dest's"])
def test_update_batch_size_refusals_change_nothing(case):
    td = TensorDict({"a": torch.zeros(4), "s": {"x": torch.zeros(4), "y": torch.zeros(4)}}, [4])
    source = TensorDict({"a": torch.ones(3), "s": {"x": torch.ones(3), "y": torch.ones(3)}}, [3])
    kwargs: dict = {}
    expected: Any = (RuntimeError, "Some keys of the dest tensordict are not present in the source")
    if case == "dest key the source lacks":
        td["b"] = torch.zeros(4)
    elif case == "nested dest key":
        del source["s", "y"]
    elif case == "dest non-tensor entry":
        td["note"] = "kept with the old batch otherwise"
    elif case == "inplace":
        kwargs["inplace"] = True
        expected = (RuntimeError, "update was called with inplace=True")
    elif case == "keys_to_update":
        kwargs["keys_to_update"] = ["a"]
        expected = (RuntimeError, "different batch-size with keys_to_update")
    elif case == "locked":
        td.lock_()
        expected = (RuntimeError, "Cannot modify locked TensorDict")
    else:
        source = TensorDict({"c": torch.ones(4, 6)}, [4, 6])
    before = snapshot(td)
    with pytest.raises(expected[0], match=expected[1]):
        td.update(source, update_batch_size=True, **kwargs)
    assert_same_snapshot(before, snapshot(td))


def test_rename_key_to_a_path_under_the_key_itself_moves_the_entry_down():
    sub = TensorDict({"b": torch.ones(2)}, [2])
    td = TensorDict({"a": torch.zeros(2), "n": sub}, [2])
    td.rename_key_("n", ("n", "x"))
    assert set(td.keys(True, True)) == {"a", ("n", "x", "b")}
    assert td["n", "x"] is sub and td["n"].batch_size == td.batch_size


@pytest.mark.parametrize("write", ["set", "setitem", "nested set", "update"])
def test_a_tensordict_cannot_be_set_inside_itself(write):
    td = TensorDict({"a": torch.zeros(2)}, [2])
    before = snapshot(td)
    with pytest.raises(ValueError, match="Cannot set a tensordict inside itself"):
        if write == "set":
            td.set("me", td)
        elif write == "setitem":
            td["me"] = td
        elif write == "nested set":
            td.set(("x", "me"), td)
        else:
            td.update({"me": td})
    assert_same_snapshot(before, snapshot(td))


@pytest.mark.parametrize("inplace", [False, True])
def test_update_with_a_tuple_key_through_a_leaf_is_refused(inplace):
    td = TensorDict({"a": torch.zeros(2)}, [2])
    before = snapshot(td)
    with pytest.raises(KeyError, match="The entry a is already present in tensordict"):
        td.update({("a", "b"): torch.ones(2)}, inplace=inplace)
    assert_same_snapshot(before, snapshot(td))


def test_split_keys_with_a_missing_key_raises_unless_a_default_is_given():
    td = TensorDict({"a": torch.zeros(4)}, [4])
    with pytest.raises(KeyError, match="zz"):
        td.split_keys(["zz"])
    fill = torch.ones(4)
    filled, rest = td.split_keys(["zz"], default=fill)
    assert filled["zz"] is fill and list(rest.keys()) == ["a"]


def test_a_str_key_replacing_a_level_written_through_a_tuple_key_is_refused():
    source = {("a", "b"): torch.zeros(2), "a": {"c": torch.ones(2)}}
    with pytest.raises(KeyError, match="The entry a is already present in tensordict"):
        TensorDict(source, [2])
    # from_dict merges them, as upstream does; so does the constructor when the tuple key comes last
    for td in (TensorDict.from_dict(source, batch_size=[2]), TensorDict(dict(reversed(source.items())), [2])):
        assert set(td.keys(True, True)) == {("a", "b"), ("a", "c")}
        assert td["a", "b"] is source["a", "b"] and td["a", "c"] is source["a"]["c"]


def test_get_and_pop_through_a_leaf_return_an_explicit_default():
    td = TensorDict({"a": torch.zeros(2)}, [2])
    before = snapshot(td)
    for call in (lambda: td.get(("a", "b")), lambda: td.pop(("a", "b"))):
        with pytest.raises(KeyThroughLeafError, match="'a' is a Tensor, not a tensordict"):
            call()
    assert td.get(("a", "b"), None) is None and td.get(("a", "b"), 5) == 5
    assert td.pop(("a", "b"), None) is None
    assert td.get(("zz", "y")) is None and td.get("zz") is None
    assert_same_snapshot(before, snapshot(td))


def test_assigning_is_locked_locks_and_unlocks_the_tree():
    td = TensorDict({"a": torch.zeros(2), "n": {"b": torch.zeros(2)}}, [2])
    td.is_locked = True
    assert td.is_locked and td["n"].is_locked
    with pytest.raises(RuntimeError, match="Cannot modify locked TensorDict"):
        td["c"] = torch.zeros(2)
    with pytest.raises(RuntimeError, match="Cannot unlock a tensordict that is part of a locked graph"):
        td["n"].is_locked = False
    td.is_locked = False
    assert not td.is_locked and not td["n"].is_locked
    td["n"].is_locked = True
    assert td["n"].is_locked and not td.is_locked


def test_set_inplace_with_a_shape_that_does_not_broadcast_raises_the_inplace_write_error():
    from torchdict._errors import InplaceWriteError

    td = TensorDict({"a": torch.zeros(4, 7)}, [4])
    before = snapshot(td)
    with pytest.raises(InplaceWriteError, match="Failed to update 'a' in tensordict") as caught:
        td.set("a", torch.ones(4, 3), inplace=True)
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, RuntimeError)
    assert_same_snapshot(before, snapshot(td))


def test_select_through_a_leaf_is_a_missing_key_unless_not_strict():
    td = TensorDict({"b": torch.zeros(4)}, [4])
    with pytest.raises(KeyError, match="'b' is a Tensor, not a tensordict, so it has no entry 'zz'"):
        td.select(("b", "zz"))
    assert td.select(("b", "zz"), strict=False).is_empty()


def test_split_keys_remainder_drops_every_empty_level_and_leaves_the_source_alone():
    td = TensorDict({"e": {"f": {}, "x": torch.ones(2)}, "g": {}, "b": torch.zeros(2)}, [2])
    before = snapshot(td)
    _, rest = td.split_keys(["b"])
    assert set(rest.keys(True)) == {"e", ("e", "x")} and rest["e", "x"] is td["e", "x"]
    _, kept = td.split_keys(["b"], reproduce_struct=True)
    assert set(kept.keys(True)) == {"e", ("e", "f"), ("e", "x"), "g"}
    assert_same_snapshot(before, snapshot(td))


@pytest.mark.parametrize("batch_dims", [None, 1])
def test_auto_batch_size_gives_each_level_the_dims_its_own_leaves_share(batch_dims):
    td = TensorDict({"a": torch.zeros(4, 5, 2), "e": {}, "s": "x",
                     "n": {"b": torch.zeros(4, 5, 6, 7), "m": {"c": torch.zeros(4, 5, 6, 3)}}})
    td.auto_batch_size_(batch_dims)
    expected = {(): [4, 5], ("n",): [4, 5, 6], ("n", "m"): [4, 5, 6, 3], ("e",): [4, 5]}
    for path, sizes in expected.items():
        level = td[path] if path else td
        assert level.batch_size == torch.Size(sizes[:batch_dims] if batch_dims else sizes)
    assert td.get("s").batch_size == td.batch_size and td["s"] == "x"


def test_nested_get_equals_reading_level_by_level():
    td = TensorDict({"a": torch.zeros(2), "n": {"m": {"x": torch.ones(2)}, "s": "hi"}}, batch_size=[2])
    assert td["n", "m", "x"] is td["n"]["m"]["x"] and td["n", "s"] == td["n"]["s"] == "hi"
    assert td["n", "m"] is td["n"]["m"] and td[()] is td and td["n",] is td["n"]
    before = snapshot(td)
    with pytest.raises(KeyError, match="not found"):
        td["n", "zz"]
    with pytest.raises(KeyThroughLeafError, match="'a' is a Tensor, not a tensordict"):
        td["a", "b"]
    assert_same_snapshot(before, snapshot(td))
