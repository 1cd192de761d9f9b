"""apply / apply_ / named_apply, stated against calling the function on each leaf by hand."""
from __future__ import annotations

import doctest

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import torchdict._apply
from torchdict import NonTensorData, TensorDict, tensorclass

from _helpers import assert_same_snapshot, snapshot
from _tensor_strategies import leaves, tensordicts

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def tensor_leaves(td: TensorDict) -> dict:
    return {key: value for key, value in leaves(td).items() if isinstance(value, torch.Tensor)}


def make_td() -> TensorDict:
    return TensorDict({"a": torch.arange(6.0).view(3, 2), "i": torch.arange(3), "sub": {"b": torch.ones(3, 4)},
                       "text": "hello"}, batch_size=[3])


FUNCTIONS = {
    "double": lambda x: x * 2,
    "as float": lambda x: x.float(),
    "flip last dim": lambda x: x.flip(-1) if x.ndim else x,
    "identity": lambda x: x,
}


@SETTINGS
@given(td=tensordicts(), name=st.sampled_from(sorted(FUNCTIONS)))
def test_apply_equals_the_function_on_every_leaf(td, name):
    fn = FUNCTIONS[name]
    result = td.apply(fn)
    assert result.batch_size == td.batch_size and result.device == td.device
    for key, leaf in tensor_leaves(td).items():
        expected = fn(leaf)
        assert torch.equal(result.get(key), expected) and result.get(key).dtype == expected.dtype, key
    assert set(result.keys(include_nested=True)) == set(td.keys(include_nested=True))


def test_seed_filter_example():
    data = TensorDict({"a": torch.tensor(1.0, dtype=torch.float), "b": torch.tensor(1, dtype=torch.int64)}, [])
    data_float = data.apply(lambda x: x if x.dtype == torch.float else None)
    assert "b" not in data_float and torch.equal(data_float["a"], torch.tensor(1.0))


def test_none_drops_keys_and_empty_sub_tensordicts():
    td = make_td()
    floats = td.apply(lambda x: x if x.dtype == torch.float32 else None)
    assert set(floats.keys(include_nested=True)) == {"a", "sub", ("sub", "b"), "text"}
    only_a = td.apply(lambda x: x if x.shape[1:] == (2,) else None)
    assert "sub" not in only_a and "i" not in only_a and "a" in only_a
    kept = td.apply(lambda x: x if x.shape[1:] == (2,) else None, filter_empty=False)
    assert "sub" in kept and list(kept["sub"].keys()) == []


def test_everything_dropped_gives_none():
    assert TensorDict(a=torch.zeros(2), sub={"b": torch.zeros(2)}).apply(lambda x: None) is None
    empty = TensorDict(a=torch.zeros(2)).apply(lambda x: None, filter_empty=False)
    assert isinstance(empty, TensorDict) and list(empty.keys()) == []


def test_non_tensor_entries_pass_through_without_calling_fn():
    seen = []
    td = make_td()
    result = td.apply(lambda x: seen.append(x) or x)
    assert all(isinstance(item, torch.Tensor) for item in seen) and len(seen) == 3
    assert result["text"] == "hello" and isinstance(result.get("text"), NonTensorData)


def test_a_non_tensor_return_becomes_non_tensor_data():
    result = TensorDict(a=torch.zeros(2), batch_size=[2]).apply(lambda x: "label")
    assert result["a"] == "label" and result.get("a").batch_size == torch.Size([2])


def test_batch_size_argument():
    td = make_td()
    summed = td.apply(lambda x: x.sum(0), batch_size=[])
    assert summed.batch_size == torch.Size([]) and summed["sub"].batch_size == torch.Size([])
    assert torch.equal(summed["a"], td["a"].sum(0)) and summed["text"] == "hello"
    grown = td.apply(lambda x: x.unsqueeze(1), batch_size=[3, 1])
    assert grown.batch_size == torch.Size([3, 1]) and grown["sub"].batch_size == torch.Size([3, 1])
    with pytest.raises(RuntimeError, match="batch dimension mismatch"):
        td.apply(lambda x: x, batch_size=[4])


def test_a_zero_dim_return_on_a_batched_td_gives_the_scalar_hint():
    with pytest.raises(RuntimeError, match="Python scalars are stored as 0-dim tensors"):
        make_td().apply(lambda x: x.sum())


def test_in_place_writes_into_the_leaves_and_works_when_locked():
    td = make_td().lock_()
    leaf = td["a"]
    assert td.apply(lambda x: x + 1, inplace=True) is td
    assert td["a"] is leaf and torch.equal(leaf, torch.arange(1.0, 7.0).view(3, 2))
    assert td.apply_(lambda x: x * 0) is td and not td.any()


def test_in_place_with_a_tensor_under_several_keys_writes_once():
    shared = torch.zeros(2)
    td = TensorDict(a=shared, b=shared, sub={"c": shared})
    td.apply_(lambda x: x + 1)
    assert torch.equal(shared, torch.ones(2))


def test_others_are_paired_by_key():
    td = make_td()
    other = td.apply(lambda x: x + 10)
    result = td.apply(lambda x, y: y - x, other)
    assert torch.equal(result["a"], torch.full((3, 2), 10.0))
    assert torch.equal(result["sub", "b"], torch.full((3, 4), 10.0))
    reordered = TensorDict({key: other[key] for key in reversed(list(other.keys()))}, batch_size=[3])
    assert torch.equal(td.apply(lambda x, y: y - x, reordered)["i"], torch.full((3,), 10))


def test_others_with_missing_keys_raise_unless_a_default_is_given():
    td = TensorDict(a=torch.ones(2), b=torch.ones(2), sub={"c": torch.ones(2)})
    other = TensorDict(a=torch.ones(2))
    with pytest.raises(KeyError, match='key "b" not found in TensorDict with keys'):
        td.apply(lambda x, y: x + y, other)
    result = td.apply(lambda x, y: x + y, other, default=0)
    assert torch.equal(result["a"], torch.full((2,), 2.0)) and torch.equal(result["b"], torch.ones(2))
    assert torch.equal(result["sub", "c"], torch.ones(2))
    with pytest.raises(TypeError, match="TensorDicts"):
        td.apply(lambda x, y: x + y, 3)


def test_named_apply():
    td = make_td()
    names = []
    td.named_apply(lambda key, x: names.append(key) or x)
    assert names == ["a", "i", "b"]
    names.clear()
    td.named_apply(lambda key, x: names.append(key) or x, nested_keys=True)
    assert names == ["a", "i", ("sub", "b")]
    dropped = td.named_apply(lambda key, x: None if key == "i" else x)
    assert "i" not in dropped and "a" in dropped
    paired = td.named_apply(lambda key, x, y: x + y, td)
    assert torch.equal(paired["a"], td["a"] * 2)


def test_device_names_lock_and_out():
    td = make_td()
    td.names = ["rows"]
    assert td.apply(lambda x: x).names == ["rows"]
    moved = td.apply(lambda x: x, device="meta")
    assert moved.device == torch.device("meta") and moved["a"].device == torch.device("meta")
    assert moved["sub"].device == torch.device("meta")
    td.lock_()
    assert not td.apply(lambda x: x).is_locked and td.apply(lambda x: x, propagate_lock=True).is_locked
    out = make_td().apply(lambda x: x * 0)
    result = make_td().apply(lambda x: x + 1, out=out)
    assert result is out and torch.equal(out["a"], td["a"] + 1)


def test_call_on_nested_and_is_leaf():
    td = make_td()
    seen = []
    td.apply(lambda x: seen.append(type(x)) or x, call_on_nested=True)
    assert TensorDict in seen
    whole = td.apply(lambda x: x.clone(), is_leaf=lambda cls: cls is TensorDict or issubclass(cls, torch.Tensor))
    assert torch.equal(whole["sub", "b"], td["sub", "b"])


def test_tensorclass_leaves_keep_their_class():
    @tensorclass
    class Point:
        x: torch.Tensor

    td = TensorDict(p=Point(x=torch.ones(3, 2), batch_size=[3]), batch_size=[3])
    result = td.apply(lambda x: x * 3)
    assert isinstance(result["p"], Point) and torch.equal(result["p"].x, torch.full((3, 2), 3.0))


def test_a_failing_function_leaves_the_tensordict_unchanged():
    td = make_td()
    before = snapshot(td)
    with pytest.raises(RuntimeError, match="batch dimension mismatch"):
        td.apply(lambda x: x[:1])
    assert_same_snapshot(before, snapshot(td))


def test_docstring_examples_run():
    failures, _ = doctest.testmod(torchdict._apply, extraglobs={"torch": torch, "TensorDict": TensorDict})
    assert failures == 0


# ------------------------------------------------------------------ nested trees in one pass
def _tree(case: str) -> TensorDict:
    """Nested TensorDicts of plain tensors (the one-pass path), or one way out of it."""
    source = {"a": torch.arange(4.0), "s": {"b": torch.ones(4, 2), "t": {"c": torch.arange(4)}}, "z": torch.zeros(4)}
    if case == "sub in the middle":
        source = {"a": torch.arange(4.0), "s": {"b": torch.ones(4, 2)}, "z": torch.zeros(4)}
    elif case == "empty sub":
        source["e"] = {}
    elif case == "only subs":
        source = {"s": {"b": torch.ones(4, 2)}, "u": {"c": torch.zeros(4)}}
    elif case == "longer sub batch":
        source["long"] = TensorDict({"x": torch.zeros(4, 3)}, batch_size=[4, 3])
    elif case == "non-tensor":
        source["s"]["text"] = "hello"
    elif case == "parameter":
        source["s"]["p"] = torch.nn.Parameter(torch.zeros(4))
    td = TensorDict(source, batch_size=[4])
    return td


TREES = ["plain", "sub in the middle", "empty sub", "only subs", "longer sub batch", "non-tensor", "parameter"]


def _calls_by_hand(td: TensorDict) -> list:
    """The keys fn is called on, in the per-level order: a level's tensors, then its sub-TensorDicts."""
    order = []

    def walk(node, path):
        for key, value in node.items():
            if isinstance(value, torch.Tensor):
                order.append(path + (key,))
        for key, value in node.items():
            if isinstance(value, TensorDict):
                walk(value, path + (key,))

    walk(td, ())
    return order


@pytest.mark.parametrize("case", TREES)
def test_nested_apply_equals_fn_on_each_leaf_in_the_per_level_order(case):
    td = _tree(case)
    seen = []
    result = td.apply(lambda x: seen.append(x) or x * 2 + 1)
    by_id = {id(leaf): key if isinstance(key, tuple) else (key,)
             for key, leaf in td.items(include_nested=True, leaves_only=True)}
    assert [by_id[id(leaf)] for leaf in seen] == _calls_by_hand(td)
    assert list(result.keys(include_nested=True)) == list(td.keys(include_nested=True))
    for key, leaf in td.items(include_nested=True, leaves_only=True):
        if isinstance(leaf, torch.Tensor):
            assert torch.equal(result[key], leaf * 2 + 1)
        else:  # non-tensor data passes through
            assert result[key] == td[key]
    for key, value in td.items(include_nested=True):
        if isinstance(value, TensorDict):
            assert result[key].batch_size == value.batch_size and not result[key].is_locked


@pytest.mark.parametrize("case", ["plain", "sub in the middle"])
def test_nested_apply_drops_none_and_emptied_sub_tensordicts(case):
    td = _tree(case)
    keep = td.apply(lambda x: x if x.dtype == torch.float32 and x.ndim == 1 else None)
    expected = [key for key, leaf in td.items(include_nested=True, leaves_only=True)
                if leaf.dtype == torch.float32 and leaf.ndim == 1]
    assert list(keep.keys(include_nested=True, leaves_only=True)) == expected
    kept_all = td.apply(lambda x: None, filter_empty=False)
    assert kept_all is not None and list(kept_all.keys(include_nested=True, leaves_only=True)) == []


def test_nested_apply_names_the_nested_key_of_a_wrong_result_and_changes_nothing():
    td = _tree("plain")
    before = snapshot(td)
    with pytest.raises(RuntimeError, match=r"batch dimension mismatch.*\('s', 't', 'c'\)"):
        td.apply(lambda x: x if x.dtype == torch.float32 else x[:2])
    assert_same_snapshot(before, snapshot(td))


def test_nested_apply_on_an_unbatched_tree_and_with_a_device():
    td = TensorDict({"a": torch.tensor(1.0), "s": {"b": torch.zeros(2)}})
    result = td.apply(lambda x: x + 1)
    assert torch.equal(result["s", "b"], torch.ones(2)) and result.batch_size == torch.Size([])
    moved = _tree("plain").apply(lambda x: x + 1, device="meta")  # each result is moved there
    assert moved.device == torch.device("meta")
    assert all(leaf.device.type == "meta" for leaf in moved.values(include_nested=True, leaves_only=True))


@pytest.mark.parametrize("case", TREES)
def test_which_trees_take_the_one_pass_path(case):
    from torchdict._apply import _ApplyRun
    from torchdict._apply_tree import plain_tree_storage

    td = _tree(case)
    run = _ApplyRun(lambda x: x, None, False, torchdict._apply._MISSING, None, False, None, False, False)
    storage = plain_tree_storage(run, td, td.batch_size)
    one_pass = case in ("plain", "sub in the middle", "empty sub", "only subs")
    assert (storage is not None) == one_pass
    if one_pass:
        assert list(storage) == list(td.keys())


@pytest.mark.parametrize("filter_empty,expected", [
    (None, {"none": {"e"}, "identity": {"a", "e", "n", ("n", "b")}, "drop b": {"a", "e"}}),
    (True, {"none": None, "identity": {"a", "n", ("n", "b")}, "drop b": {"a"}}),
    (False, {"none": {"e", "n"}, "identity": {"a", "e", "n", ("n", "b")}, "drop b": {"a", "e", "n"}}),
], ids=["default", "True", "False"])
def test_filter_empty_decides_which_empty_levels_stay(filter_empty, expected):
    # As upstream: by default a level fn emptied goes; True also drops levels that held nothing
    # (and gives None for an empty result); False keeps them all.
    td = TensorDict({"a": torch.zeros(2), "n": {"b": torch.zeros(2)}, "e": {}}, [2])
    fns = {"none": lambda x: None, "identity": lambda x: x, "drop b": lambda x: None if x is td["n", "b"] else x}
    for name, fn in fns.items():
        result = td.apply(fn, filter_empty=filter_empty)
        assert (None if result is None else set(result.keys(True))) == expected[name], name


def test_named_apply_prefix_goes_in_front_of_the_full_keys():
    td = TensorDict({"a": torch.zeros(3), "n": {"b": torch.ones(3)}}, batch_size=[3])
    seen = []
    result = td.named_apply(lambda key, x: seen.append(key) or x * 2, nested_keys=True, prefix=("p",))
    assert seen == [("p", "a"), ("p", "n", "b")]
    assert torch.equal(result["n", "b"], td["n", "b"] * 2)


@pytest.mark.parametrize("method", ["apply", "named_apply"])
def test_apply_refuses_unknown_keywords(method):
    td = TensorDict({"a": torch.zeros(3)}, batch_size=[3])
    with pytest.raises(TypeError, match="unexpected keyword arguments \\['bogus'\\]"):
        getattr(td, method)(lambda *args: args[-1], bogus=1)


@pytest.mark.parametrize("filter_empty,expected", [(True, ["x"]), (None, ["x"]), (False, ["x", "n"])])
@pytest.mark.parametrize("extra", [{}, {"device": "cpu"}, {"text": "kept"}])
def test_a_sub_tensordict_emptied_by_fn_follows_filter_empty(filter_empty, expected, extra):
    # Tensors first, then a sub-TensorDict whose only leaf fn drops (as upstream), through the
    # one-pass path and the per-level one (a device to move to, a non-tensor entry).
    device = extra.get("device")
    source = {"x": torch.ones(3), "n": {"y": torch.ones(3)}, **({"s": extra["text"]} if "text" in extra else {})}
    td = TensorDict(source, batch_size=[3])
    result = td.apply(lambda t: None if t is td["n", "y"] else t + 1, filter_empty=filter_empty, device=device)
    assert [key for key in result.keys(include_nested=True) if key != "s"] == expected
    assert torch.equal(result["x"], td["x"] + 1)
