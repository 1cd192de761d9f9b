"""consolidate() / is_consolidated() / from_consolidated, against upstream tensordict on the CPU.

The layout is upstream's byte for byte: the same storage bytes, the same metadata, the same
file, and each library reads the other's files. A move of a consolidated TensorDict copies its
storage once. (CUDA moves are in test_devices.py.)
"""
from __future__ import annotations

import os
import warnings
from typing import Any

import pytest
import torch

import torchdict
from torchdict import NonTensorData, TensorDict, tensorclass
from torchdict import _consolidate

upstream = pytest.importorskip("tensordict")

# Dtypes whose alignment never trips a view (8 bytes or less); complex128 is covered on its own.
_DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
           torch.bfloat16, torch.float32, torch.float64, torch.complex64]


def _values(shape: tuple, dtype: torch.dtype, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    values = torch.randn(shape, generator=generator, dtype=torch.float64) * 10
    if dtype is torch.bool:
        return values > 0
    if dtype.is_complex:
        return torch.complex(values, -values).to(dtype)
    return values.to(dtype)


def _tree(batch: tuple, seed: int, lib: Any = torchdict) -> Any:
    """A nested source with leaves of many dtypes and shapes (odd byte sizes: padding), and a non-tensor."""
    source: dict = {}
    for position, dtype in enumerate(_DTYPES):
        extra = (position % 3 + 1,) if position % 2 else ()
        source[f"k{position}"] = _values(batch + extra, dtype, seed + position)
    source["nested"] = {"x": _values(batch + (5,), torch.float32, seed),
                        "deeper": {"y": _values(batch, torch.int16, seed)}}
    source["text"] = lib.NonTensorData("hello", batch_size=list(batch))
    source["last"] = _values(batch + (2, 3), torch.float64, seed + 99)
    return lib.TensorDict(source, batch_size=list(batch))


_BATCHES = [(), (3,), (2, 3), (2, 1, 2)]


def _same_values(mine: Any, theirs: Any) -> None:
    keys = list(mine.keys(True, True))
    assert keys == list(theirs.keys(True, True))
    assert mine.batch_size == theirs.batch_size and str(mine.device) == str(theirs.device)
    for key in keys:
        left, right = mine.get(key), theirs.get(key)
        if isinstance(left, torch.Tensor):
            assert left.dtype == right.dtype and left.shape == right.shape and torch.equal(left, right), key
        else:
            assert left.data == right.data, key


def _storage(td: Any) -> torch.Tensor:
    return td._consolidated["storage"] if hasattr(td, "_consolidated") else td._tensordict._consolidated["storage"]


@pytest.mark.parametrize("batch", _BATCHES, ids=str)
def test_storage_and_metadata_are_upstreams(batch: tuple) -> None:
    mine = _tree(batch, 0).consolidate(metadata=True)
    theirs = _tree(batch, 0, upstream).consolidate(metadata=True)
    assert torch.equal(mine._consolidated["storage"], theirs._consolidated["storage"])
    assert mine._consolidated["metadata"] == theirs._consolidated["metadata"]
    _same_values(mine, theirs)
    assert mine.is_locked and mine.is_consolidated() and theirs.is_consolidated()
    pointer = _storage(mine).untyped_storage().data_ptr()
    assert all(leaf.untyped_storage().data_ptr() == pointer for leaf in mine.values(True, True)
               if isinstance(leaf, torch.Tensor))


def test_a_consolidated_copy_leaves_the_source_alone() -> None:
    td = _tree((3,), 1)
    before = {key: value.clone() for key, value in td.items(True, True) if isinstance(value, torch.Tensor)}
    packed = td.consolidate()
    assert not td.is_locked and not td.is_consolidated() and td["text"] is not packed.get("text")
    assert not td.get("text").is_locked if hasattr(td.get("text"), "is_locked") else True
    for key, value in before.items():
        assert torch.equal(td[key], value) and td[key].data_ptr() != packed[key].data_ptr()
    packed["k9"].add_(1)  # in place writes go to the storage, and keep it consolidated
    assert packed.is_consolidated() and not torch.equal(packed["k9"], td["k9"])


@pytest.mark.parametrize("batch", [(), (3,), (2, 3)], ids=str)
def test_the_file_is_upstreams_and_each_library_reads_the_others(tmp_path: Any, batch: tuple) -> None:
    mine_file, their_file = tmp_path / "mine.bin", tmp_path / "theirs.bin"
    mine = _tree(batch, 2).consolidate(filename=mine_file)
    theirs = _tree(batch, 2, upstream).consolidate(filename=their_file)
    assert mine_file.read_bytes() == their_file.read_bytes()
    _same_values(mine, theirs)
    for path in (mine_file, their_file):
        loaded = torchdict.from_consolidated(path)
        reference = upstream.from_consolidated(path)
        _same_values(loaded, reference)
        assert loaded.is_consolidated() and not loaded.is_locked
        assert loaded["nested"].is_consolidated() and reference["nested"].is_consolidated()
        assert TensorDict.from_consolidated(path)["last"].equal(loaded["last"])


def test_the_file_backs_the_leaves(tmp_path: Any) -> None:
    path = tmp_path / "td.bin"
    packed = TensorDict(a=torch.zeros(4), b={"c": torch.zeros(4, 2)}, batch_size=[4]).consolidate(filename=path)
    packed["b", "c"].fill_(3)  # written through the shared map
    loaded = torchdict.from_consolidated(path)
    assert torch.equal(loaded["b", "c"], torch.full((4, 2), 3.0))
    loaded["a"].fill_(7)  # a copy-on-write map: the file does not change
    assert torch.equal(torchdict.from_consolidated(path)["a"], torch.zeros(4))
    assert packed.device == torch.device("cpu") and loaded.batch_size == torch.Size([4])  # as upstream


def test_a_larger_existing_file_is_replaced_not_truncated(tmp_path: Any) -> None:
    path = tmp_path / "td.bin"
    big = TensorDict(a=torch.arange(1000.0), batch_size=[1000]).consolidate(filename=path)
    small = TensorDict(a=torch.arange(3.0), batch_size=[3]).consolidate(filename=path)
    assert torch.equal(big["a"], torch.arange(1000.0))  # the old map still reads its data
    assert torch.equal(torchdict.from_consolidated(path)["a"], small["a"])
    assert os.path.getsize(path) < 1000 * 4


def test_locked_and_names_are_recorded(tmp_path: Any) -> None:
    td = TensorDict(a=torch.zeros(2, 3), batch_size=[2, 3], names=["x", "y"]).lock_()
    packed = td.consolidate(filename=tmp_path / "f.bin")
    theirs = upstream.TensorDict(a=torch.zeros(2, 3), batch_size=[2, 3], names=["x", "y"]).lock_()
    theirs.consolidate(filename=tmp_path / "g.bin")
    assert (tmp_path / "f.bin").read_bytes() == (tmp_path / "g.bin").read_bytes()
    loaded = torchdict.from_consolidated(tmp_path / "f.bin")
    assert loaded.is_locked and loaded.names == ["x", "y"] and packed.is_locked


def test_inplace_swaps_the_leaves_of_self() -> None:
    td = TensorDict(a=torch.ones(3), b={"c": torch.zeros(3)}, batch_size=[3])
    inner = td["b"]
    assert td.consolidate(inplace=True) is td
    assert td.is_consolidated() and td.is_locked and td["b"] is inner
    assert _storage(td).untyped_storage().data_ptr() == td["b", "c"].untyped_storage().data_ptr()


def test_a_consolidated_td_is_returned_as_is_with_upstreams_warnings(tmp_path: Any) -> None:
    mine, theirs = _tree((3,), 3).consolidate(), _tree((3,), 3, upstream).consolidate()
    for packed in (mine, theirs):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert packed.consolidate() is packed
    for kwargs, category in (({"device": "meta"}, FutureWarning), ({"share_memory": True}, FutureWarning),
                             ({"filename": tmp_path / "x.bin"}, UserWarning)):
        for packed in (mine, theirs):
            with pytest.warns(category):
                assert packed.consolidate(**kwargs) is packed


def test_its_own_file_gets_the_new_batch_size(tmp_path: Any) -> None:
    path = tmp_path / "td.bin"
    packed = TensorDict(a=torch.zeros(2, 3), batch_size=[2, 3]).consolidate(filename=path)
    packed.unlock_()  # (torchdict refuses a new batch size on a locked TensorDict)
    packed.batch_size = [2]
    assert packed.is_consolidated() and packed.consolidate(filename=path) is packed
    assert torchdict.from_consolidated(path).batch_size == torch.Size([2])
    assert upstream.from_consolidated(path).batch_size == torch.Size([2])


def test_is_consolidated_follows_the_leaves() -> None:
    packed = TensorDict(a=torch.zeros(3), b={"c": torch.zeros(3)}, batch_size=[3]).consolidate()
    assert packed.is_consolidated() and not packed["b"].is_consolidated()
    assert not TensorDict(a=torch.zeros(3)).is_consolidated()
    packed.unlock_()
    packed["a"] = torch.ones(3)  # a leaf outside the storage
    assert not packed.is_consolidated()
    other = TensorDict(a=torch.zeros(3), b={"c": torch.zeros(3)}, batch_size=[3]).consolidate().unlock_()
    del other["b", "c"]
    assert not other.is_consolidated()
    assert TensorDict(batch_size=[3]).consolidate().is_consolidated()


def test_threads_give_the_same_storage() -> None:
    td = _tree((4,), 4)
    single = td.consolidate()
    threaded = td.consolidate(num_threads=3)
    assert torch.equal(_storage(single), _storage(threaded))
    future = td.consolidate(num_threads=2, return_early=True)
    assert isinstance(future, _consolidate.ConsolidateFuture)
    result = future.result()
    assert torch.equal(_storage(result), _storage(single)) and result.is_consolidated() and future.done()
    with pytest.raises(NotImplementedError):
        td.consolidate(num_threads=2, return_early=True, non_blocking=True)


def test_share_memory_and_use_buffer(tmp_path: Any) -> None:
    td = _tree((3,), 5)
    assert _storage(td.consolidate(share_memory=True)).is_shared()
    path = tmp_path / "buffered.bin"
    buffered = td.consolidate(filename=path, use_buffer=True)
    _same_values(torchdict.from_consolidated(path), upstream.from_consolidated(path))
    buffered["k9"].fill_(1)  # the leaves live in the buffer: the file keeps what was written
    assert not torch.equal(torchdict.from_consolidated(path)["k9"], buffered["k9"])
    with pytest.raises(RuntimeError, match="mutually exclusive"):
        td.consolidate(filename=tmp_path / "y.bin", device="meta")


def test_storage_device_and_moves_of_a_consolidated_td() -> None:
    packed = _tree((3,), 6).consolidate()
    theirs = _tree((3,), 6, upstream).consolidate()
    for target in ("meta", "cpu"):
        moved, reference = packed.to(target), theirs.to(target)
        assert moved.is_consolidated() and moved.is_locked and reference.is_consolidated()
        assert moved.device == reference.device == torch.device(target)
        assert _storage(moved).device == torch.device(target)
        assert list(moved.keys(True, True)) == list(reference.keys(True, True))
    same = packed.to("cpu")
    assert torch.equal(same["k9"], packed["k9"]) and same.get("text").data == "hello"
    on_meta = TensorDict(a=torch.zeros(3), batch_size=[3]).consolidate(device="meta")
    assert _storage(on_meta).device.type == "meta" and on_meta["a"].device.type == "meta"


def test_a_consolidated_td_moves_in_place_as_upstream() -> None:
    # to(device, inplace=True) on a consolidated (so locked) TensorDict: one storage copy, written into self,
    # which stays consolidated and locked, its nested TensorDicts kept.
    for lib in (upstream, torchdict):
        packed = _tree((3,), 7, lib).consolidate()
        nested = packed["nested"]
        assert packed.to("meta", inplace=True) is packed, lib.__name__
        assert packed["nested"] is nested and nested.device == torch.device("meta")
        assert packed.is_consolidated() and packed.is_locked and packed.device == torch.device("meta")
        assert _storage(packed).device.type == "meta" and packed["nested", "deeper", "y"].device.type == "meta"
    moved = _tree((3,), 7).consolidate().to("meta", batch_size=[3])
    assert moved.is_consolidated() and moved.batch_size == torch.Size([3])
    packed = _tree((3,), 7).consolidate()
    with pytest.raises(RuntimeError, match="locked"):  # a cast can't be written into the locked storage views
        packed.to(torch.float64, inplace=True)
    assert packed.is_consolidated() and packed["k0"].dtype == torch.bool and packed["k5"].dtype == torch.int64


def test_misaligned_complex128_raises_torchs_error_as_upstream() -> None:
    def build(lib: Any) -> Any:
        return lib.TensorDict(b=torch.zeros(3, dtype=torch.int8), a=torch.zeros(3, dtype=torch.complex128),
                              batch_size=[3])

    with pytest.raises(RuntimeError) as mine:
        build(torchdict).consolidate()
    with pytest.raises(RuntimeError) as theirs:
        build(upstream).consolidate()
    assert str(mine.value) == str(theirs.value)
    packed = TensorDict(a=torch.ones(3, dtype=torch.complex128), batch_size=[3]).consolidate()
    assert torch.equal(packed["a"], torch.ones(3, dtype=torch.complex128))


def test_gradients_and_non_contiguous_leaves() -> None:
    base = torch.arange(12.0).view(3, 4)
    td = TensorDict(a=base[:, 1], b=base.t()[1:], g=torch.ones(3, requires_grad=True), batch_size=[3])
    packed = td.consolidate()
    assert torch.equal(packed["a"], base[:, 1]) and torch.equal(packed["b"], base.t()[1:])
    assert not packed["g"].requires_grad  # upstream's result holds plain views of the storage too
    assert not upstream.TensorDict(g=torch.ones(3, requires_grad=True), batch_size=[3]).consolidate()["g"].requires_grad


def test_non_tensor_entries(tmp_path: Any) -> None:
    td = TensorDict(a=torch.zeros(3), batch_size=[3])
    td["note"] = "x"
    td["many"] = NonTensorData({"k": [1, 2]}, batch_size=[3])
    packed = td.consolidate(filename=tmp_path / "f.bin")
    loaded = torchdict.from_consolidated(tmp_path / "f.bin")
    assert packed["note"] == "x" and loaded["note"] == "x" and loaded["many"] == {"k": [1, 2]}
    td["bad"] = NonTensorData(object(), batch_size=[3])
    with pytest.raises(RuntimeError, match="JSON"):
        td.consolidate(filename=tmp_path / "g.bin")
    assert td.consolidate()["bad"] is not None  # in memory anything goes


def test_a_lazy_stack_entry_is_refused_clearly() -> None:
    stack = torchdict.lazy_stack([TensorDict(a=torch.zeros(2)), TensorDict(a=torch.ones(2))])
    holder = TensorDict(batch_size=[2])
    holder._tensordict["s"] = stack  # a lazy stack held as an entry
    with pytest.raises(TypeError, match="to_tensordict"):
        holder.consolidate()


@pytest.mark.parametrize("inplace", [False, True])
def test_a_lazy_stack_consolidates_its_members_into_one_storage_as_upstream(inplace) -> None:
    tensordict = pytest.importorskip("tensordict")
    results = []
    for lib in (torchdict, tensordict):
        members = [lib.TensorDict(a=torch.full((3,), float(i)), b={"c": torch.ones(3, 2) * i}, batch_size=[3])
                   for i in range(3)]
        stack = lib.lazy_stack(members, dim=1)
        packed = stack.consolidate(inplace=inplace)
        storages = {leaf.untyped_storage().data_ptr() for member in packed.tensordicts
                    for leaf in member.values(True, True)}
        results.append((type(packed).__name__, packed is stack, packed.is_consolidated(), stack.is_consolidated(),
                        packed.stack_dim, tuple(packed.batch_size), len(storages), packed["b", "c"].tolist(),
                        packed.clone().is_consolidated()))
    assert results[0] == results[1]
    assert results[0][:3] == ("LazyStackedTensorDict", False, True) and results[0][6] == 1


def test_a_lazy_stack_with_a_file_or_nested_stacks_consolidates_densely(tmp_path) -> None:
    stack = torchdict.lazy_stack([TensorDict(a=torch.zeros(2), batch_size=[2]), TensorDict(a=torch.ones(2), batch_size=[2])])
    packed = stack.consolidate(filename=tmp_path / "s.bin")
    assert type(packed) is TensorDict and packed.is_consolidated() and torch.equal(packed["a"], stack["a"])
    regrouped = torchdict.lazy_stack([stack, stack])  # members that are lazy stacks
    assert type(regrouped.consolidate()) is TensorDict


@tensorclass
class Sample:
    obs: torch.Tensor
    label: torch.Tensor


def test_tensorclass(tmp_path: Any) -> None:
    data = Sample(torch.randn(4, 3), torch.arange(4), batch_size=[4])
    packed = data.consolidate()
    assert type(packed) is Sample and packed.is_consolidated() and torch.equal(packed.obs, data.obs)
    moved = packed.to("meta")
    assert type(moved) is Sample and moved.is_consolidated()
    holder = TensorDict(s=data, batch_size=[4])
    path = tmp_path / "f.bin"
    holder.consolidate(filename=path)
    loaded = torchdict.from_consolidated(path)
    assert type(loaded["s"]) is Sample and torch.equal(loaded["s"].label, data.label)


def test_a_bad_file_is_refused(tmp_path: Any) -> None:
    path = tmp_path / "junk.bin"
    path.write_bytes(b"\x00\x01")
    with pytest.raises(RuntimeError, match="not a consolidated"):
        torchdict.from_consolidated(path)
    path.write_bytes(b"{}" + (10 ** 6).to_bytes(8, "little"))
    with pytest.raises(RuntimeError, match="not a consolidated"):
        torchdict.from_consolidated(path)


def test_top_level_and_signature_match_upstream() -> None:
    import inspect

    assert torchdict.from_consolidated is _consolidate.from_consolidated
    assert "from_consolidated" in torchdict.__all__
    mine = inspect.signature(TensorDict.consolidate)
    theirs = inspect.signature(upstream.TensorDict.consolidate)
    assert [(p.name, p.kind, p.default) for p in mine.parameters.values()] == [
        (p.name, p.kind, p.default) for p in theirs.parameters.values()]
