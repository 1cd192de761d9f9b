"""Non-tensor leaves follow the batch like a tensor of the batch shape would."""
import pytest
import torch

from torchdict import NonTensorData, NonTensorStack, TensorDict
from torchdict.nontensor import combine_non_tensor


def grid(values, shape):
    return NonTensorStack._from_flat(values, shape)


@pytest.mark.parametrize(
    "op",
    [lambda t: t[1], lambda t: t[:, ::2], lambda t: t.permute(1, 0), lambda t: t.reshape(-1),
     lambda t: t[torch.tensor([1, 0])], lambda t: t[torch.tensor([[True, False, True], [False, True, False]])],
     lambda t: t.unsqueeze(0), lambda t: t.flip(0)],
)
def test_batch_ops_on_a_stack_pick_the_values_a_tensor_would_pick(op):
    values = list("abcdef")
    stack = grid(values, (2, 3))
    reference = torch.arange(6).view(2, 3)
    result = stack._batch_op(op)
    expected_positions = op(reference)
    assert result.batch_size == expected_positions.shape
    flat = result._flat_values()
    assert flat == [values[i] for i in expected_positions.reshape(-1).tolist()]


def test_a_single_element_of_a_stack_is_plain_data():
    result = grid(["a", "b"], (2,))._batch_op(lambda t: t[1])
    assert isinstance(result, NonTensorData) and result.data == "b"


def test_non_tensor_data_only_changes_its_batch_size():
    data = NonTensorData("x", (2, 3))
    result = data._batch_op(lambda t: t.permute(1, 0)[:, :1])
    assert result.data == "x" and result.batch_size == torch.Size([3, 1])
    assert data.tolist() == [["x"] * 3] * 2


def test_combine_stacks_and_concatenates_like_torch():
    left, right = NonTensorData("a", (2,)), grid(["b", "c"], (2,))
    stacked = combine_non_tensor([left, right], lambda grids: torch.stack(grids, 1))
    assert stacked.batch_size == torch.Size([2, 2]) and stacked.tolist() == [["a", "b"], ["a", "c"]]
    catted = combine_non_tensor([left, right], lambda grids: torch.cat(grids, 0))
    assert catted.tolist() == ["a", "a", "b", "c"]


def test_set_at_writes_selected_positions():
    stack = grid(["a", "b", "c"], (3,))
    stack._set_at(torch.tensor([True, False, True]), "z")
    assert stack.tolist() == ["z", "b", "z"]
    stack._set_at(slice(0, 2), NonTensorStack("p", "q"))
    assert stack.tolist() == ["p", "q", "z"]
    with pytest.raises(RuntimeError, match="Cannot write 2 non-tensor values into 3 positions"):
        stack._set_at(slice(None), NonTensorStack("p", "q"))


def test_nested_list_round_trip():
    values = [["a", "b"], ["c", "d"]]
    stack = NonTensorStack.from_nested_list(values)
    assert stack.batch_size == torch.Size([2, 2]) and stack.data == values
    with pytest.raises(ValueError, match="rectangular"):
        NonTensorStack.from_nested_list([["a"], ["b", "c"]])


def test_in_a_tensordict():
    td = TensorDict(batch_size=[2])
    td["s"] = "hello"
    assert td.get("s").batch_size == torch.Size([2]) and td["s"] == "hello"
    td.set_non_tensor("n", 3)
    assert td["n"] == 3 and td.is_non_tensor("n") and td.is_non_tensor("s")
    td.set_("s", "bye")
    assert td["s"] == "bye"
    assert "s" not in td.keys(leaves_only=True)


def _row(text, n=4):
    return TensorDict({"a": torch.zeros(n), "s": text}, batch_size=[n])


def test_stack_then_index_gives_back_each_value():
    rows = [_row("x"), _row("y"), _row("z")]
    stacked = torch.stack(rows)
    assert [stacked[i]["s"] for i in range(3)] == ["x", "y", "z"]
    assert [td["s"] for td in stacked.unbind(0)] == ["x", "y", "z"]
    assert stacked[1, :2]["s"] == "y"
    assert stacked[:, 0]["s"] == ["x", "y", "z"]


@pytest.mark.parametrize("combine", ["stack 0", "stack 1", "cat"])
@pytest.mark.parametrize("index", [(1,), (slice(None), 2), (1, slice(0, 2)), (slice(0, 2),),
                                   (slice(None), slice(1, 3)), (slice(4, 6),)])
def test_what_is_stacked_or_concatenated_reads_back_as_written(combine, index):
    # As upstream: elements that all come from one stacked source read back as its value when
    # the selection has no more dims than the source (a row of batch [4]): stacked[1] is "y",
    # but stacked[0:1] stays a one-row list. A cat of different values is one flat list, so its
    # slices stay lists. Anything else reads back as the per-element nested list.
    rows = [_row("x"), _row("y"), _row("z")]
    combined = torch.cat(rows) if combine == "cat" else torch.stack(rows, int(combine[-1]))
    sources = NonTensorStack.from_nested_list(combined["s"], combined.batch_size)
    try:
        picked = sources._batch_op(lambda grid: grid[index])
    except IndexError:
        return
    values = set(picked._flat_values())
    result = combined[index]["s"]
    one_source_value = len(values) == 1 and combine != "cat" and len(picked.batch_size) <= 1
    if one_source_value or not picked.batch_size:
        assert result == values.pop()
    else:
        assert result == picked.data


def test_writing_one_value_at_an_index_reads_back_as_that_value():
    td = TensorDict({"a": torch.zeros(2, 3), "s": "x"}, batch_size=[2, 3])
    td[1] = TensorDict({"a": torch.ones(3), "s": "z"}, batch_size=[3])
    assert (td[0]["s"], td[1]["s"]) == ("x", "z")
    assert td["s"] == [["x"] * 3, ["z"] * 3]
    td[:] = TensorDict({"a": torch.ones(2, 3), "s": "w"}, batch_size=[2, 3])
    assert td["s"] == "w" and type(td.get("s")) is NonTensorData
    # Values given one per element stay per element, even when some are equal.
    stack = NonTensorStack("p", "p", "q")
    assert stack._batch_op(lambda grid: grid[:2]).data == ["p", "p"]


def test_slices_of_stacked_values_stay_lists_as_upstream():
    # Observed on upstream 0.15.3: an int index along the stack dim gives the stacked value back,
    # a slice keeps a (one-row) list, and a cat of different values is one flat list.
    same = torch.stack([TensorDict(s="x"), TensorDict(s="x")])
    assert same["s"] == ["x", "x"] and same[0:1]["s"] == ["x"] and same[0]["s"] == "x"
    pair = torch.stack([TensorDict(s="x"), TensorDict(s="y")])
    assert pair[1:]["s"] == ["y"] and pair.unsqueeze(1)[1]["s"] == ["y"] and pair.unsqueeze(1)[:, 0]["s"] == ["x", "y"]
    shared_x, shared_y = TensorDict({"s": "x"}, [3]), TensorDict({"s": "y"}, [3])
    rows = torch.stack([shared_x, shared_y])
    assert rows[0]["s"] == "x" and rows[0, 0:2]["s"] == "x" and rows[0:1]["s"] == [["x", "x", "x"]]
    assert torch.stack([shared_x])["s"] == [["x", "x", "x"]] and torch.cat([shared_x])["s"] == "x"
    joined = torch.cat([shared_x, shared_y])
    assert joined[0:2]["s"] == ["x", "x"] and joined[3:]["s"] == ["y", "y", "y"] and joined[4]["s"] == "y"
