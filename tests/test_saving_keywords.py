"""Upstream's keywords on memmap / memmap_ / memmap_like / save / load_memmap (atomic, archive, out, subpath, mode,
robust_key, share_non_tensor, ...), the members around them (load_memmap_, load_, memmap_refresh_, make_memmap*)
and the top-level save / load / load_memmap / memmap, against upstream tensordict 0.15."""
from __future__ import annotations

import inspect
import os
import warnings

import pytest
import torch

import torchdict
from torchdict import MemoryMappedTensor, TensorDict

tensordict = pytest.importorskip("tensordict")

LIBS = {"torchdict": torchdict, "tensordict": tensordict}


@pytest.fixture(autouse=True)
def _quiet_upstream():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        yield


def build(lib, batch=(3,)):
    return lib.TensorDict(a=torch.arange(float(torch.Size(batch).numel() * 2)).view(*batch, 2),
                          n={"m": {"b": torch.ones(batch, dtype=torch.int32)}, "c": torch.zeros(batch)},
                          label="x", batch_size=batch)


def leaves(td) -> dict:
    out = {}
    for key in td.keys(True, True):
        value = td.get(key)
        out[key] = value.clone() if isinstance(value, torch.Tensor) else getattr(value, "data", value)
    return out


def assert_same(left, right) -> None:
    assert tuple(left.batch_size) == tuple(right.batch_size)
    a, b = leaves(left), leaves(right)
    assert set(a) == set(b)
    for key in a:
        if isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]), key
        else:
            assert a[key] == b[key], key


def outcome(call):
    try:
        result = call()
    except Exception as error:  # noqa: BLE001 - the type is what is compared
        return type(error)
    return result


# ---------------------------------------------------------------- signatures
MEMBERS = ["memmap", "memmap_", "memmap_like", "save", "dumps", "load_memmap", "load", "load_memmap_", "load_",
           "memmap_refresh_", "make_memmap", "make_memmap_from_storage", "make_memmap_from_tensor", "pack"]
FUNCTIONS = ["save", "load", "load_memmap", "memmap", "pack_memmap", "unpack_memmap", "append_memmap",
             "is_memmap_archive", "refresh_archive_checksums"]


def _check_parameters(ours, theirs) -> None:
    ours, theirs = inspect.signature(ours).parameters, inspect.signature(theirs).parameters
    for name, parameter in theirs.items():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        assert name in ours, name
        mine = ours[name]
        assert mine.default == parameter.default, name
        positional = (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD)
        assert (mine.kind in positional) == (parameter.kind in positional), name
    names = [name for name, p in theirs.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.POSITIONAL_ONLY)]
    mine_names = [name for name, p in ours.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.POSITIONAL_ONLY)]
    assert mine_names[: len(names)] == names


@pytest.mark.parametrize("member", MEMBERS)
def test_member_signatures_cover_upstreams(member):
    _check_parameters(getattr(TensorDict, member), getattr(tensordict.TensorDict, member))


@pytest.mark.parametrize("name", FUNCTIONS)
def test_function_signatures_cover_upstreams(name):
    assert name in torchdict.__all__
    _check_parameters(getattr(torchdict, name), getattr(tensordict, name))


def test_memmap_is_the_function_and_the_module_stays_importable():
    import importlib

    assert callable(torchdict.memmap) and torchdict.memmap.__name__ == "memmap"
    assert importlib.import_module("torchdict.memmap").MemoryMappedTensor is MemoryMappedTensor


# ---------------------------------------------------------------- top-level functions
@pytest.mark.parametrize("batch", [(), (3,), (2, 3), (1, 2, 2)])
def test_top_level_save_and_load_match_upstream(tmp_path, batch):
    loaded = {}
    for name, lib in LIBS.items():
        saved = lib.save(build(lib, batch), tmp_path / name)
        assert saved.is_locked and type(saved["a"]).__name__ == "MemoryMappedTensor"
        loaded[name] = lib.load(tmp_path / name)
        assert_same(lib.load_memmap(tmp_path / name), loaded[name])
    assert_same(loaded["torchdict"], loaded["tensordict"])


def test_top_level_memmap_without_prefix_is_anonymous():
    mapped = torchdict.memmap(build(torchdict))
    assert mapped.is_locked and mapped.is_memmap()
    with pytest.raises(RuntimeError, match="no file"):
        mapped["a"].filename


# ---------------------------------------------------------------- load_memmap keywords
@pytest.mark.parametrize("subpath", ["n", "n/m", ("n", "m"), ("n", ("m",)), "n//m/"])
def test_subpath_matches_upstream(tmp_path, subpath):
    results = {}
    for name, lib in LIBS.items():
        build(lib).memmap(tmp_path / name)
        results[name] = lib.TensorDict.load_memmap(tmp_path / name, subpath=subpath)
    assert_same(results["torchdict"], results["tensordict"])


@pytest.mark.parametrize("subpath", ["zz", ("n", "zz"), "a", ()])
def test_bad_subpaths_fail_as_upstream(tmp_path, subpath):
    outcomes = {}
    for name, lib in LIBS.items():
        build(lib).memmap(tmp_path / name)
        outcomes[name] = outcome(lambda: lib.TensorDict.load_memmap(tmp_path / name, subpath=subpath))
    assert outcomes["torchdict"] == outcomes["tensordict"] and isinstance(outcomes["torchdict"], type)


def test_subpath_into_an_upstream_tensorclass_folder(tmp_path):
    @tensordict.tensorclass
    class Up:
        x: torch.Tensor

    tensordict.TensorDict(tc=Up(x=torch.ones(3), batch_size=[3]), batch_size=[3]).memmap(tmp_path / "up")
    # upstream keeps a tensorclass's fields in _tensordict: a subpath reaches them as obj.get(key) does
    with pytest.raises(ValueError):
        TensorDict.load_memmap(tmp_path / "up", subpath=("tc", "x"))  # a leaf, not a TensorDict
    assert TensorDict.load_memmap(tmp_path / "up", subpath=("tc", "_tensordict"))["x"].tolist() == [1.0] * 3


def test_out_matches_upstream(tmp_path):
    results = {}
    for name, lib in LIBS.items():
        build(lib).memmap(tmp_path / name)
        out = lib.TensorDict(a=torch.zeros(3, 2), z=torch.zeros(3), n={"q": torch.zeros(3)}, batch_size=[3])
        nested = out["n"]
        result = lib.TensorDict.load_memmap(tmp_path / name, out=out)
        assert result is out and out["n"] is nested
        results[name] = out
    assert sorted(map(str, results["torchdict"].keys(True))) == sorted(map(str, results["tensordict"].keys(True)))
    assert_same(results["torchdict"], results["tensordict"])


@pytest.mark.parametrize("make_out", [
    lambda lib: lib.TensorDict(a=torch.zeros(3, 2), batch_size=[3]).lock_(),  # locked
    lambda lib: lib.TensorDict(batch_size=[5]),  # another batch size
])
def test_a_refused_out_is_left_unchanged(tmp_path, make_out):
    outcomes = {}
    for name, lib in LIBS.items():
        build(lib).memmap(tmp_path / name)
        out = make_out(lib)
        outcomes[name] = outcome(lambda: lib.TensorDict.load_memmap(tmp_path / name, out=out))
        if name == "torchdict":
            assert list(out.keys()) == list(make_out(lib).keys())
    assert outcomes["torchdict"] == outcomes["tensordict"] and isinstance(outcomes["torchdict"], type)


def test_out_on_another_device_is_refused_as_upstream(tmp_path):
    for name, lib in LIBS.items():
        build(lib).memmap(tmp_path / name)
        with pytest.raises(ValueError, match="Cannot load a tensordict on device meta"):
            lib.TensorDict.load_memmap(tmp_path / name, device="meta",
                                       out=lib.TensorDict(batch_size=[3], device="cpu"))


def test_mode_none_maps_writable_files_shared_and_read_only_ones_copy_on_write(tmp_path):
    build(torchdict).memmap(tmp_path / "saved")
    shared = TensorDict.load_memmap(tmp_path / "saved")
    shared["a"] += 1
    assert TensorDict.load_memmap(tmp_path / "saved")["a"][0, 0] == 1
    if os.geteuid() == 0:
        pytest.skip("root can write a read-only file")
    os.chmod(tmp_path / "saved" / "a.memmap", 0o444)
    try:
        private = TensorDict.load_memmap(tmp_path / "saved")
        private["a"] += 1  # copy-on-write: allowed, and the file is unchanged
        assert TensorDict.load_memmap(tmp_path / "saved")["a"][0, 0] == 1
    finally:
        os.chmod(tmp_path / "saved" / "a.memmap", 0o644)


def test_device_meta_loads_the_structure_only(tmp_path):
    build(torchdict).memmap(tmp_path / "saved")
    loaded = TensorDict.load_memmap(tmp_path / "saved", device="meta")
    assert loaded["n", "m", "b"].device.type == "meta" and loaded["n", "m", "b"].dtype == torch.int32


def test_allow_pickle_none_refuses_pickles(tmp_path):
    TensorDict(blob=torchdict.NonTensorData({1, 2})).memmap(tmp_path / "saved", allow_pickle=True)
    with pytest.raises(RuntimeError, match="Refusing to load pickled"):
        TensorDict.load_memmap(tmp_path / "saved", allow_pickle=None)
    assert TensorDict.load_memmap(tmp_path / "saved", allow_pickle=True)["blob"] == {1, 2}


def test_load_memmap_of_an_upstream_lazy_stack_is_a_lazy_stack(tmp_path):
    stack = tensordict.LazyStackedTensorDict(tensordict.TensorDict(a=torch.zeros(2)),
                                              tensordict.TensorDict(a=torch.ones(3)), stack_dim=0)
    stack.memmap(tmp_path / "up")
    loaded = TensorDict.load_memmap(tmp_path / "up")
    assert type(loaded).__name__ == "LazyStackedTensorDict"
    assert [member["a"].tolist() for member in loaded.tensordicts] == [[0.0, 0.0], [1.0, 1.0, 1.0]]


# ---------------------------------------------------------------- memmap keywords
def test_atomic_into_a_new_folder_and_over_a_save(tmp_path):
    first = build(torchdict).memmap(tmp_path / "saved", atomic=True)
    assert first["a"].filename == str(tmp_path / "saved" / "a.memmap") and first.saved_path == str(tmp_path / "saved")
    second = TensorDict(b=torch.ones(3), batch_size=[3]).memmap(tmp_path / "saved", atomic=True)
    assert sorted(os.listdir(tmp_path / "saved")) == ["b.memmap", "meta.json"]
    assert second["b"].filename == str(tmp_path / "saved" / "b.memmap")
    assert sorted(os.listdir(tmp_path)) == ["saved"]  # no work folder left behind
    assert list(TensorDict.load_memmap(tmp_path / "saved").keys()) == ["b"]


def test_atomic_in_place(tmp_path):
    td = build(torchdict)
    assert td.memmap_(tmp_path / "saved", atomic=True) is td
    assert td.is_memmap() and td["a"].filename == str(tmp_path / "saved" / "a.memmap")


ATOMIC_CASES = {
    "no prefix": lambda lib, d: lib.TensorDict(a=torch.zeros(2)).memmap(atomic=True),
    "a file": lambda lib, d: lib.TensorDict(a=torch.zeros(2)).memmap(d / "file", atomic=True),
    "a foreign folder": lambda lib, d: lib.TensorDict(a=torch.zeros(2)).memmap(d / "foreign", atomic=True),
    "existsok=False over a save": lambda lib, d: lib.TensorDict(a=torch.zeros(2)).memmap(d / "saved", atomic=True,
                                                                                         existsok=False),
    "an empty folder": lambda lib, d: lib.TensorDict(a=torch.zeros(2)).memmap(d / "empty", atomic=True),
}


@pytest.mark.parametrize("case", list(ATOMIC_CASES))
def test_atomic_refusals_match_upstream_and_change_nothing(tmp_path, case):
    outcomes = {}
    for name, lib in LIBS.items():
        folder = tmp_path / name
        folder.mkdir()
        (folder / "file").write_text("x")
        (folder / "foreign").mkdir()
        (folder / "foreign" / "notes.txt").write_text("keep")
        (folder / "empty").mkdir()
        lib.TensorDict(z=torch.ones(2)).memmap(folder / "saved")
        before = sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))
        result = outcome(lambda: ATOMIC_CASES[case](lib, folder))
        outcomes[name] = result if isinstance(result, type) else "ok"
        if isinstance(result, type):
            assert sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) == before
    assert outcomes["torchdict"] == outcomes["tensordict"]


def test_robust_key_is_accepted_and_keys_stay_escaped(tmp_path):
    td = TensorDict({"a/b": torch.zeros(2)})
    td.memmap(tmp_path / "saved", robust_key=False)
    assert sorted(os.listdir(tmp_path / "saved")) == ["a%2Fb.memmap", "meta.json"]
    assert TensorDict.load_memmap(tmp_path / "saved", robust_key=False)["a/b"].shape == (2,)
    with pytest.raises(TypeError):
        td.memmap(tmp_path / "other", robust_key="yes")


def test_share_non_tensor(tmp_path):
    td = TensorDict(a=torch.zeros(2), label="x")
    assert td.memmap(tmp_path / "one", share_non_tensor=False)["label"] == "x"
    shared = td.memmap(tmp_path / "two", share_non_tensor=True)  # tests/test_share_non_tensor.py has the rest
    assert shared["label"] == "x" and shared.get("label")._is_shared()
    with pytest.raises(ValueError, match="share_non_tensor"):
        td.memmap(tmp_path / "three.tdz", share_non_tensor=True)  # an archive can't be rewritten in place
    assert not (tmp_path / "three.tdz").exists()


def test_return_early_works_for_archives_and_atomic_saves(tmp_path):
    # upstream refuses these combinations (NotImplementedError); torchdict runs them in the background
    future = build(torchdict).memmap(tmp_path / "x.tdz", return_early=True)
    assert_same(future.result(), build(torchdict))
    future = build(torchdict).memmap(tmp_path / "saved", atomic=True, return_early=True, num_threads=2)
    assert future.result().saved_path == str(tmp_path / "saved")


def test_memmap_without_prefix_writes_back_to_its_folder_as_upstream(tmp_path):
    for name, lib in LIBS.items():
        saved = build(lib).memmap(tmp_path / name)
        again = saved.memmap()
        assert again["a"].filename == str(tmp_path / name / "a.memmap")
        loaded = lib.TensorDict.load_memmap(tmp_path / name)
        loaded.memmap_()
        assert loaded.is_memmap() and loaded["a"].filename == str(tmp_path / name / "a.memmap")


# ---------------------------------------------------------------- load_memmap_ / load_ / memmap_refresh_
def test_load_memmap_into_a_tensordict_matches_upstream(tmp_path):
    results = {}
    for name, lib in LIBS.items():
        build(lib).memmap(tmp_path / name)
        td = lib.TensorDict(a=torch.zeros(3, 2), other=torch.zeros(3), batch_size=[3])
        assert td.load_memmap_(tmp_path / name) is td
        results[name] = td
    assert_same(results["torchdict"], results["tensordict"])
    assert not results["torchdict"].is_memmap()


def test_load_memmap_into_a_memory_mapped_tensordict_keeps_it_memory_mapped(tmp_path):
    for name, lib in LIBS.items():
        build(lib).memmap(tmp_path / name / "new")
        td = lib.TensorDict(a=torch.zeros(3, 2), batch_size=[3]).memmap(tmp_path / name / "old")
        td.load_memmap_(tmp_path / name / "new")
        assert td.is_memmap() and td.is_locked and "n" in td.keys()
        assert td["a"].filename == str(tmp_path / name / "new" / "a.memmap")


def test_a_failed_load_memmap_into_leaves_the_tensordict_as_it_was(tmp_path):
    build(torchdict).memmap(tmp_path / "new")
    td = TensorDict(a=torch.zeros(5, 2), batch_size=[5]).memmap(tmp_path / "old")
    with pytest.raises(RuntimeError):
        td.load_memmap_(tmp_path / "new")  # batch 3 into batch 5
    assert td.is_memmap() and td.is_locked and list(td.keys()) == ["a"] and td["a"].shape == (5, 2)


def test_load_is_deprecated_as_upstream(tmp_path):
    build(torchdict).memmap(tmp_path / "saved")
    td = TensorDict(batch_size=[3])
    with pytest.warns(DeprecationWarning, match="load_memmap_"):
        assert td.load_(tmp_path / "saved") is td
    assert "n" in td.keys()


def test_memmap_refresh_sees_another_writer(tmp_path):
    for name, lib in LIBS.items():
        td = lib.TensorDict(a=torch.zeros(3)).memmap(tmp_path / name)
        lib.TensorDict(a=torch.ones(3), b=torch.ones(3)).memmap(tmp_path / name)
        assert td.memmap_refresh_() is td
        assert sorted(td.keys()) == ["a", "b"] and td["a"].tolist() == [1.0] * 3 and td.is_memmap()


# ---------------------------------------------------------------- make_memmap*
def test_make_memmap_matches_upstream(tmp_path):
    reloaded = {}
    for name, lib in LIBS.items():
        td = lib.TensorDict(a=torch.zeros(3), batch_size=[3]).memmap(tmp_path / name)
        made = td.make_memmap(("nested", "b"), (3, 4), dtype=torch.int32)
        assert td["nested", "b"] is made and made.filename == str(tmp_path / name / "nested" / "b.memmap")
        made.fill_(2)
        copied = td.make_memmap_from_tensor("c", torch.arange(3))
        assert copied.filename == str(tmp_path / name / "c.memmap") and td.is_locked
        empty = td.make_memmap_from_tensor(("nested", "e"), torch.ones(3, 2), copy_data=False)
        assert empty.shape == (3, 2)
        reloaded[name] = TensorDict.load_memmap(tmp_path / name)
    assert sorted(map(str, reloaded["torchdict"].keys(True))) == sorted(map(str, reloaded["tensordict"].keys(True)))
    for key in ("a", ("nested", "b"), "c"):
        assert torch.equal(reloaded["torchdict"][key], reloaded["tensordict"][key])


def test_make_memmap_in_anonymous_memory(tmp_path):
    td = TensorDict(a=torch.zeros(3), batch_size=[3]).memmap()
    made = td.make_memmap("b", (3, 2))
    assert type(made) is MemoryMappedTensor and td["b"] is made


def test_make_memmap_refusals_change_nothing(tmp_path):
    td = TensorDict(a=torch.zeros(3), batch_size=[3]).memmap(tmp_path / "saved")
    before = sorted(os.listdir(tmp_path / "saved")), (tmp_path / "saved" / "meta.json").read_bytes()
    with pytest.raises(RuntimeError, match="already exists"):
        td.make_memmap("a", (3,))
    with pytest.raises(RuntimeError, match="batch dimension mismatch"):
        td.make_memmap(("new", "x"), (5,))
    with pytest.raises(RuntimeError, match="Can only make a memmap tensor"):
        TensorDict(a=torch.zeros(3)).make_memmap("b", (3,))
    assert (sorted(os.listdir(tmp_path / "saved")), (tmp_path / "saved" / "meta.json").read_bytes()) == before
    assert list(td.keys()) == ["a"]


def test_make_memmap_from_storage(tmp_path):
    td = TensorDict(a=torch.zeros(3), batch_size=[3]).memmap(tmp_path / "saved")
    MemoryMappedTensor.from_tensor(torch.arange(3), filename=tmp_path / "saved" / "s.memmap")
    storage = torch.UntypedStorage.from_file(str(tmp_path / "saved" / "s.memmap"), shared=True, nbytes=24)
    made = td.make_memmap_from_storage("s", storage, (3,), dtype=torch.int64)
    assert made.tolist() == [0, 1, 2] and made.data_ptr() == storage.data_ptr()
    assert TensorDict.load_memmap(tmp_path / "saved")["s"].tolist() == [0, 1, 2]
    with pytest.raises(RuntimeError, match="no file"):
        td.make_memmap_from_storage("t", torch.arange(3).untyped_storage(), (3,), dtype=torch.int64)
    with pytest.raises(RuntimeError, match="not from"):
        td.make_memmap_from_storage("u", storage, (3,), dtype=torch.int64)
    anonymous = TensorDict(batch_size=[3]).memmap()
    viewed = anonymous.make_memmap_from_storage("v", torch.arange(3.0).untyped_storage(), (3,))
    assert viewed.tolist() == [0.0, 1.0, 2.0]
