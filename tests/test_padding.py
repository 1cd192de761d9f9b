"""pad and pad_sequence, stated against torch.

- ``pad(td, pad_size, value)[key]`` is ``torch.nn.functional.pad`` of the leaf with ``pad_size``
  applied to its batch dims, *first dim first* (F.pad lists the last dim first), feature dims
  untouched; non-tensor entries hold ``None`` in the padded slots.
- ``pad_sequence(tds, pad_dim)[key]`` is ``torch.nn.utils.rnn.pad_sequence(..., batch_first=True)``
  of the leaves with ``pad_dim`` moved first (and moved back after the new stack dim).
"""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchdict import NonTensorData, NonTensorStack, TensorDict, tensorclass
from torchdict._padding import pad, pad_sequence

from _helpers import assert_same_snapshot, snapshot
from _tensor_strategies import leaves, tensordicts

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@tensorclass
class Sample:
    x: torch.Tensor
    tag: str


def batch_widths(pad_size, ndim):
    """``pad_size`` (first batch dim first) as F.pad's argument for a tensor of ``ndim`` dims."""
    pairs = [pad_size[i:i + 2] for i in range(0, len(pad_size), 2)]
    return [0, 0] * (ndim - len(pairs)) + [width for pair in reversed(pairs) for width in pair]


def rnn_reference(leaves_, pad_dim=0, value=0.0, side="right"):
    """torch's own padding of a sequence: along dim 0, so ``pad_dim`` is moved there and back."""
    moved = [leaf.movedim(pad_dim, 0) for leaf in leaves_]
    stacked = torch.nn.utils.rnn.pad_sequence(moved, batch_first=True, padding_value=value, padding_side=side)
    return stacked.movedim(1, pad_dim + 1)


def length_mask(lengths, length, side="right"):
    """``mask[i, j]``: position ``j`` holds data of input ``i``."""
    positions = torch.arange(length)
    lengths = torch.tensor(lengths)[:, None]
    return positions < lengths if side == "right" else positions >= length - lengths


def make_td():
    return TensorDict(
        {"a": torch.arange(6.0).view(2, 3), "b": torch.arange(24).view(2, 3, 4),
         "n": {"c": torch.arange(30.0).view(2, 3, 5)}, "s": "hi"},
        batch_size=[2, 3], names=["x", "y"],
    )


# ------------------------------------------------------------------------------------------- pad


@st.composite
def td_and_pad_size(draw):
    td = draw(tensordicts())
    pad_size = []
    for size in td.batch_size[:draw(st.integers(0, td.batch_dims))]:
        before = draw(st.integers(-size, 3))
        # F.pad crops first: the two crops together fit in the dim.
        pad_size += [before, draw(st.integers(-size - min(before, 0), 3))]
    return td, pad_size


@SETTINGS
@given(case=td_and_pad_size(), value=st.sampled_from([0.0, 1.0, -2.0]))
def test_pad_equals_functional_pad_of_every_leaf_on_the_batch_dims(case, value):
    td, pad_size = case
    before = snapshot(td)
    result = pad(td, pad_size, value=value)
    sizes = list(td.batch_size)
    for dim in range(len(pad_size) // 2):
        sizes[dim] += pad_size[2 * dim] + pad_size[2 * dim + 1]
    assert result.batch_size == torch.Size(sizes)
    grid = F.pad(torch.arange(td.numel()).view(td.batch_size), batch_widths(pad_size, td.batch_dims), value=-1)
    for key, leaf in leaves(td).items():
        got = result.get(key)
        if isinstance(leaf, torch.Tensor):
            expected = F.pad(leaf, batch_widths(pad_size, leaf.dim()), value=value)
            assert got.dtype == expected.dtype and torch.equal(got, expected), key
        else:  # the element each padded slot came from, None where the grid holds the pad value
            values = leaf._flat_values()
            assert got.batch_size == grid.shape
            assert got._flat_values() == [values[i] if i >= 0 else None for i in grid.reshape(-1).tolist()]
    if "nested" in td.keys():
        assert result["nested"].batch_size == result.batch_size + td["nested"].batch_size[td.batch_dims:]
    assert_same_snapshot(before, snapshot(td))


def test_pad_example_grows_the_batch_and_keeps_feature_dims():
    td = TensorDict({"a": torch.ones(3, 4, 1), "b": torch.ones(3, 4, 1, 1)}, batch_size=[3, 4])
    result = pad(td, [0, 1, 0, 2], value=0.0)
    assert result.batch_size == torch.Size([4, 6])
    assert result["a"].shape == (4, 6, 1) and result["b"].shape == (4, 6, 1, 1)
    assert result["a"][:3, :4].eq(1).all() and result["a"][3].eq(0).all() and result["a"][:, 4:].eq(0).all()


def test_pad_size_shorter_than_the_batch_pads_the_leading_dims():
    td = make_td()
    result = pad(td, [1, 1])
    assert result.batch_size == torch.Size([4, 3])
    assert torch.equal(result["a"], F.pad(td["a"], [0, 0, 1, 1]))
    assert result["n"].batch_size == torch.Size([4, 3])


def test_negative_widths_crop():
    td = make_td()
    result = pad(td, [-1, 0, 1, -2])
    assert result.batch_size == torch.Size([1, 2])
    assert torch.equal(result["a"], torch.tensor([[0.0, 3.0]]))
    assert result.get("s").tolist() == [[None, "hi"]]
    emptied = pad(td, [-2, 0])
    assert emptied.batch_size == torch.Size([0, 3]) and emptied["b"].shape == (0, 3, 4)


def test_pad_keeps_names_device_and_gives_an_unlocked_result():
    td = make_td()
    assert pad(td, [1, 0]).names == ["x", "y"]
    on_cpu = TensorDict({"a": torch.zeros(2)}, [2], device="cpu").lock_()
    result = pad(on_cpu, [1, 1])
    assert result.device == torch.device("cpu") and not result.is_locked


def test_pad_copies_even_with_zero_widths():
    td = make_td()
    result = pad(td, [0, 0, 0, 0])
    assert torch.equal(result["a"], td["a"]) and result["a"] is not td["a"]
    assert (result.get("s") == td.get("s")).all()


def test_non_tensor_entries_hold_none_in_the_padded_slots():
    shared = pad(TensorDict(s="hi", batch_size=[2]), [1, 1]).get("s")
    assert isinstance(shared, NonTensorStack) and shared.tolist() == [None, "hi", "hi", None]
    per_element = torch.stack([TensorDict(s="a"), TensorDict(s="b")])
    assert pad(per_element, [1, 1])["s"] == [None, "a", "b", None]
    assert pad(per_element, [-1, 1])["s"] == ["b", None]


def test_cropping_a_shared_value_keeps_it_shared():
    # torchdict's convention for batch ops (upstream gives a stack of the same value).
    result = pad(TensorDict(s="hi", batch_size=[3]), [-1, 0]).get("s")
    assert type(result) is NonTensorData and result.batch_size == (2,) and result.data == "hi"


def test_pad_of_a_tensorclass_gives_the_same_class():
    sample = Sample(x=torch.ones(2), tag="t", batch_size=[2])
    result = pad(sample, [1, 0], value=-1.0)
    assert type(result) is Sample
    assert torch.equal(result.x, torch.tensor([-1.0, 1.0, 1.0]))
    assert result.tag == [None, "t", "t"]
    assert torch.equal(sample.x, torch.ones(2))


def test_pad_inplace_replaces_the_leaves_and_keeps_the_objects():
    td = make_td()
    nested, old_a = td["n"], td["a"]
    assert pad(td, [1, 0], inplace=True) is td
    assert td.batch_size == torch.Size([3, 3]) and td.names == ["x", "y"]
    assert td["n"] is nested and nested.batch_size == torch.Size([3, 3])
    assert torch.equal(td["a"], F.pad(old_a, [0, 0, 1, 0]))
    assert torch.equal(old_a, torch.arange(6.0).view(2, 3))  # the old leaf is replaced, not written
    assert td.get("s").tolist() == [[None] * 3, ["hi"] * 3, ["hi"] * 3]
    sample = Sample(x=torch.ones(2), tag="t", batch_size=[2])
    assert pad(sample, [0, 1], inplace=True) is sample and torch.equal(sample.x, torch.tensor([1.0, 1.0, 0.0]))


@pytest.mark.parametrize("locked", ["root", "nested"])
def test_pad_inplace_refuses_a_locked_tree_and_changes_nothing(locked):
    td = make_td()
    (td if locked == "root" else td["n"]).lock_()
    before = snapshot(td)
    with pytest.raises(RuntimeError, match="locked"):
        pad(td, [1, 0], inplace=True)
    assert_same_snapshot(before, snapshot(td))
    assert td["n"].batch_size == torch.Size([2, 3])


@pytest.mark.parametrize("pad_size, error, match", [
    ([1, 1, 1, 1, 1, 1], RuntimeError, "<= 2 \\* the number of batch dimensions"),
    ([1], RuntimeError, "even number"),
    ([1, 0, 1], RuntimeError, "even number"),
    ([-3, 0], RuntimeError, "crops more elements than the dim holds"),
    ([0, 0, -2, -2], RuntimeError, "crops more"),
    ([2, -3], RuntimeError, "crops more"),
    ([1.5, 0], TypeError, "sequence of ints"),
    (["1", 0], TypeError, "sequence of ints"),
])
@pytest.mark.parametrize("inplace", [False, True])
def test_pad_errors_leave_the_input_unchanged(pad_size, error, match, inplace):
    td = make_td()
    before = snapshot(td)
    with pytest.raises(error, match=match):
        pad(td, pad_size, inplace=inplace)
    assert_same_snapshot(before, snapshot(td))


def test_pad_refuses_what_is_not_a_tensor_collection():
    with pytest.raises(TypeError, match="TensorDict or a tensorclass"):
        pad({"a": torch.zeros(2)}, [1, 1])
    with pytest.raises(TypeError, match="TensorDict or a tensorclass"):
        pad(torch.zeros(2), [1, 1])


# ---------------------------------------------------------------------------------- pad_sequence


@SETTINGS
@given(lengths=st.lists(st.integers(0, 4), min_size=1, max_size=4), side=st.sampled_from(["right", "left"]),
       value=st.sampled_from([0.0, -1.0]), seed=st.integers(0, 2**16))
def test_pad_sequence_equals_rnn_pad_sequence_of_every_leaf(lengths, side, value, seed):
    generator = torch.Generator().manual_seed(seed)
    tds = [TensorDict({"a": torch.randn(n, 2, generator=generator), "n": {"i": torch.randint(9, (n,))}})
           for n in lengths]
    befores = [snapshot(td) for td in tds]
    result = pad_sequence(tds, padding_value=value, padding_side=side, return_mask=True)
    assert result.batch_size == torch.Size([len(tds)])
    for key in ["a", ("n", "i")]:
        expected = rnn_reference([td[key] for td in tds], value=value, side=side)
        assert result[key].dtype == expected.dtype and torch.equal(result[key], expected), key
        assert torch.equal(result["masks", *((key,) if isinstance(key, str) else key)],
                           length_mask(lengths, max(lengths), side))
    for td, before in zip(tds, befores):
        assert_same_snapshot(before, snapshot(td))


def sequences():
    """Three samples whose batch (their time dim) has lengths 3, 2, 1."""
    return [
        TensorDict({"a": torch.arange(3.0), "s": "u", "n": {"c": torch.zeros(3, 2)}}, [3]),
        TensorDict({"a": torch.arange(2.0), "s": "v", "n": {"c": torch.ones(2, 2)}}, [2]),
        TensorDict({"a": torch.arange(1.0) + 5, "s": "w", "n": {"c": torch.ones(1, 2)}}, [1]),
    ]


@pytest.mark.parametrize("side", ["right", "left"])
def test_padding_a_batch_dim_pads_the_batch_size(side):
    tds = sequences()
    result = pad_sequence(tds, padding_value=-1, padding_side=side, return_mask=True)
    assert result.batch_size == torch.Size([3, 3])
    assert result["n"].batch_size == torch.Size([3, 3])
    assert torch.equal(result["a"], rnn_reference([td["a"] for td in tds], value=-1, side=side))
    assert torch.equal(result["n", "c"], rnn_reference([td["n", "c"] for td in tds], value=-1, side=side))
    data = [["u"] * 3, ["v"] * 2, ["w"]]
    padded = [row + [None] * (3 - len(row)) if side == "right" else [None] * (3 - len(row)) + row for row in data]
    assert result["s"] == padded
    mask = length_mask([3, 2, 1], 3, side)
    # The mask has the result's batch shape, and so has the masks TensorDict (nested ones too).
    assert torch.equal(result["masks", "a"], mask) and torch.equal(result["masks", "n", "c"], mask)
    assert result["masks"].batch_size == result["masks", "n"].batch_size == result.batch_size
    assert set(result["masks"].keys(include_nested=True, leaves_only=True)) == {"a", ("n", "c")}


def test_padding_an_inner_batch_dim():
    tds = [TensorDict({"a": torch.randn(2, n, 4)}, [2, n]) for n in (3, 5)]
    for pad_dim in (1, -2):
        result = pad_sequence(tds, pad_dim=pad_dim, return_mask=True)
        assert result.batch_size == torch.Size([2, 2, 5])
        assert torch.equal(result["a"], rnn_reference([td["a"] for td in tds], pad_dim=1))
        assert torch.equal(result["masks", "a"], length_mask([3, 5], 5)[:, None, :].expand(2, 2, 5))


@pytest.mark.parametrize("pad_dim", [1, -1])
def test_padding_a_feature_dim_keeps_the_batch_and_masks_have_the_length_last(pad_dim):
    # "a" is padded along its last dim either way; "b" along its middle dim (1) or its last one (-1).
    tds = [TensorDict({"a": torch.randn(2, n), "b": torch.randn(2, n, 3) if pad_dim == 1 else torch.randn(2, 3, n)},
                      [2]) for n in (3, 5)]
    result = pad_sequence(tds, pad_dim=pad_dim, return_mask=True)
    assert result.batch_size == torch.Size([2, 2])
    assert torch.equal(result["a"], rnn_reference([td["a"] for td in tds], pad_dim=1))
    assert torch.equal(result["b"], rnn_reference([td["b"] for td in tds], pad_dim=1 if pad_dim == 1 else 2))
    # The mask is the result's batch shape followed by the padded length, wherever the padded dim is.
    mask = length_mask([3, 5], 5)[:, None, :].expand(2, 2, 5)
    assert torch.equal(result["masks", "a"], mask)
    assert torch.equal(result["masks", "b"], mask)


def test_a_nested_batch_dim_beyond_the_parent_is_padded_too():
    tds = [TensorDict({"n": TensorDict({"c": torch.randn(n, 2), "s": f"t{n}"}, [n])}) for n in (3, 2)]
    result = pad_sequence(tds, return_mask=True)
    assert result.batch_size == torch.Size([2]) and result["n"].batch_size == torch.Size([2, 3])
    assert torch.equal(result["n", "c"], rnn_reference([td["n", "c"] for td in tds]))
    assert result["n", "s"] == [["t3"] * 3, ["t2", "t2", None]]
    assert torch.equal(result["masks", "n", "c"], length_mask([3, 2], 3))


def test_non_tensor_entries_of_unbatched_samples_are_stacked():
    result = pad_sequence([TensorDict(s="a", x=torch.zeros(2)), TensorDict(s="a", x=torch.zeros(3))],
                          return_mask=True)
    assert result.get("s").tolist() == ["a", "a"]
    assert list(result["masks"].keys()) == ["x"]  # non-tensor entries get no mask


def test_samples_with_only_non_tensor_entries_are_padded_along_pad_dim():
    result = pad_sequence([TensorDict(s="a", batch_size=[2]), TensorDict(s="b", batch_size=[3])],
                          return_mask=True)
    assert result.batch_size == torch.Size([2, 3])
    assert result["s"] == [["a", "a", None], ["b", "b", "b"]]
    assert "masks" not in result.keys()  # no tensor entry, no mask


@pytest.mark.parametrize("return_mask, path", [("mm", ("mm",)), (("x", "m"), ("x", "m")), ((("x",), "m"), ("x", "m"))])
def test_return_mask_names_the_masks_entry(return_mask, path):
    result = pad_sequence([TensorDict(a=torch.ones(2)), TensorDict(a=torch.ones(3))], return_mask=return_mask)
    assert torch.equal(result[(*path, "a")], length_mask([2, 3], 3))
    assert "masks" not in result.keys()


def test_padding_value_by_key():
    tds = [TensorDict(ids=torch.ones(n, dtype=torch.long), labels=torch.ones(n, dtype=torch.long),
                      n={"x": torch.ones(n)}) for n in (2, 3)]
    result = pad_sequence(tds, padding_value={"ids": 7, "labels": -100})
    assert torch.equal(result["ids"], torch.tensor([[1, 1, 7], [1, 1, 1]]))
    assert torch.equal(result["labels"], torch.tensor([[1, 1, -100], [1, 1, 1]]))
    assert torch.equal(result["n", "x"], torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]))  # unnamed: 0
    nested = pad_sequence(tds, padding_value={("n", "x"): 2.0})
    assert torch.equal(nested["n", "x"], torch.tensor([[1.0, 1.0, 2.0], [1.0, 1.0, 1.0]]))


def test_pad_sequence_of_tensorclasses_gives_the_class():
    samples = [Sample(x=torch.ones(n), tag=f"t{n}", batch_size=[n]) for n in (1, 2)]
    result = pad_sequence(samples)
    assert type(result) is Sample and result.batch_size == torch.Size([2, 2])
    assert torch.equal(result.x, torch.tensor([[1.0, 0.0], [1.0, 1.0]]))
    assert result.tag == [["t1", None], ["t2", "t2"]]
    with pytest.raises(RuntimeError, match="return_mask=False"):
        pad_sequence(samples, return_mask=True)


def test_a_single_sample_and_samples_without_entries():
    single = pad_sequence([TensorDict(a=torch.ones(2))], return_mask=True)
    assert torch.equal(single["a"], torch.ones(1, 2)) and single["masks", "a"].all()
    empty = pad_sequence([TensorDict(batch_size=[2]), TensorDict(batch_size=[3])])
    assert empty.batch_size == torch.Size([2, 3]) and not list(empty.keys())


def test_pad_sequence_keeps_the_device_and_drops_names():
    tds = [TensorDict(x=torch.zeros(n), batch_size=[n], device="cpu", names=["t"]) for n in (1, 2)]
    result = pad_sequence(tds)
    assert result.device == torch.device("cpu") and result.names == [None, None]


def test_out_receives_the_result_in_place():
    tds = [TensorDict(x=torch.ones(2)), TensorDict(x=torch.ones(3))]
    out = TensorDict({"x": torch.full((2, 3), 5.0)}, [2])
    buffer = out["x"]
    assert pad_sequence(tds, out=out, return_mask=True) is out
    assert out["x"] is buffer and torch.equal(buffer, torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]))
    assert torch.equal(out["masks", "x"], length_mask([2, 3], 3))  # a missing entry is added
    locked = TensorDict({"x": torch.zeros(2, 3)}, [2]).lock_()
    pad_sequence(tds, out=locked)  # existing entries are written in place, allowed when locked
    assert torch.equal(locked["x"], buffer)


@pytest.mark.parametrize("out, match", [
    (TensorDict({"x": torch.zeros(3, 3)}, [3]), "batch size"),
    (TensorDict({"x": torch.zeros(2, 4)}, [2]), "shape"),
    (TensorDict({"x": {"y": torch.zeros(2)}}, [2]), "TensorDict at 'x'"),
    (TensorDict({"y": torch.zeros(2)}, [2]).lock_(), "locked"),
])
def test_a_bad_out_is_refused_and_left_unchanged(out, match):
    tds = [TensorDict(x=torch.ones(2)), TensorDict(x=torch.ones(3))]
    before = snapshot(out)
    with pytest.raises(RuntimeError, match=match):
        pad_sequence(tds, out=out)
    assert_same_snapshot(before, snapshot(out))


def scalar_sample(n):
    return TensorDict(a=torch.tensor(float(n)))


@pytest.mark.parametrize("make, kwargs, error, match", [
    (lambda: [], {}, RuntimeError, "cannot be empty"),
    (lambda: [TensorDict(x=torch.ones(2))], {"padding_side": "middle"}, ValueError, "padding_side"),
    (lambda: [TensorDict(x=torch.ones(2)), {"x": torch.ones(2)}], {}, TypeError, "position 1"),
    (lambda: [TensorDict(x=torch.ones(2))], {"pad_dim": 0.5}, TypeError, "pad_dim"),
    (lambda: [TensorDict(x=torch.ones(2))], {"return_mask": 1}, TypeError, "return_mask"),
    (lambda: [TensorDict(x=torch.ones(2)), TensorDict(x=torch.ones(2), y=torch.ones(2))], {}, KeyError,
     "same keys"),
    (lambda: [TensorDict(n={"x": torch.ones(2)}), TensorDict(n={"y": torch.ones(2)})], {}, KeyError,
     "sub-tensordicts at 'n'"),
    (lambda: [TensorDict(x=torch.ones(2)), TensorDict(x={"y": torch.ones(2)})], {}, TypeError,
     "different kinds"),
    (lambda: [TensorDict(x=torch.ones(2)), TensorDict(x="text")], {}, TypeError, "different kinds"),
    (lambda: [scalar_sample(1), scalar_sample(2)], {}, RuntimeError, "Cannot pad scalars"),
    (lambda: [TensorDict(x=torch.ones(2, 3)), TensorDict(x=torch.ones(3, 5))], {}, RuntimeError,
     "same shape except along dim 0"),
    (lambda: [TensorDict(x=torch.ones(2, 3)), TensorDict(x=torch.ones(3, 5))], {"pad_dim": 1}, RuntimeError,
     "same shape except along dim 1"),
    (lambda: [TensorDict(x=torch.ones(2, 3)), TensorDict(x=torch.ones(3))], {}, RuntimeError, "same shape"),
    # torch would broadcast the size-1 dim: refused, every dim but pad_dim must match exactly.
    (lambda: [TensorDict(x=torch.ones(2, 3)), TensorDict(x=torch.ones(2, 1))], {"pad_dim": 0}, RuntimeError,
     "same shape"),
    (lambda: [TensorDict(x=torch.ones(2, 3)), TensorDict(x=torch.ones(2, 5))], {"pad_dim": 2}, IndexError,
     "out of range"),
    (lambda: [TensorDict(x=torch.ones(2, 3)), TensorDict(x=torch.ones(2, 5))], {"pad_dim": -3}, IndexError,
     "out of range"),
    (lambda: [TensorDict(a=torch.ones(3), batch_size=[3]), TensorDict(a=torch.ones(2, 2), batch_size=[2, 2])],
     {}, RuntimeError, "as many dims"),
    (lambda: [TensorDict(s="a", batch_size=[2]), TensorDict(s="b", batch_size=[3])], {"pad_dim": 1},
     IndexError, "out of range"),
    (lambda: [TensorDict(batch_size=[2, 2]), TensorDict(batch_size=[2, 3])], {}, RuntimeError,
     "only pad along dim 0"),
    (lambda: [TensorDict(x=torch.ones(2)), TensorDict(x=torch.ones(3))], {"padding_value": {"z": 1}}, KeyError,
     "name no entry"),
    (lambda: [TensorDict(n={"x": torch.ones(2)})], {"padding_value": {"n": 1}}, KeyError, "name no entry"),
    (lambda: [TensorDict(x=torch.ones(2), masks=torch.ones(2))], {"return_mask": True}, KeyError,
     "already hold an entry"),
    (lambda: [TensorDict(x=torch.ones(2), m=torch.ones(2))], {"return_mask": ("m", "k")}, KeyError,
     "already hold an entry"),
])
def test_pad_sequence_errors_leave_the_inputs_unchanged(make, kwargs, error, match):
    tds = make()
    befores = [snapshot(td) for td in tds if isinstance(td, TensorDict)]
    with pytest.raises(error, match=match):
        pad_sequence(tds, **kwargs)
    afters = [snapshot(td) for td in tds if isinstance(td, TensorDict)]
    for before, after in zip(befores, afters):
        assert_same_snapshot(before, after)
