"""lazy_stack / LazyStackedTensorDict, against torch.stack of the members' values and dense stacks."""
import os
import warnings

import pytest

import torch

from torchdict import NonTensorStack, TensorDict, is_tensor_collection
from torchdict.lazy import LazyStackedTensorDict, lazy_stack, maybe_dense_stack

from _helpers import assert_same_snapshot, snapshot

RAGGED = "pass as_padded_tensor=True, as_nested_tensor=True or as_list=True"


def make_members(count=3, ragged=True):
    """Members of batch [2, 3]: a shared "x", a nested "n.z", a string, and (ragged) "y" of width i + 1."""
    tds = []
    for i in range(count):
        td = TensorDict({"x": torch.arange(24.0).view(2, 3, 4) + 100 * i, "n": {"z": torch.full((2, 3), float(i))},
                         "s": f"m{i}"}, batch_size=[2, 3])
        td["y"] = torch.rand(2, 3, i + 1 if ragged else 2)
        td[f"only{i}"] = torch.zeros(2, 3)
        tds.append(td)
    return tds


def snapshots(tds):
    return [snapshot(td) for td in tds]


def assert_unchanged(tds, before):
    for td, old in zip(tds, before):
        assert_same_snapshot(old, snapshot(td))


# ------------------------------------------------------------------------------- construction


@pytest.mark.parametrize("dim", [0, 1, 2, -1, -2, -3])
def test_batch_size_and_reads_equal_torch_stack(dim):
    tds = make_members()
    td = lazy_stack(tds, dim)
    positive = dim % 3
    assert td.stack_dim == positive
    assert td.batch_size == torch.stack([torch.zeros(2, 3)] * 3, dim).shape
    assert td.tensordicts == tds and all(m is t for m, t in zip(td.tensordicts, tds))
    # A negative dim counts from the end of the batch dims (as the dense stack), not of the leaves.
    assert torch.equal(td["x"], torch.stack([t["x"] for t in tds], positive))
    assert torch.equal(td["n", "z"], torch.stack([t["n", "z"] for t in tds], positive))
    assert torch.equal(td.get(("n", "z")), td["n"]["z"])
    dense = torch.stack([t.exclude("y", "only0", "only1", "only2") for t in tds], dim)
    assert td["s"] == dense["s"]


def test_construction_errors():
    with pytest.raises(RuntimeError, match="items cannot be empty"):
        lazy_stack([])
    with pytest.raises(RuntimeError, match="congruent batch sizes"):
        lazy_stack([TensorDict(batch_size=[3]), TensorDict(batch_size=[2])], strict_shape=True)
    with pytest.raises(RuntimeError, match="batch sizes in tensordicts differs"):
        lazy_stack([TensorDict(batch_size=[3]), TensorDict(batch_size=[3, 2])])
    with pytest.raises(RuntimeError, match="Stack dim 2 is too big"):
        lazy_stack([TensorDict(batch_size=[3])] * 2, dim=2)
    with pytest.raises(RuntimeError, match="Stack dim -3 is too big"):
        lazy_stack([TensorDict(batch_size=[3])] * 2, dim=-3)
    with pytest.raises(TypeError, match="TensorDict instances"):
        lazy_stack([TensorDict(), torch.zeros(())])
    assert torch.equal(lazy_stack([torch.zeros(3)]), torch.zeros(1, 3))  # tensors alone: torch.stack, as upstream
    with pytest.raises(RuntimeError, match="devices differ"):
        lazy_stack([TensorDict(device="cpu"), TensorDict()])


def test_class_constructors_len_iter_names():
    tds = make_members()
    td = LazyStackedTensorDict(*tds, stack_dim=1)
    assert td.batch_size == (2, 3, 3) and len(td) == 2
    assert LazyStackedTensorDict.lazy_stack(tds, 1).batch_size == td.batch_size
    assert [item.batch_size for item in td] == [torch.Size([3, 3])] * 2
    assert all(item is t for item, t in zip(lazy_stack(tds), tds))
    assert td.names == [None, None, None]
    named = [TensorDict(batch_size=[2], names=["t"]) for _ in range(2)]
    assert lazy_stack(named, 1).names == ["t", None]
    assert is_tensor_collection(td)
    assert td.batch_dims == td.ndim == td.dim() == 3 and td.shape == td.batch_size


# ------------------------------------------------------------------------------- keys


def test_keys_are_the_shared_ones_and_exclusive_keys_are_hidden():
    tds = make_members()
    td = lazy_stack(tds)
    assert td.keys() == ["x", "n", "s", "y"]
    assert set(td.keys(True)) == {"x", "n", ("n", "z"), "s", "y"}
    assert set(td.keys(True, True)) == set(tds[0].exclude("only0").keys(True, True))
    assert "x" in td and ("n", "z") in td and "only0" not in td
    assert td.get("only0") is None and td.get("only0", "default") == "default"
    with pytest.raises(KeyError, match='key "only0" not found in LazyStackedTensorDict'):
        td["only0"]


# ------------------------------------------------------------------------------- reading


def test_sub_tensordict_reads_are_lazy_stacks_of_the_members_ones():
    tds = make_members()
    sub = lazy_stack(tds, 1)["n"]
    assert isinstance(sub, LazyStackedTensorDict) and sub.stack_dim == 1
    assert all(m is t["n"] for m, t in zip(sub.tensordicts, tds))


def test_non_tensor_reads_match_the_dense_stack():
    tds = [TensorDict(s="a", batch_size=[2]), TensorDict(s="b", batch_size=[2])]
    td, dense = lazy_stack(tds, 1), torch.stack(tds, 1)
    assert td["s"] == dense["s"] == [["a", "b"], ["a", "b"]]
    assert isinstance(td.get("s"), NonTensorStack) and (td.get("s") == dense.get("s")).all()


def test_mixed_kinds_raise():
    td = lazy_stack([TensorDict(n={"a": 0}), TensorDict(n=torch.zeros(()))])
    with pytest.raises(TypeError, match="different kinds"):
        td["n"]


@pytest.mark.parametrize("dim", [0, 1])
def test_ragged_reads(dim):
    tds = make_members()
    td = lazy_stack(tds, dim)
    before = snapshots(tds)
    with pytest.raises(RuntimeError, match=f"Failed to stack tensors .* under the key 'y'.*{RAGGED}"):
        td["y"]
    with pytest.raises(RuntimeError, match=RAGGED):
        td.contiguous()
    assert_unchanged(tds, before)
    assert td.get_item_shape("y") == torch.Size([3, 2, 3, -1] if dim == 0 else [2, 3, 3, -1])
    values = td.get("y", as_list=True)
    assert all(v is t["y"] for v, t in zip(values, tds))
    # The members along dim 0 whatever the stack dim, as upstream (and as a nested tensor's components).
    padded = torch.stack([torch.nn.functional.pad(t["y"], (0, 3 - t["y"].shape[-1]), value=-1.0) for t in tds], 0)
    assert torch.equal(td.get("y", as_padded_tensor=True, padding_value=-1.0), padded)
    left = torch.stack([torch.nn.functional.pad(t["y"], (3 - t["y"].shape[-1], 0)) for t in tds], 0)
    assert torch.equal(td.get("y", as_padded_tensor=True, padding_side="left"), left)
    nested = td.get("y", as_nested_tensor=True)
    assert nested.layout == torch.jagged
    assert all(torch.equal(a, t["y"]) for a, t in zip(nested.unbind(), tds))
    with warnings.catch_warnings():  # torch calls its strided nested layout a prototype
        warnings.simplefilter("ignore", UserWarning)
        strided = td.get("y", as_nested_tensor=True, layout=torch.strided)
    assert strided.layout == torch.strided and all(torch.equal(a, t["y"]) for a, t in zip(strided.unbind(), tds))


def test_read_option_errors():
    td = lazy_stack(make_members())
    with pytest.raises(RuntimeError, match="Expected padding_side to be one of left or right, but got middle"):
        td.get("y", as_padded_tensor=True, padding_side="middle")
    with pytest.raises(ValueError, match="at most one"):
        td.get("y", as_list=True, as_padded_tensor=True)
    with pytest.raises(TypeError, match="need tensor entries"):
        td.get("n", as_padded_tensor=True)
    assert td.get("missing", 3, as_list=True) == 3


def test_padded_equals_the_dense_read_when_shapes_agree():
    td = lazy_stack(make_members(ragged=False), 2)
    # The padded read puts the members along dim 0 (as upstream), the dense read along the stack dim.
    assert torch.equal(td.get("y", as_padded_tensor=True), td["y"].movedim(2, 0))
    assert td.get_item_shape("y") == td["y"].shape


# ------------------------------------------------------------------------------- indexing


@pytest.mark.parametrize("dim", [0, 1, 2])
def test_int_along_the_stack_dim_is_the_member(dim):
    tds = make_members()
    td = lazy_stack(tds, dim)
    index = (slice(None),) * dim + (1,)
    assert td[index] is tds[1]
    assert td[index[:-1] + (-1,)] is tds[2]
    with pytest.raises(IndexError, match="index 5 is out of bounds for the stack dim of size 3"):
        td[index[:-1] + (5,)]


@pytest.mark.parametrize("selector", [slice(1, None), [2, 0], torch.tensor([2, 0, 2]),
                                      torch.tensor([True, False, True]), [True, False, True], range(2)])
def test_selection_along_the_stack_dim_keeps_the_members(selector):
    tds = make_members()
    td = lazy_stack(tds)
    positions = list(range(3))[selector] if isinstance(selector, slice) else (
        torch.arange(3)[torch.as_tensor(list(selector) if isinstance(selector, range) else selector)].tolist())
    result = td[selector]
    assert isinstance(result, LazyStackedTensorDict) and result.stack_dim == 0
    assert [m is tds[p] for m, p in zip(result.tensordicts, positions)] == [True] * len(positions)
    assert len(result.tensordicts) == len(positions)


@pytest.mark.parametrize("dim", [0, 1, 2])
@pytest.mark.parametrize("index", [
    (0,), (slice(None), 1), (Ellipsis, 2), (None,), (slice(None), None, slice(0, 2)), (1, slice(None), 2),
    (slice(None), [0, 2]), (Ellipsis, torch.tensor([True, False, True])), (slice(None), slice(None), [1, 0]),
    ([1, 0],), (torch.tensor(1),), (slice(None), torch.tensor([[True, False, True], [False, True, True]])),
])
def test_indexing_equals_indexing_the_dense_stack(dim, index):
    tds = make_members(ragged=False)
    for i, t in enumerate(tds):
        del t[f"only{i}"]
    td, dense = lazy_stack(tds, dim), torch.stack(tds, dim)
    try:
        expected = dense[index]
    except IndexError:
        with pytest.raises(IndexError):
            td[index]
        return
    got = td[index]
    assert got.batch_size == expected.batch_size
    for key in ("x", "y", ("n", "z")):
        assert torch.equal(got[key], expected[key]), key
    assert got["s"] == expected["s"]


def test_unsupported_and_bad_indices():
    td = lazy_stack(make_members())
    with pytest.raises(IndexError, match="at most one list or tensor"):
        td[[0, 1], :, [0, 1]]
    with pytest.raises(IndexError, match="selects no member"):
        td[[]]
    with pytest.raises(IndexError, match="too many indices"):
        td[0, 0, 0, 0]
    with pytest.raises(IndexError, match="shape of the mask"):
        td[torch.tensor([True, False])]
    with pytest.raises(IndexError, match="Unsupported index"):
        td[torch.tensor([[0, 1]])]


@pytest.mark.parametrize("dim", [0, 1])
def test_unbind(dim):
    tds = make_members()
    td = lazy_stack(tds, dim)
    assert all(a is b for a, b in zip(td.unbind(dim), tds))
    other = 1 - dim
    dense = torch.stack([t.select("x") for t in tds], dim)
    for got, expected in zip(td.unbind(other), dense.unbind(other)):
        assert torch.equal(got["x"], expected["x"])


# ------------------------------------------------------------------------------- writing


@pytest.mark.parametrize("dim", [0, 1])
def test_set_splits_into_the_members(dim):
    tds = make_members()
    td = lazy_stack(tds, dim)
    value = torch.rand(td.batch_size + (5,))
    td["new"] = value
    td.set(("n", "w"), value)
    for i, t in enumerate(tds):
        assert torch.equal(t["new"], value.select(dim, i))
        assert torch.equal(t["n", "w"], value.select(dim, i))
    assert torch.equal(td["new"], value)
    td["text"] = "shared"
    assert [t["text"] for t in tds] == ["shared"] * 3
    td["sub"] = {"a": torch.zeros(td.batch_size)}
    assert all(t["sub", "a"].shape == (2, 3) for t in tds)


def test_set_a_list_writes_one_value_per_member():
    tds = make_members()
    td = lazy_stack(tds)
    values = [torch.rand(2, 3, i) for i in range(3)]
    td["ragged"] = values
    assert all(t["ragged"] is v for t, v in zip(tds, values))
    with pytest.raises(ValueError, match="one value per member"):
        td["bad"] = values[:2]


def test_set_errors_leave_the_members_unchanged():
    tds = make_members()
    td = lazy_stack(tds)
    before = snapshots(tds)
    with pytest.raises(RuntimeError, match="batch dimension mismatch"):
        td["bad"] = torch.zeros(2, 3)
    # "only2" is a tensor in member 2 only: the nested write fails there, after members 0 and 1.
    with pytest.raises(KeyError, match="already present"):
        td[("only2", "deep")] = torch.zeros(3, 2, 3)
    assert_unchanged(tds, before)


def test_failed_nested_write_undoes_earlier_members():
    tds = make_members()
    td = lazy_stack(tds)
    before = snapshots(tds)
    with pytest.raises(KeyError, match="already present"):
        td.set(("only2", "deep"), torch.zeros(3, 2, 3))
    assert all(("only2", "deep") not in t.keys(True) for t in tds)
    assert all("only2" not in t.keys() for t in tds[:2])
    assert_unchanged(tds, before)


def test_set_in_place_writes_into_the_same_tensors():
    tds = make_members()
    td = lazy_stack(tds, 1)
    olds = [t["x"] for t in tds]
    value = torch.rand(2, 3, 3, 4)
    td.set_("x", value)
    assert all(t["x"] is old and torch.equal(old, value[:, i]) for i, (t, old) in enumerate(zip(tds, olds)))
    before = snapshots(tds)
    with pytest.raises(KeyError, match="all members of the stack have this key"):
        td.set_("only0", torch.zeros(2, 3, 3))
    with pytest.raises(RuntimeError):
        td.set_("y", torch.zeros(2, 3, 3, 1, 5))  # broadcasts into no member
    assert_unchanged(tds, before)


@pytest.mark.parametrize("dim", [0, 1])
def test_setitem_at_index_writes_through(dim):
    tds = make_members(ragged=False)
    td = lazy_stack(tds, dim)
    dense = torch.stack([t.select("x") for t in tds], dim)
    olds = [t["x"] for t in tds]
    for index in [(slice(None), 1), (slice(0, 2),), (Ellipsis, [0, 2])]:
        value = TensorDict(x=torch.rand(dense[index]["x"].shape), batch_size=dense[index].batch_size)
        td[index] = value
        dense[index] = value
    one = (slice(None),) * dim + (2,)
    td[one] = TensorDict(x=torch.full((2, 3, 4), 7.0), batch_size=[2, 3])
    dense[one] = TensorDict(x=torch.full((2, 3, 4), 7.0), batch_size=[2, 3])
    assert all(t["x"] is old for t, old in zip(tds, olds))
    assert torch.equal(td["x"], dense["x"])
    td[0] = 0.0
    dense[0] = 0.0
    assert torch.equal(td["x"], dense["x"])


def test_setitem_at_index_errors_leave_the_members_unchanged():
    tds = make_members()
    tds[2]["x"] = torch.zeros(2, 3, 5)
    td = lazy_stack(tds)
    before = snapshots(tds)
    # Member 2's "x" is wider: the write fails there, after members 0 and 1 took theirs (new key "x2" too).
    value = TensorDict(x=torch.ones(3, 3, 4), x2=torch.ones(3, 3), batch_size=[3, 3])
    with pytest.raises(RuntimeError):
        td[:, 0] = value
    assert_unchanged(tds, before)
    with pytest.raises(RuntimeError, match="batch size"):
        td[:, 0] = TensorDict(batch_size=[2])
    with pytest.raises(TypeError, match="TensorDict or a Python number"):
        td[:, 0] = "text"
    assert_unchanged(tds, before)


# ------------------------------------------------------------------------------- members


def test_append_insert_extend():
    tds = make_members(2)
    td = lazy_stack(tds)
    new = make_members(3)[2]
    td.append(new)
    td.insert(0, new)
    td.extend([tds[0]])
    assert td.batch_size == (5, 2, 3)
    assert [m is e for m, e in zip(td.tensordicts, [new, *tds, new, tds[0]])] == [True] * 5
    with pytest.raises(ValueError, match="Batch sizes in tensordicts differs"):
        td.append(TensorDict(batch_size=[2]))
    with pytest.raises(ValueError, match="Batch sizes in tensordicts differs"):
        td.extend([tds[0], TensorDict(batch_size=[2])])
    with pytest.raises(TypeError, match="Expected new value to be a TensorDict"):
        td.insert(0, torch.zeros(2, 3))
    assert len(td.tensordicts) == 5


# ------------------------------------------------------------------------------- conversions


@pytest.mark.parametrize("dim", [0, 2])
def test_contiguous_is_the_dense_stack(dim):
    tds = [t.exclude(f"only{i}") for i, t in enumerate(make_members(ragged=False))]
    td = lazy_stack(tds, dim)
    dense, expected = td.contiguous(), torch.stack(tds, dim)
    assert type(dense) is TensorDict and td.to_tensordict().batch_size == expected.batch_size
    for key in expected.keys(True, True):
        if isinstance(expected[key], torch.Tensor):
            assert torch.equal(dense[key], expected[key])
        else:
            assert dense[key] == expected[key]


def test_clone_apply_to():
    tds = make_members()
    td = lazy_stack(tds, 1)
    clone = td.clone()
    assert isinstance(clone, LazyStackedTensorDict) and clone.stack_dim == 1
    assert all(c is not t and c["x"] is not t["x"] and torch.equal(c["x"], t["x"]) for c, t in
               zip(clone.tensordicts, tds))
    doubled = td.apply(lambda x: x * 2)
    assert torch.equal(doubled["x"], td["x"] * 2)
    assert [v.shape for v in doubled.get("y", as_list=True)] == [t["y"].shape for t in tds]
    half = td.to(torch.float16)
    assert half["x"].dtype == torch.float16 and tds[0]["x"].dtype == torch.float32
    assert td.to("cpu").device == torch.device("cpu") and td.device is None


def test_lock():
    tds = make_members()
    td = lazy_stack(tds)
    td.lock_()
    assert td.is_locked and all(t.is_locked for t in tds)
    before = snapshots(tds)
    with pytest.raises(RuntimeError, match="Cannot modify locked TensorDict"):
        td["new"] = torch.zeros(3, 2, 3)
    with pytest.raises(RuntimeError, match="Cannot modify locked TensorDict"):
        td.append(tds[0])
    assert_unchanged(tds, before)
    td.set_("x", torch.zeros(3, 2, 3, 4))  # in place is allowed
    assert not td.unlock_().is_locked and not any(t.is_locked for t in tds)


def test_maybe_dense_stack():
    same = [TensorDict(a=torch.zeros(2)), TensorDict(a=torch.ones(2))]
    assert type(maybe_dense_stack(same)) is TensorDict
    assert type(LazyStackedTensorDict.maybe_dense_stack(same, 0)) is TensorDict
    ragged = [TensorDict(a=torch.zeros(2)), TensorDict(a=torch.ones(3))]
    assert type(maybe_dense_stack(ragged)) is LazyStackedTensorDict
    exclusive = [TensorDict(a=torch.zeros(2)), TensorDict(b=torch.ones(2))]
    assert type(maybe_dense_stack(exclusive)) is LazyStackedTensorDict


def test_repr():
    a = TensorDict({"x": torch.zeros(3, 2), "e": torch.zeros(3)}, batch_size=[3])
    b = TensorDict({"x": torch.zeros(3, 5)}, batch_size=[3])
    assert repr(lazy_stack([a, b])) == """LazyStackedTensorDict(
    fields={
        x: Tensor(shape=torch.Size([2, 3, -1]), device=cpu, dtype=torch.float32, is_shared=False)},
    exclusive_fields={
        0: {
            e: Tensor(shape=torch.Size([3]), device=cpu, dtype=torch.float32, is_shared=False)}},
    batch_size=torch.Size([2, 3]),
    device=None,
    is_shared=False,
    stack_dim=0)"""
    assert repr(lazy_stack([TensorDict()])) == (
        "LazyStackedTensorDict(\n    fields={\n    },\n    batch_size=torch.Size([1]),\n    device=None,\n"
        "    is_shared=False,\n    stack_dim=0)")


def test_the_lazy_stack_family_is_imported_on_first_use():
    """``import torchdict`` leaves it out (fewer objects at import); a pickle or ``from torchdict import``
    brings it in."""
    import pickle
    import subprocess
    import sys

    data = pickle.dumps(lazy_stack([TensorDict(a=torch.zeros(2), batch_size=[2])] * 2))
    code = (
        "import pickle, sys, torch, torchdict\n"
        "assert 'torchdict.lazy' not in sys.modules\n"
        "stack = pickle.loads(sys.stdin.buffer.read())\n"
        "from torchdict import LazyStackedTensorDict\n"
        "assert isinstance(stack, LazyStackedTensorDict) and stack.batch_size == (2, 2)\n"
        "assert torch.vmap(lambda td: td + 1)(stack)['a'].shape == (2, 2)\n"
    )
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    result = subprocess.run([sys.executable, "-c", code], input=data, capture_output=True,
                            env=dict(os.environ, PYTHONPATH=src), timeout=120)
    assert result.returncode == 0, result.stderr.decode()[-2000:]
