""".tdz archives (memmap(archive=True), pack_memmap, unpack_memmap, refresh_archive_checksums, is_memmap_archive)
and append_memmap, against upstream tensordict 0.15 and plain torch."""
from __future__ import annotations

import os
import struct
import warnings
import zipfile

import pytest
import torch

import torchdict
from torchdict import NonTensorData, NonTensorStack, TensorDict

tensordict = pytest.importorskip("tensordict")

from _dtype_samples import ALL_DTYPES, sample  # noqa: E402

LIBS = {"torchdict": torchdict, "tensordict": tensordict}


@pytest.fixture(autouse=True)
def _quiet_upstream():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        yield


def build(lib, batch=(3,), with_non_tensor=True):
    """The same TensorDict in either library: nested keys, several dtypes, non-tensor data."""
    data = {
        "obs": sample(torch.float32, (*batch, 2)),
        "a/b": sample(torch.int64, batch),
        "x y": sample(torch.bool, batch),
        "nested": {"deep": {"c": sample(torch.float64, (*batch, 2, 2))}, "u": sample(torch.uint8, batch)},
        "empty": lib.TensorDict(batch_size=batch),
    }
    td = lib.TensorDict(data, batch_size=batch)
    if with_non_tensor:
        td["label"] = lib.NonTensorData("run-7", batch_size=batch) if batch else "run-7"
    return td


def flat(td) -> dict:
    """Every leaf as (kind, value): comparable across the two libraries."""
    out = {}
    for key in td.keys(True, True):
        value = td.get(key)
        if isinstance(value, torch.Tensor):
            out[key] = ("tensor", value.dtype, value.clone())
        elif type(value).__name__ == "NonTensorData":
            out[key] = ("data", value.data)
        elif type(value).__name__ == "NonTensorStack":
            out[key] = ("stack", value.tolist())
        else:
            out[key] = ("collection", tuple(value.batch_size))
    return out


def assert_same(left, right) -> None:
    assert tuple(left.batch_size) == tuple(right.batch_size)
    a, b = flat(left), flat(right)
    assert set(a) == set(b)
    for key in a:
        assert a[key][0] == b[key][0], key
        if a[key][0] == "tensor":
            assert a[key][1] == b[key][1] and torch.equal(a[key][2], b[key][2]), key
        else:
            assert a[key][1:] == b[key][1:], key


def save_and_load(td, path):
    td.save(path)
    return TensorDict.load_memmap(path)


def payload_offset(path, name) -> int:
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo(name)
    with open(path, "rb") as handle:
        handle.seek(info.header_offset + 26)
        name_length, extra_length = struct.unpack("<2H", handle.read(4))
    return info.header_offset + 30 + name_length + extra_length


def flip_byte(path, name, out_path) -> None:
    data = bytearray(open(path, "rb").read())
    data[payload_offset(path, name)] ^= 0xFF
    with open(out_path, "wb") as handle:
        handle.write(data)


# ---------------------------------------------------------------- round trips
@pytest.mark.parametrize("batch", [(), (3,), (3, 2), (2, 1, 2)])
def test_archive_round_trip_over_batch_ranks(tmp_path, batch):
    td = build(torchdict, batch)
    result = td.save(tmp_path / "x.tdz")
    assert torchdict.is_memmap_archive(tmp_path / "x.tdz")
    assert_same(result, td)
    assert not result.is_locked and not result.is_memmap()  # as upstream: the archive loaded back
    assert_same(TensorDict.load_memmap(tmp_path / "x.tdz"), td)
    assert_same(torchdict.load(tmp_path / "x.tdz"), td)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_every_dtype_round_trips_through_an_archive(tmp_path, dtype):
    td = TensorDict(x=sample(dtype, (4, 3)), batch_size=[4])
    loaded = save_and_load(td, tmp_path / "x.tdz")
    assert loaded["x"].dtype == dtype
    assert torch.equal(loaded["x"].view(torch.uint8), td["x"].view(torch.uint8))


def test_stored_leaves_are_aligned_views_of_one_mapping(tmp_path):
    td = TensorDict(a=torch.arange(7, dtype=torch.int8), b=torch.arange(5.0, dtype=torch.float64), batch_size=[])
    td.save(tmp_path / "x.tdz")
    for name in ("a.memmap", "b.memmap"):
        assert payload_offset(tmp_path / "x.tdz", name) % 64 == 0
    loaded = TensorDict.load_memmap(tmp_path / "x.tdz")
    assert loaded["a"].untyped_storage().data_ptr() == loaded["b"].untyped_storage().data_ptr()
    assert loaded["a"].untyped_storage().nbytes() == os.path.getsize(tmp_path / "x.tdz")


def test_expanded_and_non_contiguous_leaves_are_written_dense(tmp_path):
    td = TensorDict(e=torch.arange(3.0).expand(1000, 3), t=torch.arange(12).view(3, 4).t(), batch_size=[])
    loaded = save_and_load(td, tmp_path / "x.tdz")
    assert torch.equal(loaded["e"], td["e"]) and torch.equal(loaded["t"], td["t"])


def test_default_mode_is_copy_on_write_and_r_plus_writes_through(tmp_path):
    TensorDict(a=torch.zeros(3)).save(tmp_path / "x.tdz")
    private = TensorDict.load_memmap(tmp_path / "x.tdz")
    private["a"] += 1
    assert TensorDict.load_memmap(tmp_path / "x.tdz")["a"].sum() == 0
    shared = TensorDict.load_memmap(tmp_path / "x.tdz", mode="r+")
    shared["a"] += 2
    assert TensorDict.load_memmap(tmp_path / "x.tdz")["a"].tolist() == [2.0, 2.0, 2.0]


@pytest.mark.parametrize("compression", ["deflate", "bzip2", "lzma", zipfile.ZIP_DEFLATED])
def test_compressed_archives_round_trip_and_load_with_threads(tmp_path, compression):
    td = build(torchdict, (3,))
    td.memmap(tmp_path / "x.tdz", compression=compression)
    with zipfile.ZipFile(tmp_path / "x.tdz") as archive:
        assert archive.getinfo("obs.memmap").compress_type != zipfile.ZIP_STORED
        assert archive.getinfo("meta.json").compress_type == zipfile.ZIP_STORED
    assert_same(TensorDict.load_memmap(tmp_path / "x.tdz", num_threads=2), td)


def test_memmap_like_archive_is_zero_filled_and_writable(tmp_path):
    td = TensorDict(a=torch.ones(4, 2), n={"b": torch.ones(4)}, batch_size=[4])
    like = td.memmap_like(tmp_path / "x.tdz")
    assert like["a"].sum() == 0 and like["n", "b"].shape == (4,)
    like["a"][1] = 5
    assert TensorDict.load_memmap(tmp_path / "x.tdz")["a"][1].tolist() == [5.0, 5.0]


def test_tensorclass_archive_round_trip(tmp_path):
    @torchdict.tensorclass
    class Point:
        x: torch.Tensor
        name: str

    point = Point(x=torch.arange(3.0), name="p", batch_size=[3])
    loaded = point.save(tmp_path / "p.tdz")
    assert type(loaded) is Point and loaded.name == "p" and torch.equal(loaded.x, point.x)
    assert type(torchdict.load(tmp_path / "p.tdz")) is Point


def test_lazy_stack_and_lone_non_tensor_archives_through_the_top_level_functions(tmp_path):
    stack = torchdict.LazyStackedTensorDict(TensorDict(a=torch.zeros(2)), TensorDict(a=torch.ones(3)), stack_dim=0)
    loaded = torchdict.save(stack, tmp_path / "l.tdz")
    assert type(loaded).__name__ == "LazyStackedTensorDict"
    assert [member["a"].tolist() for member in loaded.tensordicts] == [[0.0, 0.0], [1.0, 1.0, 1.0]]
    assert torchdict.save(NonTensorData("hello"), tmp_path / "n.tdz").data == "hello"


def test_non_tensor_stacks_and_names_survive(tmp_path):
    td = TensorDict(s=NonTensorStack("a", "b", "c"), v=torch.zeros(3), batch_size=[3], names=["t"])
    loaded = save_and_load(td, tmp_path / "x.tdz")
    assert loaded.get("s").tolist() == ["a", "b", "c"] and loaded.names == ["t"]


def test_key_order_is_kept(tmp_path):
    td = TensorDict(z=torch.zeros(1), n={"q": torch.zeros(1)}, a=torch.zeros(1), s="v", batch_size=[1])
    assert list(save_and_load(td, tmp_path / "x.tdz").keys()) == \
        ["z", "n", "a", "s"]


def test_an_archive_is_deterministic(tmp_path):
    td = build(torchdict, (2,))
    td.save(tmp_path / "one.tdz")
    td.save(tmp_path / "two.tdz")
    assert (tmp_path / "one.tdz").read_bytes() == (tmp_path / "two.tdz").read_bytes()


# ---------------------------------------------------------------- interop with upstream tensordict
@pytest.mark.parametrize("batch", [(), (3,), (2, 3)])
@pytest.mark.parametrize("compression", [None, "deflate"])
def test_upstream_archives_load_in_torchdict(tmp_path, batch, compression):
    upstream = build(tensordict, batch)
    upstream.memmap(tmp_path / "up.tdz", compression=compression)
    assert_same(TensorDict.load_memmap(tmp_path / "up.tdz"), upstream)
    assert_same(TensorDict.load_memmap(tmp_path / "up.tdz", subpath=("nested", "deep")), upstream["nested", "deep"])


@pytest.mark.parametrize("batch", [(), (3,), (2, 3)])
def test_torchdict_archives_load_in_upstream(tmp_path, batch):
    ours = build(torchdict, batch)
    ours["stack"] = NonTensorStack(*["a", "b", "c"][: batch[0]]) if len(batch) == 1 else "s"
    ours.save(tmp_path / "ours.tdz")
    assert_same(tensordict.TensorDict.load_memmap(tmp_path / "ours.tdz"), ours)
    assert tensordict.is_memmap_archive(tmp_path / "ours.tdz")


def test_a_layout_upstream_cannot_hold_stays_torchdicts_and_loads_here(tmp_path):
    td = TensorDict(shape=torch.zeros(2), batch_size=[2])  # "shape" is a field of upstream's meta.json
    td.save(tmp_path / "x.tdz")
    assert torch.equal(TensorDict.load_memmap(tmp_path / "x.tdz")["shape"], torch.zeros(2))


def test_pack_and_unpack_interoperate_with_upstream(tmp_path):
    upstream = build(tensordict, (3,))
    upstream.memmap(tmp_path / "up")
    torchdict.pack_memmap(tmp_path / "up", tmp_path / "up.tdz")
    assert_same(tensordict.TensorDict.load_memmap(tmp_path / "up.tdz"), upstream)
    assert_same(TensorDict.load_memmap(tmp_path / "up.tdz"), upstream)
    tensordict.unpack_memmap(tmp_path / "up.tdz", tmp_path / "back")
    assert_same(TensorDict.load_memmap(tmp_path / "back"), upstream)
    # an upstream archive unpacked by torchdict, an upstream-packed torchdict folder
    ours = build(torchdict, (3,))
    ours.memmap(tmp_path / "ours")
    tensordict.pack_memmap(tmp_path / "ours", tmp_path / "ours.tdz")
    assert_same(TensorDict.load_memmap(tmp_path / "ours.tdz"), ours)
    torchdict.unpack_memmap(tmp_path / "ours.tdz", tmp_path / "ours_back")
    assert_same(TensorDict.load_memmap(tmp_path / "ours_back"), ours)


def test_archive_refresh_interoperates(tmp_path):
    TensorDict(a=torch.zeros(3)).save(tmp_path / "x.tdz")
    TensorDict.load_memmap(tmp_path / "x.tdz", mode="r+")["a"].add_(1)
    tensordict.refresh_archive_checksums(tmp_path / "x.tdz")
    with zipfile.ZipFile(tmp_path / "x.tdz") as archive:
        assert archive.testzip() is None


# ---------------------------------------------------------------- checksums
def test_an_altered_payload_is_refused_with_the_entry_named(tmp_path):
    TensorDict(a=torch.arange(100.0), b=torch.zeros(3)).save(tmp_path / "x.tdz")
    flip_byte(tmp_path / "x.tdz", "a.memmap", tmp_path / "bad.tdz")
    with pytest.raises(zipfile.BadZipFile, match=r"bad\.tdz is corrupted: the entry 'a\.memmap'"):
        TensorDict.load_memmap(tmp_path / "bad.tdz")
    with pytest.raises(zipfile.BadZipFile):
        torchdict.unpack_memmap(tmp_path / "bad.tdz", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_an_altered_meta_json_is_refused(tmp_path):
    TensorDict(a=torch.zeros(3)).save(tmp_path / "x.tdz")
    flip_byte(tmp_path / "x.tdz", "meta.json", tmp_path / "bad.tdz")
    with pytest.raises(zipfile.BadZipFile, match="meta.json"):
        TensorDict.load_memmap(tmp_path / "bad.tdz")


def test_an_altered_compressed_entry_is_refused(tmp_path):
    TensorDict(a=torch.arange(1000.0)).memmap(tmp_path / "x.tdz", compression="deflate")
    flip_byte(tmp_path / "x.tdz", "a.memmap", tmp_path / "bad.tdz")
    with pytest.raises(zipfile.BadZipFile):
        TensorDict.load_memmap(tmp_path / "bad.tdz")


def test_a_truncated_archive_is_refused(tmp_path):
    TensorDict(a=torch.arange(1000.0)).save(tmp_path / "x.tdz")
    data = (tmp_path / "x.tdz").read_bytes()
    (tmp_path / "cut.tdz").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="not a memory-mapped tensordict archive"):
        TensorDict.load_memmap(tmp_path / "cut.tdz")


def test_writes_in_place_unseal_and_refresh_seals_again(tmp_path):
    path = tmp_path / "x.tdz"
    TensorDict(a=torch.zeros(3)).save(path)
    TensorDict.load_memmap(path, mode="r+")["a"].add_(1)
    with zipfile.ZipFile(path) as archive:
        assert archive.testzip() == "a.memmap"  # the zip's checksum is stale
    assert TensorDict.load_memmap(path)["a"].tolist() == [1.0, 1.0, 1.0]  # unsealed: loads
    assert torchdict.refresh_archive_checksums(path) == path
    with zipfile.ZipFile(path) as archive:
        assert archive.testzip() is None and archive.comment == b""
    flip_byte(path, "a.memmap", tmp_path / "bad.tdz")  # sealed again: an alteration is caught
    with pytest.raises(zipfile.BadZipFile):
        TensorDict.load_memmap(tmp_path / "bad.tdz")


def test_a_meta_device_load_reads_no_payload(tmp_path):
    TensorDict(a=torch.zeros(3)).save(tmp_path / "x.tdz")
    flip_byte(tmp_path / "x.tdz", "a.memmap", tmp_path / "bad.tdz")
    assert TensorDict.load_memmap(tmp_path / "bad.tdz", device="meta")["a"].device.type == "meta"


# ---------------------------------------------------------------- failed calls leave nothing
def test_a_refused_archive_write_leaves_no_file(tmp_path):
    td = TensorDict(a=torch.zeros(3), blob=NonTensorData(b"bytes"))
    with pytest.raises(TypeError, match="allow_pickle"):
        td.save(tmp_path / "x.tdz")
    assert list(tmp_path.iterdir()) == []


def test_a_failed_overwrite_keeps_the_old_archive(tmp_path):
    TensorDict(a=torch.ones(3)).save(tmp_path / "x.tdz")
    before = (tmp_path / "x.tdz").read_bytes()
    with pytest.raises(TypeError):
        TensorDict(a=torch.zeros(3), blob=NonTensorData({1, 2})).save(tmp_path / "x.tdz")
    assert (tmp_path / "x.tdz").read_bytes() == before
    with pytest.raises(RuntimeError, match="already exists"):
        TensorDict(a=torch.zeros(3)).memmap(tmp_path / "x.tdz", existsok=False)
    assert (tmp_path / "x.tdz").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.tdz"]


def test_a_symlinked_archive_path_replaces_the_file_it_names(tmp_path):
    TensorDict(a=torch.ones(3)).save(tmp_path / "real.tdz")
    os.symlink(tmp_path / "real.tdz", tmp_path / "latest.tdz")
    TensorDict(a=torch.zeros(3)).save(tmp_path / "latest.tdz")
    assert os.path.islink(tmp_path / "latest.tdz")
    assert TensorDict.load_memmap(tmp_path / "real.tdz")["a"].sum() == 0


# ---------------------------------------------------------------- unpacking safely
@pytest.mark.parametrize("name", ["../evil.memmap", "/abs.memmap", "a/../../evil", "./x", "a\\b"])
def test_unpack_refuses_names_that_leave_the_folder(tmp_path, name):
    with zipfile.ZipFile(tmp_path / "x.tdz", "w") as archive:
        archive.writestr("meta.json", "{}")
        archive.writestr(name, b"x")
    with pytest.raises(ValueError, match="outside the target folder"):
        torchdict.unpack_memmap(tmp_path / "x.tdz", tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.tdz"]


def test_unpack_replaces_an_earlier_save_and_refuses_a_foreign_folder(tmp_path):
    TensorDict(a=torch.ones(3)).save(tmp_path / "x.tdz")
    TensorDict(b=torch.zeros(3)).memmap(tmp_path / "out")
    torchdict.unpack_memmap(tmp_path / "x.tdz", tmp_path / "out")
    assert list(TensorDict.load_memmap(tmp_path / "out").keys()) == ["a"]
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(RuntimeError, match="not part of a saved TensorDict"):
        torchdict.unpack_memmap(tmp_path / "x.tdz", tmp_path / "mine")
    assert sorted(os.listdir(tmp_path / "mine")) == ["notes.txt"]


def test_pack_refuses_a_symlink_inside_the_folder(tmp_path):
    TensorDict(a=torch.ones(3)).memmap(tmp_path / "saved")
    (tmp_path / "secret").write_text("x")
    os.symlink(tmp_path / "secret", tmp_path / "saved" / "b.memmap")
    with pytest.raises(RuntimeError, match="symlink"):
        torchdict.pack_memmap(tmp_path / "saved", tmp_path / "x.tdz")
    assert not (tmp_path / "x.tdz").exists()


# ---------------------------------------------------------------- differential errors
def _outcome(call):
    try:
        result = call()
    except Exception as error:  # noqa: BLE001 - the type is what is compared
        return type(error)
    return type(result).__name__


ERROR_CASES = {
    "load a file that is not an archive": lambda lib, d: lib.TensorDict.load_memmap(d / "plain.txt"),
    "archive onto a folder": lambda lib, d: lib.TensorDict(a=torch.zeros(2)).save(d / "folder", archive=True),
    "compression for a folder": lambda lib, d: lib.TensorDict(a=torch.zeros(2)).memmap(d / "f", compression="lzma"),
    "unknown compression": lambda lib, d: lib.TensorDict(a=torch.zeros(2)).memmap(d / "c.tdz", compression="zz"),
    "archive without a path": lambda lib, d: lib.TensorDict(a=torch.zeros(2)).memmap(archive=True),
    "pack a folder without meta.json": lambda lib, d: lib.pack_memmap(d / "folder", d / "o.tdz"),
    "pack into the folder itself": lambda lib, d: lib.pack_memmap(d / "saved", d / "saved" / "o.tdz"),
    "unpack a file that is not an archive": lambda lib, d: lib.unpack_memmap(d / "plain.txt", d / "u"),
    "refresh a file that is not an archive": lambda lib, d: lib.refresh_archive_checksums(d / "plain.txt"),
    "is_memmap_archive of a folder": lambda lib, d: lib.is_memmap_archive(d / "saved"),
    "is_memmap_archive of a missing path": lambda lib, d: lib.is_memmap_archive(d / "missing"),
    "r+ on a compressed archive": lambda lib, d: lib.TensorDict.load_memmap(d / "deflated.tdz", mode="r+"),
    "append to an archive": lambda lib, d: lib.append_memmap(d / "deflated.tdz", lib.TensorDict(a=torch.zeros(1))),
    "append a non-collection": lambda lib, d: lib.append_memmap(d / "saved", 3),
    "append other keys": lambda lib, d: lib.append_memmap(d / "saved", lib.TensorDict(z=torch.zeros(1, 2), batch_size=[1])),
    "append another dtype": lambda lib, d: lib.append_memmap(d / "saved", lib.TensorDict(a=torch.zeros(1, 2, dtype=torch.int64), batch_size=[1])),
    "append another shape": lambda lib, d: lib.append_memmap(d / "saved", lib.TensorDict(a=torch.zeros(1, 3), batch_size=[1])),
    "append no batch dims": lambda lib, d: lib.append_memmap(d / "saved", lib.TensorDict(a=torch.zeros(1, 2))),
}


@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_errors_match_upstream(tmp_path, case):
    outcomes = {}
    for name, lib in LIBS.items():
        folder = tmp_path / name
        folder.mkdir()
        (folder / "plain.txt").write_text("not a zip")
        (folder / "folder").mkdir()
        lib.TensorDict(a=torch.zeros(2, 2), batch_size=[2]).memmap(folder / "saved")
        lib.TensorDict(a=torch.zeros(2)).memmap(folder / "deflated.tdz", compression="deflate")
        outcomes[name] = _outcome(lambda: ERROR_CASES[case](lib, folder))
    assert outcomes["torchdict"] == outcomes["tensordict"]


# ---------------------------------------------------------------- append_memmap
@pytest.mark.parametrize("rows", [1, 4])
def test_append_matches_upstream(tmp_path, rows):
    results = {}
    for name, lib in LIBS.items():
        td = lib.TensorDict(a=torch.arange(6.0).view(3, 2), n={"b": torch.arange(3)}, label="x", batch_size=[3])
        lib.save(td, tmp_path / name)
        extra = lib.TensorDict(a=torch.ones(rows, 2), n={"b": torch.full((rows,), 7)}, label="x", batch_size=[rows])
        lib.append_memmap(tmp_path / name, extra)
        results[name] = TensorDict.load_memmap(tmp_path / name)
    assert_same(results["torchdict"], results["tensordict"])
    assert results["torchdict"].batch_size == (3 + rows,)


def test_append_is_checked_before_anything_is_written(tmp_path):
    torchdict.save(TensorDict(a=torch.zeros(3, 2), label="x", batch_size=[3]), tmp_path / "saved")
    files = {p: p.read_bytes() for p in (tmp_path / "saved").iterdir()}
    with pytest.raises(ValueError, match="stays as it is"):
        torchdict.append_memmap(tmp_path / "saved", TensorDict(a=torch.ones(2, 2), label="y", batch_size=[2]))
    assert {p: p.read_bytes() for p in (tmp_path / "saved").iterdir()} == files


def test_an_append_is_seen_whole_by_a_later_load_and_not_by_an_earlier_one(tmp_path):
    torchdict.save(TensorDict(a=torch.zeros(3), n={"b": torch.zeros(3)}, batch_size=[3]), tmp_path / "saved")
    before = TensorDict.load_memmap(tmp_path / "saved")
    torchdict.append_memmap(tmp_path / "saved", TensorDict(a=torch.ones(2), n={"b": torch.ones(2)}, batch_size=[2]))
    assert before["a"].tolist() == [0.0, 0.0, 0.0]
    after = TensorDict.load_memmap(tmp_path / "saved")
    assert after["a"].tolist() == [0.0, 0.0, 0.0, 1.0, 1.0] and after["n", "b"].shape == (5,)


def test_compresslevel_reaches_zipfile(tmp_path):
    TensorDict(a=torch.arange(20000) % 7).memmap(tmp_path / "saved")
    fast = torchdict.pack_memmap(tmp_path / "saved", tmp_path / "fast.tdz", compression="deflate", compresslevel=1)
    best = torchdict.pack_memmap(tmp_path / "saved", tmp_path / "best.tdz", compression="deflate", compresslevel=9)
    assert os.path.getsize(best) < os.path.getsize(fast) < os.path.getsize(tmp_path / "saved" / "a.memmap")
    assert torch.equal(TensorDict.load_memmap(best)["a"], torch.arange(20000) % 7)
