"""Arrow / Parquet / pandas / CSV / JSON / numpy structured arrays (issue 21, item 3), checked against upstream.

Every call runs on upstream tensordict and on torchdict with equal inputs: equal results or the same
exception type. Files go both ways: written by one library, read by the other.
"""
from __future__ import annotations

import os
import sys
import warnings

import numpy as np
import pytest
import torch

import torchdict
from torchdict import NonTensorData, NonTensorStack, TensorDict

from _format_helpers import assert_same, assert_same_outcome, outcome

pd = pytest.importorskip("pandas")
pa = pytest.importorskip("pyarrow")
upstream = pytest.importorskip("tensordict")

FORMATS = ("csv", "json", "parquet")
NUMPY_DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16,
                torch.uint32, torch.uint64, torch.float16, torch.float32, torch.float64]
NO_NUMPY_DTYPES = [torch.bfloat16, torch.float8_e4m3fn]
COMPLEX_DTYPES = [torch.complex64, torch.complex128]


@pytest.fixture(autouse=True)
def _quiet_upstream_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        yield


def frames_equal(left, right):
    pd.testing.assert_frame_equal(left, right)


def sample_td(lib, n=3):
    """A batch-[n] TensorDict with nested levels, several dtypes and a column of strings."""
    return lib.TensorDict(
        a=torch.arange(n), f=torch.linspace(0, 1, n, dtype=torch.float64), b=torch.arange(n) % 2 == 0,
        s=lib.NonTensorStack(*[f"row{i}" for i in range(n)]),
        n=lib.TensorDict(c=torch.zeros(n, dtype=torch.float32),
                         m=lib.TensorDict(e=torch.ones(n, dtype=torch.int32), batch_size=[n]), batch_size=[n]),
        batch_size=[n])


def sample_frame():
    return pd.DataFrame({
        "a": [1, 2, 3], "s": ["x", "y", "z"], "b": [True, False, True], "f": [1.0, None, 3.0],
        "c": pd.Categorical(["u", "v", "u"]), "t": pd.to_datetime(["2020-01-01", "2020-01-02", "2020-01-03"]),
        "o.p": [1, 2, 3], "o.q": [0.1, 0.2, 0.3], "u8": np.array([1, 2, 3], dtype=np.uint8),
    })


# ---------------------------------------------------------------------------- to_pandas
@pytest.mark.parametrize("separator", [None, ".", "/", "__"])
def test_to_pandas_matches_upstream(separator):
    assert_same_outcome(lambda: sample_td(upstream).to_pandas(separator=separator),
                        lambda: sample_td(torchdict).to_pandas(separator=separator), compare=frames_equal)


@pytest.mark.parametrize("batch_size", [[], [0], [4], [2, 3], [2, 3, 4]])
def test_to_pandas_batch_ranks_match_upstream(batch_size):
    """Tables are rank 1: a rank-0 collection fails in pandas, ranks 2-3 on their 2-D leaves, as upstream."""
    def build(lib):
        return lib.TensorDict(x=torch.zeros(batch_size), batch_size=batch_size)

    assert_same_outcome(lambda: build(upstream).to_pandas(), lambda: build(torchdict).to_pandas(),
                        compare=frames_equal)


def test_to_pandas_of_an_empty_collection_is_an_empty_frame():
    for batch_size in ([3], [0]):
        assert_same_outcome(lambda: upstream.TensorDict(batch_size=batch_size).to_pandas(),
                            lambda: TensorDict(batch_size=batch_size).to_pandas(), compare=frames_equal)


@pytest.mark.parametrize("dtype", NUMPY_DTYPES + NO_NUMPY_DTYPES + COMPLEX_DTYPES, ids=str)
def test_to_pandas_dtypes_match_upstream(dtype):
    def build(lib):
        return lib.TensorDict(x=torch.zeros(3, dtype=dtype), batch_size=[3])

    assert_same_outcome(lambda: build(upstream).to_pandas(), lambda: build(torchdict).to_pandas(),
                        compare=frames_equal)


def test_to_pandas_errors_name_the_problem():
    with pytest.raises(ValueError, match="requires a separator"):
        sample_td(torchdict).to_pandas()
    with pytest.raises(ValueError, match=r"shape torch.Size\(\[3, 2\]\) at key 'x'"):
        TensorDict(x=torch.zeros(3, 2), batch_size=[3]).to_pandas()


def test_to_pandas_copies_the_data():
    td = TensorDict(x=torch.zeros(3), batch_size=[3])
    frame = td.to_pandas()
    td["x"] += 1
    assert frame["x"].tolist() == [0.0, 0.0, 0.0]


def test_to_pandas_non_tensor_data_repeats_its_value():
    def build(lib):
        return lib.TensorDict(x=torch.zeros(2), tag=lib.NonTensorData("run", batch_size=[2]), batch_size=[2])

    assert_same_outcome(lambda: build(upstream).to_pandas(), lambda: build(torchdict).to_pandas(),
                        compare=frames_equal)


def test_nested_tensorclass_columns_match_upstream():
    @upstream.tensorclass
    class UpPoint:
        x: torch.Tensor
        y: torch.Tensor

    @torchdict.tensorclass
    class OurPoint:
        x: torch.Tensor
        y: torch.Tensor

    up = upstream.TensorDict(p=UpPoint(x=torch.zeros(3), y=torch.ones(3), batch_size=[3]), batch_size=[3])
    ours = TensorDict(p=OurPoint(x=torch.zeros(3), y=torch.ones(3), batch_size=[3]), batch_size=[3])
    assert_same_outcome(lambda: up.to_pandas(separator="."), lambda: ours.to_pandas(separator="."),
                        compare=frames_equal)
    frame = ours.to_pandas()
    assert list(frame.columns) == ["p"] and float(frame["p"][2].y) == 1.0


# ---------------------------------------------------------------------------- from_pandas
@pytest.mark.parametrize("options", [
    {}, {"separator": "."}, {"dtype": torch.float32}, {"dtype": torch.int64}, {"auto_batch_size": True},
    {"batch_size": [3]}, {"batch_size": [3], "auto_batch_size": True}, {"batch_dims": 1}, {"batch_dims": 2},
    {"device": "cpu"}, {"batch_size": [4]},
], ids=str)
def test_from_pandas_matches_upstream(options):
    frame = sample_frame()
    assert_same_outcome(lambda: upstream.TensorDict.from_pandas(frame, **options),
                        lambda: TensorDict.from_pandas(frame, **options))
    assert_same_outcome(lambda: upstream.from_pandas(frame, **options), lambda: torchdict.from_pandas(frame, **options))


def test_from_pandas_string_column_is_one_value_as_upstream():
    """Through pandas a string column is one NonTensorData holding the column's array, as upstream."""
    td = torchdict.from_pandas(pd.DataFrame({"s": ["x", "y"]}))
    assert isinstance(td.get("s"), NonTensorData)
    assert td["s"].tolist() == ["x", "y"]


def test_from_pandas_copies_the_columns():
    frame = pd.DataFrame({"x": [1.0, 2.0]})
    td = torchdict.from_pandas(frame)
    td["x"] += 1
    assert frame["x"].tolist() == [1.0, 2.0]


def test_from_pandas_separator_conflict_matches_upstream():
    frame = pd.DataFrame({"a": [1], "a.b": [2]})
    assert_same_outcome(lambda: upstream.from_pandas(frame, separator="."),
                        lambda: torchdict.from_pandas(frame, separator="."))


def test_batch_dims_alone_warns_as_upstream():
    frame = pd.DataFrame({"x": [1.0, 2.0]})
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        torchdict.from_pandas(frame, batch_dims=1)  # would give the same batch size: no warning
        with pytest.raises(FutureWarning, match="ignores batch_dims=1"):
            torchdict.from_pandas(frame, batch_dims=1, batch_size=[2])


def test_from_pandas_of_an_empty_frame_matches_upstream():
    for frame in (pd.DataFrame(), pd.DataFrame({"x": np.zeros(0)})):
        assert_same_outcome(lambda: upstream.from_pandas(frame), lambda: torchdict.from_pandas(frame))


# ---------------------------------------------------------------------------- files: CSV / JSON / Parquet
def _read(lib, fmt, path, **options):
    return getattr(lib.TensorDict, f"from_{fmt}")(path, **options)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("separator", [".", "/"])
def test_files_go_both_ways(tmp_path, fmt, separator):
    """Written by either library, read by either library: the same TensorDict."""
    ours_path, up_path = tmp_path / f"ours.{fmt}", tmp_path / f"up.{fmt}"
    getattr(sample_td(torchdict), f"to_{fmt}")(ours_path, separator=separator)
    getattr(sample_td(upstream), f"to_{fmt}")(up_path, separator=separator)
    if fmt != "parquet":  # pandas writes both text files: byte for byte the same
        assert ours_path.read_bytes() == up_path.read_bytes()
    for path in (ours_path, up_path):
        assert_same_outcome(lambda: _read(upstream, fmt, path, separator=separator),
                            lambda: _read(torchdict, fmt, path, separator=separator))
    back = _read(torchdict, fmt, ours_path, separator=separator)
    original = sample_td(torchdict)
    assert torch.equal(back["n", "m", "e"].to(torch.int32), original["n", "m", "e"])
    assert list(back["s"]) == original["s"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_top_level_readers_match_the_classmethods(tmp_path, fmt):
    path = tmp_path / f"x.{fmt}"
    sample_td(torchdict).to_pandas(separator=".")  # a nested collection needs a separator
    getattr(sample_td(torchdict), f"to_{fmt}")(path, separator=".")
    reader = getattr(torchdict, f"from_{fmt}")
    assert_same(_read(torchdict, fmt, path, separator="."), reader(path, separator="."))
    assert_same(getattr(upstream, f"from_{fmt}")(path, separator="."), reader(path, separator="."))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", NUMPY_DTYPES + NO_NUMPY_DTYPES + COMPLEX_DTYPES, ids=str)
def test_file_dtypes_match_upstream(tmp_path, fmt, dtype):
    """Each dtype: written (or refused with the same error type) and read back as upstream does."""
    def write(lib, name):
        td = lib.TensorDict(x=torch.arange(3).to(dtype), batch_size=[3])
        getattr(td, f"to_{fmt}")(tmp_path / name)
        return None

    written = assert_same_outcome(lambda: write(upstream, f"up.{fmt}"), lambda: write(torchdict, f"ours.{fmt}"),
                                  compare=lambda up, ours: None)
    if written[0] == "ok":
        for name in (f"up.{fmt}", f"ours.{fmt}"):
            assert_same_outcome(lambda: _read(upstream, fmt, tmp_path / name),
                                lambda: _read(torchdict, fmt, tmp_path / name))
    else:
        assert not (tmp_path / f"ours.{fmt}").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no partial file left


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("options", [{}, {"dtype": torch.float32}, {"auto_batch_size": True}, {"batch_size": [2]},
                                     {"batch_size": [2], "auto_batch_size": True}, {"batch_dims": 1},
                                     {"device": "cpu"}], ids=str)
def test_reader_options_match_upstream(tmp_path, fmt, options):
    path = tmp_path / f"x.{fmt}"
    TensorDict(x=torch.tensor([1.0, 2.0]), i=torch.tensor([1, 2]), batch_size=[2]).__getattribute__(f"to_{fmt}")(path)
    assert_same_outcome(lambda: _read(upstream, fmt, path, **options), lambda: _read(torchdict, fmt, path, **options))


def test_from_parquet_columns_and_kwargs(tmp_path):
    path = tmp_path / "x.parquet"
    sample_td(torchdict).to_parquet(path, separator=".")
    for columns in (["a"], ["a", "n.c"], ["missing"]):
        assert_same_outcome(lambda: upstream.TensorDict.from_parquet(path, columns=columns, separator="."),
                            lambda: TensorDict.from_parquet(path, columns=columns, separator="."))


def test_from_parquet_gives_one_string_per_row(tmp_path):
    path = tmp_path / "x.parquet"
    sample_td(torchdict).to_parquet(path, separator=".")
    td = torchdict.from_parquet(path, separator=".")
    assert isinstance(td.get("s"), NonTensorStack) and td[1]["s"] == "row1"


def test_csv_and_json_pass_their_kwargs(tmp_path):
    td = TensorDict(x=torch.tensor([1.0, 2.0]), batch_size=[2])
    for lib_td, name in ((td, "ours"), (upstream.TensorDict(x=torch.tensor([1.0, 2.0]), batch_size=[2]), "up")):
        lib_td.to_csv(tmp_path / f"{name}.csv", sep=";")
        lib_td.to_json(tmp_path / f"{name}.jsonl", lines=True)
    assert (tmp_path / "ours.csv").read_text() == (tmp_path / "up.csv").read_text() == "x\n1.0\n2.0\n"
    assert (tmp_path / "ours.jsonl").read_text() == (tmp_path / "up.jsonl").read_text()
    assert_same(upstream.from_csv(tmp_path / "ours.csv", sep=";"), torchdict.from_csv(tmp_path / "ours.csv", sep=";"))
    assert_same(upstream.from_json(tmp_path / "ours.jsonl", lines=True),
                torchdict.from_json(tmp_path / "ours.jsonl", lines=True))


def test_append_mode_writes_in_place(tmp_path):
    path = tmp_path / "x.csv"
    td = TensorDict(x=torch.tensor([1, 2]), batch_size=[2])
    td.to_csv(path)
    td.to_csv(path, mode="a", header=False)
    assert torchdict.from_csv(path)["x"].tolist() == [1, 2, 1, 2]


@pytest.mark.parametrize("fmt", FORMATS)
def test_refused_write_leaves_the_old_file(tmp_path, fmt):
    path = tmp_path / f"x.{fmt}"
    getattr(TensorDict(x=torch.tensor([1, 2]), batch_size=[2]), f"to_{fmt}")(path)
    before = path.read_bytes()
    with pytest.raises(ValueError):
        getattr(TensorDict(x=torch.zeros(2, 2), batch_size=[2]), f"to_{fmt}")(path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


@pytest.mark.parametrize("fmt, options, error", [
    ("csv", {"encoding": "ascii"}, UnicodeEncodeError),  # fails on the row holding "é", mid-file
])
def test_write_failing_midway_leaves_the_old_file(tmp_path, fmt, options, error):
    path = tmp_path / f"x.{fmt}"
    getattr(TensorDict(x=torch.tensor([1, 2]), batch_size=[2]), f"to_{fmt}")(path)
    before = path.read_bytes()
    td = TensorDict(x=torch.arange(1000), s=NonTensorStack(*(["a"] * 999 + ["é"])), batch_size=[1000])
    with pytest.raises(error):
        getattr(td, f"to_{fmt}")(path, **options)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_reading_a_file_of_another_format_raises(tmp_path, fmt):
    path = tmp_path / f"x.{fmt}"
    path.write_bytes(b"\x00\x01PAR1 not a table" if fmt == "csv" else b"a,b\n1,2\n")
    assert_same_outcome(lambda: _read(upstream, fmt, path), lambda: _read(torchdict, fmt, path))


def test_reading_a_missing_file_raises_file_not_found(tmp_path):
    for fmt in FORMATS:
        with pytest.raises(FileNotFoundError):
            _read(torchdict, fmt, tmp_path / f"missing.{fmt}")


# ---------------------------------------------------------------------------- Arrow tables
def arrow_tables():
    dates = np.array(["2020-01-01", "2020-01-02"], dtype="datetime64[D]")
    return {
        "basic": pa.table({"x": [1.0, 2.0, 3.0], "ids": pa.array([[1, 2], [3], []]), "text": ["a", "b", "c"],
                           "b": [True, False, True]}),
        "nulls": pa.table({"y": pa.array([1.0, None]), "i": pa.array([1, None], pa.uint32()), "s": ["a", None],
                           "bo": pa.array([True, None])}),
        "struct": pa.table({"st": pa.array([{"a": 1, "b": "x"}, None])}),
        "empty": pa.table({"s": pa.array([], pa.string()), "x": pa.array([], pa.float32())}),
        "fixed_size_list": pa.table({"f": pa.array([[1, 2], [3, 4]], pa.list_(pa.int32(), 2))}),
        "fixed_shape_tensor": pa.table({"t": pa.FixedShapeTensorArray.from_numpy_ndarray(
            np.arange(24, dtype=np.float32).reshape(2, 3, 4))}),
        "map_with_null": pa.table({"m": pa.array([[("k", None)], [("j", 1)]], pa.map_(pa.string(), pa.int64()))}),
        "null_in_list": pa.table({"l": pa.array([["a", None], ["b"]])}),
        "null_in_jagged": pa.table({"l": pa.array([[1, 2], None])}),
        "date": pa.table({"d": pa.array(dates)}),
        "sliced": pa.table({"x": pa.array([1, 2, 3, 4]), "l": pa.array([[1], [2, 3], [4], []])}).slice(1, 2),
        "chunked": pa.concat_tables([pa.table({"x": [1, 2]}), pa.table({"x": [3]})]),
        "unsigned_nulls": pa.table({"u": pa.array([1, None], pa.uint64())}),
    }


@pytest.mark.parametrize("nulls", ["raise", "fill", "mask"])
@pytest.mark.parametrize("name", list(arrow_tables()))
def test_from_arrow_matches_upstream(name, nulls):
    table = arrow_tables()[name]
    with warnings.catch_warnings(record=True) as up_warnings:
        warnings.simplefilter("always")
        up = outcome(lambda: upstream.from_arrow(table, nulls=nulls))
    with warnings.catch_warnings(record=True) as our_warnings:
        warnings.simplefilter("always")
        ours = outcome(lambda: torchdict.from_arrow(table, nulls=nulls))
    assert up[0] == ours[0], (up, ours)
    if up[0] == "ok":
        assert_same(up[1], ours[1])
    else:
        assert type(up[1]) is type(ours[1])
    assert ([w.category for w in up_warnings if w.category is FutureWarning]
            == [w.category for w in our_warnings if w.category is FutureWarning])


@pytest.mark.parametrize("options", [
    {"nulls": "bad"}, {"mask_key": "m"}, {"nulls": "mask", "mask_key": "m"}, {"nulls": "mask", "mask_key": ("a", "b")},
    {"nulls": "mask", "mask_key": ()}, {"nulls": "mask", "mask_key": 3}, {"nulls": "mask", "mask_key": "y"},
    {"copy": True}, {"copy": False}, {"device": "cpu"},
], ids=str)
def test_from_arrow_options_match_upstream(options):
    table = arrow_tables()["nulls"]
    assert_same_outcome(lambda: upstream.from_arrow(table, **options), lambda: torchdict.from_arrow(table, **options))


def test_from_arrow_views_or_copies_as_asked():
    table = pa.table({"x": pa.array(np.arange(4.0))})
    buffer_address = table.column("x").chunk(0).buffers()[1].address
    assert torchdict.from_arrow(table)["x"].data_ptr() == buffer_address  # a mutable buffer is viewed
    assert torchdict.from_arrow(table, copy=True)["x"].data_ptr() != buffer_address


def test_from_arrow_copies_immutable_buffers(tmp_path):
    """A memory-mapped (read-only) buffer is copied by default: writing into it would crash the process."""
    import pyarrow.feather as feather

    path = str(tmp_path / "x.arrow")
    feather.write_feather(pa.table({"x": np.arange(4.0)}), path, compression="uncompressed")
    table = feather.read_table(path, memory_map=True)
    td = torchdict.from_arrow(table)
    td["x"] += 1  # safe: a copy
    assert table.column("x").to_pylist() == [0.0, 1.0, 2.0, 3.0]


def test_from_arrow_accepts_what_pyarrow_table_accepts():
    assert_same(upstream.from_arrow({"x": [1, 2]}), torchdict.from_arrow({"x": [1, 2]}))
    batch = pa.record_batch({"x": [1.0, 2.0]})
    assert_same(upstream.from_arrow(batch), torchdict.from_arrow(batch))


def test_to_arrow_matches_upstream():
    def build(lib):
        jagged = torch.nested.nested_tensor_from_jagged(torch.arange(5.0), torch.tensor([0, 2, 2, 5]))
        return lib.TensorDict(x=torch.arange(3.0), img=torch.zeros(3, 2, 2), j=jagged,
                              s=lib.NonTensorStack("a", "b", "c"), e=lib.TensorDict(batch_size=[3]),
                              n=lib.TensorDict(y=torch.tensor([1, 2, 3]), batch_size=[3]), batch_size=[3])

    up, ours = upstream.to_arrow(build(upstream)), torchdict.to_arrow(build(torchdict))
    assert up.equals(ours), (up.schema, ours.schema)
    assert_same(upstream.from_arrow(ours), torchdict.from_arrow(up))


@pytest.mark.parametrize("batch_size", [[], [0], [2, 3], [2, 3, 4]])
def test_to_arrow_batch_ranks_match_upstream(batch_size):
    def build(lib):
        return lib.TensorDict(x=torch.zeros(*batch_size, 2), batch_size=batch_size)

    assert_same_outcome(lambda: upstream.to_arrow(build(upstream)), lambda: torchdict.to_arrow(build(torchdict)),
                        compare=lambda up, ours: up.equals(ours) or pytest.fail("tables differ"))


@pytest.mark.parametrize("dtype", NUMPY_DTYPES + NO_NUMPY_DTYPES + COMPLEX_DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(3,), (3, 2), (0, 2)], ids=str)
def test_arrow_dtypes_round_trip_as_upstream(dtype, shape):
    def build(lib):
        return lib.TensorDict(x=torch.ones(shape).to(dtype), batch_size=shape[:1])

    result = assert_same_outcome(lambda: upstream.to_arrow(build(upstream)),
                                 lambda: torchdict.to_arrow(build(torchdict)),
                                 compare=lambda up, ours: up.equals(ours) or pytest.fail("tables differ"))
    if result[0] == "ok":
        back = torchdict.from_arrow(result[1])
        assert back["x"].dtype == dtype and torch.equal(back["x"], build(torchdict)["x"])


def test_to_arrow_of_an_empty_collection():
    assert_same_outcome(lambda: upstream.to_arrow(upstream.TensorDict(batch_size=[3])),
                        lambda: torchdict.to_arrow(TensorDict(batch_size=[3])),
                        compare=lambda up, ours: up.equals(ours) or pytest.fail("tables differ"))


# ---------------------------------------------------------------------------- numpy structured arrays
def struct_td(lib, batch_size):
    return lib.TensorDict(a=torch.arange(int(np.prod(batch_size))).reshape(batch_size), b=torch.zeros(*batch_size, 2),
                          n=lib.TensorDict(c=torch.ones(batch_size, dtype=torch.float16), batch_size=batch_size),
                          batch_size=batch_size)


@pytest.mark.parametrize("batch_size", [[], [3], [2, 3], [2, 3, 4], [0]], ids=str)
def test_to_struct_array_matches_upstream(batch_size):
    up, ours = struct_td(upstream, batch_size).to_struct_array(), struct_td(torchdict, batch_size).to_struct_array()
    assert up.dtype == ours.dtype and up.shape == ours.shape
    assert np.array_equal(up, ours)
    assert_same(upstream.TensorDict.from_struct_array(ours), TensorDict.from_struct_array(up))


def test_to_struct_array_strings_match_upstream():
    def build(lib):
        return lib.TensorDict(s=lib.NonTensorStack("x", "a much longer string"), t=lib.NonTensorData("tag", batch_size=[2]),
                              v=torch.tensor([1, 2]), batch_size=[2])

    up, ours = build(upstream).to_struct_array(), build(torchdict).to_struct_array()
    assert up.dtype == ours.dtype and np.array_equal(up, ours)


@pytest.mark.parametrize("dtype", NUMPY_DTYPES + NO_NUMPY_DTYPES + COMPLEX_DTYPES, ids=str)
def test_struct_array_dtypes_match_upstream(dtype):
    def build(lib):
        return lib.TensorDict(x=torch.ones(3).to(dtype), batch_size=[3])

    result = assert_same_outcome(lambda: build(upstream).to_struct_array(), lambda: build(torchdict).to_struct_array(),
                                 compare=lambda up, ours: np.array_equal(up, ours) or pytest.fail("arrays differ"))
    if result[0] == "ok":
        assert TensorDict.from_struct_array(result[1])["x"].dtype == dtype


def test_to_struct_array_of_an_empty_collection_raises_value_error():
    assert_same_outcome(lambda: upstream.TensorDict(batch_size=[2]).to_struct_array(),
                        lambda: TensorDict(batch_size=[2]).to_struct_array())


@pytest.mark.parametrize("options", [{}, {"auto_batch_size": True}, {"batch_size": [2]},
                                     {"batch_size": [2], "auto_batch_size": True}, {"batch_dims": 1},
                                     {"auto_batch_size": True, "batch_dims": 2}, {"batch_size": [3]}], ids=str)
def test_from_struct_array_matches_upstream(options):
    array = np.zeros((2, 3), dtype=[("i", "i8"), ("f", "f4", (4,)), ("name", "U5"), ("sub", [("z", "u1")])])
    assert_same_outcome(lambda: upstream.TensorDict.from_struct_array(array, **options),
                        lambda: TensorDict.from_struct_array(array, **options))
    assert_same_outcome(lambda: upstream.from_struct_array(array, **options),
                        lambda: torchdict.from_struct_array(array, **options))


def test_from_struct_array_shares_memory():
    array = np.array([(1, 2.0)], dtype=[("i", "i8"), ("f", "f8")])
    td = torchdict.from_struct_array(array)
    array["i"] += 5
    td["f"] += 1
    assert td["i"].tolist() == [6] and array["f"].tolist() == [3.0]
    packed = np.array([(1, 2.0)], dtype=[("i", "i8"), ("f", "f4")])  # 12-byte records: "i" can't be viewed
    assert torchdict.from_struct_array(packed)["i"].tolist() == [1]


def test_from_struct_array_device_moves_the_leaves():
    array = np.array([(1, 2.0)], dtype=[("i", "i8"), ("f", "f8")])
    assert torchdict.from_struct_array(array, device="cpu").device == torch.device("cpu")


# ---------------------------------------------------------------------------- optional libraries
@pytest.mark.parametrize("call", [
    lambda: TensorDict(x=torch.zeros(2), batch_size=[2]).to_pandas(),
    lambda: torchdict.from_pandas(None),
    lambda: torchdict.from_json("x.json"),
], ids=["to_pandas", "from_pandas", "from_json"])
def test_missing_pandas_names_the_extra(monkeypatch, call):
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ImportError, match=r"torchdict\[arrow\]"):
        call()


@pytest.mark.parametrize("call", [
    lambda: torchdict.to_arrow(TensorDict(x=torch.zeros(2), batch_size=[2])),
    lambda: torchdict.from_arrow({"x": [1]}),
], ids=["to_arrow", "from_arrow"])
def test_missing_pyarrow_names_the_extra(monkeypatch, call):
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(ImportError, match=r"torchdict\[arrow\]"):
        call()


def test_csv_and_parquet_need_one_of_the_two(monkeypatch, tmp_path):
    path = tmp_path / "x.csv"
    TensorDict(x=torch.tensor([1, 2]), batch_size=[2]).to_csv(path)
    monkeypatch.setitem(sys.modules, "pandas", None)
    assert torchdict.from_csv(path)["x"].tolist() == [1, 2]  # pyarrow's CSV reader, as upstream
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(ImportError, match=r"torchdict\[arrow\]"):
        torchdict.from_csv(path)
    with pytest.raises(ImportError, match=r"torchdict\[arrow\]"):
        torchdict.from_parquet(tmp_path / "x.parquet")


def test_importing_torchdict_loads_no_format_library():
    import subprocess

    code = ("import sys, torchdict; "
            "print(sorted(m for m in ('pandas', 'pyarrow', 'safetensors', 'torchdict.formats.tabular') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("values", [[[1, 2], [3]], [[1.5], [2.0, 3.0]], [[True], [False, True]], [[1, 2], []],
                                    [[1, 2], [3, 4]], [["a"], ["b", "c"]], [{"k": 1}, {"k": 2}]],
                         ids=["ragged", "ragged_float", "ragged_bool", "ragged_empty", "rectangular", "strings",
                              "structs"])
def test_parquet_list_and_struct_columns_match_upstream(tmp_path, values):
    import pyarrow.parquet as pq

    path = tmp_path / "lists.parquet"
    pq.write_table(pa.table({"v": pa.array(values), "x": [0.0, 1.0]}), path)
    up, ours = upstream.from_parquet(path), torchdict.from_parquet(path)
    if len({len(value) for value in values}) > 1:
        # Ragged rows: one value per row (a row of numbers as a tensor), as upstream; torchdict's stack has the
        # batch size [2] where upstream's is sometimes [2, -1] (rows of strings).
        assert ours.get("v").batch_size == torch.Size([2])
        assert [repr(row) for row in ours.get("v").tolist()] == [repr(row) for row in up.get("v").tolist()]
        up, ours = up.exclude("v"), ours.exclude("v")
    assert_same(up, ours)


def test_readers_on_a_non_tensordict_class_give_a_tensordict():
    td = torchdict.LazyStackedTensorDict.from_pandas(pd.DataFrame({"a": [1, 2]}))
    assert type(td) is TensorDict and td["a"].tolist() == [1, 2]
