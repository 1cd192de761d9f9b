"""zarr: ``to_zarr`` / ``from_zarr`` (a PersistentTensorDict over a zarr 3 store), checked against upstream."""
from __future__ import annotations

import pickle
import sys
import warnings

import numpy as np
import pytest
import torch
import zarr

import tensordict as upstream
import torchdict
from torchdict import NonTensorData, NonTensorStack, PersistentTensorDict, TensorDict

from test_formats_h5 import BATCHES, STORABLE, UNSTORABLE, _plain, _sample, assert_same_leaves

# upstream warns when it unpickles a value with allow_pickle=None (and zarr about its unstable string type)
pytestmark = [pytest.mark.filterwarnings("ignore::FutureWarning"), pytest.mark.filterwarnings("ignore::UserWarning")]


@pytest.mark.parametrize("dtype", STORABLE, ids=str)
@pytest.mark.parametrize("batch", BATCHES, ids=str)
def test_round_trip_every_dtype_and_batch_rank(tmp_path, dtype, batch):
    source = TensorDict({"x": _sample(dtype, batch + (2,)), "n": {"y": _sample(dtype, batch)}}, batch_size=batch)
    path = tmp_path / "store.zarr"
    written = source.to_zarr(path)
    assert isinstance(written, PersistentTensorDict) and written.backend == "zarr"
    assert_same_leaves(written, source)
    reopened = torchdict.from_zarr(path)
    # the batch size is stored in the store: it comes back without being given
    assert reopened.batch_size == torch.Size(batch) and reopened["n"].batch_size == torch.Size(batch)
    assert_same_leaves(reopened, source)
    if dtype is torch.uint64 and not batch:
        return  # upstream 0.15 can't read a 0-dim uint64 array (TypeError from torch.as_tensor of a numpy scalar)
    theirs = upstream.from_zarr(str(path))
    assert theirs.batch_size == torch.Size(batch)
    assert_same_leaves(theirs, source)


@pytest.mark.parametrize("dtype", UNSTORABLE, ids=str)
def test_unstorable_dtype_is_a_clear_error_and_leaves_nothing(tmp_path, dtype):
    with pytest.raises(TypeError, match=f"can't store the {dtype} tensor at key 'bad'"):
        TensorDict({"bad": torch.ones(2).to(dtype)}, [2]).to_zarr(tmp_path / "s.zarr")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(TypeError):
        upstream.TensorDict({"bad": torch.ones(2).to(dtype)}, [2]).to_zarr(str(tmp_path / "u.zarr"))


def test_batch_sizes_and_names_are_kept(tmp_path):
    source = TensorDict({"a": torch.zeros(3, 4), "n": TensorDict({"b": torch.zeros(3, 4, 5)}, [3, 4])},
                        batch_size=[3], names=["time"])
    source.to_zarr(tmp_path / "s.zarr")
    ours = torchdict.from_zarr(tmp_path / "s.zarr")
    theirs = upstream.from_zarr(str(tmp_path / "s.zarr"))
    assert ours.batch_size == theirs.batch_size == torch.Size([3])
    assert ours["n"].batch_size == theirs["n"].batch_size == torch.Size([3, 4])
    assert ours.names == theirs.names == ["time"]
    empty = TensorDict({}, batch_size=[2, 5])
    empty.to_zarr(tmp_path / "e.zarr")
    assert torchdict.from_zarr(tmp_path / "e.zarr").batch_size == torch.Size([2, 5])
    assert upstream.from_zarr(str(tmp_path / "e.zarr")).batch_size == torch.Size([2, 5])


VALUES = {"str": "hello", "int": 3, "float": 2.5, "bool": True, "list": [1, "a", None], "dict": {"k": [1, 2]},
          "none": None}


@pytest.mark.parametrize("name", VALUES)
def test_json_values_round_trip_and_interoperate(tmp_path, name):
    value = VALUES[name]
    TensorDict({"t": torch.zeros(2), "v": NonTensorData(value)}, [2]).to_zarr(tmp_path / "ours.zarr")
    upstream.TensorDict({"t": torch.zeros(2), "v": upstream.NonTensorData(value)}, [2]).to_zarr(
        str(tmp_path / "theirs.zarr"))
    for path in ("ours.zarr", "theirs.zarr"):
        assert torchdict.from_zarr(tmp_path / path)["v"] == value
        assert _plain(upstream.from_zarr(str(tmp_path / path))["v"]) == value


def test_pickled_values_need_allow_pickle(tmp_path):
    value = {1, 2}  # a set: JSON can't hold it, so it is pickled (as upstream does)
    written = TensorDict({"v": NonTensorData(value)}, []).to_zarr(tmp_path / "p.zarr")
    assert written["v"] == value  # this call wrote it: readable
    with pytest.raises(RuntimeError, match="allow_pickle=True"):
        torchdict.from_zarr(tmp_path / "p.zarr")["v"]
    with pytest.raises(RuntimeError, match="allow_pickle=True"):
        torchdict.from_zarr(tmp_path / "p.zarr", allow_pickle=False)["v"]
    assert torchdict.from_zarr(tmp_path / "p.zarr", allow_pickle=True)["v"] == value
    assert upstream.from_zarr(str(tmp_path / "p.zarr"), allow_pickle=True)["v"] == value
    upstream.TensorDict({"v": upstream.NonTensorData(value)}, []).to_zarr(str(tmp_path / "u.zarr"))
    assert torchdict.from_zarr(tmp_path / "u.zarr", allow_pickle=True)["v"] == value
    with pytest.raises(TypeError, match="allow_pickle"):
        torchdict.from_zarr(tmp_path / "u.zarr", allow_pickle="yes")
    assert TensorDict({"v": NonTensorData(value)}, []).to_zarr(tmp_path / "q.zarr", allow_pickle=False) is not None
    with pytest.raises(RuntimeError, match="allow_pickle"):
        torchdict.from_zarr(tmp_path / "q.zarr")["v"]


@pytest.mark.parametrize("values", [["a", "bb", "c"], [1, 2, 3], [{"a": 1}, {"b": 2}, None]], ids=str)
def test_stacks_round_trip_and_interoperate(tmp_path, values):
    TensorDict({"s": NonTensorStack(*values)}, [3]).to_zarr(tmp_path / "ours.zarr")
    upstream.TensorDict({"s": upstream.NonTensorStack(*values)}, [3]).to_zarr(str(tmp_path / "theirs.zarr"))
    for path in ("ours.zarr", "theirs.zarr"):
        ours = torchdict.from_zarr(tmp_path / path)
        assert isinstance(ours.get("s"), NonTensorStack) and ours["s"] == values
        assert ours[1]["s"] == values[1]
        assert _plain(upstream.from_zarr(str(tmp_path / path))["s"]) == values


def test_store_written_by_upstream_loads_with_equal_contents(tmp_path):
    torch.manual_seed(0)
    source = upstream.TensorDict({"obs": torch.randn(4, 3), "next": {"r": torch.arange(4)}, "label": "x"}, [4])
    source.to_zarr(str(tmp_path / "u.zarr"))
    ours, theirs = torchdict.from_zarr(tmp_path / "u.zarr"), upstream.from_zarr(str(tmp_path / "u.zarr"))
    assert ours.batch_size == theirs.batch_size and ours.keys(True) == list(theirs.keys(True))
    assert_same_leaves(ours, theirs)


def test_store_written_by_torchdict_loads_in_upstream_with_equal_contents(tmp_path):
    torch.manual_seed(0)
    source = TensorDict({"obs": torch.randn(4, 3), "next": {"r": torch.arange(4)}, "label": "x"}, [4])
    source.to_zarr(tmp_path / "t.zarr", chunks=(2,))
    theirs = upstream.from_zarr(str(tmp_path / "t.zarr"))
    assert theirs.batch_size == torch.Size([4])
    assert_same_leaves(theirs, source)
    assert zarr.open_array(str(tmp_path / "t.zarr" / "obs"), mode="r").chunks == (2, 3)


def test_foreign_store(tmp_path):
    group = zarr.open_group(str(tmp_path / "f.zarr"), mode="w")
    group.create_array("x", shape=(6, 2), dtype="f8")[...] = np.arange(12.0).reshape(6, 2)
    group.create_group("g").create_array("y", shape=(6,), dtype="i4")[...] = np.arange(6)
    ours, theirs = torchdict.from_zarr(tmp_path / "f.zarr"), upstream.from_zarr(str(tmp_path / "f.zarr"))
    assert ours.batch_size == theirs.batch_size == torch.Size([6])
    assert ours["g"].batch_size == theirs["g"].batch_size
    assert_same_leaves(ours, theirs)


INDICES = [0, -1, slice(1, 3), slice(None, None, 2), [3, 0, 3], torch.tensor([True, False, True, False, True, False]),
           (Ellipsis, 1), ()]


@pytest.mark.parametrize("index", INDICES, ids=str)
def test_indexing_matches_upstream(tmp_path, index):
    source = TensorDict({"a": torch.arange(24).view(6, 2, 2), "n": {"b": torch.randn(6, 2)}}, [6, 2])
    source.to_zarr(tmp_path / "i.zarr", chunks=(2,))
    ours, theirs = torchdict.from_zarr(tmp_path / "i.zarr"), upstream.from_zarr(str(tmp_path / "i.zarr"))
    expected = theirs[index].to_tensordict()
    got = ours[index]
    assert got.batch_size == expected.batch_size
    assert_same_leaves(got, expected)


WRITES = {
    "setitem": lambda td: td.__setitem__("a", torch.full((4, 3), 2.5)),
    "set new": lambda td: td.set(("n", "c"), torch.ones(4)),
    "index = number": lambda td: td.__setitem__(slice(1, 3), 7),
    "index = dict": lambda td: td.__setitem__(torch.tensor([0, 2]), {"a": torch.ones(2, 3, dtype=torch.long)}),
    "del": lambda td: td.del_("a"),
    "update_": lambda td: td.update_({"n": {"b": torch.zeros(4)}}),
    "add_": lambda td: td.add_(1),
    "set str": lambda td: td.set("s", "text"),
    "read-only write": "r",
}


@pytest.mark.parametrize("name", WRITES)
def test_writes_match_upstream(tmp_path, name):
    source = TensorDict({"a": torch.arange(12).view(4, 3), "n": {"b": torch.ones(4)}}, [4])
    source.to_zarr(tmp_path / "u.zarr")
    source.to_zarr(tmp_path / "t.zarr")
    mode = "r" if WRITES[name] == "r" else "r+"
    write = WRITES[name] if mode == "r+" else (lambda td: td.__setitem__("a", torch.zeros(4, 3)))
    theirs, ours = upstream.from_zarr(str(tmp_path / "u.zarr"), mode=mode), torchdict.from_zarr(
        tmp_path / "t.zarr", mode=mode)
    errors = []
    for td in (theirs, ours):
        try:
            write(td)
            errors.append(None)
        except Exception as err:  # noqa: BLE001 - compared below
            errors.append(err)
    assert (errors[0] is None) == (errors[1] is None), errors
    for reader in (upstream.from_zarr, torchdict.from_zarr):  # both libraries see the same stores
        assert_same_leaves(reader(str(tmp_path / "t.zarr")), reader(str(tmp_path / "u.zarr")))


def test_structure_changes_keep_consolidated_metadata_in_step(tmp_path):
    TensorDict({"a": torch.zeros(2)}, [2]).to_zarr(tmp_path / "c.zarr")
    td = torchdict.from_zarr(tmp_path / "c.zarr", mode="r+")
    td["b"] = torch.ones(2)
    td.del_("a")
    # a read-only open uses the consolidated metadata: it must list the new structure
    assert list(upstream.from_zarr(str(tmp_path / "c.zarr")).keys()) == torchdict.from_zarr(tmp_path / "c.zarr").keys()
    assert list(torchdict.from_zarr(tmp_path / "c.zarr").keys()) == ["b"]


def test_lazy_reads_follow_the_chunks(tmp_path, monkeypatch):
    from torchdict.formats._zarr_backend import ZarrBackend

    TensorDict({"a": torch.arange(2_000).view(1_000, 2)}, [1_000]).to_zarr(tmp_path / "l.zarr", chunks=(10,))
    sizes = []
    original = ZarrBackend.read_at
    monkeypatch.setattr(ZarrBackend, "read_at", lambda self, node, index: (
        lambda out: (sizes.append(out.size), out)[1])(original(self, node, index)))
    monkeypatch.setattr(ZarrBackend, "read_all", lambda *args: pytest.fail("a whole array was read"))
    td = torchdict.from_zarr(tmp_path / "l.zarr")
    assert td[[900, 5]]["a"].tolist() == [[1800, 1801], [10, 11]]
    assert td[3:5]["a"].tolist() == [[6, 7], [8, 9]]
    assert max(sizes) == 4


def test_writing_never_replaces_a_folder_of_other_files(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="not a zarr store"):
        TensorDict({"a": torch.zeros(2)}, [2]).to_zarr(folder)
    assert (folder / "notes.txt").read_text() == "keep me"
    # an existing store is replaced once the new one is complete; a failed write keeps the old one
    TensorDict({"a": torch.zeros(2)}, [2]).to_zarr(tmp_path / "s.zarr")
    with pytest.raises(TypeError):
        TensorDict({"b": torch.zeros(2, dtype=torch.bfloat16)}, [2]).to_zarr(tmp_path / "s.zarr")
    assert torchdict.from_zarr(tmp_path / "s.zarr").keys() == ["a"]
    TensorDict({"c": torch.ones(2)}, [2]).to_zarr(tmp_path / "s.zarr")
    assert torchdict.from_zarr(tmp_path / "s.zarr").keys() == ["c"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["mine", "s.zarr"]


def test_from_zarr_errors_and_options(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.zarr"):
        torchdict.from_zarr(tmp_path / "missing.zarr")
    (tmp_path / "file.zarr").write_text("x")
    with pytest.raises(OSError, match="not a zarr store"):
        torchdict.from_zarr(tmp_path / "file.zarr")
    TensorDict({"a": torch.zeros(4, 3)}, [4]).to_zarr(tmp_path / "s.zarr")
    for lib in (upstream, torchdict):
        with pytest.raises(TypeError, match="Conflicting"):
            lib.from_zarr(str(tmp_path / "s.zarr"), batch_size=[4], auto_batch_size=True)
        assert lib.from_zarr(str(tmp_path / "s.zarr"), auto_batch_size=True).batch_size == torch.Size([4, 3])
        assert lib.from_zarr(str(tmp_path / "s.zarr"), batch_size=[]).batch_size == torch.Size([])


def test_zip_store_and_pickling(tmp_path):
    store = zarr.storage.ZipStore(str(tmp_path / "s.zip"), mode="w")
    TensorDict({"a": torch.arange(3)}, [3]).to_zarr(store)
    store.close()
    reader = torchdict.from_zarr(zarr.storage.ZipStore(str(tmp_path / "s.zip"), mode="r"))
    assert reader["a"].tolist() == [0, 1, 2]
    td = TensorDict({"a": torch.arange(3)}, [3]).to_zarr(tmp_path / "p.zarr")
    clone = pickle.loads(pickle.dumps(td))
    assert clone["a"].tolist() == [0, 1, 2] and clone.batch_size == torch.Size([3])


def test_missing_zarr_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "zarr", None)
    with pytest.raises(ImportError, match=r"to_zarr needs zarr: pip install torchdict\[zarr\]"):
        TensorDict({"a": torch.zeros(2)}, [2]).to_zarr(tmp_path / "x.zarr")
    with pytest.raises(ImportError, match=r"from_zarr needs zarr: pip install torchdict\[zarr\]"):
        TensorDict.from_zarr(tmp_path / "x.zarr")
    assert list(tmp_path.iterdir()) == []


def test_no_warning_from_our_own_calls(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        td = TensorDict({"a": torch.zeros(2), "s": NonTensorStack("x", "y")}, [2]).to_zarr(tmp_path / "w.zarr")
        assert td["s"] == ["x", "y"]
        assert torchdict.from_zarr(tmp_path / "w.zarr")[0]["s"] == "x"
