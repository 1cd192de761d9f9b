"""from_namedtuple / to_namedtuple, from_dataclass, from_any and auto_device_, stated against
plain Python containers and torch tensors."""
import dataclasses
import types
from collections import namedtuple

import numpy as np
import pytest
import torch

from torchdict import TensorDict, tensorclass

from _helpers import assert_same_snapshot, snapshot

Pair = namedtuple("Pair", ["obs", "info"])
Info = namedtuple("Info", ["reward", "tag"])


@dataclasses.dataclass
class Inner:
    x: torch.Tensor
    label: str = "in"


@dataclasses.dataclass
class Outer:
    a: torch.Tensor
    inner: Inner


@dataclasses.dataclass
class Defaults:
    n: int = 3
    tag: str = "t"


@tensorclass
class Point:
    x: torch.Tensor


def _assert_same_leaves(left: TensorDict, right: TensorDict) -> None:
    assert list(left.keys(True, True)) == list(right.keys(True, True))
    for key in left.keys(True, True):
        a, b = left.get(key), right.get(key)
        if isinstance(a, torch.Tensor):
            assert a is b
        else:
            assert a.tolist() == b.tolist()


# ---------------------------------------------------------------- to_namedtuple / from_namedtuple
def test_to_namedtuple_nests_generic_dicts_and_shares_tensors():
    td = TensorDict(a=torch.zeros(3, 2), n={"b": torch.ones(3), "s": "text"}, batch_size=[3])
    result = td.to_namedtuple()
    assert type(result).__name__ == "GenericDict" and type(result)._fields == ("a", "n")
    assert type(result.n)._fields == ("b", "s")
    assert result.a is td["a"] and result.n.b is td["n", "b"]
    assert result.n.s == "text"


def test_to_namedtuple_dest_cls():
    td = TensorDict(a=torch.zeros(2), n={"b": torch.ones(2)})
    as_dict = td.to_namedtuple(dest_cls=dict)
    assert as_dict == {"a": td["a"], "n": {"b": td["n", "b"]}}
    space = td.to_namedtuple(dest_cls=types.SimpleNamespace)
    assert isinstance(space.n, types.SimpleNamespace) and space.n.b is td["n", "b"]
    Top = namedtuple("Top", ["a", "n"])
    top = td.to_namedtuple(dest_cls=Top)
    assert type(top) is Top and type(top.n).__name__ == "GenericDict"  # a namedtuple class: this level only


def test_to_namedtuple_needs_identifier_keys():
    with pytest.raises(ValueError):
        TensorDict({"a b": torch.zeros(())}).to_namedtuple()


def test_namedtuple_round_trip_nested():
    td = TensorDict(a=torch.arange(6.0).view(3, 2), n={"b": torch.ones(3), "c": {"d": torch.zeros(3, 1)}},
                    batch_size=[3])
    back = TensorDict.from_namedtuple(td.to_namedtuple(), batch_size=[3])
    assert back.batch_size == td.batch_size and back["n"].batch_size == torch.Size([3])
    _assert_same_leaves(back, td)


def test_from_namedtuple_converts_nested_containers():
    obs = torch.zeros(3, 2)
    nt = Pair(obs=obs, info=Info(reward=torch.ones(3, 4), tag="x"))
    td = TensorDict.from_namedtuple(nt)
    assert td.batch_size == torch.Size([]) and td["obs"] is obs  # not copied
    assert td["info", "tag"] == "x" and torch.equal(td["info", "reward"], torch.ones(3, 4))
    plain = TensorDict.from_namedtuple(Pair(obs=(1, 2), info=Inner(torch.zeros(2))))
    assert plain["obs", "0"].item() == 1 and plain["obs", "1"].item() == 2  # a tuple: keys "0", "1"
    assert plain["info", "label"] == "in"


def test_from_namedtuple_batch_size_options():
    nt = Pair(obs=torch.zeros(3, 2), info=Info(reward=torch.ones(3, 4), tag="x"))
    auto = TensorDict.from_namedtuple(nt, auto_batch_size=True)
    assert auto.batch_size == torch.Size([3]) and auto["info"].batch_size == torch.Size([3, 4])
    capped = TensorDict.from_namedtuple(nt, auto_batch_size=True, batch_dims=1)
    assert capped["info"].batch_size == torch.Size([3])
    assert TensorDict.from_namedtuple(nt, batch_size=[3])["info"].batch_size == torch.Size([3])
    with pytest.warns(UserWarning, match="batch_dims"):
        assert TensorDict.from_namedtuple(nt, batch_dims=1).batch_size == torch.Size([])
    meta = TensorDict.from_namedtuple(nt, device="meta")
    assert meta.device == meta["info"].device == torch.device("meta") and meta["obs"].is_meta


@pytest.mark.parametrize("bad", [(1, 2), {"a": 1}, [torch.zeros(1)]])
def test_from_namedtuple_rejects_other_types(bad):
    with pytest.raises(TypeError):
        TensorDict.from_namedtuple(bad)


def test_from_namedtuple_errors_leave_the_input_unchanged():
    sub = TensorDict(a=torch.zeros(3))
    nt = Pair(obs=torch.zeros(3, 2), info=sub)
    before = snapshot(sub)
    with pytest.raises(TypeError):
        TensorDict.from_namedtuple(nt, batch_size=[3], auto_batch_size=True)
    with pytest.raises(RuntimeError):
        TensorDict.from_namedtuple(nt, batch_size=[4])
    assert_same_snapshot(before, snapshot(sub))


# ---------------------------------------------------------------- from_dataclass
def test_from_dataclass_instance_nested():
    a = torch.zeros(3, 2)
    td = TensorDict.from_dataclass(Outer(a=a, inner=Inner(torch.ones(3, 4))))
    assert type(td) is TensorDict and td["a"] is a
    assert td["inner", "label"] == "in" and torch.equal(td["inner", "x"], torch.ones(3, 4))
    auto = TensorDict.from_dataclass(Outer(a=a, inner=Inner(torch.ones(3, 4))), auto_batch_size=True)
    assert auto.batch_size == torch.Size([3]) and auto["inner"].batch_size == torch.Size([3, 4])


def test_from_dataclass_keeps_tensorclass_and_tensordict_values():
    @dataclasses.dataclass
    class Holder:
        point: Point
        sub: TensorDict

    point, sub = Point(x=torch.zeros(2)), TensorDict(a=torch.zeros(2))
    td = TensorDict.from_dataclass(Holder(point, sub))
    assert td["point"] is point and td["sub"] is sub


def test_from_dataclass_type():
    td = TensorDict.from_dataclass(Defaults)
    assert td["n"].item() == 3 and td["tag"] == "t"
    with pytest.raises(TypeError, match="no default"):
        TensorDict.from_dataclass(Inner)


@pytest.mark.parametrize("bad", [1, {"a": 1}, Pair(1, 2)])
def test_from_dataclass_rejects_non_dataclasses(bad):
    with pytest.raises(TypeError):
        TensorDict.from_dataclass(bad)


# ---------------------------------------------------------------- from_any
def test_from_any_dispatch():
    x = torch.zeros(3, 2)
    assert TensorDict.from_any({"a": x, "n": {"b": x}})["n", "b"] is x
    assert TensorDict.from_any(Pair(x, Info(x, "t")))["info", "tag"] == "t"
    assert TensorDict.from_any(Inner(x))["x"] is x
    assert list(TensorDict.from_any((x, {"b": x})).keys(True, True)) == ["0", ("1", "b")]
    assert TensorDict.from_any({"t": (x, x)}, auto_batch_size=True).batch_size == torch.Size([3, 2])
    td, point = TensorDict(a=x, batch_size=[3]), Point(x=x, batch_size=[3])
    # Collections come back as they are, options not applied (as upstream).
    assert TensorDict.from_any(td, device="meta") is td and TensorDict.from_any(point) is point


@pytest.mark.parametrize("leaf", [torch.zeros(2), 1, "s", None, np.zeros(3), [1, 2], [[1.0, 2.0], [3.0, 4.0]],
                                  [torch.zeros(1), torch.ones(1)], [1, "a"]])
def test_from_any_of_a_leaf_value_matches_upstream(leaf):
    tensordict = pytest.importorskip("tensordict")
    ours, theirs = TensorDict.from_any(leaf), tensordict.TensorDict.from_any(leaf)
    assert type(ours).__name__ == type(theirs).__name__
    if isinstance(theirs, torch.Tensor):
        assert torch.equal(ours, theirs) and ours.dtype == theirs.dtype
    elif type(theirs).__name__ == "NonTensorStack":
        assert ours.tolist() == theirs.tolist() and ours.batch_size == theirs.batch_size
    else:
        assert ours is leaf


def test_from_any_structured_array():
    array = np.zeros(3, dtype=[("f", np.float32), ("g", np.int64, (2,)), ("h", [("u", np.float64)])])
    td = TensorDict.from_any(array)
    assert td.batch_size == td["h"].batch_size == torch.Size([3])
    assert td["g"].shape == torch.Size([3, 2]) and td["h", "u"].dtype == torch.float64
    td["f"][0] = 5.0  # f's stride (28 bytes) is a multiple of 4: shared
    td["g"][0] = 7  # g's is not a multiple of 8: copied
    assert array["f"][0] == 5.0 and (array["g"][0] == 0).all()
    grid = np.zeros((2, 3), dtype=[("f", np.float32)])
    assert TensorDict.from_any(grid).batch_size == torch.Size([2, 3])
    assert TensorDict.from_any(grid, batch_size=[2]).batch_size == torch.Size([2])
    assert TensorDict.from_any(grid, auto_batch_size=True, batch_dims=1).batch_size == torch.Size([2])
    words = TensorDict.from_any(np.array([("ab",), ("cd",)], dtype=[("s", "U2")]))
    assert words["s"].tolist() == ["ab", "cd"]


# ---------------------------------------------------------------- auto_device_
def test_auto_device_sets_the_shared_device_everywhere():
    meta = torch.zeros(3, device="meta")
    td = TensorDict(a=meta, n={"b": meta, "s": "text"}, p=Point(x=meta))
    sub = td["n"]
    assert td.device is None and td.auto_device_() is td
    assert td.device == sub.device == td["p"].device == td.get(("n", "s")).device == torch.device("meta")
    assert td["n"] is sub and td["a"] is meta  # nothing rebuilt or moved


def test_auto_device_clears_on_mixed_devices():
    td = TensorDict(a=torch.zeros(3), n=TensorDict(b=torch.zeros(3, device="meta"), device="meta"))
    td.auto_device_()
    assert td.device is None and td["n"].device is None
    assert td["n", "b"].is_meta and not td["a"].is_meta


def test_auto_device_without_tensors_and_when_locked():
    assert TensorDict(device="meta", s="x").auto_device_().device is None
    empty_sub = TensorDict(n={}, a=torch.zeros(1)).auto_device_()
    assert empty_sub["n"].device == torch.device("cpu")
    locked = TensorDict(a=torch.zeros(1)).lock_()
    assert locked.auto_device_().device == torch.device("cpu") and locked.is_locked
