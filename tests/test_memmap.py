"""MemoryMappedTensor: a tensor whose bytes live in a file, stated against plain torch."""
from __future__ import annotations

import copy
import importlib
import multiprocessing
import os
import pickle

import pytest
import torch

from torchdict import MemoryMappedTensor
from _dtype_samples import ALL_DTYPES, sample

memmap_module = importlib.import_module("torchdict.memmap")  # torchdict.memmap is the function, as upstream's


def file_bytes(path) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


def raw_bytes(tensor: torch.Tensor) -> bytes:
    """C-order little-endian bytes of ``tensor`` (what the file must hold)."""
    flat = tensor.contiguous().reshape(-1)
    return bytes(flat.view(torch.uint8).tolist()) if flat.numel() else b""


# ---------------------------------------------------------------- from_tensor
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_from_tensor_file_holds_the_raw_little_endian_bytes(tmp_path, dtype):
    source = sample(dtype)
    path = tmp_path / "x.memmap"
    mmt = MemoryMappedTensor.from_tensor(source, filename=path)
    assert type(mmt) is MemoryMappedTensor and mmt.dtype == dtype and mmt.shape == source.shape
    assert torch.equal(mmt.view(torch.uint8), source.view(torch.uint8))
    assert file_bytes(path) == raw_bytes(source)
    assert mmt.filename == str(path)


def test_from_tensor_without_filename_uses_anonymous_shared_memory():
    source = torch.arange(6.0).view(2, 3)
    mmt = MemoryMappedTensor.from_tensor(source)
    assert torch.equal(mmt, source) and mmt.is_shared()
    assert mmt.data_ptr() != source.data_ptr()
    with pytest.raises(RuntimeError, match="The MemoryMappedTensor has no file associated."):
        mmt.filename


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.arange(12.0).view(3, 4).t(),  # transposed
        lambda: torch.arange(4.0).expand(5, 4),  # expanded (stride 0)
        lambda: torch.arange(20.0).view(4, 5)[:, 1::2],  # strided slice
        lambda: torch.complex(torch.ones(3), torch.arange(3.0)).conj(),  # lazy conjugate bit
        lambda: torch.tensor(3.5),  # 0-dim
        lambda: torch.zeros(0, 3),  # empty
    ],
    ids=["transposed", "expanded", "strided", "conj", "0-dim", "empty"],
)
def test_from_tensor_stores_any_layout_in_c_order(tmp_path, make):
    source = make()
    path = tmp_path / "x.memmap"
    mmt = MemoryMappedTensor.from_tensor(source, filename=path)
    assert torch.equal(mmt, source.resolve_conj()) and mmt.shape == source.shape
    assert file_bytes(path) == raw_bytes(source.resolve_conj())


def test_large_strided_tensor_is_written_chunk_by_chunk(tmp_path, monkeypatch):
    monkeypatch.setattr(memmap_module, "_CHUNK_BYTES", 64)
    source = torch.arange(3 * 7, dtype=torch.int64).view(7, 3).t().expand(5, 3, 7)
    mmt = MemoryMappedTensor.from_tensor(source, filename=tmp_path / "x.memmap")
    assert torch.equal(mmt, source)
    assert file_bytes(tmp_path / "x.memmap") == raw_bytes(source)


def test_from_tensor_shape_broadcasts_the_input(tmp_path):
    mmt = MemoryMappedTensor.from_tensor(torch.arange(3), filename=tmp_path / "x.memmap", shape=(2, 3))
    assert torch.equal(mmt, torch.arange(3).expand(2, 3))


def test_from_tensor_refuses_an_existing_file_and_leaves_it_alone(tmp_path):
    path = tmp_path / "x.memmap"
    path.write_bytes(b"previous")
    with pytest.raises(RuntimeError, match="already exists"):
        MemoryMappedTensor.from_tensor(torch.zeros(3), filename=path)
    assert path.read_bytes() == b"previous"
    overwritten = MemoryMappedTensor.from_tensor(torch.ones(3), filename=path, existsok=True)
    assert torch.equal(overwritten, torch.ones(3)) and path.stat().st_size == 12  # old tail cut off


def test_from_tensor_refuses_requires_grad_before_creating_a_file(tmp_path):
    with pytest.raises(RuntimeError, match="incompatible with tensor.requires_grad"):
        MemoryMappedTensor.from_tensor(torch.zeros(2, requires_grad=True), filename=tmp_path / "x.memmap")
    assert not (tmp_path / "x.memmap").exists()


def test_from_tensor_refuses_sparse_layouts(tmp_path):
    with pytest.raises(TypeError, match="only strided"):
        MemoryMappedTensor.from_tensor(torch.eye(2).to_sparse(), filename=tmp_path / "x.memmap")
    assert not (tmp_path / "x.memmap").exists()


def test_from_tensor_returns_a_tensor_already_at_its_place(tmp_path):
    path = tmp_path / "x.memmap"
    mmt = MemoryMappedTensor.from_tensor(torch.arange(3), filename=path)
    assert MemoryMappedTensor.from_tensor(mmt, filename=path) is mmt
    anonymous = MemoryMappedTensor.from_tensor(torch.arange(3))
    assert MemoryMappedTensor.from_tensor(anonymous) is anonymous


def test_copying_a_file_backed_tensor_to_another_file_needs_copy_existing(tmp_path):
    mmt = MemoryMappedTensor.from_tensor(torch.arange(3), filename=tmp_path / "a.memmap")
    with pytest.raises(RuntimeError, match="copy_existing=True"):
        MemoryMappedTensor.from_tensor(mmt, filename=tmp_path / "b.memmap")
    assert not (tmp_path / "b.memmap").exists()
    copied = MemoryMappedTensor.from_tensor(mmt, filename=tmp_path / "b.memmap", copy_existing=True)
    copied[0] = 10
    assert mmt.tolist() == [0, 1, 2] and copied.tolist() == [10, 1, 2]


def test_from_tensor_rejects_non_tensors():
    with pytest.raises(TypeError, match="expects a torch.Tensor"):
        MemoryMappedTensor.from_tensor([1, 2, 3])


# ---------------------------------------------------------------- allocation
def test_zeros_allocates_a_sparse_file(tmp_path):
    path = tmp_path / "big.memmap"
    mmt = MemoryMappedTensor.zeros(64, 1024, 1024, dtype=torch.uint8, filename=path)  # 64 MiB
    stat = os.stat(path)
    assert stat.st_size == 64 << 20
    assert stat.st_blocks * 512 < (1 << 20)  # almost no blocks on disk
    assert mmt.shape == (64, 1024, 1024) and not mmt[5].any()


@pytest.mark.parametrize("shape_args", [((2, 3),), (2, 3), ([2, 3],), (torch.Size([2, 3]),)])
def test_constructors_accept_every_shape_spelling(shape_args):
    assert MemoryMappedTensor.empty(*shape_args).shape == (2, 3)
    assert torch.equal(MemoryMappedTensor.zeros(*shape_args), torch.zeros(2, 3))
    assert torch.equal(MemoryMappedTensor.ones(*shape_args, dtype=torch.int32), torch.ones(2, 3, dtype=torch.int32))


def test_full_and_like_constructors_match_torch(tmp_path):
    full = MemoryMappedTensor.full((2, 2), fill_value=7, dtype=torch.int16, filename=tmp_path / "f.memmap")
    assert torch.equal(full, torch.full((2, 2), 7, dtype=torch.int16))
    assert torch.equal(MemoryMappedTensor.full((3,), fill_value=1.5), torch.full((3,), 1.5))
    template = torch.empty(4, 2, dtype=torch.float64)
    assert torch.equal(MemoryMappedTensor.zeros_like(template), torch.zeros_like(template))
    assert torch.equal(MemoryMappedTensor.ones_like(template), torch.ones_like(template))
    assert torch.equal(MemoryMappedTensor.full_like(template, 3.0), torch.full_like(template, 3.0))
    assert MemoryMappedTensor.empty_like(template).shape == template.shape
    with pytest.raises(TypeError):
        MemoryMappedTensor.full((2,), 5.0)  # fill_value is keyword-only


def test_zeros_over_an_existing_file_clears_it(tmp_path):
    path = tmp_path / "x.memmap"
    MemoryMappedTensor.from_tensor(torch.ones(4), filename=path)
    assert not MemoryMappedTensor.zeros(4, filename=path, existsok=True).any()


# ---------------------------------------------------------------- from_filename
def test_from_filename_maps_an_existing_file_and_shares_writes(tmp_path):
    path = tmp_path / "x.memmap"
    first = MemoryMappedTensor.from_tensor(torch.arange(6), filename=path)
    second = MemoryMappedTensor.from_filename(path, torch.int64, [2, 3])
    assert torch.equal(second, torch.arange(6).view(2, 3))
    second[1, 2] = 100
    assert first[5].item() == 100
    assert MemoryMappedTensor.from_filename(path, torch.int64, [2, 3], index=1).tolist() == [3, 4, 100]


def test_from_filename_read_mode_keeps_writes_private_and_opens_read_only_files(tmp_path):
    path = tmp_path / "x.memmap"
    MemoryMappedTensor.from_tensor(torch.arange(3), filename=path)
    os.chmod(path, 0o444)
    try:
        private = MemoryMappedTensor.from_filename(path, torch.int64, [3], mode="r")
        private[0] = 42
        assert private.tolist() == [42, 1, 2]
        assert torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.int64).tolist() == [0, 1, 2]
    finally:
        os.chmod(path, 0o644)
    with pytest.raises(ValueError, match="mode must be"):
        MemoryMappedTensor.from_filename(path, torch.int64, [3], mode="w")


def test_from_filename_refuses_a_truncated_file_without_growing_it(tmp_path):
    path = tmp_path / "x.memmap"
    path.write_bytes(b"\x00" * 10)
    with pytest.raises(RuntimeError, match="truncated"):
        MemoryMappedTensor.from_filename(path, torch.float32, [4])
    assert path.stat().st_size == 10


def test_from_filename_ignores_extra_trailing_bytes(tmp_path):
    path = tmp_path / "x.memmap"
    path.write_bytes(bytes([1, 0, 2, 0, 9]))
    assert MemoryMappedTensor.from_filename(path, torch.int16, [2]).tolist() == [1, 2]


# ---------------------------------------------------------------- indexing and ops
@pytest.fixture
def on_disk(tmp_path):
    return MemoryMappedTensor.from_tensor(torch.arange(24.0).view(4, 6), filename=tmp_path / "x.memmap")


@pytest.mark.parametrize("index", [1, slice(1, 3), (1, slice(None, None, 2)), (Ellipsis, 2), (None, 0)],
                         ids=["int", "slice", "tuple", "ellipsis", "none"])
def test_basic_indexing_returns_views_that_write_through_to_the_file(on_disk, index):
    plain = torch.arange(24.0).view(4, 6)
    view = on_disk[index]
    assert type(view) is MemoryMappedTensor
    assert view.filename == on_disk.filename
    assert torch.equal(view, plain[index])
    view.fill_(-1)
    plain[index] = -1
    reread = MemoryMappedTensor.from_filename(on_disk.filename, torch.float32, [4, 6])
    assert torch.equal(reread, plain)


def test_a_view_does_not_relabel_the_tensor_it_came_from(on_disk):
    plain = on_disk.as_subclass(torch.Tensor)
    wrapped = MemoryMappedTensor._wrap(plain, on_disk._mapped_file)
    views = [on_disk[0], on_disk[:, 1:], wrapped[0], wrapped[..., 2]]
    assert [type(view) for view in views] == [MemoryMappedTensor] * 4
    assert type(plain) is torch.Tensor and type(plain[0]) is torch.Tensor  # the caller's tensor stays plain
    assert type(on_disk) is MemoryMappedTensor and on_disk.shape == (4, 6)
    assert all(view.filename == on_disk.filename for view in views)


@pytest.mark.parametrize("make", ["from_tensor", "from_filename", "loaded", "unpickled view", "wrapped"])
def test_views_of_views_know_their_file_after_the_root_is_gone(tmp_path, make):
    # The file is recorded once, on the mapping's root; every view finds it through its base.
    import gc

    path = tmp_path / "x.memmap"
    root = MemoryMappedTensor.from_tensor(torch.arange(60.0).view(5, 3, 4), filename=path)
    if make == "from_filename":
        root = MemoryMappedTensor.from_filename(path, torch.float32, [5, 3, 4])
    elif make == "loaded":
        from torchdict import TensorDict

        TensorDict({"x": root}, batch_size=[5]).memmap(tmp_path / "saved", copy_existing=True)
        path = tmp_path / "saved" / "x.memmap"
        root = TensorDict.load_memmap(tmp_path / "saved")["x"]
    elif make == "unpickled view":
        root = pickle.loads(pickle.dumps(root[1:]))
    elif make == "wrapped":  # a plain tensor on the file's storage, as another process sees it
        root = MemoryMappedTensor._wrap(root.as_subclass(torch.Tensor), root._mapped_file)
    expected = torch.arange(60.0).view(5, 3, 4)[1:] if make == "unpickled view" else torch.arange(60.0).view(5, 3, 4)
    view = root[2][1:, ::2]
    del root
    gc.collect()
    deeper = view[0]
    for tensor in (view, deeper):
        assert type(tensor) is MemoryMappedTensor
        assert os.path.samefile(tensor.filename, path)
    assert torch.equal(view, expected[2][1:, ::2])
    reopened = pickle.loads(pickle.dumps(deeper))
    assert torch.equal(reopened, expected[2][1, ::2]) and os.path.samefile(reopened.filename, path)


def test_anonymous_views_have_no_file():
    anonymous = MemoryMappedTensor.zeros(4, 3)
    for tensor in (anonymous, anonymous[1], anonymous[1:][0]):
        assert type(tensor) is MemoryMappedTensor
        with pytest.raises(RuntimeError, match="no file associated"):
            tensor.filename


def test_td_int_index_of_a_memmapped_td_gives_file_views(tmp_path):
    from torchdict import TensorDict

    source = TensorDict({"x": torch.arange(12.0).view(4, 3), "n": {"y": torch.arange(4)}}, batch_size=[4])
    loaded = TensorDict.load_memmap(source.memmap(tmp_path).saved_path)
    for index in (2, -1, slice(1, 3)):
        item = loaded[index]
        for key in ("x", ("n", "y")):
            assert type(item[key]) is MemoryMappedTensor and torch.equal(item[key], source[key][index])
            assert os.path.samefile(item[key].filename, loaded[key].filename)
    with pytest.raises(IndexError, match="out of bounds"):
        loaded[4]


@pytest.mark.parametrize("index", [[0, 2], torch.tensor([3, 1]), torch.tensor([True, False, True, False])],
                         ids=["list", "tensor", "mask"])
def test_advanced_indexing_returns_plain_tensors(on_disk, index):
    plain = torch.arange(24.0).view(4, 6)
    result = on_disk[index]
    assert type(result) is torch.Tensor
    assert torch.equal(result, plain[index])


def test_arithmetic_and_other_ops_return_plain_tensors(on_disk):
    plain = torch.arange(24.0).view(4, 6)
    for result, expected in [(on_disk + 1, plain + 1), (on_disk.sum(0), plain.sum(0)),
                             (torch.stack([on_disk, on_disk]), torch.stack([plain, plain])),
                             (on_disk.clone(), plain), (on_disk.view(-1), plain.view(-1))]:
        assert type(result) is torch.Tensor
        assert torch.equal(result, expected)


def test_repr_names_the_class(on_disk):
    assert repr(on_disk).startswith("MemoryMappedTensor(")


# ---------------------------------------------------------------- pickling and processes
def test_file_backed_tensor_pickles_as_a_reference_not_data(tmp_path):
    mmt = MemoryMappedTensor.zeros(1000, 1000, filename=tmp_path / "x.memmap")
    payload = pickle.dumps(mmt)
    assert len(payload) < 2000  # 4 MB of data, a few hundred bytes of pickle
    clone = pickle.loads(payload)
    assert type(clone) is MemoryMappedTensor and clone.filename == mmt.filename
    clone[3, 4] = 5
    assert mmt[3, 4].item() == 5


def test_pickled_view_keeps_its_offset_and_strides(on_disk):
    view = on_disk[1:, ::2]
    clone = pickle.loads(pickle.dumps(view))
    assert torch.equal(clone, view) and clone.stride() == view.stride()
    clone[0, 0] = 1000
    assert on_disk[1, 0].item() == 1000


def test_anonymous_tensor_pickles_its_data():
    mmt = MemoryMappedTensor.from_tensor(torch.arange(4.0))
    clone = pickle.loads(pickle.dumps(mmt))
    assert type(clone) is MemoryMappedTensor and torch.equal(clone, mmt)


def test_deepcopy_does_not_alias_the_file(on_disk):
    duplicate = copy.deepcopy(on_disk)
    duplicate.fill_(0)
    assert torch.equal(on_disk, torch.arange(24.0).view(4, 6))
    with pytest.raises(RuntimeError, match="no file associated"):
        duplicate.filename


def _write_in_child(tensor, row, value):
    tensor[row] = value


@pytest.mark.slow
@pytest.mark.parametrize("backing", ["file", "anonymous"])
def test_tensor_sent_to_a_spawned_process_is_written_there(tmp_path, backing):
    filename = tmp_path / "x.memmap" if backing == "file" else None
    mmt = MemoryMappedTensor.zeros(4, 3, filename=filename)
    context = multiprocessing.get_context("spawn")
    process = context.Process(target=_write_in_child, args=(mmt, 2, 7.0))
    process.start()
    process.join(120)
    assert process.exitcode == 0
    expected = torch.zeros(4, 3)
    expected[2] = 7.0
    assert torch.equal(mmt, expected)


# --------------------------------------------------------------------- td[i] through the plain alias


def _loaded(tmp_path):
    from torchdict import TensorDict

    TensorDict({"a": torch.arange(24.0).view(4, 2, 3), "b": torch.arange(4)}, batch_size=[4]).memmap(tmp_path)
    return TensorDict.load_memmap(tmp_path)


@pytest.mark.parametrize("change", [
    lambda leaf: leaf.transpose_(1, 2), lambda leaf: leaf.swapdims_(1, 2), lambda leaf: leaf.unsqueeze_(1),
    lambda leaf: leaf.as_strided_((4, 3), (6, 1)), lambda leaf: leaf.set_(torch.arange(100.0, 124.0).view(4, 2, 3)),
    lambda leaf: setattr(leaf, "data", torch.full((4, 2, 3), 7.0)), lambda leaf: leaf.requires_grad_(),
    lambda leaf: setattr(leaf, "requires_grad", True),
])
def test_td_index_follows_in_place_changes_of_a_memory_mapped_leaf(tmp_path, change):
    # td[i] indexes a cached plain view of each memory-mapped leaf; every in-place change of the
    # leaf's layout, storage or autograd state drops it, so td[i] always equals leaf[i].
    td = _loaded(tmp_path)
    leaf = td["a"]
    first = td[1]["a"]
    assert type(first) is MemoryMappedTensor and torch.equal(first, leaf.as_subclass(torch.Tensor)[1])
    change(leaf)
    result = td[1]["a"]
    expected = torch.Tensor.__getitem__(leaf, 1)
    assert torch.equal(result.as_subclass(torch.Tensor), expected)
    assert result.shape == expected.shape and result.stride() == expected.stride()
    assert result.requires_grad == expected.requires_grad


def test_td_index_gives_memory_mapped_views_of_the_file(tmp_path):
    td = _loaded(tmp_path)
    row = td[2]
    assert type(row["a"]) is MemoryMappedTensor and row["a"].filename == td["a"].filename
    row["a"].fill_(-1)  # a view: writes reach the file
    assert (td["a"][2] == -1).all()
    assert pickle.loads(pickle.dumps(row["a"])).filename == td["a"].filename


def test_a_leaf_with_its_alias_is_freed_with_its_tensordict(tmp_path):
    import gc
    import weakref

    td = _loaded(tmp_path)
    td[0]
    assert isinstance(td["a"].__dict__.get(memmap_module.PLAIN_ALIAS), torch.Tensor)
    refs = [weakref.ref(leaf) for leaf in td.values()]
    del td
    gc.collect()
    assert all(ref() is None for ref in refs)
    root = memmap_module._adopt(torch.zeros(3, 2), None)  # a MemoryMappedTensor that is no view
    alias = memmap_module.plain_alias(root)
    assert root._base is None and alias._base is None  # set on the storage: it does not hold the root
    assert alias.data_ptr() == root.data_ptr() and alias.stride() == root.stride()
    ref = weakref.ref(root)
    del root, alias
    gc.collect()
    assert ref() is None


def test_a_root_leaf_that_requires_grad_is_indexed_with_its_history():
    floats = memmap_module._adopt(torch.arange(6.0).view(3, 2).clone(), None).requires_grad_()
    assert memmap_module.plain_alias(floats) is False  # a storage alias would drop the history
    from torchdict import TensorDict

    row = TensorDict({"x": floats}, batch_size=[3])[1]["x"]
    assert row.requires_grad and row.grad_fn is not None and type(row) is MemoryMappedTensor
    row.sum().backward()
    assert torch.equal(floats.grad, torch.tensor([[0.0, 0.0], [1.0, 1.0], [0.0, 0.0]]))


def test_td_index_of_a_root_leaf_reads_and_writes_the_file(tmp_path):
    from torchdict import TensorDict

    td = _loaded(tmp_path)
    root = td["b"]
    assert root._base is None
    assert [int(td[i]["b"]) for i in range(4)] == root.tolist()
    row = td[3]["b"]
    assert type(row) is MemoryMappedTensor and row.filename == root.filename
    assert pickle.loads(pickle.dumps(row)).filename == root.filename
    row.fill_(42)  # through the storage alias: the write reaches the leaf, and so the file
    assert int(root[3]) == 42
    assert int(TensorDict.load_memmap(tmp_path)["b"][3]) == 42
    root.set_(torch.arange(10, 14))  # a new storage drops the alias
    assert int(td[1]["b"]) == 11


def test_an_item_of_a_root_leaf_outlives_its_tensordict(tmp_path):
    import gc

    td = _loaded(tmp_path)
    filename = td["b"].filename
    row = td[2]["b"]
    del td
    gc.collect()
    assert row.filename == filename and int(row) == 2
