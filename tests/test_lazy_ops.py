"""LazyStackedTensorDict's member-wise operations and reductions, against each member's own
result or the dense torch.stack of the members (construction, reads and writes: test_lazy.py)."""
import pickle
import warnings

import pytest
import torch

from torchdict import TensorDict
from torchdict.lazy import LazyStackedTensorDict, lazy_stack

from test_lazy import RAGGED, assert_unchanged, make_members, snapshots

# ------------------------------------------------------------------------------- member-wise operations


def dense_members(count=3):
    """Members without exclusive or ragged keys, so that the dense stack exists to compare with."""
    return [t.exclude(f"only{i}") for i, t in enumerate(make_members(count, ragged=False))]


def assert_td_equal(got, expected):
    assert got.batch_size == expected.batch_size
    assert set(got.keys(True, True)) == set(expected.keys(True, True))
    for key in expected.keys(True, True):
        if isinstance(expected[key], torch.Tensor):  # close: pow may differ in the last bit across kernels
            torch.testing.assert_close(got[key], expected[key], rtol=1e-6, atol=0, msg=str(key))
        else:
            assert got[key] == expected[key], key


@pytest.mark.parametrize("dim", [0, 1, 2])
def test_select_exclude_are_lazy_stacks_of_the_members_ones(dim):
    tds = make_members()
    td = lazy_stack(tds, dim)
    for result, expected in [(td.select("x", ("n", "z")), [t.select("x", ("n", "z")) for t in tds]),
                             (td.exclude("x", "only1", "missing"), [t.exclude("x", "only1") for t in tds])]:
        assert isinstance(result, LazyStackedTensorDict) and result.stack_dim == td.stack_dim
        for member, want in zip(result.tensordicts, expected):
            assert_td_equal(member, want)
    assert td.keys() == ["x", "n", "s", "y"] and all(f"only{i}" in t.keys() for i, t in enumerate(tds))


def test_select_errors_and_in_place_forms():
    tds = make_members()
    td = lazy_stack(tds)
    before = snapshots(tds)
    with pytest.raises(KeyError, match='key "only0" not found in TensorDict'):
        td.select("x", "only0")  # member 1 lacks it
    assert_unchanged(tds, before)
    assert [list(t.keys()) for t in td.select("only0", strict=False).tensordicts] == [["only0"], [], []]
    td.lock_()
    before = snapshots(tds)
    with pytest.raises(RuntimeError, match="Cannot modify locked TensorDict"):
        td.select("x", inplace=True)
    with pytest.raises(RuntimeError, match="Cannot modify locked TensorDict"):
        td.exclude("x", inplace=True)
    assert_unchanged(tds, before)
    td.unlock_()
    assert td.select("x", "n", inplace=True) is td
    assert td.exclude(("n", "z"), inplace=True) is td
    assert td.tensordicts == tds and [list(t.keys(True)) for t in tds] == [["x", "n"]] * 3


@pytest.mark.parametrize("dim", [0, 1])
def test_items_and_values_are_the_stacked_reads(dim):
    tds = make_members(ragged=False)
    td = lazy_stack(tds, dim)
    items = list(td.items(include_nested=True, leaves_only=True))
    assert [key for key, _ in items] == td.keys(True, True)
    for key, value in items:
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, torch.stack([t[key] for t in tds], dim))
    assert [type(value).__name__ for value in td.values()] == ["Tensor", "LazyStackedTensorDict", "NonTensorStack",
                                                             "Tensor"]


def test_items_raise_the_ragged_error_at_a_ragged_entry():
    td = lazy_stack(make_members())
    items = td.items()
    assert [key for key, _ in (next(items), next(items), next(items))] == ["x", "n", "s"]
    with pytest.raises(RuntimeError, match=f"under the key 'y'.*{RAGGED}"):
        next(items)
    with pytest.raises(RuntimeError, match=RAGGED):
        list(td.values())


@pytest.mark.parametrize("dim", [0, 1])
def test_update_writes_each_member_its_slice(dim):
    tds = make_members()
    td = lazy_stack(tds, dim)
    new, w = torch.rand(td.batch_size + (2,)), torch.rand(td.batch_size)
    assert td.update({"new": new, "n": {"w": w}, ("deep", "k"): w}) is td
    for i, t in enumerate(tds):
        assert torch.equal(t["new"], new.select(dim, i)) and torch.equal(t["deep", "k"], w.select(dim, i))
        assert torch.equal(t["n", "w"], w.select(dim, i)) and torch.equal(t["n", "z"], torch.full((2, 3), float(i)))
    olds = [t["x"] for t in tds]
    x = torch.rand(td.batch_size + (4,))
    td.update(TensorDict(x=x, batch_size=td.batch_size), inplace=True)
    assert all(t["x"] is old for t, old in zip(tds, olds)) and torch.equal(td["x"], x)
    td.update({"x": x + 1})  # not in place: the members get new tensors
    assert all(t["x"] is not old for t, old in zip(tds, olds)) and torch.equal(td["x"], x + 1)


def test_update_from_a_lazy_source_writes_ragged_entries_member_by_member():
    tds = make_members()
    td = lazy_stack(tds, 1)
    source = lazy_stack([TensorDict(r=torch.rand(2, 3, i + 1), batch_size=[2, 3]) for i in range(3)], 1)
    td.update(source)
    assert all(t["r"] is s["r"] for t, s in zip(tds, source.tensordicts))


@pytest.mark.parametrize("inplace", [False, True])
def test_a_failing_update_changes_nothing(inplace):
    tds = make_members()
    td = lazy_stack(tds)
    before = snapshots(tds)
    good = {"x": torch.rand(3, 2, 3, 4), "new": torch.zeros(3, 2, 3), "n": {"z": torch.ones(3, 2, 3), "w": torch.ones(3, 2, 3)}}
    with pytest.raises(RuntimeError, match="batch dimension mismatch"):
        td.update({**good, "bad": torch.zeros(3)}, inplace=inplace)
    # "only2" is a tensor in member 2 only: writing through it fails there, after the other entries.
    with pytest.raises(KeyError, match="already present"):
        td.update({**good, ("only2", "deep"): torch.zeros(3, 2, 3)}, inplace=inplace)
    assert_unchanged(tds, before)
    with pytest.raises(AttributeError):
        td.update(3)


def test_update_on_a_locked_stack():
    tds = make_members()
    td = lazy_stack(tds).lock_()
    before = snapshots(tds)
    with pytest.raises(RuntimeError, match="Cannot modify locked TensorDict"):
        td.update({"x": torch.zeros(3, 2, 3, 4)})
    assert_unchanged(tds, before)
    td.update({"x": torch.ones(3, 2, 3, 4)}, inplace=True)  # in place is allowed
    assert torch.equal(td["x"], torch.ones(3, 2, 3, 4))


def test_del_is_member_wise():
    tds = make_members()
    td = lazy_stack(tds)
    del td["x"]
    del td["n", "z"]
    assert all("x" not in t.keys() and ("n", "z") not in t.keys(True) for t in tds)
    del td["only1"]  # an exclusive key goes from the members that hold it, as upstream
    assert "only1" not in tds[1].keys() and "only0" in tds[0].keys()
    with pytest.raises(KeyError, match="Key missing not found in any of the stacked tensordicts"):
        del td["missing"]
    assert td.del_("s") is td and all("s" not in t.keys() for t in tds)
    td.lock_()
    with pytest.raises(RuntimeError, match="Cannot modify locked TensorDict"):
        del td["y"]
    assert all("y" in t.keys() for t in tds)


@pytest.mark.parametrize("dim", [0, 2])
def test_pop_returns_the_stacked_value_and_removes_it(dim):
    tds = make_members()
    td = lazy_stack(tds, dim)
    expected = torch.stack([t["x"] for t in tds], dim)
    assert torch.equal(td.pop("x"), expected) and all("x" not in t.keys() for t in tds)
    assert [m is t["n"] for m, t in zip(td.get("n").tensordicts, tds)] == [True] * 3
    assert td.pop("missing", 3) == 3 and td.pop("only0", None) is None
    before = snapshots(tds)
    with pytest.raises(KeyError, match='key "only0" not found in LazyStackedTensorDict'):
        td.pop("only0")
    with pytest.raises(RuntimeError, match=RAGGED):
        td.pop("y")  # the read fails before anything is deleted
    assert_unchanged(tds, before)
    td.lock_()
    before = snapshots(tds)
    with pytest.raises(RuntimeError, match="Cannot modify locked TensorDict"):
        td.pop(("n", "z"))
    assert_unchanged(tds, before)


ARITHMETIC = [
    lambda a, b: a + b, lambda a, b: a - b, lambda a, b: a * b, lambda a, b: a / b, lambda a, b: a ** b,
    lambda a, b: a == b, lambda a, b: a != b, lambda a, b: a < b, lambda a, b: a >= b, lambda a, b: a.maximum(b),
    lambda a, b: a.add(b, alpha=2), lambda a, b: a % b,
]
#: ``number <op> lazy`` and ``lazy <op> lazy`` (``dense <op> lazy`` is dense: tested below).
REFLECTED = [lambda a, b: b - a, lambda a, b: b * a, lambda a, b: b / a, lambda a, b: b ** a]


@pytest.mark.parametrize("dim", [0, 1, 2])
@pytest.mark.parametrize("op", ARITHMETIC + REFLECTED)
def test_arithmetic_equals_the_dense_stacks(dim, op):
    tds = dense_members()
    td, dense = lazy_stack(tds, dim), torch.stack(tds, dim)
    other = [t.clone().apply(lambda x: x + 2) for t in tds]
    lazy_other, dense_other = lazy_stack(other, dim), torch.stack(other, dim)
    operands = [(2.0, 2.0), (lazy_other, dense_other)]
    if op not in REFLECTED:
        other_dim = (dim + 1) % 3  # a lazy operand stacked along another dim
        operands += [(dense_other, dense_other), (lazy_stack(list(dense_other.unbind(other_dim)), other_dim),
                                                  dense_other)]
    for operand, dense_operand in operands:
        result = op(td, operand)
        assert isinstance(result, LazyStackedTensorDict) and result.stack_dim == td.stack_dim
        assert_td_equal(result.contiguous(), op(dense, dense_operand))


@pytest.mark.parametrize("dim", [0, 1, 2])
def test_a_dense_tensordict_with_a_lazy_stack_uses_its_dense_form(dim):
    # dense <op> lazy, and torch.stack mixing both: the lazy stack stands in as its contiguous() form and
    # the result is a dense TensorDict (as upstream). torch.cat of a mix with the lazy stack first is a
    # lazy stack (as upstream: the dense items are split along its stack dim); with the dense item first,
    # TensorDict's torch.cat runs first and gives the dense result (upstream: a lazy stack).
    tds = dense_members()
    td, dense = lazy_stack(tds, dim), torch.stack(tds, dim)
    other = torch.stack([t.clone().apply(lambda x: x + 2) for t in tds], dim)
    for op in (lambda a, b: a - b, lambda a, b: a * b, lambda a, b: a == b, lambda a, b: a.maximum(b)):
        result = op(other, td)
        assert type(result) is TensorDict
        assert_td_equal(result, op(other, dense))
    for items in ([other, td], [td, other]):
        denses = [dense if item is td else item for item in items]
        stacked = torch.stack(items, 0)
        assert type(stacked) is TensorDict
        assert_td_equal(stacked, torch.stack(denses, 0))
        joined = torch.cat(items, 0)
        assert type(joined) is (LazyStackedTensorDict if items[0] is td else TensorDict)
        assert_td_equal(joined.contiguous(), torch.cat(denses, 0))


@pytest.mark.parametrize("dim", [0, 1])
def test_arithmetic_on_ragged_members_is_each_members_own(dim):
    tds = make_members()
    td = lazy_stack(tds, dim)
    for result, expected in [(td * 3 + 1, [t * 3 + 1 for t in tds]), (-td, [-t for t in tds]),
                             (abs(td - 50), [abs(t - 50) for t in tds]), (td.exp(), [t.exp() for t in tds]),
                             (td == td.clone(), [t == t.clone() for t in tds]), (td.clamp(0, 1), [t.clamp(0, 1)
                                                                                             for t in tds])]:
        assert result.stack_dim == td.stack_dim
        for member, want in zip(result.tensordicts, expected):
            assert_td_equal(member, want)
    assert (td == td.clone()).all() and not (td != td).any()
    assert torch.equal(torch.abs(td - 50)["x"], abs(td - 50)["x"]) and torch.equal(torch.add(td, 1)["x"],
                                                                                     td["x"] + 1)


@pytest.mark.parametrize("dim", [0, 1, 2])
def test_tensor_operands_broadcast_from_the_left_as_the_dense_stack(dim):
    tds = dense_members()
    td, dense = lazy_stack(tds, dim), torch.stack(tds, dim)
    batch = td.batch_size
    for operand in [torch.tensor(2.0), torch.rand(batch), torch.rand(batch[1:]), torch.rand(batch[2:]),
                    torch.rand(1, *batch[1:]), torch.rand(batch[0], 1, 1), torch.rand(5, *batch)]:
        result = td * operand  # the last one grows the batch in front (the stack dim moves right)
        assert result.batch_size == (dense * operand).batch_size
        assert_td_equal(result.contiguous(), dense * operand)


def test_operand_errors():
    tds = make_members()
    td = lazy_stack(tds)
    before = snapshots(tds)
    with pytest.raises(TypeError, match="unsupported operand"):
        td + "text"
    with pytest.raises(TypeError, match="unsupported operand"):
        td.add("text")
    with pytest.raises(RuntimeError, match="same batch size"):
        td + TensorDict(batch_size=[3, 2])
    with pytest.raises(RuntimeError, match=r"size of the operand \(2\) must match the size of the stack dim \(3\)"):
        td + torch.zeros(2, 2, 3)  # its first dim meets the stack dim
    with pytest.raises(KeyError):
        td + td.clone().exclude("x")  # the members' own key check
    assert_unchanged(tds, before)


def test_in_place_ops_keep_the_tensors_and_fail_without_writing():
    tds = make_members()
    td = lazy_stack(tds, 1)
    olds = [t["x"] for t in tds]
    expected = (td["x"] + 1) * 2
    td += 1
    assert td.mul_(2) is td and td.abs_() is td
    assert all(t["x"] is old for t, old in zip(tds, olds)) and torch.equal(td["x"], expected)
    tds[2]["x"] = torch.zeros(2, 3, 4, dtype=torch.long)  # the last member refuses a float operand in place
    before = snapshots(tds)
    with pytest.raises(RuntimeError, match="can't be cast"):
        td.add_(0.5)
    with pytest.raises(RuntimeError, match="can't be cast"):
        td *= 0.5
    with pytest.raises(RuntimeError, match="can't be cast"):
        td.sqrt_()
    with pytest.raises(KeyError):
        td.add_(td.clone().exclude(("n", "z")))
    assert_unchanged(tds, before)
    td.lock_()
    td.sub_(1)  # in place is allowed on a locked stack: member 0's "n.z" was 0, then (0 + 1) * 2
    assert torch.equal(tds[0]["n", "z"], torch.full((2, 3), 1.0))


def test_results_of_a_locked_stack_are_locked_as_the_dense_ones():
    td = lazy_stack(dense_members(), 1).lock_()
    dense = torch.stack(dense_members(), 1).lock_()
    for op in (lambda t: t + 1, lambda t: t.abs(), lambda t: t == 1, lambda t: t.select("x"), lambda t: t.clone()):
        assert op(td).is_locked == op(dense).is_locked


def test_bool_and_hash_are_refused():
    td = lazy_stack(make_members())
    with pytest.raises(RuntimeError, match="Converting a tensordict to boolean value is not permitted"):
        bool(td == td)
    with pytest.raises(TypeError, match="unhashable"):
        hash(td)


@pytest.mark.parametrize("dim", [0, 2])
@pytest.mark.parametrize("locked", [False, True])
def test_pickle_round_trip(dim, locked):
    import pickle

    tds = make_members()
    td = lazy_stack(tds, dim)
    if locked:
        td.lock_()
    copy = pickle.loads(pickle.dumps(td))
    assert isinstance(copy, LazyStackedTensorDict) and copy.stack_dim == td.stack_dim
    assert copy.batch_size == td.batch_size and copy.is_locked == locked
    for member, original in zip(copy.tensordicts, tds):
        assert member is not original and member.is_locked == locked
        assert_td_equal(member, original)


@pytest.mark.parametrize("stack_dim", [0, 1])
@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_torch_stack_of_lazy_stacks_equals_the_dense_stack(stack_dim, dim):
    first, second = dense_members(), dense_members()
    second = [t * 2 for t in second]
    lazies = [lazy_stack(first, stack_dim), lazy_stack(second, stack_dim)]
    result = torch.stack(lazies, dim)
    assert isinstance(result, LazyStackedTensorDict)
    assert all(type(member) is TensorDict for member in result.tensordicts)
    assert_td_equal(result.contiguous(), torch.stack([t.contiguous() for t in lazies], dim))


def test_torch_stack_of_lazy_stacks_errors():
    td = lazy_stack(dense_members())
    with pytest.raises(RuntimeError, match="same batch size and stack_dim"):
        torch.stack([td, lazy_stack(dense_members(), 1)])
    with pytest.raises(IndexError, match="Dimension out of range"):
        torch.stack([td, td], 5)
    other = make_members()
    del other[0]["only0"]
    with pytest.raises(RuntimeError, match="exclusive"):
        torch.stack([lazy_stack(make_members()), lazy_stack(other)])  # the members' own dense stack


# ------------------------------------------------------------------------------- reductions

REDUCTIONS = ["sum", "nansum", "mean", "nanmean", "prod", "std", "var", "amax", "amin", "max", "min"]


def assert_reduction_equal(got, expected):
    """Equal results of a reduction: TensorDicts (a lazy one through its dense form), tensors or
    ``torch.return_types`` pairs."""
    if isinstance(expected, torch.Tensor):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    elif isinstance(expected, tuple):
        assert type(got) is type(expected)
        assert_reduction_equal(got.values, expected.values)
        assert_reduction_equal(got.indices, expected.indices)
    else:
        if isinstance(got, LazyStackedTensorDict):
            got = got.contiguous()
        assert type(got) is TensorDict
        assert got.batch_size == expected.batch_size
        tensor_keys = [key for key in expected.keys(True, True) if isinstance(expected[key], torch.Tensor)]
        assert tensor_keys and tensor_keys == [key for key in got.keys(True, True) if key in tensor_keys]
        for key in tensor_keys:
            torch.testing.assert_close(got[key], expected[key], rtol=1e-5, atol=1e-6, equal_nan=True, msg=str(key))


@pytest.mark.parametrize("stack_dim", [0, 1, 2])
@pytest.mark.parametrize("name", REDUCTIONS)
def test_reductions_equal_the_dense_stacks(stack_dim, name):
    tds = [t.sin() for t in dense_members()]  # in [-1, 1]: no product overflows
    warnings.simplefilter("ignore", UserWarning)  # std/var("feature") of a leaf without feature dims: NaN
    td, dense = lazy_stack(tds, stack_dim), torch.stack(tds, stack_dim)
    for dim in [None, 0, 1, 2, -1, (0, 2), (1, 2)]:
        for keepdim in (False, True):
            kwargs = {"keepdim": keepdim} if dim is None else {"dim": dim, "keepdim": keepdim}
            if name in ("max", "min") and dim is None and keepdim:
                kwargs["return_indices"] = False
            result = getattr(td, name)(**kwargs)
            assert_reduction_equal(result, getattr(dense, name)(**kwargs))
            values = result.values if isinstance(result, tuple) else result
            # As upstream: a dense TensorDict, whatever the dim.
            assert type(values) is TensorDict
    assert_reduction_equal(getattr(td, name)(reduce=True), getattr(dense, name)(reduce=True))
    other = (stack_dim + 1) % 3
    assert_reduction_equal(getattr(td, name)(other, reduce=True), getattr(dense, name)(other, reduce=True))
    assert_reduction_equal(getattr(td, name)("feature"), getattr(dense, name)("feature"))


@pytest.mark.parametrize("stack_dim", [0, 1, 2])
@pytest.mark.parametrize("name", ["all", "any"])
def test_all_any_with_dim_equal_the_dense_stacks(stack_dim, name):
    tds = [t.exclude("s") > 10 for t in dense_members()]
    td, dense = lazy_stack(tds, stack_dim), torch.stack(tds, stack_dim)
    assert getattr(td, name)() is getattr(dense, name)()
    for dim in [0, 1, 2, -1, (0, 1)]:
        expected = getattr(dense, name)(dim)
        assert any(leaf.any() for leaf in expected.values(True, True)) and not expected.all()
        assert_reduction_equal(getattr(td, name)(dim), expected)


@pytest.mark.parametrize("stack_dim", [0, 2])
@pytest.mark.parametrize("name", REDUCTIONS)
def test_reductions_of_ragged_members_raise_except_reduce_true(stack_dim, name):
    """As upstream: ragged members can't give one value per key (RuntimeError, any dim), but
    ``reduce=True`` without a dim is over every element of every member, exclusive keys too."""
    tds = make_members()  # "y" of widths 1, 2, 3 and exclusive keys
    td = lazy_stack(tds, stack_dim)
    before = snapshots(tds)
    for dim in (None, stack_dim, (stack_dim + 1) % 3):
        kwargs = {} if dim is None else {"dim": dim}
        with pytest.raises(RuntimeError, match="requires this object to be cast to a regular TensorDict"):
            getattr(td, name)(**kwargs)
    assert_unchanged(tds, before)
    pooled = torch.cat([leaf.reshape(-1) for t in tds for leaf in t.values(True, True)
                        if isinstance(leaf, torch.Tensor)])
    torch.testing.assert_close(getattr(td, name)(reduce=True), getattr(torch, name)(pooled))


def test_reduction_dim_errors():
    td = lazy_stack(dense_members(), 1)
    for dim in (3, -4, (0, 3)):
        with pytest.raises(IndexError, match="Incompatible dim"):
            td.sum(dim)
        with pytest.raises(IndexError, match="Incompatible dim"):
            td.all(dim)
    with pytest.raises(RuntimeError, match="multiple times"):
        td.mean((0, 0))
    with pytest.raises(TypeError):
        td.sum(0, correction=1)


def test_torch_reduction_functions_call_the_lazy_stacks_methods():
    ragged = lazy_stack([TensorDict(x=torch.arange(3.0)), TensorDict(x=torch.arange(5.0))])
    joined = torch.cat([torch.arange(3.0), torch.arange(5.0)])
    assert torch.equal(ragged.sum(reduce=True), joined.sum()) and torch.equal(ragged.mean(reduce=True), joined.mean())
    with pytest.raises(RuntimeError, match="requires this object to be cast"):
        torch.sum(ragged)
    assert torch.all(ragged >= 0) and not torch.any(ragged > 10)
    members = [TensorDict(x=torch.arange(3.0) + shift, batch_size=[3]) for shift in (0.0, 3.0)]
    td, dense = lazy_stack(members, 1), torch.stack(members, 1)
    for function in (torch.sum, torch.mean, torch.amax, torch.prod):
        for dim in (0, 1):
            result = function(td, dim)
            result = result.contiguous() if isinstance(result, LazyStackedTensorDict) else result
            assert torch.equal(result["x"], function(dense, dim)["x"])
    with pytest.raises(IndexError, match="Incompatible dim"):
        torch.sum(td, 2)
