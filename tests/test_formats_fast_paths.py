"""The fast paths the format benchmarks led to (benchmarks/bench_formats.py), checked against upstream.

- Arrow: integer / float columns without nulls become tensors through ``torch.frombuffer`` (views of mutable
  buffers), ``to_arrow`` converts a plain 1-D CPU tensor without its usual checks, ``from_parquet`` views the
  reader's buffers instead of copying them;
- HDF5: nodes are opened with h5py's low-level calls and kept per collection while their link points at the
  same object; a file is opened with one look at each node;
- safetensors: a level is built in one constructor call from all the file's tensors.

Each fast path must give what the general path (and upstream) gives, including after the file or the table
changes behind it.
"""
from __future__ import annotations

import gc
import warnings

import numpy as np
import pytest
import torch

import torchdict
from torchdict import TensorDict

from _format_helpers import assert_same, assert_same_outcome

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
h5py = pytest.importorskip("h5py")
upstream = pytest.importorskip("tensordict")

ARROW_NUMBER_TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(),
                      pa.uint64(), pa.float16(), pa.float32(), pa.float64()]


@pytest.fixture(autouse=True)
def _quiet_upstream_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        yield


def _column(kind, rows: int = 7):
    values = np.arange(rows) % 5
    if pa.types.is_floating(kind):
        return pa.array(values.astype(kind.to_pandas_dtype()))
    return pa.array(values, type=kind)


# ---------------------------------------------------------------------------- from_arrow
@pytest.mark.parametrize("copy", [None, True, False])
@pytest.mark.parametrize("kind", ARROW_NUMBER_TYPES, ids=str)
def test_number_columns_match_upstream(kind, copy):
    table = pa.table({"x": _column(kind), "y": _column(kind)})
    assert_same_outcome(lambda: upstream.from_arrow(table, copy=copy), lambda: torchdict.from_arrow(table, copy=copy))


@pytest.mark.parametrize("start, length", [(0, 7), (1, 4), (3, 4), (6, 1), (2, 0)])
def test_sliced_tables_match_upstream(start, length):
    """A slice views its parent's buffer from an offset: the tensor starts there and stops at its length."""
    table = pa.table({"f": _column(pa.float32(), 9), "i": _column(pa.int64(), 9), "u": _column(pa.uint16(), 9)})
    part = table.slice(start, length)
    assert_same(upstream.from_arrow(part), torchdict.from_arrow(part))


def test_several_batches_and_record_batches_match_upstream():
    chunked = pa.concat_tables([pa.table({"x": _column(pa.int32(), 3)}), pa.table({"x": _column(pa.int32(), 2)})])
    batch = pa.record_batch({"x": _column(pa.float64(), 4), "s": pa.array(list("abcd"))})
    for table in (chunked, batch, pa.table({"x": pa.array([], pa.int64())}), pa.table({})):
        assert_same(upstream.from_arrow(table), torchdict.from_arrow(table))


def test_a_view_of_a_mutable_buffer_is_a_view_and_keeps_the_memory():
    values = np.arange(1000, dtype=np.float64)
    table = pa.table({"x": values})
    address = table.column("x").chunk(0).buffers()[1].address
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # frombuffer warns for a read-only buffer: it must not be given one
        td = torchdict.from_arrow(table)
    assert td["x"].data_ptr() == address
    assert torchdict.from_arrow(table, copy=False)["x"].data_ptr() == address
    assert torchdict.from_arrow(table, copy=True)["x"].data_ptr() != address
    del table, values
    gc.collect()
    for _ in range(5):  # memory freed and reused would show here
        np.full(1000, -1.0)
    assert td["x"].tolist() == list(map(float, range(1000)))


def test_read_only_buffers_are_copied_unless_asked_not_to(tmp_path):
    import pyarrow.feather as feather

    path = str(tmp_path / "x.arrow")
    feather.write_feather(pa.table({"x": np.arange(4.0), "i": np.arange(4)}), path, compression="uncompressed")
    table = feather.read_table(path, memory_map=True)
    assert not table.column("x").chunk(0).buffers()[1].is_mutable
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        copied = torchdict.from_arrow(table)
    assert copied["x"].data_ptr() != table.column("x").chunk(0).buffers()[1].address
    viewed = torchdict.from_arrow(table, copy=False)
    assert viewed["x"].data_ptr() == table.column("x").chunk(0).buffers()[1].address
    assert_same(upstream.from_arrow(table), copied)


def test_nulls_still_take_the_general_path():
    table = pa.table({"x": pa.array([1.0, None, 3.0]), "i": pa.array([1, 2, None], pa.int32())})
    for nulls in ("raise", "fill", "mask"):
        assert_same_outcome(lambda: upstream.from_arrow(table, nulls=nulls),
                            lambda: torchdict.from_arrow(table, nulls=nulls))


# ---------------------------------------------------------------------------- to_arrow
@pytest.mark.parametrize("name", ["plain", "grad", "strided", "parameter", "uint32", "float16", "bfloat16", "conj",
                                  "neg", "empty", "bool"])
def test_to_arrow_columns_match_upstream(name):
    def value():
        return {
            "plain": lambda: torch.arange(6.0),
            "grad": lambda: torch.arange(6.0, requires_grad=True),
            "strided": lambda: torch.arange(12.0)[::2],
            "parameter": lambda: torch.nn.Parameter(torch.arange(6.0), requires_grad=False),
            "uint32": lambda: torch.arange(6, dtype=torch.uint32),
            "float16": lambda: torch.arange(6, dtype=torch.float16),
            "bfloat16": lambda: torch.arange(6, dtype=torch.bfloat16),
            "conj": lambda: torch.arange(6, dtype=torch.complex64).conj(),
            "neg": lambda: torch.arange(6.0)._neg_view(),
            "empty": lambda: torch.zeros(0),
            "bool": lambda: torch.arange(6) % 2 == 0,
        }[name]()

    rows = 0 if name == "empty" else 6

    def build(lib):
        return lib.to_arrow(lib.TensorDict(x=value(), batch_size=[rows]))

    ours = assert_same_outcome(lambda: build(upstream), lambda: build(torchdict), compare=lambda a, b: a.equals(b))
    if ours[0] == "ok" and name == "plain":
        assert ours[1].column("x").to_pylist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_to_arrow_views_a_contiguous_cpu_column():
    tensor = torch.arange(8, dtype=torch.int64)
    table = torchdict.to_arrow(TensorDict(x=tensor, batch_size=[8]))
    assert table.column("x").chunk(0).buffers()[1].address == tensor.data_ptr()


# ---------------------------------------------------------------------------- from_parquet
def _parquet(tmp_path, table, **options):
    path = str(tmp_path / "t.parquet")
    pq.write_table(table, path, **options)
    return path


@pytest.mark.parametrize("options", [{}, {"row_group_size": 3}], ids=["one row group", "several row groups"])
@pytest.mark.parametrize("read", [{}, {"memory_map": True}, {"columns": ["i"]}, {"dtype": torch.float32}],
                         ids=str)
def test_from_parquet_matches_upstream(tmp_path, options, read):
    table = pa.table({"f": _column(pa.float32(), 10), "i": _column(pa.int64(), 10), "u": _column(pa.uint8(), 10),
                      "b": pa.array([True, False] * 5), "n": pa.array([1.0, None] * 5),
                      "s": pa.array(list("abcdefghij"))})
    path = _parquet(tmp_path, table, **options)
    assert_same_outcome(lambda: upstream.TensorDict.from_parquet(path, **read),
                        lambda: torchdict.TensorDict.from_parquet(path, **read))


def test_from_parquet_results_are_writable_and_their_own(tmp_path):
    path = _parquet(tmp_path, pa.table({"x": np.arange(6.0)}))
    first, second = torchdict.from_parquet(path), torchdict.from_parquet(path)
    first["x"] += 1
    assert first["x"].tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert second["x"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


# ---------------------------------------------------------------------------- HDF5 nodes
def _write(path, lib=torchdict):
    td = lib.TensorDict(a=torch.arange(6.0).view(3, 2), b=torch.arange(3), nested=lib.TensorDict(
        c=torch.ones(3, 4), batch_size=[3]), batch_size=[3])
    td.to_h5(path).close()


@pytest.mark.parametrize("mode", ["r", "r+"])
def test_an_entry_replaced_through_the_file_reads_anew(tmp_path, mode):
    path = str(tmp_path / "d.h5")
    _write(path)
    td = torchdict.from_h5(path, mode=mode)
    assert td["a"].tolist() == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]
    if mode == "r":
        td.close()
        with h5py.File(path, "r+") as file:
            del file["a"]
            file["a"] = np.full((3, 5), 7.0)
        td = torchdict.from_h5(path, mode=mode)
    else:
        del td.file["a"]
        td.file["a"] = np.full((3, 5), 7.0)  # behind the collection's back, through h5py
    assert td["a"].shape == (3, 5) and bool((td["a"] == 7).all())
    assert td[1:]["a"].shape == (2, 5)
    td.close()


def test_an_entry_changed_through_another_collection_reads_anew(tmp_path):
    path = str(tmp_path / "d.h5")
    _write(path)
    td = torchdict.from_h5(path, mode="r+")
    other = td.copy()
    assert td["b"].tolist() == [0, 1, 2]
    other["b"] = torch.tensor([5.0, 6.0, 7.0, 8.0])[:3]  # same shape: written into the dataset
    assert td["b"].tolist() == [5, 6, 7]
    other.set("b", torch.tensor([9.0, 9.0, 9.0]))  # replaced: a new dataset, float now
    assert td["b"].dtype == torch.float32 and td["b"].tolist() == [9.0, 9.0, 9.0]
    del other["b"]
    assert "b" not in td
    with pytest.raises(KeyError):
        td["b"]
    td.close()


def test_links_read_as_upstream(tmp_path):
    path = str(tmp_path / "d.h5")
    _write(path)
    with h5py.File(path, "r+") as file:
        file["soft"] = h5py.SoftLink("/a")
        file["hard"] = file["b"]
    ours, theirs = torchdict.from_h5(path), upstream.from_h5(path)
    for key in ("soft", "hard"):
        assert torch.equal(ours[key], theirs[key])
    assert ours[1:]["soft"].tolist() == theirs[1:]["soft"].tolist()
    ours.close()
    theirs.close()
    with h5py.File(path, "r+") as file:
        file["dangling"] = h5py.SoftLink("/nowhere")
    assert_same_outcome(lambda: upstream.from_h5(path), lambda: torchdict.from_h5(path))


def test_other_dataset_types_are_classified_by_the_full_rule(tmp_path):
    """Fixed-length strings, compounds, enums, opaque values are not tensors; a big-endian number is one.

    The backend decides from the dtype's metadata first; the full rule (h5py's dtype checks) must agree, and
    upstream must read the kinds it reads the same way.
    """
    from torchdict.formats._h5_backend import H5Backend
    from torchdict.formats._storage import DATA, TENSOR, torch_dtype_of

    path = str(tmp_path / "d.h5")
    with h5py.File(path, "w") as file:
        file["x"] = np.arange(3.0)
        file["fixed"] = np.array([b"ab", b"cd", b"ef"])
        file["compound"] = np.zeros(3, dtype=[("p", "i4"), ("q", "f8")])
        file.create_dataset("enum", data=np.array([0, 1, 0], dtype="i1"),
                            dtype=h5py.enum_dtype({"off": 0, "on": 1}, basetype="i1"))
        file["opaque"] = np.arange(3).astype(h5py.opaque_dtype(np.dtype("i8")))
        file["text"] = np.array(["a", "b", "c"], dtype=h5py.string_dtype())
        file["big_endian"] = np.arange(3, dtype=">i4")
    backend = H5Backend()
    with h5py.File(path, "r") as file:
        for name, node in file.items():
            dtype = node.dtype
            full = DATA if (h5py.check_string_dtype(dtype) or h5py.check_vlen_dtype(dtype)
                            or h5py.check_enum_dtype(dtype) or h5py.check_opaque_dtype(dtype)
                            or torch_dtype_of(dtype) is None) else TENSOR
            assert backend.kind(node) == full, name
    ours, theirs = torchdict.from_h5(path), upstream.from_h5(path)
    for key in ("x", "fixed", "enum", "opaque", "text"):
        assert type(ours.get(key)).__name__ == type(theirs.get(key)).__name__, key
    assert ours["big_endian"].tolist() == [0, 1, 2]
    ours.close()
    theirs.close()


def test_nodes_are_released_on_close_and_reads_fail_after(tmp_path):
    path = str(tmp_path / "d.h5")
    _write(path)
    td = torchdict.from_h5(path)
    td.to_tensordict()
    td.close()
    with pytest.raises(KeyError):
        td["a"]
    with pytest.raises(KeyError):
        td["nested", "c"]
    reopened = torchdict.from_h5(path)  # the file is not held open by a node kept from before
    assert reopened["nested", "c"].shape == (3, 4)
    reopened.close()


@pytest.mark.parametrize("batch_size", [(), (3,), (3, 2)])
def test_written_collections_keep_their_nested_batch_sizes(tmp_path, batch_size):
    def build(lib):
        inner = lib.TensorDict(c=torch.zeros(*batch_size, 4, 5), batch_size=[*batch_size, 4])
        return lib.TensorDict(a=torch.zeros(*batch_size, 2), inner=inner, batch_size=batch_size)

    ours = build(torchdict).to_h5(str(tmp_path / "ours.h5"))
    theirs = build(upstream).to_h5(str(tmp_path / "theirs.h5"))
    assert ours["inner"].batch_size == theirs["inner"].batch_size
    assert_same(theirs.to_tensordict(), ours.to_tensordict())
    ours.close()
    theirs.close()


# ---------------------------------------------------------------------------- safetensors
def test_safetensors_levels_with_non_tensor_values_keep_their_order(tmp_path):
    def build(lib):
        inner = lib.TensorDict(b=torch.zeros(2), batch_size=[2])
        inner.set_non_tensor("note", "x")
        inner.set("c", torch.ones(2, 3))
        td = lib.TensorDict(batch_size=[2])
        td.set("z", torch.arange(2))
        td.set("inner", inner)
        td.set_non_tensor("meta", {"k": [1, 2]})
        td.set("a", torch.arange(2.0))
        return td

    for writer in (torchdict, upstream):
        path = str(tmp_path / writer.__name__)
        writer.to_safetensors(build(writer), path)
        ours, theirs = torchdict.from_safetensors(path), upstream.from_safetensors(path)
        assert_same(theirs, ours)
        assert list(ours.keys()) == list(theirs.keys())
        assert list(ours["inner"].keys()) == list(theirs["inner"].keys())


def test_safetensors_without_bulk_reads(tmp_path, monkeypatch):
    """Older safetensors have no ``get_tensors``: the tensors are read one by one, with the same result."""
    import safetensors

    real = safetensors.safe_open

    class Handle:
        def __init__(self, *args, **kwargs):
            self._inner = real(*args, **kwargs)

        def __enter__(self):
            self._file = self._inner.__enter__()
            return self

        def __exit__(self, *exc):
            return self._inner.__exit__(*exc)

        def metadata(self):
            return self._file.metadata()

        def keys(self):
            return self._file.keys()

        def get_tensor(self, name):
            return self._file.get_tensor(name)

    td = TensorDict(a=torch.arange(3.0), n=TensorDict(b=torch.ones(3, 2), batch_size=[3]), batch_size=[3])
    path = str(tmp_path / "x.safetensors")
    torchdict.to_safetensors(td, path)
    expected = torchdict.from_safetensors(path)
    monkeypatch.setattr(safetensors, "safe_open", Handle)
    assert_same(expected, torchdict.from_safetensors(path))
