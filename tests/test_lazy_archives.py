"""A lazy stack's, and a lone NonTensorData / NonTensorStack's, own memmap / memmap_like / save to a .tdz archive.

Differential against upstream tensordict 0.15.3: the same kind of result, the same values, and archives each
library writes load in the other.
"""
import os
import zipfile

import pytest
import tensordict
import torch

import torchdict

LIBS = {"torchdict": torchdict, "tensordict": tensordict}
KINDS = ["dense", "ragged", "exclusive", "nested", "rank0", "non_tensor"]


def make(lib, kind):
    TD = lib.TensorDict
    if kind == "dense":  # members of batch [2], stacked on dim 1
        return lib.lazy_stack([TD(a=torch.arange(6.0).view(2, 3), b=TD(c=torch.ones(2, 1), batch_size=[2]),
                                  batch_size=[2]),
                               TD(a=-torch.arange(6.0).view(2, 3), b=TD(c=torch.zeros(2, 1), batch_size=[2]),
                                  batch_size=[2])], 1)
    if kind == "ragged":
        return lib.lazy_stack([TD(a=torch.zeros(2)), TD(a=torch.arange(3.0))])
    if kind == "exclusive":
        return lib.lazy_stack([TD(a=torch.zeros(2)), TD(a=torch.ones(2), b=TD(c=torch.arange(4)))])
    if kind == "nested":
        return lib.lazy_stack([lib.lazy_stack([TD(a=torch.zeros(2)), TD(a=torch.ones(3))]),
                               lib.lazy_stack([TD(a=torch.full((1,), 2.0)), TD(a=torch.arange(2.0))])])
    if kind == "rank0":
        return lib.lazy_stack([TD(x=torch.tensor(1), y=torch.tensor([1.0, 2.0])),
                               TD(x=torch.tensor(2), y=torch.tensor([3.0, 4.0]))])
    return lib.lazy_stack([TD(a=torch.zeros(2), s="first", batch_size=[2]),
                           TD(a=torch.ones(2), s="second", batch_size=[2])])


def describe(value):
    """A library-neutral description of a collection: classes, batch sizes, stack dims, keys and values."""
    members = getattr(value, "tensordicts", None)
    if members is not None:
        return ("lazy", tuple(value.batch_size), value.stack_dim, [describe(member) for member in members])
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, value.tolist())
    if type(value).__name__ in ("NonTensorData", "NonTensorStack"):
        return ("non_tensor", type(value).__name__, tuple(value.batch_size), value.tolist())
    if hasattr(value, "keys"):
        return ("td", tuple(value.batch_size),
                {key: describe(value.get(key)) for key in sorted(value.keys())})
    return ("value", value)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("how", ["suffix", "archive=True", "save", "dumps"])
def test_memmap_writes_one_archive_and_returns_its_lazy_stack(tmp_path, kind, how):
    results = {}
    for name, lib in LIBS.items():
        stack = make(lib, kind)
        if how == "suffix":
            path = tmp_path / f"{name}.tdz"
            result = stack.memmap(path)
        elif how == "archive=True":
            path = tmp_path / name
            result = stack.memmap(path, archive=True)
        else:
            path = tmp_path / f"{name}.tdz"
            result = getattr(stack, how)(path)
        assert os.path.isfile(path) and zipfile.is_zipfile(path)  # one file, not a folder of members
        assert type(result).__name__ == "LazyStackedTensorDict"
        results[name] = (describe(result), result.is_locked)
    assert results["torchdict"] == results["tensordict"]
    assert describe(make(torchdict, kind)) == results["torchdict"][0]


@pytest.mark.parametrize("kind", KINDS)
def test_archives_load_in_either_library(tmp_path, kind):
    for writer_name, writer in LIBS.items():
        path = tmp_path / f"{writer_name}.tdz"
        make(writer, kind).memmap(path)
        expected = describe(make(writer, kind))
        for reader in LIBS.values():
            assert describe(reader.LazyStackedTensorDict.load_memmap(path)) == expected
            assert describe(reader.TensorDict.load_memmap(path)) == expected
        assert describe(torchdict.load(path)) == expected


@pytest.mark.parametrize("kind", ["dense", "ragged", "exclusive"])
def test_memmap_like_writes_a_zero_filled_writable_archive(tmp_path, kind):
    results = {}
    for name, lib in LIBS.items():
        path = tmp_path / f"{name}.tdz"
        result = make(lib, kind).memmap_like(path)
        assert os.path.isfile(path)
        assert type(result).__name__ == "LazyStackedTensorDict"
        results[name] = describe(result)
    assert results["torchdict"] == results["tensordict"]
    result = make(torchdict, kind).memmap_like(tmp_path / "again.tdz")
    result.tensordicts[1]["a"].fill_(5)  # writable: it reaches the file
    assert torchdict.TensorDict.load_memmap(tmp_path / "again.tdz").tensordicts[1]["a"].eq(5).all()


def test_archive_keywords_of_a_lazy_stack(tmp_path):
    stack = make(torchdict, "ragged")
    compressed = stack.memmap(tmp_path / "small.tdz", compression="deflate")
    assert describe(compressed) == describe(stack)
    with zipfile.ZipFile(tmp_path / "small.tdz") as archive:
        assert any(info.compress_type == zipfile.ZIP_DEFLATED for info in archive.infolist())
    before = os.path.getmtime(tmp_path / "small.tdz")
    for lib in LIBS.values():  # the same refusal as upstream's, and nothing written
        with pytest.raises(RuntimeError, match="already exists"):
            make(lib, "ragged").memmap(tmp_path / "small.tdz", existsok=False)
    assert os.path.getmtime(tmp_path / "small.tdz") == before
    future = stack.memmap(tmp_path / "early.tdz", return_early=True)  # upstream refuses; torchdict runs it
    assert describe(future.result()) == describe(stack)
    with pytest.raises(ValueError, match="share_non_tensor"):
        stack.memmap(tmp_path / "shared.tdz", share_non_tensor=True)
    assert not os.path.exists(tmp_path / "shared.tdz")
    assert describe(torchdict.save(stack, tmp_path / "top.tdz")) == describe(stack)
    folder = stack.memmap(tmp_path / "folder", archive=False)  # a folder of members, as before
    assert os.path.isdir(tmp_path / "folder" / "0") and folder.is_locked


def lone(lib, kind):
    return lib.NonTensorData("a value") if kind == "data" else lib.NonTensorStack("a", "b", "c")


@pytest.mark.parametrize("kind", ["data", "stack"])
@pytest.mark.parametrize("how", ["suffix", "archive=True", "memmap_like", "save"])
def test_a_lone_non_tensor_leaf_writes_an_archive(tmp_path, kind, how):
    results = {}
    for name, lib in LIBS.items():
        leaf = lone(lib, kind)
        path = tmp_path / (name if how == "archive=True" else f"{name}.tdz")
        if how == "suffix":
            result = leaf.memmap(path)
        elif how == "archive=True":
            result = leaf.memmap(path, archive=True)
        elif how == "memmap_like":
            result = leaf.memmap_like(path)
        else:
            result = leaf.save(path)
        assert os.path.isfile(path) and zipfile.is_zipfile(path)
        results[name] = (describe(result), result.is_locked, str(result.device))
    assert results["torchdict"] == results["tensordict"]


@pytest.mark.parametrize("kind", ["data", "stack"])
def test_lone_leaf_archives_load_in_either_library(tmp_path, kind):
    for writer_name, writer in LIBS.items():
        path = tmp_path / f"{writer_name}.tdz"
        lone(writer, kind).memmap(path)
        expected = describe(lone(torchdict, kind).memmap(tmp_path / f"{writer_name}-folder"))
        for reader in LIBS.values():
            cls = reader.NonTensorData if kind == "data" else reader.NonTensorStack
            assert describe(cls.load_memmap(path))[1:3] == expected[1:3]
            assert describe(reader.TensorDict.load_memmap(path))[1:] == expected[1:]


def test_lone_leaf_archive_keywords(tmp_path):
    leaf = torchdict.NonTensorData(("not", "json"))
    with pytest.raises(TypeError, match="allow_pickle"):
        leaf.memmap(tmp_path / "refused.tdz")
    assert not os.path.exists(tmp_path / "refused.tdz")
    saved = leaf.memmap(tmp_path / "pickled.tdz", allow_pickle=True)
    assert saved.data == ("not", "json")
    with pytest.raises(RuntimeError, match="already exists"):
        torchdict.NonTensorData("x").memmap(tmp_path / "pickled.tdz", existsok=False)
    stack = torchdict.NonTensorStack(("a",), ("b",)).memmap(tmp_path / "stack.tdz", allow_pickle=True)
    assert stack.tolist() == [("a",), ("b",)]
    with pytest.raises(RuntimeError, match="allow_pickle"):
        torchdict.NonTensorStack.load_memmap(tmp_path / "stack.tdz")
    loaded = torchdict.NonTensorStack.load_memmap(tmp_path / "stack.tdz", allow_pickle=True)
    assert loaded.tolist() == [("a",), ("b",)]
    assert torchdict.NonTensorData("x").memmap(tmp_path / "early.tdz", return_early=True).result().data == "x"
    with pytest.raises(ValueError, match="share_non_tensor"):
        torchdict.NonTensorData("x").memmap(tmp_path / "shared.tdz", share_non_tensor=True)
    with pytest.raises(ValueError, match="compression"):
        torchdict.NonTensorData("x").memmap(tmp_path / "folder", compression="deflate")
    with pytest.raises(TypeError, match="archive"):
        torchdict.NonTensorData("x").memmap_(tmp_path / "in_place", archive=True)
