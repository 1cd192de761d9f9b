"""Indexing a TensorDict along its batch dims, stated against torch on a tensor of the batch shape.

Reading: ``td[idx]`` holds, for every leaf, the leaf rearranged exactly as torch
rearranges a tensor of the batch shape (``arange(numel).view(batch)[idx]``).
Writing: ``td[idx] = value`` equals writing each leaf with torch.
"""
import warnings

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchdict import InplaceWriteError, NonTensorData, NonTensorStack, TensorDict

from _helpers import assert_same_snapshot, snapshot
from _tensor_strategies import (
    advanced_index,
    assert_matches_grid,
    basic_index_items,
    batch_sizes,
    expected_leaf,
    grid_of,
    tensordicts,
)

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def make_td():
    return TensorDict(
        {"key 1": torch.arange(60.0).view(3, 4, 5), "n": {"x": torch.zeros(3, 4, 2)}, "s": "str"},
        batch_size=[3, 4],
    )


# ------------------------------------------------------------------------------- reading: properties


@SETTINGS
@given(data=st.data())
def test_basic_index_equals_torch_on_the_batch_shape_and_gives_views(data):
    td = data.draw(tensordicts())
    items = data.draw(basic_index_items(td.batch_size))
    index = items[0] if len(items) == 1 and data.draw(st.booleans()) else items
    result = td[index]
    assert_matches_grid(result, td, grid_of(td.batch_size)[index])
    if any(type(item) is bool for item in items):
        return  # torch copies for a bool index (it is a 0-d mask)
    for key, leaf in td.items(include_nested=True, leaves_only=True):
        if leaf.numel() and result[key].numel():
            # Views: the result's leaves live in the source leaves' storage.
            assert result[key].untyped_storage().data_ptr() == leaf.untyped_storage().data_ptr()


@SETTINGS
@given(data=st.data())
def test_advanced_index_equals_torch_on_the_batch_shape(data):
    td = data.draw(tensordicts(batch=data.draw(batch_sizes(min_dims=1))))
    index = data.draw(advanced_index(td.batch_size))
    expected_grid = grid_of(td.batch_size)[index]
    assert_matches_grid(td[index], td, expected_grid)


@SETTINGS
@given(data=st.data())
def test_mixed_tuple_index_equals_torch(data):
    td = data.draw(tensordicts(batch=data.draw(batch_sizes(min_dims=2))))
    first = data.draw(st.sampled_from([slice(None), 0, None, Ellipsis]))
    size = td.batch_size[-1] if first is Ellipsis else td.batch_size[1]
    rows = torch.tensor(data.draw(st.lists(st.integers(-size, size - 1), max_size=4)), dtype=torch.long)
    index = (first, rows) if first is not None else (first, slice(None), rows)
    assert_matches_grid(td[index], td, grid_of(td.batch_size)[index])


def test_index_table_of_behaviour_md():
    td = make_td()
    cases = [
        (0, [4], (4, 5)), (-1, [4], (4, 5)), (slice(0, 2), [2, 4], (2, 4, 5)),
        (slice(None, None, 2), [2, 4], (2, 4, 5)), ((Ellipsis, slice(None, 2)), [3, 2], (3, 2, 5)),
        ((1, 2), [], (5,)), (None, [1, 3, 4], (1, 3, 4, 5)), (True, [1, 3, 4], (1, 3, 4, 5)),
        ((None, 0), [1, 4], (1, 4, 5)), ((Ellipsis, None), [3, 4, 1], (3, 4, 1, 5)), (Ellipsis, [3, 4], (3, 4, 5)),
    ]
    for index, batch, shape in cases:
        result = td[index]
        assert result.batch_size == torch.Size(batch), index
        assert result["key 1"].shape == torch.Size(shape), index
        assert result["n"].batch_size == torch.Size(batch), index
        assert result["s"] == "str"
    for index in (range(2), [0, 2], np.array([0, 2]), torch.tensor([0, 2]), torch.tensor([True, False, True])):
        assert td[index].batch_size == torch.Size([2, 4])
    assert td[torch.ones(3, 4, dtype=torch.bool)].batch_size == torch.Size([12])
    assert td[torch.tensor([0, 1]), torch.tensor([1, 2])].batch_size == torch.Size([2])
    assert td[torch.tensor(1)].batch_size == torch.Size([4])
    assert td[np.int64(1)].batch_size == torch.Size([4])


def test_zero_dim_tensordict_allows_ellipsis_none_and_bools():
    td = TensorDict(a=torch.tensor(1.0), s="x")
    assert td[...].batch_size == torch.Size([])
    assert td[None].batch_size == torch.Size([1]) and td[None]["a"].shape == (1,)
    assert td[True].batch_size == torch.Size([1])
    assert td[False].batch_size == torch.Size([0])


def test_tensor_index_on_dim0_uses_torch_semantics_for_negative_and_int32_rows():
    td = make_td()
    for rows in (torch.tensor([0, -1]), torch.tensor([2, 0], dtype=torch.int32), torch.tensor([], dtype=torch.long)):
        result = td[rows]
        assert torch.equal(result["key 1"], td["key 1"][rows])
        assert torch.equal(result["n", "x"], td["n", "x"][rows])
        assert result.batch_size == torch.Size([len(rows), 4])


def test_tensor_index_on_a_tensordict_without_tensor_leaves_still_checks_bounds():
    td = TensorDict({"s": NonTensorStack("a", "b", "c")}, batch_size=[3])
    assert td[torch.tensor([2, 0])]["s"] == ["c", "a"]
    with pytest.raises(IndexError, match="index 5 is out of bounds for dimension 0 with size 3"):
        TensorDict(batch_size=[3])[torch.tensor([5])]


def test_non_tensor_stack_follows_the_index():
    td = TensorDict({"s": NonTensorStack.from_nested_list([["a", "b"], ["c", "d"]])}, batch_size=[2, 2])
    assert td[1]["s"] == ["c", "d"]
    assert td[:, 0]["s"] == ["a", "c"]
    assert td[1, 1]["s"] == "d"
    assert td[torch.tensor([[True, False], [False, True]])]["s"] == ["a", "d"]


def test_names_follow_basic_indexing():
    td = make_td()
    td.names = ["a", "b"]
    assert td[0].names == ["b"]
    assert td[:2].names == ["a", "b"]
    assert td[None].names == [None, "a", "b"]
    assert td[torch.tensor([0, 1])].names == ["a", "b"]


def test_indexing_a_locked_tensordict_gives_an_unlocked_result():
    td = make_td().lock_()
    assert not td[0].is_locked


# ------------------------------------------------------------------------------- reading: errors


@pytest.mark.parametrize(
    "index, error, fragment",
    [
        (5, IndexError, "index 5 is out of bounds for dimension 0 with size 3"),
        (-5, IndexError, "index -5 is out of bounds for dimension 0 with size 3"),
        ((slice(None), 7), IndexError, "index 7 is out of bounds for dimension 1 with size 4"),
        (torch.tensor([0, 5]), IndexError, "index 5 is out of bounds for dimension 0 with size 3"),
        (torch.tensor([True, False]), IndexError,
         "The shape of the mask [2] at index 0 does not match the shape of the indexed tensor [3, 4] at index 0"),
        (torch.tensor([0.0]), IndexError, "tensors used as indices must be long, int, byte or bool tensors"),
        (0.5, IndexError, "only integers, slices"),
        (slice(None, None, -1), ValueError, "step must be greater than zero"),
        ((Ellipsis, Ellipsis), IndexError, "an index can only have a single ellipsis"),
        ((Ellipsis, 0, 0, 0), RuntimeError, "Not enough dimensions in TensorDict for index provided."),
    ],
)
def test_bad_index_raises_like_torch_and_changes_nothing(index, error, fragment):
    td = make_td()
    before = snapshot(td)
    with pytest.raises(error) as info:
        td[index]
    assert fragment in str(info.value)
    assert_same_snapshot(before, snapshot(td))


@pytest.mark.parametrize("index", [0, slice(None), torch.tensor(0), torch.tensor([0])])
def test_batch_index_on_a_zero_dim_tensordict_raises(index):
    td = TensorDict(a=torch.zeros(3))
    with pytest.raises(RuntimeError, match="indexing a tensordict with td.batch_dims==0 is not permitted"):
        td[index]


def test_index_past_the_batch_dims_warns_and_indexes_the_leaves():
    td = make_td()
    with pytest.warns(FutureWarning, match="An index runs past the batch dims"):
        result = td[:, :, 0]
    assert result.batch_size == torch.Size([3, 4])
    assert torch.equal(result["key 1"], td["key 1"][:, :, 0])
    assert torch.equal(result["n", "x"], td["n", "x"][:, :, 0])


def test_past_batch_warning_points_at_the_caller():
    td = make_td()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        td[:, :, 0]
    assert caught and caught[0].filename == __file__


# ------------------------------------------------------------------------------- writing: properties


def _shifted(leaf: torch.Tensor) -> torch.Tensor:
    return ~leaf if leaf.dtype is torch.bool else leaf + 1


@SETTINGS
@given(data=st.data())
def test_setitem_with_a_tensordict_equals_per_leaf_setitem(data):
    td = data.draw(tensordicts())
    n_batch = td.batch_dims
    if n_batch and data.draw(st.booleans()):
        index = data.draw(advanced_index(td.batch_size, unique=True))
    else:
        index = data.draw(basic_index_items(td.batch_size))
    positions = grid_of(td.batch_size)[index]
    expected = {}
    new_values = {}
    for key, leaf in td.items(include_nested=True, leaves_only=True):
        value = _shifted(expected_leaf(leaf, n_batch, positions))
        new_values[key] = value
        reference = leaf.clone()
        reference.view((-1,) + leaf.shape[n_batch:])[positions] = value
        expected[key] = reference
    before_text = td.get("text").tolist() if "text" in td.keys() else None
    td[index] = TensorDict(new_values, batch_size=positions.shape)
    for key, reference in expected.items():
        assert torch.equal(td[key], reference), key
    if before_text is not None:  # absent from the value: untouched
        assert td.get("text").tolist() == before_text


@SETTINGS
@given(data=st.data())
def test_setitem_with_a_number_writes_every_tensor_leaf(data):
    td = data.draw(tensordicts(batch=data.draw(batch_sizes(min_dims=1))))
    index = data.draw(basic_index_items(td.batch_size))
    positions = grid_of(td.batch_size)[index]
    expected = {}
    for key, leaf in td.items(include_nested=True, leaves_only=True):
        reference = leaf.clone()
        reference.view((-1,) + leaf.shape[td.batch_dims:])[positions] = 1
        expected[key] = reference
    text = td.get("text").tolist() if "text" in td.keys() else None
    td[index] = 1
    for key, reference in expected.items():
        assert torch.equal(td[key], reference), key
    if text is not None:
        assert td.get("text").tolist() == text  # non-tensor entries are left alone


def test_setitem_broadcasts_a_tensor_like_torch():
    td = make_td()
    td[:, 0] = torch.ones(3, 1)
    assert (td["key 1"][:, 0] == 1).all() and (td["n", "x"][:, 0] == 1).all()
    assert td["key 1"][:, 1].sum() > 3


def test_setitem_with_a_dict_and_partial_keys():
    td = make_td()
    old_nested = td["n", "x"].clone()
    td[0] = {"key 1": torch.full((4, 5), -1.0)}
    assert (td["key 1"][0] == -1).all()
    assert torch.equal(td["n", "x"], old_nested)


def test_setitem_keeps_leaf_objects_and_works_when_locked():
    td = make_td()
    leaf = td["key 1"]
    td.lock_()
    td[1] = {"key 1": torch.zeros(4, 5), "n": {"x": torch.ones(4, 2)}}
    assert td["key 1"] is leaf and (leaf[1] == 0).all()
    assert (td["n", "x"][1] == 1).all()


def test_setitem_with_a_mask_and_a_tensordict():
    td = make_td()
    mask = torch.tensor([True, False, True])
    td[mask] = TensorDict({"key 1": torch.zeros(2, 4, 5)}, batch_size=[2, 4])
    assert (td["key 1"][mask] == 0).all() and (td["key 1"][1] != 0).any()


def test_setitem_repeats_a_source_batch_matching_the_slots_last_dims():
    # td[1:3] = value of batch [4] on batch [3, 4]: the value is written into both rows, like a
    # tensor of shape [4] would be, nested entries and new keys included.
    td = make_td()
    value = TensorDict({"key 1": torch.randn(4, 5), "n": {"x": torch.randn(4, 2)}, "new": torch.ones(4)},
                       batch_size=[4])
    expected = {key: td[key].clone() for key in ("key 1", ("n", "x"))}
    for key in expected:
        expected[key][1:3] = value[key]
    td[1:3] = value
    for key, tensor in expected.items():
        assert torch.equal(td[key], tensor)
    assert td["new"].tolist() == [[0.0] * 4, [1.0] * 4, [1.0] * 4]


def test_setitem_non_tensor_values():
    td = make_td()
    td[0] = {"s": "str"}  # the same value: stays shared
    assert type(td.get("s")) is NonTensorData
    td[0] = {"s": "other"}
    assert type(td.get("s")) is NonTensorStack
    assert td["s"] == [["other"] * 4, ["str"] * 4, ["str"] * 4]


# ------------------------------------------------------------------------------- writing: errors


def test_setitem_batch_mismatch_error_and_nothing_changes():
    td = make_td()
    before = snapshot(td)
    for source_batch in ([5], [], [1]):
        value = TensorDict({"key 1": torch.ones(*source_batch, 5)}, batch_size=source_batch)
        with pytest.raises(RuntimeError) as info:
            td[0] = value
        assert str(info.value) == (
            "indexed destination TensorDict batch size is torch.Size([4]) (batch_size = torch.Size([3, 4]), "
            f"index=0), which differs from the source batch size {torch.Size(source_batch)}"
        )
        assert_same_snapshot(before, snapshot(td))


def test_setitem_dict_leaf_mismatch_raises_e_batch():
    td = make_td()
    before = snapshot(td)
    with pytest.raises(RuntimeError, match=r"batch dimension mismatch, got self.batch_size=torch.Size\(\[4\]\)"):
        td[0] = {"key 1": torch.ones(3, 5)}
    with pytest.raises(RuntimeError, match="Python scalars are stored as 0-dim tensors"):
        td[0] = {"new": 1.5}
    assert_same_snapshot(before, snapshot(td))


def test_failed_write_is_atomic():
    td = make_td()
    before = snapshot(td)
    # "key 1" would fit; "n"/"x" has the wrong feature shape: nothing may be written.
    value = TensorDict({"key 1": torch.zeros(4, 5), "n": {"x": torch.zeros(4, 3)}}, batch_size=[4])
    with pytest.raises(RuntimeError, match=r"the value at key \('n', 'x'\) has shape torch\.Size\(\[4, 3\]\), "
                                           r"which does not fit the indexed slot of shape torch\.Size\(\[4, 2\]\)"):
        td[0] = value
    assert_same_snapshot(before, snapshot(td))
    # A new key on a locked td after a valid one: nothing written either.
    td.lock_()
    before = snapshot(td)
    with pytest.raises(RuntimeError, match="Cannot modify locked TensorDict"):
        td[0] = {"key 1": torch.zeros(4, 5), "new": torch.zeros(4)}
    assert_same_snapshot(before, snapshot(td))


def test_setitem_of_a_tensor_over_a_sub_tensordict_raises_inplace_error():
    td = make_td()
    before = snapshot(td)
    with pytest.raises(InplaceWriteError, match="Failed to update 'n'"):
        td[0] = {"key 1": torch.zeros(4, 5), "n": torch.zeros(4)}
    assert_same_snapshot(before, snapshot(td))


def test_setitem_tensor_that_does_not_broadcast_names_the_key_and_shapes():
    td = make_td()
    before = snapshot(td)
    # A RuntimeError as upstream's (torch's expand error), worded with the key and the shapes.
    with pytest.raises(RuntimeError, match=r"the value at key 'key 1' has shape torch\.Size\(\[3\]\), which does "
                                           r"not fit the indexed slot of shape torch\.Size\(\[3, 5\]\)"):
        td[:, 0] = torch.ones(3)
    assert_same_snapshot(before, snapshot(td))


def test_setitem_other_errors():
    td = make_td()
    before = snapshot(td)
    with pytest.raises(TypeError, match="needs a TensorDict, a mapping, a tensor or a number"):
        td[0] = "hey"
    with pytest.raises(IndexError, match="index 3 is out of bounds for dimension 0 with size 3"):
        td[3] = 0
    with pytest.raises(IndexError, match="too many indices"):
        td[0, 0, 0] = 0
    assert_same_snapshot(before, snapshot(td))
    zero_dim = TensorDict(a=torch.zeros(3))
    with pytest.raises(IndexError, match="too many indices for tensor of dimension 0"):
        zero_dim[0] = {"a": torch.ones(3)}
    zero_dim[...] = {"a": torch.ones(3)}
    assert (zero_dim["a"] == 1).all()


# ------------------------------------------------------------------------------- lazy preallocation


def foo():
    data = TensorDict({}, batch_size=[])
    data["a"] = torch.randn(3)
    data["b"] = TensorDict({"c": torch.zeros(2)}, batch_size=[])
    return data


def test_seed_preallocation_example():
    N = 10
    data = TensorDict({}, batch_size=[N])
    for i in range(N):
        data[i] = foo()
    assert data.batch_size == torch.Size([10])
    assert data["a"].shape == (10, 3) and data["a"].dtype == torch.float32
    assert data["b"].batch_size == torch.Size([10]) and data["b", "c"].shape == (10, 2)


def test_preallocation_in_shuffled_order_matches_stack():
    steps = [TensorDict({"a": torch.randn(3), "b": {"c": torch.randint(0, 9, (2,))}}) for _ in range(8)]
    data = TensorDict({}, batch_size=[8])
    for i in torch.randperm(8).tolist():
        data[i] = steps[i]
    stacked = torch.stack(steps)
    assert torch.equal(data["a"], stacked["a"]) and torch.equal(data["b", "c"], stacked["b", "c"])
    assert data["b", "c"].dtype == torch.int64


def test_preallocation_allocates_zeros_with_the_value_dtype():
    data = TensorDict({}, batch_size=[4])
    data[2] = TensorDict({"m": torch.tensor(True), "i": torch.tensor([7], dtype=torch.int32)})
    assert data["m"].dtype == torch.bool and data["m"].tolist() == [False, False, True, False]
    assert data["i"].dtype == torch.int32 and data["i"].view(-1).tolist() == [0, 0, 7, 0]


def test_preallocation_multi_dim_index_slices_and_dicts():
    data = TensorDict({}, batch_size=[10, 2])
    data[torch.tensor([0, 1])] = TensorDict({"a": torch.ones(2, 2, 3)}, [2, 2])
    assert data["a"].shape == (10, 2, 3) and data["a"].sum() == 12
    data[3:5] = {"b": {"c": torch.ones(2, 2)}}
    assert data["b"].batch_size == torch.Size([10, 2]) and data["b", "c"].sum() == 4
    data[5, 1] = {"d": torch.ones(4)}
    assert data["d"].shape == (10, 2, 4) and data["d"][5, 1].sum() == 4 and data["d"].sum() == 4


def test_preallocation_of_a_sub_tensordict_with_extra_batch_dims():
    data = TensorDict({}, batch_size=[3])
    data[1] = TensorDict({"a": TensorDict({"b": torch.ones(6, 3)}, [6])}, [])
    assert data["a"].batch_size == torch.Size([3, 6])
    assert data["a", "b"].shape == (3, 6, 3)


def test_preallocation_of_non_tensor_values_broadcasts_then_stacks():
    data = TensorDict({}, batch_size=[4])
    data[0] = TensorDict({"s": "a"})
    assert type(data.get("s")) is NonTensorData and data["s"] == "a"
    data[1] = TensorDict({"s": "a"})
    assert type(data.get("s")) is NonTensorData
    data[2] = TensorDict({"s": "b"})
    assert data["s"] == ["a", "a", "b", "a"]
    data[0:2] = TensorDict({"s": NonTensorStack("x", "y")}, [2])
    assert data["s"] == ["x", "y", "b", "a"]


def test_preallocation_on_a_locked_tensordict_raises_and_changes_nothing():
    data = TensorDict({}, batch_size=[4]).lock_()
    before = snapshot(data)
    with pytest.raises(RuntimeError, match="Cannot modify locked TensorDict"):
        data[0] = TensorDict({"a": torch.ones(2)})
    assert_same_snapshot(before, snapshot(data))
    assert list(data.keys()) == []


def test_preallocation_follows_the_tensordict_device():
    data = TensorDict({}, batch_size=[2], device="cpu")
    data[0] = TensorDict({"a": torch.ones(2)})
    assert data["a"].device == torch.device("cpu")


def test_doc_page_examples_run():
    import re
    from pathlib import Path

    page = Path(__file__).resolve().parents[1] / "docs" / "tensor_semantics.md"
    # The sections on indexing, preallocation, stack/cat and shape ops come before "## Arithmetic".
    text = page.read_text().split("\n## Arithmetic")[0]
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= 2
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(page), "exec"), namespace)
    data = namespace["data"]
    assert data["obs"].shape == (1000, 4) and data["next"].batch_size == torch.Size([1000])
    assert data["info"] == "ok"


@pytest.mark.parametrize("index", [True, torch.tensor([True, False, True, False]), torch.tensor([0, 2])], ids=repr)
def test_writing_a_tensor_casts_it_to_each_leaf_dtype_whatever_the_index(index):
    # A bool or tensor index writes through index_put_, which refuses a dtype mismatch that
    # basic indexing casts: every leaf must still get the value, in its own dtype.
    td = TensorDict(a=torch.zeros(4), b=torch.zeros(4, dtype=torch.long), batch_size=[4])
    value = torch.tensor([1.5, 2.5]) if isinstance(index, torch.Tensor) and index.dtype == torch.long else \
        torch.tensor(7.5)
    expected = {key: leaf.clone() for key, leaf in td.items()}
    for leaf in expected.values():
        leaf[index] = value.to(leaf.dtype)
    td[index] = value
    for key, leaf in expected.items():
        assert torch.equal(td[key], leaf) and td[key].dtype == leaf.dtype


@pytest.mark.parametrize("index", [("key 1", 0), (0, "key 1"), (slice(None), "n")])
def test_an_index_mixing_keys_and_batch_items_is_an_index_error(index):
    td = make_td()
    before = snapshot(td)
    with pytest.raises(IndexError, match="a batch index cannot hold the str"):
        td[index]
    with pytest.raises(IndexError, match="a batch index cannot hold the str"):
        td[index] = 0
    assert_same_snapshot(before, snapshot(td))
