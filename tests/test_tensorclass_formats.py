"""The file-format readers of a tensorclass (issue 21): ``MyClass.from_pandas``, ``from_csv``, ``from_json``,
``from_parquet``, ``from_struct_array``, ``from_h5``, ``from_zarr``, and the ``to_*`` writers of an instance.

Every call runs on upstream tensordict and on torchdict with the same class declared in each: equal instances
(class, batch size, device, each field) or the same exception type. A failed call leaves its input as it was.
One deliberate difference is checked as such: ``from_h5`` / ``from_zarr`` read the file into memory and close
it (a torchdict tensorclass keeps its fields in a TensorDict), where upstream wraps the open file.
"""
from __future__ import annotations

import hashlib
import os
import warnings
from typing import Optional

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import torchdict

from _format_helpers import assert_same, outcome, same_values

pd = pytest.importorskip("pandas")
pa = pytest.importorskip("pyarrow")
upstream = pytest.importorskip("tensordict")

READERS = ("from_pandas", "from_csv", "from_json", "from_parquet", "from_struct_array", "from_h5", "from_zarr")


@pytest.fixture(autouse=True)
def _quiet_upstream_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        yield


def declare(lib):
    """The same classes, declared with ``lib``'s decorator: ``Row`` (tensors, a string, a nested class) and
    ``Point`` (two tensors, a ``__post_init__`` that counts its calls)."""

    @lib.tensorclass
    class Inner:
        a: torch.Tensor

    @lib.tensorclass
    class Row:
        x: torch.Tensor
        y: torch.Tensor
        q: Optional[Inner] = None
        s: str = "default"

    @lib.tensorclass
    class Point:
        x: torch.Tensor
        y: torch.Tensor

        def __post_init__(self):
            CALLS.append(type(self).__name__)

    return {"Row": Row, "Point": Point, "Inner": Inner}


CALLS: list = []
UP = declare(upstream)
OURS = declare(torchdict)


def _field_value(value):
    """A field as both libraries can be compared on it (an open file's level read into memory)."""
    if hasattr(value, "batch_size") and type(value).__name__ == "PersistentTensorDict":
        return value.to_tensordict()
    return value


def assert_same_instance(up, ours):
    assert type(up).__name__ == type(ours).__name__
    assert torchdict.is_tensorclass(ours)
    assert tuple(up.batch_size) == tuple(ours.batch_size)
    assert up.device == ours.device
    for name in type(ours)._tc_field_names:
        left, right = _field_value(getattr(up, name)), getattr(ours, name)
        if left is None or right is None:
            assert left is None and right is None, (name, left, right)
        elif isinstance(left, torch.Tensor) or hasattr(left, "batch_size"):
            assert_same(left, right, name)
        elif type(left) is bytes and type(right) is str:
            assert left.decode() == right, name  # HDF5 strings read back as str in torchdict (docs/compat.md)
        else:
            assert same_values(left, right), (name, left, right)


def assert_same_call(up_call, our_call):
    up, ours = outcome(up_call), outcome(our_call)
    assert up[0] == ours[0], f"upstream {up[0]} ({up[1]!r}), torchdict {ours[0]} ({ours[1]!r})"
    if up[0] == "error":
        assert isinstance(ours[1], type(up[1])) or isinstance(up[1], type(ours[1])), (up[1], ours[1])
    else:
        assert_same_instance(up[1], ours[1])
    return ours


def digest(path) -> str:
    """The bytes under ``path`` (a file or a folder), hashed: a failed read must leave them as they were."""
    sha = hashlib.sha256()
    paths = [path] if os.path.isfile(path) else sorted(
        os.path.join(root, name) for root, _, names in os.walk(path) for name in names)
    for file in paths:
        sha.update(file.encode())
        with open(file, "rb") as handle:
            sha.update(handle.read())
    return sha.hexdigest()


def frame():
    return pd.DataFrame({"x": [1, 2, 3], "y": [0.5, 1.5, 2.5], "s": ["a", "b", "c"], "q.a": [1.0, 2.0, 3.0]})


# ---------------------------------------------------------------------------- the members exist, as upstream's
@pytest.mark.parametrize("name", READERS)
def test_readers_are_classmethods_with_upstream_parameters(name):
    import inspect

    ours = inspect.signature(getattr(OURS["Row"], name))
    theirs = inspect.signature(getattr(upstream.TensorDict, name))
    assert list(ours.parameters) == list(theirs.parameters)
    for parameter in theirs.parameters.values():
        assert ours.parameters[parameter.name].default == parameter.default
        assert ours.parameters[parameter.name].kind == parameter.kind
    assert name in dir(torchdict.TensorClass)


# ---------------------------------------------------------------------------- pandas / CSV / JSON / Parquet
@pytest.mark.parametrize("options", [
    {}, {"separator": "."}, {"dtype": torch.float32, "separator": "."}, {"device": "cpu"},
    {"auto_batch_size": True}, {"batch_size": [3]}, {"batch_size": []}, {"batch_dims": 1},
    {"auto_batch_size": True, "batch_size": [3]},
], ids=str)
def test_from_pandas_matches_upstream(options):
    data = frame()
    before = data.copy()
    assert_same_call(lambda: UP["Row"].from_pandas(data, **options),
                     lambda: OURS["Row"].from_pandas(data, **options))
    pd.testing.assert_frame_equal(data, before)


def test_from_pandas_nested_level_stays_a_tensordict_as_upstream():
    """Upstream wraps the read TensorDict as it is: a nested level under a tensorclass-annotated field is a
    TensorDict, not that class (``from_tensordict`` / ``from_dict`` would make it one)."""
    ours = OURS["Row"].from_pandas(frame(), separator=".")
    up = UP["Row"].from_pandas(frame(), separator=".")
    assert type(ours.q).__name__ == type(up.q).__name__ == "TensorDict"
    assert_same_instance(up, ours)


@pytest.mark.parametrize("columns", [["x"], ["x", "y", "w"], ["w"], []], ids=str)
def test_missing_and_extra_columns_match_upstream(columns):
    data = pd.DataFrame({name: [1, 2] for name in columns})
    result = assert_same_call(lambda: UP["Row"].from_pandas(data), lambda: OURS["Row"].from_pandas(data))
    if result[0] == "ok":
        # a field the frame lacks is None, its declared default is not filled (as upstream)
        assert result[1].s is None and result[1].q is None
    else:
        assert isinstance(result[1], ValueError) and "w" in str(result[1])


def test_post_init_runs_once_per_read_as_upstream():
    data = pd.DataFrame({"x": [1, 2], "y": [3, 4]})
    for lib in (UP, OURS):
        CALLS.clear()
        lib["Point"].from_pandas(data)
        assert CALLS == ["Point"]


@pytest.mark.parametrize("fmt", ["csv", "json", "json-lines", "parquet"])
@pytest.mark.parametrize("options", [{}, {"separator": "."}, {"auto_batch_size": True}, {"dtype": torch.float64}],
                         ids=str)
def test_file_readers_match_upstream(tmp_path, fmt, options):
    path = str(tmp_path / f"rows.{fmt}")
    data = frame()
    if fmt == "csv":
        data.to_csv(path, index=False)
    elif fmt == "parquet":
        data.to_parquet(path)
    else:
        data.to_json(path, orient="records", lines=fmt == "json-lines")
    reader = {"csv": "from_csv", "json": "from_json", "json-lines": "from_json", "parquet": "from_parquet"}[fmt]
    extra = {"lines": True} if fmt == "json-lines" else {}
    assert_same_call(lambda: getattr(UP["Row"], reader)(path, **options, **extra),
                     lambda: getattr(OURS["Row"], reader)(path, **options, **extra))


def test_from_parquet_columns_and_reader_kwargs_match_upstream(tmp_path):
    path = str(tmp_path / "rows.parquet")
    frame().to_parquet(path)
    for columns in (["x", "y"], ["x", "q.a"], ["nope"]):
        assert_same_call(lambda: UP["Row"].from_parquet(path, columns=columns, separator="."),
                         lambda: OURS["Row"].from_parquet(path, columns=columns, separator="."))
    csv_path = str(tmp_path / "rows.csv")
    frame().to_csv(csv_path, index=False, sep=";")
    assert_same_call(lambda: UP["Row"].from_csv(csv_path, sep=";", separator="."),
                     lambda: OURS["Row"].from_csv(csv_path, sep=";", separator="."))


@pytest.mark.parametrize("reader", ["from_csv", "from_json", "from_parquet"])
def test_a_file_with_a_column_that_is_not_a_field_is_refused_and_left_alone(tmp_path, reader):
    path = str(tmp_path / "rows")
    data = pd.DataFrame({"x": [1, 2], "other": [3, 4]})
    {"from_csv": lambda: data.to_csv(path, index=False), "from_json": lambda: data.to_json(path, orient="records"),
     "from_parquet": lambda: data.to_parquet(path)}[reader]()
    before = digest(path)
    result = assert_same_call(lambda: getattr(UP["Row"], reader)(path), lambda: getattr(OURS["Row"], reader)(path))
    assert result[0] == "error" and isinstance(result[1], ValueError)
    assert digest(path) == before


def test_a_missing_file_raises_as_upstream(tmp_path):
    missing = str(tmp_path / "missing")
    for reader in ("from_csv", "from_json", "from_parquet", "from_h5", "from_zarr"):
        assert_same_call(lambda: getattr(UP["Row"], reader)(missing), lambda: getattr(OURS["Row"], reader)(missing))
    assert not os.path.exists(missing)


# ---------------------------------------------------------------------------- numpy structured arrays
def _struct_array(shape):
    dtype = np.dtype([("x", "i8"), ("y", "f4", (2,)), ("s", "U10"), ("q", [("a", "f8")])])
    array = np.zeros(shape, dtype=dtype)
    flat = array.reshape(-1)
    for i in range(flat.size):
        flat[i] = (i, (i / 2, -i), f"r{i}", (i * 3.0,))
    return array


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.lists(st.integers(0, 3), min_size=0, max_size=3).map(tuple),
       option=st.sampled_from([{}, {"auto_batch_size": True}, {"batch_size": []}]))
def test_from_struct_array_matches_upstream_at_batch_ranks_0_to_3(shape, option):
    array = _struct_array(shape)
    before = array.copy()
    assert_same_call(lambda: UP["Row"].from_struct_array(array, **option),
                     lambda: OURS["Row"].from_struct_array(array, **option))
    assert array.tobytes() == before.tobytes()


def test_from_struct_array_on_a_device_matches_upstream():
    # Flat: upstream 0.15.3 raises "Can only mark one TensorDict at a time" for a nested struct with a device
    # (TensorDict.from_struct_array too), a bug torchdict does not copy.
    array = np.array([(1, 0.5), (2, 1.5)], dtype=[("x", "i8"), ("y", "f4")])
    assert_same_call(lambda: UP["Row"].from_struct_array(array, device="cpu"),
                     lambda: OURS["Row"].from_struct_array(array, device="cpu"))


def test_from_struct_array_shares_the_array_memory_as_upstream():
    array = _struct_array((4,))
    ours, up = OURS["Row"].from_struct_array(array), UP["Row"].from_struct_array(array)
    array["x"] += 100
    assert ours.x.tolist() == up.x.tolist() == [100, 101, 102, 103]


def test_from_struct_array_with_a_field_the_class_lacks_is_refused():
    array = np.zeros(3, dtype=[("x", "i8"), ("z", "f4")])
    result = assert_same_call(lambda: UP["Row"].from_struct_array(array),
                              lambda: OURS["Row"].from_struct_array(array))
    assert isinstance(result[1], ValueError)


# ---------------------------------------------------------------------------- HDF5 and zarr
def _write_file(lib, kind, path):
    td = lib.TensorDict(x=torch.arange(4), y=torch.linspace(0, 1, 4), s=lib.NonTensorData("tag"),
                        q=lib.TensorDict(a=torch.ones(4, 2), batch_size=[4]), batch_size=[4])
    written = td.to_h5(path) if kind == "h5" else td.to_zarr(path)
    if kind == "h5":
        written.close()


@pytest.mark.parametrize("kind", ["h5", "zarr"])
@pytest.mark.parametrize("writer", ["upstream", "torchdict"])
@pytest.mark.parametrize("options", [{}, {"batch_size": [4]}, {"auto_batch_size": True, "batch_dims": 1},
                                     {"batch_size": [4], "auto_batch_size": True}], ids=str)
def test_file_of_arrays_reads_as_upstream(tmp_path, kind, writer, options):
    if kind == "h5":
        pytest.importorskip("h5py")
    else:
        pytest.importorskip("zarr")
    path = str(tmp_path / f"data.{kind}")
    _write_file(upstream if writer == "upstream" else torchdict, kind, path)
    before = digest(path)
    reader = "from_h5" if kind == "h5" else "from_zarr"
    up, ours = outcome(lambda: getattr(UP["Row"], reader)(path, **options)), \
        outcome(lambda: getattr(OURS["Row"], reader)(path, **options))
    assert up[0] == ours[0], (up, ours)
    if up[0] == "ok":
        assert_same_instance(up[1], ours[1])
        # torchdict's fields are in memory: a TensorDict, not the file
        assert type(ours[1]._tensordict) is torchdict.TensorDict
        assert type(ours[1].q) is torchdict.TensorDict
        if kind == "h5":
            up[1]._tensordict.close()
    else:
        assert isinstance(ours[1], type(up[1])), (up, ours)
    assert digest(path) == before


def test_from_h5_closes_the_file_it_read(tmp_path):
    h5py = pytest.importorskip("h5py")
    path = str(tmp_path / "data.h5")
    _write_file(torchdict, "h5", path)
    row = OURS["Row"].from_h5(path)
    with h5py.File(path, "w"):  # h5py refuses to truncate a file this process still holds open
        pass
    assert row.x.tolist() == [0, 1, 2, 3] and row.s == "tag"  # read before the file was emptied


@pytest.mark.parametrize("kind", ["h5", "zarr"])
def test_a_file_with_a_group_that_is_not_a_field_is_refused_and_closed(tmp_path, kind):
    pytest.importorskip("h5py" if kind == "h5" else "zarr")
    path = str(tmp_path / f"data.{kind}")
    td = torchdict.TensorDict(x=torch.zeros(2), other=torch.ones(2), batch_size=[2])
    written = td.to_h5(path) if kind == "h5" else td.to_zarr(path)
    if kind == "h5":
        written.close()
    before = digest(path)
    reader = "from_h5" if kind == "h5" else "from_zarr"
    with pytest.raises(ValueError, match="other"):
        getattr(OURS["Row"], reader)(path)
    if kind == "h5":
        import h5py

        with h5py.File(path, "r+"):  # closed: h5py would refuse "r+" beside a read-only handle of this process
            pass
    assert digest(path) == before
    # upstream refuses it too (and leaves its file open: checked after ours)
    result = assert_same_call(lambda: getattr(UP["Row"], reader)(path), lambda: getattr(OURS["Row"], reader)(path))
    assert isinstance(result[1], ValueError)


def test_from_zarr_leaves_a_store_object_open(tmp_path):
    zarr = pytest.importorskip("zarr")
    store = zarr.storage.MemoryStore()
    torchdict.TensorDict(x=torch.arange(3), y=torch.ones(3), batch_size=[3]).to_zarr(store)
    first = OURS["Row"].from_zarr(store)
    second = OURS["Row"].from_zarr(store)  # the store still reads
    assert first.x.tolist() == second.x.tolist() == [0, 1, 2]


# ---------------------------------------------------------------------------- writers of an instance
def _instance(lib):
    classes = UP if lib is upstream else OURS
    return classes["Row"](x=torch.arange(3), y=torch.ones(3), q=classes["Inner"](a=torch.zeros(3), batch_size=[3]),
                          s="hi", batch_size=[3])


def test_to_pandas_and_struct_array_of_an_instance_match_upstream():
    up, ours = _instance(upstream), _instance(torchdict)
    pd.testing.assert_frame_equal(up.to_pandas(separator="."), ours.to_pandas(separator="."))
    left, right = up.to_struct_array(), ours.to_struct_array()
    assert left.dtype == right.dtype and left.tobytes() == right.tobytes()


@pytest.mark.parametrize("fmt", ["csv", "json", "parquet"])
def test_table_files_written_by_an_instance_match_upstream_and_read_back(tmp_path, fmt):
    up_path, our_path = str(tmp_path / f"up.{fmt}"), str(tmp_path / f"ours.{fmt}")
    getattr(_instance(upstream), f"to_{fmt}")(up_path, separator=".")
    getattr(_instance(torchdict), f"to_{fmt}")(our_path, separator=".")
    if fmt == "parquet":
        import pyarrow.parquet as pq

        # the same columns and values (string columns: upstream writes large_string, torchdict string)
        assert pq.read_table(up_path).to_pydict() == pq.read_table(our_path).to_pydict()
    else:
        with open(up_path) as left, open(our_path) as right:
            assert left.read() == right.read()
    back = getattr(OURS["Row"], f"from_{fmt}")(our_path, separator=".")
    assert back.x.tolist() == [0, 1, 2] and back.q["a"].tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("kind", ["h5", "zarr"])
def test_an_instance_written_to_a_file_reads_back_in_both_libraries(tmp_path, kind):
    pytest.importorskip("h5py" if kind == "h5" else "zarr")
    path = str(tmp_path / f"data.{kind}")
    written = getattr(_instance(torchdict), f"to_{kind}")(path)
    if kind == "h5":
        written.close()
    reader = f"from_{kind}"
    ours = getattr(OURS["Row"], reader)(path)
    up = getattr(UP["Row"], reader)(path)
    assert_same_instance(up, ours)
    assert ours.s == "hi"
    if kind == "h5":
        up._tensordict.close()
