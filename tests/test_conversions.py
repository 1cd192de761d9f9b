"""Conversions out of a TensorDict (to_tensordict, tolist, numpy, filter_non_tensor_data), size
introspection (param_count, bytes, data_ptr), separates and copy_at_, stated against plain torch."""
import numpy as np
import pytest
import torch

from torchdict import NonTensorData, TensorDict, tensorclass

from _helpers import assert_same_snapshot, snapshot


def make_td():
    return TensorDict({"a": torch.arange(4.0).view(2, 2), "s": "text", "n": {"b": torch.ones(2, 2, 3)}},
                      batch_size=[2, 2])


@tensorclass
class Point:
    x: torch.Tensor


def test_to_tensordict_is_a_plain_deep_copy():
    td = make_td()
    td["p"] = Point(x=torch.zeros(2, 2), batch_size=[2, 2])
    td.lock_()
    copy = td.to_tensordict()
    assert type(copy) is TensorDict and not copy.is_locked and copy.batch_size == td.batch_size
    assert type(copy["p"]) is TensorDict  # a nested tensorclass becomes a TensorDict
    for key, leaf in td.items(include_nested=True, leaves_only=True):
        if isinstance(leaf, torch.Tensor):
            assert torch.equal(copy[key], leaf) and copy[key].data_ptr() != leaf.data_ptr()
    copy["a"] += 1  # the source is untouched
    assert torch.equal(td["a"], torch.arange(4.0).view(2, 2))
    assert copy["s"] == "text"


def test_to_tensordict_of_memory_mapped_leaves_gives_plain_tensors(tmp_path):
    saved = TensorDict({"a": torch.arange(3.0)}, batch_size=[3]).memmap(tmp_path)
    copy = saved.to_tensordict()
    assert type(copy["a"]) is torch.Tensor and torch.equal(copy["a"], saved["a"])


@pytest.mark.parametrize("convert", [False, True, "numpy"])
def test_tolist_has_one_entry_per_batch_element(convert):
    td = make_td()
    result = td.tolist(convert_tensors=convert)
    assert len(result) == 2 and all(len(row) == 2 for row in result)
    for i in range(2):
        for j in range(2):
            entry = result[i][j]
            assert entry["s"] == "text"
            for key, expected in (("a", td["a"][i, j]), ("b", td["n", "b"][i, j])):
                value = entry[key] if key == "a" else entry["n"][key]
                if convert == "numpy":
                    assert isinstance(value, np.ndarray) and np.array_equal(value, expected.numpy())
                elif convert:
                    assert value == expected.tolist()
                else:
                    assert torch.equal(value, expected)


def test_tolist_edge_batches_and_nodes():
    assert TensorDict({"a": torch.arange(2.0)}, batch_size=[]).tolist(convert_tensors=True) == {"a": [0.0, 1.0]}
    assert TensorDict({"a": torch.zeros(0, 2)}, batch_size=[0]).tolist() == []
    nodes = make_td().tolist(convert_nodes=False)
    assert all(type(item) is TensorDict and item.batch_size == torch.Size([]) for row in nodes for item in row)


def test_numpy_gives_nested_dicts_of_arrays():
    td = make_td()
    result = td.numpy()
    assert np.array_equal(result["a"], td["a"].numpy()) and np.array_equal(result["n"]["b"], td["n", "b"].numpy())
    assert result["s"] == "text"
    stacked = torch.stack([TensorDict(s="x"), TensorDict(s="y")])
    assert stacked.numpy() == {"s": ["x", "y"]}


def test_filter_non_tensor_data_drops_them_at_every_level_and_shares_the_leaves():
    td = make_td()
    td["n", "t"] = "inner text"
    result = td.filter_non_tensor_data()
    assert list(result.keys(include_nested=True, leaves_only=True)) == ["a", ("n", "b")]
    assert result["a"] is td["a"] and result["n", "b"] is td["n", "b"]
    assert td["n", "t"] == "inner text" and isinstance(td.get("s"), NonTensorData)  # the source is unchanged


def test_param_count_and_bytes_sum_over_the_tensor_leaves():
    td = TensorDict({"a": torch.zeros(3), "n": {"b": torch.zeros(3, 2, dtype=torch.float64)}, "s": "x"},
                    batch_size=[3])
    td["c"] = td["a"]  # the same tensor under a second key
    assert td.param_count() == 3 + 6 + 3
    assert td.param_count(count_duplicates=False) == 3 + 6
    assert td.bytes() == 3 * 4 + 6 * 8 + 3 * 4
    assert td.bytes(count_duplicates=False) == 3 * 4 + 6 * 8
    assert td.expand(2, 3).bytes() == 2 * td.bytes()  # as numel() * element_size() of each leaf


def test_data_ptr_gives_each_leafs_pointer():
    td = make_td()
    view = td[1:]
    pointers = view.data_ptr()
    assert pointers.batch_size == torch.Size([]) and "s" not in pointers.keys()
    assert pointers["a"].item() == view["a"].data_ptr() and pointers["n", "b"].item() == view["n", "b"].data_ptr()
    assert view.data_ptr(storage=True)["a"].item() == td["a"].untyped_storage().data_ptr()


def test_separates_moves_the_keys_out():
    td = make_td()
    a, b = td["a"], td["n", "b"]
    separated = td.separates("a", ("n", "b"))
    assert separated["a"] is a and separated["n", "b"] is b and separated.batch_size == td.batch_size
    assert list(td.keys(include_nested=True)) == ["s"]  # the emptied level is dropped
    kept = make_td()
    kept.separates(("n", "b"), filter_empty=False)
    assert "n" in kept.keys() and kept["n"].is_empty()


def test_separates_errors_change_nothing():
    td = make_td()
    before = snapshot(td)
    with pytest.raises(KeyError):
        td.separates("a", "missing")
    assert_same_snapshot(before, snapshot(td))
    td.lock_()
    before = snapshot(td)
    with pytest.raises(RuntimeError, match="Cannot modify locked TensorDict"):
        td.separates("a")
    assert_same_snapshot(before, snapshot(td))


def test_copy_at_writes_in_place_at_an_index():
    td = make_td()
    leaf = td["a"]
    td.copy_at_(TensorDict({"a": torch.full((2,), -1.0)}, batch_size=[2]), 1)
    expected = torch.arange(4.0).view(2, 2)
    expected[1] = -1
    assert td["a"] is leaf and torch.equal(leaf, expected)
