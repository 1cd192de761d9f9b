"""HDF5: ``PersistentTensorDict``, ``to_h5`` / ``from_h5``, checked against upstream tensordict on the same files."""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
import warnings

import h5py
import numpy as np
import pytest
import torch

import tensordict as upstream
import torchdict
from torchdict import NonTensorData, NonTensorStack, PersistentTensorDict, TensorDict

# upstream 0.15 warns when it reads a str it wrote as bytes (it changes in 0.17): not what these tests check
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

STORABLE = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32,
            torch.uint64, torch.float16, torch.float32, torch.float64, torch.complex64, torch.complex128]
UNSTORABLE = [torch.bfloat16, torch.complex32, torch.float8_e4m3fn]
BATCHES = [(), (3,), (3, 2), (2, 3, 2)]


def _sample(dtype: torch.dtype, shape: tuple) -> torch.Tensor:
    values = torch.arange(int(np.prod(shape)) if shape else 1).reshape(shape) % 5
    if dtype.is_complex:
        return (values + 1j * values).to(dtype)
    return values.to(dtype)


def _leaves(td) -> dict:
    """key -> tensor or plain value, for every leaf of a collection (ours or upstream's), nested ones included."""
    dense = td.to_tensordict() if hasattr(td, "to_tensordict") else td
    out = {}
    for key in dense.keys(True, True, is_leaf=lambda cls: issubclass(cls, torch.Tensor)
                          or cls.__name__ in ("NonTensorData", "NonTensorStack")):
        value = dense.get(key)
        if isinstance(value, torch.Tensor):
            out[key] = value
        elif type(value).__name__ == "NonTensorStack":
            out[key] = value.tolist()
        else:
            out[key] = value.data
    return out


def _plain(value):
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, list) or type(value).__name__ == "LinkedList":
        return [_plain(item) for item in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value


def assert_same_leaves(ours, theirs, *, strings_as_bytes_ok=True) -> None:
    left, right = _leaves(ours), _leaves(theirs)
    assert sorted(map(str, left)) == sorted(map(str, right))
    for key, value in right.items():
        got = left[key]
        if isinstance(value, torch.Tensor):
            assert isinstance(got, torch.Tensor), key
            assert got.dtype == value.dtype and got.shape == value.shape, key
            assert torch.equal(got, value), key
        else:
            assert _plain(got) == _plain(value), key


def _nested_source(lib, batch=(3,)):
    torch.manual_seed(0)
    return lib.TensorDict(
        {"obs": torch.randn(*batch, 2), "done": torch.zeros(*batch, dtype=torch.bool),
         "next": {"obs": torch.randn(*batch, 2), "deep": {"r": torch.arange(int(np.prod(batch) or 1)).reshape(batch)}}},
        batch_size=batch)


# ---------------------------------------------------------------------- round trips
@pytest.mark.parametrize("dtype", STORABLE, ids=str)
@pytest.mark.parametrize("batch", BATCHES, ids=str)
def test_round_trip_every_dtype_and_batch_rank(tmp_path, dtype, batch):
    source = TensorDict({"x": _sample(dtype, batch + (2,)), "n": {"y": _sample(dtype, batch)}}, batch_size=batch)
    path = tmp_path / "data.h5"
    written = source.to_h5(path)
    assert isinstance(written, PersistentTensorDict) and written.batch_size == torch.Size(batch)
    assert written["n"].batch_size == torch.Size(batch)
    assert_same_leaves(written, source)
    written.close()
    with torchdict.from_h5(path, batch_size=batch) as reopened:
        assert_same_leaves(reopened, source)
    if dtype is torch.uint64 and not batch:
        return  # upstream 0.15 can't read a 0-dim uint64 dataset (TypeError from torch.as_tensor of a numpy scalar)
    # upstream reads the same file back to the same leaves
    theirs = upstream.from_h5(str(path), batch_size=batch)
    assert_same_leaves(theirs, source)
    theirs.close()


@pytest.mark.parametrize("dtype", UNSTORABLE, ids=str)
def test_unstorable_dtype_is_a_clear_error_and_leaves_no_file(tmp_path, dtype):
    source = TensorDict({"ok": torch.ones(2), "bad": torch.ones(2).to(dtype)}, batch_size=[2])
    path = tmp_path / "data.h5"
    with pytest.raises(TypeError, match=f"can't store the {dtype} tensor at key 'bad'"):
        source.to_h5(path)
    assert list(tmp_path.iterdir()) == []  # not even a partial file
    with pytest.raises(TypeError):  # upstream refuses it too (with numpy's message)
        upstream.TensorDict({"bad": torch.ones(2).to(dtype)}, [2]).to_h5(str(tmp_path / "theirs.h5"))


def test_unstorable_dtype_set_on_an_open_file_changes_nothing(tmp_path):
    td = TensorDict({"a": torch.ones(2)}, [2]).to_h5(tmp_path / "d.h5")
    with pytest.raises(TypeError, match="bfloat16"):
        td.set("b", {"ok": torch.ones(2), "bad": torch.ones(2, dtype=torch.bfloat16)})
    assert td.keys(True) == ["a"]


def test_nested_keys_and_empty_collections(tmp_path):
    source = _nested_source(torchdict)
    with source.to_h5(tmp_path / "n.h5") as td:
        assert sorted(map(str, td.keys(True, True))) == sorted(map(str, source.keys(True, True)))
        assert torch.equal(td["next", "deep", "r"], source["next", "deep", "r"])
        assert isinstance(td["next"], PersistentTensorDict) and isinstance(td["next", "deep"], PersistentTensorDict)
    empty = TensorDict({}, batch_size=[4])
    with empty.to_h5(tmp_path / "e.h5") as td:
        assert td.keys() == [] and td.is_empty() and td.batch_size == torch.Size([4])
    with torchdict.from_h5(tmp_path / "e.h5") as td:
        assert td.batch_size == upstream.from_h5(str(tmp_path / "e.h5")).batch_size == torch.Size([])
    with TensorDict({"g": {}}, [2]).to_h5(tmp_path / "g.h5") as td:
        assert td.keys(True) == ["g"] and td["g"].is_empty()


NON_TENSOR = {
    "str": "hello",
    "unicode": "héllo ✓",
    "bytes": b"raw\x00bytes",
    "int": 3,
    "float": 2.5,
    "bool": True,
    "list": [1, 2, 3],
}


@pytest.mark.parametrize("name", NON_TENSOR)
def test_non_tensor_values_round_trip_and_interoperate(tmp_path, name):
    value = NON_TENSOR[name]
    ours = TensorDict({"t": torch.zeros(3), "v": NonTensorData(value)}, batch_size=[3])
    with ours.to_h5(tmp_path / "ours.h5") as td:
        got = td["v"]
        assert _plain(got) == _plain(value)
        if isinstance(value, str):
            assert got == value  # torchdict reads back the str it wrote (upstream 0.15: bytes, with a warning)
    theirs = upstream.TensorDict({"t": torch.zeros(3), "v": upstream.NonTensorData(value)}, batch_size=[3])
    theirs.to_h5(str(tmp_path / "theirs.h5")).close()
    # each library reads the other's file to the same value
    with torchdict.from_h5(tmp_path / "theirs.h5") as td:
        assert _plain(td["v"]) == _plain(value)
    reader = upstream.from_h5(str(tmp_path / "ours.h5"))
    assert _plain(reader["v"]) == _plain(value)
    reader.close()


STACKS = {
    "str": ["a", "bb", "ccc"],
    "bytes": [b"a", b"bb", b"c"],
    "int": [1, 2, 3],
    "float": [0.5, 1.5, 2.5],
    "bool": [True, False, True],
}


@pytest.mark.parametrize("name", STACKS)
def test_non_tensor_stacks_round_trip_and_interoperate(tmp_path, name):
    values = STACKS[name]
    ours = TensorDict({"t": torch.zeros(3), "s": NonTensorStack(*values)}, batch_size=[3])
    with ours.to_h5(tmp_path / "ours.h5") as td:
        assert isinstance(td.get("s"), NonTensorStack) and td["s"] == values
        assert td[1]["s"] == values[1]
        assert td[torch.tensor([2, 0])]["s"] == [values[2], values[0]]
    theirs = upstream.TensorDict({"t": torch.zeros(3), "s": upstream.NonTensorStack(*values)}, batch_size=[3])
    theirs.to_h5(str(tmp_path / "theirs.h5")).close()
    with torchdict.from_h5(tmp_path / "theirs.h5") as td:
        assert td["s"] == values and td.batch_size == torch.Size([3])
    reader = upstream.from_h5(str(tmp_path / "ours.h5"))
    assert _plain(reader["s"]) == [_plain(v) for v in values]
    reader.close()


def test_nested_stack_of_str_keeps_its_shape(tmp_path):
    stack = NonTensorStack.from_list([["a", "b"], ["c", "d"], ["e", "f"]])
    with TensorDict({"s": stack}, batch_size=[3]).to_h5(tmp_path / "s.h5") as td:
        assert td.get("s").batch_size == torch.Size([3, 2]) and td["s"] == [["a", "b"], ["c", "d"], ["e", "f"]]


@pytest.mark.parametrize("value, error", [({"a": 1}, TypeError), (None, TypeError), ("nul\x00char", ValueError)],
                         ids=["dict", "none", "nul"])
def test_values_hdf5_cannot_hold_are_refused_before_writing(tmp_path, value, error):
    source = TensorDict({"t": torch.zeros(2), "v": NonTensorData(value)}, batch_size=[2])
    with pytest.raises(error, match="key 'v'"):
        source.to_h5(tmp_path / "x.h5")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(error):  # upstream refuses the same values
        upstream.TensorDict({"t": torch.zeros(2), "v": upstream.NonTensorData(value)}, [2]).to_h5(
            str(tmp_path / "u.h5"))


def test_mixed_stack_is_refused_as_upstream_does(tmp_path):
    with pytest.raises(TypeError, match="all str"):
        TensorDict({"s": NonTensorStack(1, "a")}, [2]).to_h5(tmp_path / "x.h5")
    with pytest.raises(TypeError):
        upstream.TensorDict({"s": upstream.NonTensorStack(1, "a")}, [2]).to_h5(str(tmp_path / "u.h5"))


def test_names_and_source_batch_sizes_are_kept_by_to_h5(tmp_path):
    source = TensorDict({"a": torch.zeros(3, 4), "n": TensorDict({"b": torch.zeros(3, 4, 5)}, [3, 4])},
                        batch_size=[3], names=["time"])
    with source.to_h5(tmp_path / "x.h5") as td:
        assert td.names == ["time"] and td["n"].batch_size == torch.Size([3, 4])
        assert td[0:2].names == ["time"]


def test_to_h5_kwargs_reach_h5py(tmp_path):
    with TensorDict({"a": torch.zeros(100, 4)}, [100]).to_h5(tmp_path / "c.h5", compression="gzip") as td:
        assert td.file["a"].compression == "gzip"


def test_lazy_stacks_and_tensorclasses_write_too(tmp_path):
    stacked = torchdict.lazy_stack([TensorDict({"a": torch.full((2,), float(i))}, [2]) for i in range(3)])
    with stacked.to_h5(tmp_path / "l.h5") as td:
        assert td.batch_size == torch.Size([3, 2]) and torch.equal(td["a"], stacked["a"])

    @torchdict.tensorclass
    class Pair:
        x: torch.Tensor
        y: torch.Tensor

    pair = Pair(x=torch.ones(3), y=torch.zeros(3, 2), batch_size=[3])
    with pair.to_h5(tmp_path / "p.h5") as td:
        assert torch.equal(td["y"], pair.y) and td.batch_size == torch.Size([3])


# ---------------------------------------------------------------------- interop
def test_file_written_by_upstream_loads_with_equal_contents(tmp_path):
    source = _nested_source(upstream, (4, 3))
    source["label"] = "run-1"
    source.to_h5(str(tmp_path / "u.h5")).close()
    theirs = upstream.from_h5(str(tmp_path / "u.h5"))
    with torchdict.from_h5(tmp_path / "u.h5") as ours:
        assert ours.batch_size == theirs.batch_size
        for key in ("next", ("next", "deep")):
            assert ours[key].batch_size == theirs[key].batch_size
        assert_same_leaves(ours, theirs)
        assert ours["label"] == "run-1"
    theirs.close()


def test_file_written_by_torchdict_loads_in_upstream_with_equal_contents(tmp_path):
    source = _nested_source(torchdict, (4, 3))
    source["label"] = "run-1"
    source.to_h5(tmp_path / "t.h5").close()
    theirs = upstream.from_h5(str(tmp_path / "t.h5"))
    with torchdict.from_h5(tmp_path / "t.h5") as ours:
        assert ours.batch_size == theirs.batch_size
        assert ours["next"].batch_size == theirs["next"].batch_size
        assert_same_leaves(ours, theirs)
        assert_same_leaves(theirs, source)
    theirs.close()


def test_foreign_file_of_plain_h5py_datasets(tmp_path):
    path = tmp_path / "foreign.h5"
    with h5py.File(path, "w") as file:
        file["observations"] = np.arange(20, dtype=">f4").reshape(10, 2)  # big-endian: torch reads native only
        file["actions"] = np.arange(10)
        file["names"] = np.array([b"a", b"b"] * 5)
        file.create_group("infos")["qpos"] = np.zeros((10, 3))
    theirs = upstream.from_h5(str(path))
    with torchdict.from_h5(path) as ours:
        assert ours.batch_size == theirs.batch_size == torch.Size([10])
        assert ours["observations"].dtype == torch.float32 and ours["observations"][3].tolist() == [6.0, 7.0]
        assert ours["infos"].batch_size == theirs["infos"].batch_size
        assert _plain(ours["names"]) == _plain(theirs["names"])  # unmarked strings stay bytes, as upstream
        assert isinstance(ours.get("names"), NonTensorData)
    with torchdict.from_h5(path, non_tensor_as_stack=True) as ours:
        rows = upstream.from_h5(str(path), non_tensor_as_stack=True)
        assert isinstance(ours.get("names"), NonTensorStack) and ours["names"] == rows["names"]
        assert ours[2:4]["names"] == [b"a", b"b"]
        rows.close()
    theirs.close()


# ---------------------------------------------------------------------- PersistentTensorDict against upstream's
def _pair_on_one_file(tmp_path, batch=(5, 4), mode="r"):
    torch.manual_seed(1)
    source = upstream.TensorDict({"a": torch.randn(*batch, 3), "b": {"c": torch.arange(20).view(*batch)},
                                  "m": torch.rand(*batch) > 0.5}, batch)
    source.to_h5(str(tmp_path / "u.h5")).close()
    if mode != "r":
        import shutil

        shutil.copy(tmp_path / "u.h5", tmp_path / "t.h5")
        return (upstream.from_h5(str(tmp_path / "u.h5"), mode=mode, batch_size=batch),
                torchdict.from_h5(tmp_path / "t.h5", mode=mode, batch_size=batch))
    return (upstream.from_h5(str(tmp_path / "u.h5"), batch_size=batch),
            torchdict.from_h5(tmp_path / "u.h5", batch_size=batch))


INDICES = {
    "int": 0, "negative": -1, "slice": slice(1, 4), "step": slice(None, None, 2), "pair": (1, 2),
    "second dim": (slice(None), 1), "list": [0, 2], "repeated list": [3, 1, 3], "tensor": torch.tensor([4, 0]),
    "mask": torch.tensor([True, False, True, False, True]), "ellipsis": (Ellipsis, 0), "none": (None, 0),
    "2d index": torch.tensor([[0, 1], [2, 3]]), "two tensors": (torch.tensor([0, 1]), torch.tensor([1, 2])),
    "tensor on dim 1": (slice(None), torch.tensor([3, 0])), "full mask": "mask2d", "range": range(2), "empty": (),
    "rows then slice": (torch.tensor([1, 3]), slice(1, 3)), "numpy": np.array([2, 4]),
}


@pytest.mark.parametrize("name", INDICES)
def test_indexing_matches_upstream(tmp_path, name):
    theirs, ours = _pair_on_one_file(tmp_path)
    index = INDICES[name]
    if isinstance(index, str):
        index = torch.arange(20).view(5, 4) % 3 == 0
    expected = theirs[index].to_tensordict()
    got = ours[index]
    assert isinstance(got, TensorDict)
    assert got.batch_size == expected.batch_size
    assert_same_leaves(got, expected)
    theirs.close()
    ours.close()


@pytest.mark.parametrize("index", [10, (0, 10), slice(None, None, -1), torch.tensor([7])], ids=str)
def test_bad_indices_raise_as_upstream(tmp_path, index):
    theirs, ours = _pair_on_one_file(tmp_path)
    with pytest.raises(Exception) as expected:
        theirs[index].to_tensordict()
    with pytest.raises(type(expected.value)):
        ours[index]


WRITES = {
    "setitem same shape keeps dtype": lambda td, lib: td.__setitem__("a", torch.full((5, 4, 3), 2)),
    "set replaces": lambda td, lib: td.set("a", torch.full((5, 4, 3), 2)),
    "set new nested": lambda td, lib: td.set(("b", "d"), torch.ones(5, 4, 1)),
    "set new deep": lambda td, lib: td.set(("x", "y"), torch.ones(5, 4)),
    "set_": lambda td, lib: td.set_(("b", "c"), torch.full((5, 4), 3)),
    "del": lambda td, lib: td.del_("m"),
    "pop": lambda td, lib: td.pop("m"),
    "update": lambda td, lib: td.update({"m": torch.zeros(5, 4, dtype=torch.bool), "g": torch.ones(5, 4, 2)}),
    "update nested": lambda td, lib: td.update({"b": {"c": torch.ones(5, 4, dtype=torch.long), "e": torch.ones(5, 4)}}),
    "update_": lambda td, lib: td.update_({"a": torch.zeros(5, 4, 3)}),
    "index = number": lambda td, lib: td.__setitem__(slice(1, 3), 5),
    "index = dict": lambda td, lib: td.__setitem__(torch.tensor([0, 2]), {"a": torch.ones(2, 4, 3)}),
    "index = td": lambda td, lib: td.__setitem__((1, 2), lib.TensorDict({"a": torch.ones(3)})),
    "index = new key": lambda td, lib: td.__setitem__(slice(0, 2), {"new": torch.ones(2, 4, 2)}),
    "mask = number": lambda td, lib: td.__setitem__(torch.tensor([True, False, True, False, False]), 1),
    "add_": lambda td, lib: td.add_(1),
    "zero_": lambda td, lib: td.zero_(),
    "apply_": lambda td, lib: td.apply_(lambda x: x * 2),
    "rename_key_": lambda td, lib: td.rename_key_("m", "mask"),
    "fill_": lambda td, lib: td.fill_("a", 3),
    "masked_fill_": lambda td, lib: td.masked_fill_(torch.arange(20).view(5, 4) > 10, -1),
    "set non-tensor": lambda td, lib: td.set("s", "hello"),
    "create_nested": lambda td, lib: td.create_nested("n"),
    "set_at_": lambda td, lib: td.set_at_("a", 9, (2, 1)),
    "update_at_": lambda td, lib: td.update_at_({"a": torch.zeros(3)}, (1, 1)),
    "set bad batch": lambda td, lib: td.set("z", torch.ones(3)),
    "set_ missing": lambda td, lib: td.set_("nope", torch.ones(5, 4)),
    "del missing": lambda td, lib: td.del_("nope"),
    "batch_size bad": lambda td, lib: setattr(td, "batch_size", [6]),
    "batch_size shorter": lambda td, lib: setattr(td, "batch_size", [5]),
    "lock then new key": lambda td, lib: (td.lock_(), td.set("q", torch.ones(5, 4))),
    "lock then setitem": lambda td, lib: (td.lock_(), td.__setitem__("a", torch.zeros(5, 4, 3))),
    "lock then set": lambda td, lib: (td.lock_(), td.set("a", torch.zeros(5, 4, 3))),
    "lock then del": lambda td, lib: (td.lock_(), td.del_("a")),
}


def _file_leaves(path) -> dict:
    with h5py.File(path, "r") as file:
        out = {}
        file.visititems(lambda name, node: out.__setitem__(name, np.asarray(node[()]) if isinstance(
            node, h5py.Dataset) else None))
    return out


@pytest.mark.parametrize("name", WRITES)
def test_writes_match_upstream(tmp_path, name):
    theirs, ours = _pair_on_one_file(tmp_path, mode="r+")
    results = []
    for td, lib in ((theirs, upstream), (ours, torchdict)):
        try:
            WRITES[name](td, lib)
            error = None
        except Exception as err:  # noqa: BLE001 - compared below
            error = err
        results.append((error, td.batch_size))
        td.close()
    (their_error, their_batch), (our_error, our_batch) = results
    assert (their_error is None) == (our_error is None), (their_error, our_error)
    if their_error is not None:
        assert isinstance(our_error, type(their_error)) or isinstance(their_error, type(our_error)), (
            their_error, our_error)
    assert our_batch == their_batch
    expected, got = _file_leaves(tmp_path / "u.h5"), _file_leaves(tmp_path / "t.h5")
    assert sorted(expected) == sorted(got)
    for key, value in expected.items():
        if value is not None:
            assert value.dtype == got[key].dtype and np.array_equal(value, got[key]), key


@pytest.mark.parametrize("index", [torch.tensor([4, 1]), torch.tensor([1, 1, 3]), [3, 0, 3]], ids=str)
def test_unsorted_and_repeated_row_writes_match_tensordict(tmp_path, index):
    # upstream 0.15 refuses these (h5py wants increasing indices); torchdict writes them as a TensorDict does
    source = TensorDict({"a": torch.zeros(5, 2), "n": {"b": torch.zeros(5)}}, [5])
    value = {"a": torch.arange(2 * len(index), dtype=torch.float32).view(-1, 2),
             "n": {"b": torch.arange(len(index), dtype=torch.float32)}}
    with source.to_h5(tmp_path / "u.h5", ) as td:
        td[index] = value
        expected = source.clone()
        expected[index] = value
        assert_same_leaves(td, expected)


def test_reads_match_upstream(tmp_path):
    theirs, ours = _pair_on_one_file(tmp_path)
    assert ours.batch_size == theirs.batch_size and len(ours) == len(theirs)
    assert ours.keys() == list(theirs.keys())
    assert ours.keys(True) == list(theirs.keys(True))
    assert ours.keys(True, True) == list(theirs.keys(True, True))
    assert ours.get_item_shape("a") == theirs.get_item_shape("a")
    assert torch.equal(ours.get(("b", "c")), theirs.get(("b", "c")))
    assert torch.equal(ours.get_at("a", 2), theirs.get_at("a", 2))
    assert ours.get("nope", 7) == theirs.get("nope", 7) == 7
    assert ("b", "c") in ours and "nope" not in ours and ("a", "x") not in ours
    assert ours.entry_class("a") is torch.Tensor and ours.entry_class("b") is PersistentTensorDict
    with pytest.raises(KeyError):
        ours["nope"]
    with pytest.raises(KeyError):
        theirs["nope"]
    assert_same_leaves(ours.to_tensordict(), theirs.to_tensordict())
    assert torch.equal((ours["a"] + 1), (theirs + 1)["a"])
    assert_same_leaves(ours.sum(dim=1), theirs.to_tensordict().sum(dim=1))
    assert [td.batch_size for td in ours] == [td.batch_size for td in theirs]
    theirs.close()
    ours.close()


def test_read_only_mode_refuses_writes_as_upstream(tmp_path):
    theirs, ours = _pair_on_one_file(tmp_path)
    for write in (lambda td: td.__setitem__("a", torch.zeros(5, 4, 3)), lambda td: td.set("z", torch.zeros(5, 4)),
                  lambda td: td.__setitem__(0, 1)):
        with pytest.raises((OSError, ValueError)):
            write(theirs)
        with pytest.raises(OSError, match="read-only"):
            write(ours)
        with pytest.raises(ValueError):  # the error is both, as h5py raises one or the other
            write(ours)
    assert torch.equal(ours["a"], theirs["a"])


def test_closed_file_reads_raise_key_error_as_upstream(tmp_path):
    td = TensorDict({"a": torch.zeros(2)}, [2]).to_h5(tmp_path / "c.h5")
    td.close()
    with pytest.raises(KeyError, match="closed"):
        td["a"]


# ---------------------------------------------------------------------- lazy reads and writes
class _Counting:
    """Wraps a backend's reads to record how many elements each one returns."""

    def __init__(self, monkeypatch, backend_class):
        self.sizes: list = []
        self.full_reads = 0
        read_at, read_all = backend_class.read_at, backend_class.read_all

        def counted_at(backend, node, index):
            out = read_at(backend, node, index)
            self.sizes.append(out.size)
            return out

        def counted_all(backend, node):
            self.full_reads += 1
            return read_all(backend, node)

        monkeypatch.setattr(backend_class, "read_at", counted_at)
        monkeypatch.setattr(backend_class, "read_all", counted_all)


@pytest.mark.parametrize("index, rows", [(5, 1), (slice(10, 13), 3), ([9000, 3, 9000], 2),
                                         (torch.tensor([7, 8, 9]), 3), ((slice(0, 20, 10),), 2),
                                         (torch.arange(10_000) % 2_500 == 1, 4)], ids=str)
def test_indexing_reads_only_the_selected_rows(tmp_path, monkeypatch, index, rows):
    from torchdict.formats._h5_backend import H5Backend

    source = TensorDict({"a": torch.arange(20_000).view(10_000, 2), "n": {"b": torch.zeros(10_000, 2)}}, [10_000])
    source.to_h5(tmp_path / "big.h5").close()
    counter = _Counting(monkeypatch, H5Backend)
    with torchdict.from_h5(tmp_path / "big.h5") as td:
        got = td[index]
    assert counter.full_reads == 0
    assert counter.sizes and max(counter.sizes) <= rows * 2  # every row of these datasets holds 2 elements
    assert torch.equal(got["a"], source["a"][index])


def test_indexed_writes_write_only_the_selected_rows(tmp_path, monkeypatch):
    from torchdict.formats._h5_backend import H5Backend

    TensorDict({"a": torch.zeros(10_000, 2)}, [10_000]).to_h5(tmp_path / "w.h5").close()
    written = []
    original = H5Backend.write_at
    monkeypatch.setattr(H5Backend, "write_at", lambda self, node, index, array: (
        written.append(array.shape), original(self, node, index, array))[-1])
    monkeypatch.setattr(H5Backend, "write_all", lambda *args: pytest.fail("a whole dataset was written"))
    monkeypatch.setattr(H5Backend, "read_all", lambda *args: pytest.fail("a whole dataset was read"))
    with torchdict.from_h5(tmp_path / "w.h5", mode="r+") as td:
        td[torch.tensor([9_999, 5])] = {"a": torch.tensor([[1.0, 2.0], [3.0, 4.0]])}
        td[7] = 1
    assert written == [(2, 2), (2,)]
    with h5py.File(tmp_path / "w.h5") as file:
        assert file["a"][9_999].tolist() == [1.0, 2.0] and file["a"][5].tolist() == [3.0, 4.0]
        assert file["a"][7].tolist() == [1.0, 1.0] and file["a"][6].tolist() == [0.0, 0.0]


def test_entries_are_read_when_asked_for(tmp_path, monkeypatch):
    from torchdict.formats._h5_backend import H5Backend

    TensorDict({"a": torch.zeros(3), "b": torch.ones(3), "n": {"c": torch.ones(3)}}, [3]).to_h5(
        tmp_path / "l.h5").close()
    counter = _Counting(monkeypatch, H5Backend)
    with torchdict.from_h5(tmp_path / "l.h5") as td:
        assert counter.full_reads == 0  # opening, batch size, keys: metadata only
        td.keys(True, True)
        "b" in td
        repr(td)
        assert counter.full_reads == 0
        td["b"]
        assert counter.full_reads == 1


# ---------------------------------------------------------------------- from_h5 options and the class
def test_from_h5_batch_options_match_upstream(tmp_path):
    TensorDict({"a": torch.zeros(4, 3, 2), "n": {"b": torch.zeros(4, 3)}}, []).to_h5(tmp_path / "o.h5").close()
    path = str(tmp_path / "o.h5")
    for kwargs in ({}, {"batch_size": [4]}, {"auto_batch_size": True}, {"auto_batch_size": True, "batch_dims": 1}):
        theirs, ours = upstream.from_h5(path, **kwargs), torchdict.from_h5(path, **kwargs)
        assert ours.batch_size == theirs.batch_size, kwargs
        assert ours["n"].batch_size == theirs["n"].batch_size, kwargs
        theirs.close()
        ours.close()
    for lib in (upstream, torchdict):
        with pytest.raises(TypeError, match="Conflicting batch sizes"):
            lib.from_h5(path, batch_size=[4], auto_batch_size=True)
        with pytest.raises(ValueError, match="batch size and array size mismatch"):
            lib.from_h5(path, batch_size=[5])
        with pytest.warns(FutureWarning, match="ignores batch_dims=1"):
            lib.from_h5(path, batch_dims=1).close()


def test_from_h5_on_bad_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.h5"):
        torchdict.from_h5(tmp_path / "missing.h5")
    (tmp_path / "text.h5").write_text("not hdf5")
    with pytest.raises(OSError, match="not an HDF5 file"):
        torchdict.from_h5(tmp_path / "text.h5")
    TensorDict({"a": torch.zeros(1000)}, [1000]).to_h5(tmp_path / "full.h5").close()
    data = (tmp_path / "full.h5").read_bytes()
    (tmp_path / "cut.h5").write_bytes(data[: len(data) // 3])
    with pytest.raises(OSError, match="cut.h5"):
        torchdict.from_h5(tmp_path / "cut.h5")["a"]
    with pytest.raises(ValueError, match="Invalid mode"):
        torchdict.from_h5(tmp_path / "full.h5", mode="q")


def test_constructor_and_from_dict_as_upstream(tmp_path):
    td = PersistentTensorDict(filename=tmp_path / "c.h5", batch_size=[3], mode="w")
    td["a", "b"] = torch.zeros(3, 4)
    td["a", "b"] += 1
    assert torch.equal(td["a", "b"][0], torch.ones(4)) and isinstance(td["a"], PersistentTensorDict)
    td.close()
    with pytest.raises(RuntimeError, match="Either group or filename"):
        PersistentTensorDict(batch_size=[3])
    with pytest.raises(NotImplementedError, match="Unknown backend"):
        PersistentTensorDict(filename=tmp_path / "c.h5", backend="nope")
    with h5py.File(tmp_path / "c.h5", "r") as file:
        over_group = PersistentTensorDict(group=file["a"], batch_size=[3])
        assert torch.equal(over_group["b"], torch.ones(3, 4))
    data = {"a": torch.zeros(3, 4), "b": {"c": torch.ones(3)}}
    ours = PersistentTensorDict.from_dict(data, tmp_path / "d.h5")
    theirs = upstream.PersistentTensorDict.from_dict(data, str(tmp_path / "u.h5"))
    assert ours.batch_size == theirs.batch_size and ours["b"].batch_size == theirs["b"].batch_size
    assert_same_leaves(ours, theirs)
    ours.close()
    theirs.close()


def test_context_manager_closes_and_lock_blocks_restore(tmp_path):
    td = TensorDict({"a": torch.zeros(2)}, [2]).to_h5(tmp_path / "m.h5")
    with td.lock_():
        assert td.is_locked
    assert not td.is_locked and td["a"].shape == (2,)  # the lock block did not close the file
    td.lock_()
    with td.unlock_():
        assert not td.is_locked
    assert td.is_locked
    with td as same:
        assert same is td
    with pytest.raises(KeyError):
        td["a"]


def test_clone_copy_and_to(tmp_path):
    td = TensorDict({"a": torch.arange(3), "n": {"b": torch.zeros(3, 2)}}, [3]).to_h5(tmp_path / "c.h5")
    shallow = td.clone(recurse=False)
    assert isinstance(shallow, PersistentTensorDict) and shallow.file == td.file
    copied = td.clone(newfile=tmp_path / "copy.h5")
    assert isinstance(copied, PersistentTensorDict) and copied.filename == tmp_path / "copy.h5"
    copied["a"] = torch.full((3,), 7)
    assert td["a"].tolist() == [0, 1, 2]
    with pytest.warns(UserWarning, match="newfile"):
        temporary = td.clone()
    assert_same_leaves(temporary, td)
    os.unlink(temporary.filename)
    moved = td.to("cpu")
    assert moved is td or isinstance(moved, PersistentTensorDict)
    meta = td.to("meta")
    assert isinstance(meta, PersistentTensorDict) and meta["a"].device.type == "meta"
    assert isinstance(td.to(torch.float64), TensorDict) and td.to(torch.float64)["a"].dtype == torch.float64
    for other in (temporary, copied, td):
        other.close()


def test_pickling_reopens_the_file_and_never_truncates_it(tmp_path):
    td = PersistentTensorDict(filename=tmp_path / "p.h5", batch_size=[2], mode="w")
    td["a"] = torch.ones(2)
    td.lock_()
    clone = pickle.loads(pickle.dumps(td))
    assert torch.equal(clone["a"], torch.ones(2)) and clone.is_locked  # mode "w" reopened as "r+"
    clone.close()
    td.close()
    reader = torchdict.from_h5(tmp_path / "p.h5")
    copy = pickle.loads(pickle.dumps(reader))
    with pytest.raises(OSError):
        copy["b"] = torch.ones(2)  # a read-only tensordict stays read-only
    reader.close()
    copy.close()


def test_dense_results_and_in_place_ops(tmp_path):
    with TensorDict({"a": torch.arange(6.0).view(3, 2)}, [3]).to_h5(tmp_path / "o.h5") as td:
        assert isinstance(td * 2, TensorDict) and torch.equal((td * 2)["a"], torch.arange(6.0).view(3, 2) * 2)
        td.mul_(2)
        assert torch.equal(td["a"], torch.arange(6.0).view(3, 2) * 2)
        td *= 0.5
        assert torch.equal(td["a"], torch.arange(6.0).view(3, 2))
        assert td.empty(recurse=True).batch_size == td.batch_size


def test_missing_h5py_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "h5py", None)
    with pytest.raises(ImportError, match=r"to_h5 needs h5py: pip install torchdict\[h5\]"):
        TensorDict({"a": torch.zeros(2)}, [2]).to_h5(tmp_path / "x.h5")
    with pytest.raises(ImportError, match=r"from_h5 needs h5py: pip install torchdict\[h5\]"):
        torchdict.from_h5(tmp_path / "x.h5")
    with pytest.raises(ImportError, match=r"torchdict\[h5\]"):
        PersistentTensorDict(filename=tmp_path / "x.h5", mode="w")
    assert list(tmp_path.iterdir()) == []


def test_import_torchdict_loads_no_format_library():
    code = ("import sys, torchdict; assert torchdict.TensorDict.to_h5; "
            "bad = [m for m in ('h5py', 'zarr', 'torchdict.formats.h5', 'torchdict.formats.zarr') if m in sys.modules]; "
            "print(bad)")
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ,
                         "PYTHONPATH": src}, check=True)
    assert out.stdout.strip() == "[]"


def test_failed_write_over_an_existing_file_keeps_the_old_one(tmp_path):
    path = tmp_path / "keep.h5"
    TensorDict({"a": torch.ones(2)}, [2]).to_h5(path).close()
    with pytest.raises(TypeError):
        TensorDict({"b": torch.ones(2, dtype=torch.bfloat16)}, [2]).to_h5(path)
    with torchdict.from_h5(path) as td:
        assert td.keys() == ["a"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.h5"]


def test_warnings_of_upstream_reading_strings_are_not_ours(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with TensorDict({"s": "x"}, []).to_h5(tmp_path / "s.h5") as td:
            assert td["s"] == "x"


def test_non_tensor_scalars_do_not_count_towards_the_inferred_batch(tmp_path):
    TensorDict({"t": torch.zeros(3), "i": NonTensorData(3)}, [3]).to_h5(tmp_path / "s.h5").close()
    with torchdict.from_h5(tmp_path / "s.h5") as td:
        assert td.batch_size == torch.Size([3])  # upstream 0.15 gives [] here (it counts the value as 0-dim)
        assert td["i"] == 3 and type(td["i"]) is int


def test_a_dataloader_gets_one_tensordict_per_batch(tmp_path):
    from torch.utils.data import DataLoader

    with TensorDict({"a": torch.arange(10)}, [10]).to_h5(tmp_path / "d.h5") as td:
        batches = list(DataLoader(td, batch_size=4, collate_fn=lambda batch: batch))
    assert [batch["a"].tolist() for batch in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


# ---------------------------------------------------------------------- any index: the same as a TensorDict
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@st.composite
def _batch_and_index(draw):
    batch = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=3)))
    items = []
    for size in batch[: draw(st.integers(1, len(batch)))]:
        kind = draw(st.sampled_from(["int", "slice", "list", "mask", "full"]))
        if kind == "int":
            items.append(draw(st.integers(-size, size - 1)))
        elif kind == "slice":
            items.append(slice(draw(st.none() | st.integers(-size, size)), draw(st.none() | st.integers(-size, size)),
                               draw(st.none() | st.integers(1, 3))))
        elif kind == "list":
            items.append(torch.tensor(draw(st.lists(st.integers(-size, size - 1), min_size=1, max_size=4))))
        elif kind == "mask":
            items.append(torch.tensor(draw(st.lists(st.booleans(), min_size=size, max_size=size))))
        else:
            items.append(slice(None))
    if draw(st.booleans()) and len(items) < len(batch):
        items.insert(draw(st.integers(0, len(items))), Ellipsis)
    return batch, tuple(items) if len(items) > 1 or draw(st.booleans()) else items[0]


@settings(max_examples=60)
@given(_batch_and_index())
def test_any_index_reads_and_writes_as_a_tensordict(tmp_path_factory, case):
    batch, index = case
    folder = tmp_path_factory.mktemp("h5")
    values = torch.arange(int(np.prod(batch)) * 2, dtype=torch.float32).view(*batch, 2)
    expected = TensorDict({"a": values, "n": {"b": values[..., 0].long()}}, batch_size=batch)
    with expected.to_h5(folder / "x.h5") as td:
        try:
            want = expected[index]
        except Exception as err:  # noqa: BLE001 - the same error type is expected
            with pytest.raises(type(err)):
                td[index]
            return
        assert_same_leaves(td[index], want)
        fill = torch.arange(want.batch_size.numel(), dtype=torch.float32).view(want.batch_size)
        td[index] = {"a": fill.unsqueeze(-1).expand(*want.batch_size, 2), "n": {"b": fill.long()}}
        expected[index] = {"a": fill.unsqueeze(-1).expand(*want.batch_size, 2), "n": {"b": fill.long()}}
        assert_same_leaves(td, expected)


def test_update_takes_entries_as_keywords_as_upstream(tmp_path):
    results = []
    for lib, name in ((torchdict, "ours.h5"), (upstream, "theirs.h5")):
        source = lib.TensorDict({"a": torch.zeros(3)}, batch_size=[3])
        td = lib.PersistentTensorDict.from_dict(source, filename=str(tmp_path / name))
        td.update(b=torch.ones(3))
        td.update({"a": torch.full((3,), 2.0)}, c=torch.full((3,), 3.0))
        td.update_(b=torch.full((3,), 4.0))
        results.append({key: td[key].tolist() for key in sorted(td.keys())})
        td.close()
    assert results[0] == results[1]
