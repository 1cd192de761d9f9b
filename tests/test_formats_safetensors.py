"""safetensors files (issue 21, item 2): round trips, upstream's layout both ways, memory-mapped loads."""
from __future__ import annotations

import json
import os
import struct
import sys
import warnings

import pytest
import torch

import torchdict
from torchdict import NonTensorData, NonTensorStack, TensorDict, from_safetensors, lazy_stack, to_safetensors

from _format_helpers import assert_same, assert_same_outcome

safetensors = pytest.importorskip("safetensors")
upstream = pytest.importorskip("tensordict")
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32,
          torch.uint64, torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.float8_e4m3fn,
          torch.float8_e5m2, torch.complex64, torch.complex128]


@pytest.fixture(autouse=True)
def _quiet_upstream_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        yield


def nested_td(lib, batch_size):
    leading = list(batch_size)
    return lib.TensorDict(
        a=torch.arange(float(2 * torch.Size(leading).numel())).reshape(*leading, 2),
        n=lib.TensorDict(b=torch.ones(*leading, 3, dtype=torch.int32),
                         deeper=lib.TensorDict(c=torch.zeros(leading, dtype=torch.bool), batch_size=leading),
                         batch_size=leading),
        label=lib.NonTensorData({"run": 1, "tags": ["x", None]}),
        batch_size=leading)


def written_by(lib, td, path):
    (upstream.to_safetensors if lib is upstream else to_safetensors)(td, path)
    return path


# ---------------------------------------------------------------------------- round trips and interop
@pytest.mark.parametrize("batch_size", [[], [2], [2, 3], [2, 3, 4], [0], [2, 0]], ids=str)
def test_files_are_upstreams_byte_for_byte_and_load_both_ways(tmp_path, batch_size):
    ours = written_by(torchdict, nested_td(torchdict, batch_size), tmp_path / "ours.safetensors")
    theirs = written_by(upstream, nested_td(upstream, batch_size), tmp_path / "theirs.safetensors")
    assert ours.read_bytes() == theirs.read_bytes()
    for path in (ours, theirs):
        assert_same(upstream.from_safetensors(path), from_safetensors(path))
    assert_same(nested_td(torchdict, batch_size), from_safetensors(ours))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dtypes_round_trip_or_fail_as_upstream(tmp_path, dtype):
    def save(lib, name):
        td = lib.TensorDict(x=torch.ones(2, 3).to(dtype), batch_size=[2])
        written_by(lib, td, tmp_path / name)

    result = assert_same_outcome(lambda: save(upstream, "up"), lambda: save(torchdict, "ours"),
                                 compare=lambda up, ours: None)
    if result[0] == "ok":
        loaded = from_safetensors(tmp_path / "ours")
        assert loaded["x"].dtype == dtype and torch.equal(loaded["x"], torch.ones(2, 3).to(dtype))
        assert_same(upstream.from_safetensors(tmp_path / "ours"), loaded)
    else:
        assert isinstance(result[1], KeyError) and "complex128" in str(result[1])
        assert os.listdir(tmp_path) == []  # no partial file left


def test_dim_names_and_devices_are_kept(tmp_path):
    up = upstream.TensorDict(x=torch.zeros(2, 3), batch_size=[2, 3], names=["batch", "time"])
    ours = TensorDict(x=torch.zeros(2, 3), batch_size=[2, 3], names=["batch", "time"])
    assert written_by(torchdict, ours, tmp_path / "o").read_bytes() == written_by(upstream, up, tmp_path / "u").read_bytes()
    assert from_safetensors(tmp_path / "u").names == ["batch", "time"]
    loaded = from_safetensors(tmp_path / "u", device="cpu")
    assert loaded.device == torch.device("cpu")
    assert_same(upstream.from_safetensors(tmp_path / "u", device="cpu"), loaded)


def test_empty_collection_round_trips(tmp_path):
    for batch_size in ([], [3]):
        path = written_by(torchdict, TensorDict(batch_size=batch_size), tmp_path / f"e{len(batch_size)}")
        assert_same(upstream.from_safetensors(path), from_safetensors(path))
        assert from_safetensors(path).batch_size == torch.Size(batch_size)


def test_lazy_stacks_round_trip_both_ways(tmp_path):
    ours = lazy_stack([TensorDict(a=torch.zeros(3)), TensorDict(a=torch.ones(3))], dim=0)
    theirs = upstream.lazy_stack([upstream.TensorDict(a=torch.zeros(3)), upstream.TensorDict(a=torch.ones(3))], dim=0)
    assert written_by(torchdict, ours, tmp_path / "o").read_bytes() == written_by(upstream, theirs, tmp_path / "u").read_bytes()
    for path in (tmp_path / "o", tmp_path / "u"):
        loaded = from_safetensors(path)
        assert isinstance(loaded, torchdict.LazyStackedTensorDict) and loaded.stack_dim == 0
        assert_same(upstream.from_safetensors(path), loaded)


def test_lazy_stack_with_different_keys_is_refused_as_upstream(tmp_path):
    assert_same_outcome(
        lambda: written_by(upstream, upstream.lazy_stack([upstream.TensorDict(a=0), upstream.TensorDict(b=1)]),
                           tmp_path / "u"),
        lambda: written_by(torchdict, lazy_stack([TensorDict(a=0), TensorDict(b=1)]), tmp_path / "o"),
        compare=lambda up, ours: None)


def test_tensorclass_round_trips(tmp_path):
    @torchdict.tensorclass
    class Obs:
        pixels: torch.Tensor
        reward: torch.Tensor

    obs = Obs(pixels=torch.zeros(4, 2, 2), reward=torch.arange(4.0), batch_size=[4])
    path = written_by(torchdict, obs, tmp_path / "tc")
    loaded = from_safetensors(path)
    assert type(loaded) is Obs and torch.equal(loaded.reward, obs.reward)
    meta = json.loads(safe_open(str(path), "pt").metadata()["tensordict"])
    assert meta["root"]["class"] == str(Obs)  # upstream's way of naming the class


def test_unknown_tensorclass_is_not_imported(tmp_path):
    path = tmp_path / "x"
    document = {"version": 1, "root": {"batch_size": [], "names": None, "class": "<class 'os.Nope'>", "keys": {}}}
    save_file({}, str(path), metadata={"tensordict": json.dumps(document)})
    with pytest.raises(RuntimeError, match="Could not find the tensorclass"):
        from_safetensors(path)


def test_overlapping_views_are_saved_separately(tmp_path):
    base = torch.arange(6.0)
    path = written_by(torchdict, TensorDict(whole=base, tail=base[2:], head=base[:2]), tmp_path / "v")
    loaded = from_safetensors(path)
    assert loaded["tail"].tolist() == [2.0, 3.0, 4.0, 5.0] and loaded["head"].tolist() == [0.0, 1.0]


# ---------------------------------------------------------------------------- what can't be stored
@pytest.mark.parametrize("case", ["stack", "object", "bare", "nested_tensor", "sparse", "same_name"])
def test_refusals_match_upstream(tmp_path, case):
    def build(lib):
        if case == "stack":
            return lib.TensorDict(s=lib.NonTensorStack("a", "b"), batch_size=[2])
        if case == "object":
            return lib.TensorDict(o=lib.NonTensorData(object()))
        if case == "bare":
            return lib.NonTensorData("x")
        if case == "nested_tensor":
            return lib.TensorDict(j=torch.nested.nested_tensor_from_jagged(torch.arange(3.0), torch.tensor([0, 1, 3])),
                                  batch_size=[2])
        if case == "sparse":
            return lib.TensorDict(s=torch.eye(2).to_sparse())
        return lib.TensorDict({"a.b": torch.zeros(1), "a": {"b": torch.zeros(1)}})

    result = assert_same_outcome(lambda: written_by(upstream, build(upstream), tmp_path / "u"),
                                 lambda: written_by(torchdict, build(torchdict), tmp_path / "o"),
                                 compare=lambda up, ours: None)
    assert result[0] == "error"
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------------------- plain safetensors files
def test_checkpoint_loads_nested_and_goes_into_a_module(tmp_path):
    module = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    path = str(tmp_path / "model.safetensors")
    save_file({name: torch.full_like(p, 0.5) for name, p in module.state_dict().items()}, path)
    params = from_safetensors(path)
    assert_same(upstream.from_safetensors(path), params)
    assert params.batch_size == torch.Size([]) and params["0", "weight"].shape == (4, 3)
    params.to_module(module)
    assert torch.equal(module[2].bias, torch.full((1,), 0.5))


# ---------------------------------------------------------------------------- memory mapping
def test_load_is_memory_mapped_and_copy_on_write(tmp_path):
    path = written_by(torchdict, TensorDict(x=torch.zeros(256, 1024)), tmp_path / "big.safetensors")
    before = path.read_bytes()
    loaded = from_safetensors(path)
    with open("/proc/self/maps") as maps:
        assert str(path) in maps.read()  # the file is mapped, not read into fresh memory
    loaded["x"] += 1  # private mapping: the file does not change
    assert path.read_bytes() == before
    assert from_safetensors(path)["x"].sum() == 0


# ---------------------------------------------------------------------------- bad input
def test_a_file_of_another_format_names_the_file(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(safetensors.SafetensorError, match="x.csv"):
        from_safetensors(path)


def test_a_truncated_file_names_the_file(tmp_path):
    path = written_by(torchdict, TensorDict(x=torch.zeros(100)), tmp_path / "t.safetensors")
    path.write_bytes(path.read_bytes()[:-50])
    with pytest.raises(safetensors.SafetensorError, match="t.safetensors"):
        from_safetensors(path)


def test_missing_file_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        from_safetensors(tmp_path / "nope.safetensors")


def _with_metadata(path, document, tensors=None):
    save_file(tensors if tensors is not None else {"x": torch.zeros(2)}, str(path),
              metadata={"tensordict": document if isinstance(document, str) else json.dumps(document)})
    return path


@pytest.mark.parametrize("document, message", [
    ({"version": 2, "root": {}}, "version 2"),
    ("{not json", "not valid JSON"),
    ({"version": 1, "root": {"batch_size": [], "names": None, "keys": {}}}, r"not in its tensordict metadata"),
    ({"version": 1, "root": {"batch_size": [], "names": None, "keys": {"x": {"tensor": "y"}}}}, "does not hold"),
    ({"version": 1, "root": {"names": None, "keys": {}}}, "malformed"),
])
def test_bad_metadata_is_a_value_error_naming_the_file(tmp_path, document, message):
    path = _with_metadata(tmp_path / "m.safetensors", document)
    with pytest.raises(ValueError, match=message) as caught:
        from_safetensors(path)
    assert "m.safetensors" in str(caught.value)


def test_bad_metadata_errors_match_upstreams_types(tmp_path):
    for index, document in enumerate([{"version": 2, "root": {}},
                                      {"version": 1, "root": {"batch_size": [], "names": None, "keys": {}}}]):
        path = _with_metadata(tmp_path / f"{index}", document)
        assert_same_outcome(lambda: upstream.from_safetensors(path), lambda: from_safetensors(path))


def test_header_of_the_file_is_what_safetensors_reads(tmp_path):
    """The file is a plain safetensors file: an 8-byte header length, a JSON header, the data."""
    path = written_by(torchdict, TensorDict(x=torch.arange(4, dtype=torch.int32)), tmp_path / "h")
    raw = path.read_bytes()
    header = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
    assert header["x"]["dtype"] == "I32" and header["x"]["shape"] == [4]


# ---------------------------------------------------------------------------- writes and the optional library
def test_failed_write_keeps_the_old_file(tmp_path):
    path = written_by(torchdict, TensorDict(x=torch.zeros(2)), tmp_path / "keep.safetensors")
    before = path.read_bytes()
    with pytest.raises(KeyError):
        to_safetensors(TensorDict(x=torch.zeros(2), z=torch.zeros(2, dtype=torch.complex128)), path)
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["keep.safetensors"]


def test_write_does_not_copy_contiguous_tensors(tmp_path, monkeypatch):
    import safetensors.torch as st_torch

    seen = {}
    real = st_torch.save_file

    def spy(tensors, filename, metadata=None):
        seen.update({name: tensor.data_ptr() for name, tensor in tensors.items()})
        return real(tensors, filename, metadata=metadata)

    monkeypatch.setattr(st_torch, "save_file", spy)
    td = TensorDict(x=torch.zeros(8), n={"y": torch.ones(3)})
    to_safetensors(td, tmp_path / "s")
    assert seen == {"x": td["x"].data_ptr(), "n.y": td["n", "y"].data_ptr()}


@pytest.mark.parametrize("call", [lambda p: to_safetensors(TensorDict(), p), lambda p: from_safetensors(p)],
                         ids=["to_safetensors", "from_safetensors"])
def test_missing_safetensors_names_the_extra(tmp_path, monkeypatch, call):
    monkeypatch.setitem(sys.modules, "safetensors", None)
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)
    with pytest.raises(ImportError, match=r"torchdict\[safetensors\]"):
        call(tmp_path / "x")


def test_top_level_names_match_upstreams_signatures():
    import inspect

    for name in ("to_safetensors", "from_safetensors"):
        ours = list(inspect.signature(getattr(torchdict, name)).parameters)
        assert ours == list(inspect.signature(getattr(upstream, name)).parameters), name
    assert isinstance(NonTensorStack, type)
