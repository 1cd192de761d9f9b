"""File safety of saved folders: no symlink is followed (save and load), and a save over an existing
save is written beside it and swapped in, so the path always loads as the old or the new save."""
from __future__ import annotations

import fcntl
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch

import torchdict._folder_swap as folder_swap
import torchdict.saving as saving
from torchdict import NonTensorData, TensorDict

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")


# ---------------------------------------------------------------- helpers
def assert_same(actual: TensorDict, expected: TensorDict) -> None:
    """Same keys in the same order, same batch size, tensors bit for bit, same non-tensor values."""
    assert actual.batch_size == expected.batch_size
    assert list(actual.keys(True, True)) == list(expected.keys(True, True))
    for key in expected.keys(True, True):
        want, got = expected.get(key), actual.get(key)
        if isinstance(want, torch.Tensor):
            assert got.dtype == want.dtype and got.shape == want.shape, key
            assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), key
        else:
            assert got.tolist() == want.tolist(), key


def old_td() -> TensorDict:
    td = TensorDict({"a": torch.zeros(4, 3), "sub": {"c": torch.arange(4)}}, batch_size=[4])
    td["blob"] = b"old bytes"  # pickled (allow_pickle=True)
    return td


def new_td() -> TensorDict:
    td = TensorDict({"a": torch.ones(4, 3), "sub": {"c": torch.arange(4) + 10}}, batch_size=[4])
    td["blob"] = b"new bytes"
    return td


def snapshot_tree(folder) -> dict:
    """Every file under ``folder`` with its bytes (symlinks as their target), to show nothing changed."""
    found = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, folder)
            if os.path.islink(path):
                found[rel] = ("link", os.readlink(path))
            elif os.path.isfile(path):
                with open(path, "rb") as handle:
                    found[rel] = handle.read()
            else:
                found[rel] = "dir"
    return found


def siblings(prefix) -> set:
    """The hidden swap siblings of ``prefix`` that exist."""
    return {kind for kind in ("new", "spare", "old") if os.path.lexists(folder_swap.sibling(str(prefix), kind))}


@pytest.fixture
def outside(tmp_path):
    """A folder outside every save, with a file and a sub-folder a planted symlink may point at."""
    folder = tmp_path / "outside"
    (folder / "dir").mkdir(parents=True)
    (folder / "victim.bin").write_bytes(b"do not touch" * 10)
    (folder / "dir" / "victim.bin").write_bytes(b"nor this")
    return folder


# Each file kind a saved folder holds: (name inside the folder, what the link points at).
KINDS = {
    "data file": ("a.memmap", "victim.bin"),
    "nested data file": ("sub/c.memmap", "victim.bin"),
    "pickle": ("blob.pickle", "victim.bin"),
    "meta.json": ("meta.json", "victim.bin"),
    "nested meta.json": ("sub/meta.json", "victim.bin"),
    "sub-folder": ("sub", "dir"),
}


def plant(folder, name: str, target) -> str:
    """Replace ``folder/name`` (file or folder) by a symlink to ``target``; returns the link's path."""
    path = os.path.join(folder, name)
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    os.symlink(target, path)
    return path


# ---------------------------------------------------------------- symlinks: saving
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("method", ["memmap", "memmap_", "memmap_like"])
@pytest.mark.parametrize("existing", ["over a save", "into a new folder"])
def test_a_save_refuses_a_symlink_in_the_folder(tmp_path, outside, kind, method, existing):
    prefix = tmp_path / "ckpt"
    if existing == "over a save":
        old_td().memmap(prefix, allow_pickle=True)
    name, target = KINDS[kind]
    link = plant(prefix, name, outside / target)
    before_outside, before_folder = snapshot_tree(outside), snapshot_tree(prefix)
    with pytest.raises(RuntimeError, match="symlink") as raised:
        getattr(new_td(), method)(prefix, allow_pickle=True)
    assert link in str(raised.value)
    assert snapshot_tree(outside) == before_outside  # nothing written outside the folder
    assert snapshot_tree(prefix) == before_folder  # refused before anything was written
    assert siblings(prefix) == set()


def test_the_pickle_file_of_memmap_allow_pickle_is_not_written_through_a_link(tmp_path, outside):
    """The reported hole: td.memmap(path, allow_pickle=True) wrote through a planted .pickle link."""
    prefix = tmp_path / "ckpt"
    prefix.mkdir()
    os.symlink(outside / "victim.bin", prefix / "blob.pickle")
    with pytest.raises(RuntimeError, match=r"symlink .*blob\.pickle"):
        new_td().memmap(prefix, allow_pickle=True)
    assert (outside / "victim.bin").read_bytes() == b"do not touch" * 10


def test_a_link_at_the_temporary_meta_name_is_removed_not_followed(tmp_path, outside):
    prefix = tmp_path / "ckpt"
    prefix.mkdir()
    temporary = prefix / f"%meta-{os.getpid()}-{threading.get_ident()}.tmp"
    os.symlink(outside / "victim.bin", temporary)
    new_td().memmap(prefix, allow_pickle=True)
    assert (outside / "victim.bin").read_bytes() == b"do not touch" * 10
    assert not os.path.lexists(temporary)
    assert_same(TensorDict.load_memmap(prefix, allow_pickle=True), new_td())


@pytest.mark.parametrize("kind", ["new", "spare", "old"])
def test_a_link_at_a_swap_sibling_name_is_removed_not_followed(tmp_path, outside, kind):
    prefix = tmp_path / "ckpt"
    old_td().memmap(prefix, allow_pickle=True)
    os.symlink(outside / "dir", folder_swap.sibling(str(prefix), kind))
    before = snapshot_tree(outside)
    new_td().memmap(prefix, allow_pickle=True)
    assert snapshot_tree(outside) == before
    assert_same(TensorDict.load_memmap(prefix, allow_pickle=True), new_td())
    assert siblings(prefix) == {"spare"} and not os.path.islink(folder_swap.sibling(str(prefix), "spare"))


def test_the_folder_named_by_the_caller_may_be_a_symlink(tmp_path):
    real = tmp_path / "real"
    link = tmp_path / "latest"
    old_td().memmap(real, allow_pickle=True)
    os.symlink(real, link)
    new_td().memmap(link, allow_pickle=True)  # a swap: done where the folder really lies
    assert os.path.islink(link) and os.readlink(link) == str(real)
    assert_same(TensorDict.load_memmap(link, allow_pickle=True), new_td())
    assert siblings(real) == {"spare"} and siblings(link) == set()


# ---------------------------------------------------------------- symlinks: loading
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("mode", ["r+", "r"])
def test_a_load_refuses_a_symlink_in_the_folder(tmp_path, kind, mode):
    prefix = tmp_path / "ckpt"
    old_td().memmap(prefix, allow_pickle=True)
    name, _ = KINDS[kind]
    # The link points at a valid copy of what it replaces: following it would load fine, and
    # with mode="r+" writes to the loaded tensors would land in the copy, outside the folder.
    copy = tmp_path / "outside-copy"
    source = prefix / name
    if source.is_dir():
        shutil.copytree(source, copy)
    else:
        shutil.copyfile(source, copy)
    link = plant(prefix, name, copy)
    before = snapshot_tree(tmp_path / "outside-copy") if copy.is_dir() else copy.read_bytes()
    with pytest.raises(RuntimeError, match="symlink") as raised:
        TensorDict.load_memmap(prefix, allow_pickle=True, mode=mode)
    assert link in str(raised.value)
    after = snapshot_tree(copy) if copy.is_dir() else copy.read_bytes()
    assert after == before


def test_a_load_refuses_a_fifo_instead_of_blocking(tmp_path):
    prefix = tmp_path / "ckpt"
    old_td().memmap(prefix, allow_pickle=True)
    os.unlink(prefix / "meta.json")
    os.mkfifo(prefix / "meta.json")
    with pytest.raises(RuntimeError, match="not a regular file"):
        TensorDict.load_memmap(prefix, allow_pickle=True)


def test_the_folder_given_to_load_may_be_a_symlink(tmp_path):
    old_td().memmap(tmp_path / "real", allow_pickle=True)
    os.symlink(tmp_path / "real", tmp_path / "latest")
    assert_same(TensorDict.load_memmap(tmp_path / "latest", allow_pickle=True), old_td())


def _upstream_folder(folder) -> None:
    """A small folder in upstream tensordict 0.15's layout: one tensor, one nested TensorDict."""
    td_type = "<class 'tensordict._td.TensorDict'>"
    os.makedirs(folder / "sub")
    tensor_meta = {"device": "cpu", "shape": [2], "dtype": "torch.float32", "is_nested": False}
    (folder / "meta.json").write_text(json.dumps({"x": tensor_meta, "sub": {"type": "TensorDict"}, "shape": [2],
                                                  "device": "cpu", "_type": td_type}))
    (folder / "x.memmap").write_bytes(torch.ones(2).numpy().tobytes())
    (folder / "sub" / "meta.json").write_text(json.dumps({"y": tensor_meta, "shape": [2], "device": "cpu",
                                                          "_type": td_type}))
    (folder / "sub" / "y.memmap").write_bytes(torch.ones(2).numpy().tobytes())


@pytest.mark.parametrize("name", ["x.memmap", "sub", "sub/y.memmap", "meta.json"])
def test_an_upstream_folder_with_a_symlink_is_refused(tmp_path, name):
    folder = tmp_path / "upstream"
    _upstream_folder(folder)
    assert TensorDict.load_memmap(folder)["sub", "y"].tolist() == [1.0, 1.0]
    copy = tmp_path / "copy"
    (shutil.copytree if (folder / name).is_dir() else shutil.copyfile)(folder / name, copy)
    link = plant(folder, name, copy)
    with pytest.raises(RuntimeError, match="symlink") as raised:
        TensorDict.load_memmap(folder)
    assert link in str(raised.value)


def test_upstream_other_pickle_is_not_read_through_a_link(tmp_path):
    folder = tmp_path / "upstream"
    os.makedirs(folder)
    (folder / "meta.json").write_text(json.dumps({"_type": "<class 'tensordict.tensorclass.NonTensorData'>",
                                                  "shape": []}))
    (tmp_path / "elsewhere.pickle").write_bytes(pickle.dumps({"data": 3}))
    os.symlink(tmp_path / "elsewhere.pickle", folder / "other.pickle")
    with pytest.raises(RuntimeError, match="symlink"):
        TensorDict.load_memmap(folder, allow_pickle=True)


# ---------------------------------------------------------------- the swap
def test_a_save_over_a_save_is_swapped_in_and_the_old_one_kept_as_spare(tmp_path):
    prefix = tmp_path / "ckpt"
    old_td().memmap(prefix, allow_pickle=True)
    assert siblings(prefix) == set()  # a new folder is written in place
    saved = new_td().memmap(prefix, allow_pickle=True)
    assert_same(TensorDict.load_memmap(prefix, allow_pickle=True), new_td())
    assert saved.saved_path == str(prefix) and saved["a"].filename == str(prefix / "a.memmap")
    spare = folder_swap.sibling(str(prefix), "spare")
    assert siblings(prefix) == {"spare"}
    assert not os.path.exists(os.path.join(spare, "meta.json"))  # never loads as a save
    with pytest.raises(FileNotFoundError, match="did not finish"):
        TensorDict.load_memmap(spare)


def test_the_next_save_rewrites_the_spare_files_in_place(tmp_path):
    """The speed of an overwrite: the files of the version replaced last time are reused."""
    prefix = tmp_path / "ckpt"
    for td in (old_td(), new_td()):
        td.memmap(prefix, allow_pickle=True)
    spare = folder_swap.sibling(str(prefix), "spare")
    spare_inode = os.stat(os.path.join(spare, "a.memmap")).st_ino
    third = TensorDict({"a": torch.full((4, 3), 7.0), "sub": {"c": torch.arange(4)}, "blob": "text"},
                       batch_size=[4])
    third.memmap(prefix, allow_pickle=True)
    assert os.stat(prefix / "a.memmap").st_ino == spare_inode
    assert_same(TensorDict.load_memmap(prefix), third)
    assert not os.path.exists(prefix / "blob.pickle")  # files of the spare the save does not hold are gone
    assert sorted(os.listdir(prefix)) == ["a.memmap", "meta.json", "sub"]


def test_memmap_in_place_again_keeps_the_same_files(tmp_path):
    prefix = tmp_path / "ckpt"
    td = TensorDict({"a": torch.arange(6.0), "sub": {"c": torch.ones(6, 3)}}, batch_size=[6])
    td.memmap_(prefix)
    leaf = td["a"]
    inode = os.stat(prefix / "a.memmap").st_ino
    td.unlock_()
    td["a"][0] = 42.0  # writes go to the file
    td.memmap_(prefix)
    assert td["a"] is leaf  # nothing was rewritten or remapped
    assert os.stat(prefix / "a.memmap").st_ino == inode
    td["a"][1] = 43.0
    assert TensorDict.load_memmap(prefix)["a"][:2].tolist() == [42.0, 43.0]


def test_a_save_never_writes_a_file_another_name_links(tmp_path):
    """memmap_ again links unchanged files into the new folder; the spare then shares them with
    whatever maps them, so the next save must write new files rather than rewrite those."""
    prefix = tmp_path / "ckpt"
    td = TensorDict({"a": torch.arange(6.0)}, batch_size=[])
    td.memmap_(prefix)
    td.memmap_(prefix)  # the old folder (now the spare) and the new one link the same file
    other = TensorDict({"a": torch.full((6,), -1.0)}, batch_size=[])
    other.memmap(prefix)  # starts from the spare, whose file is also the saved one
    assert td["a"].tolist() == list(range(6))  # that file was not rewritten: the save was beside it
    assert TensorDict.load_memmap(prefix)["a"].tolist() == [-1.0] * 6


def test_saving_a_loaded_td_back_after_another_save_writes_its_own_data(tmp_path):
    prefix = tmp_path / "ckpt"
    old_td().memmap(prefix, allow_pickle=True)
    loaded = TensorDict.load_memmap(prefix, allow_pickle=True)
    new_td().memmap(prefix, allow_pickle=True)  # prefix/a.memmap now names another file
    loaded.memmap(prefix, allow_pickle=True)
    assert_same(TensorDict.load_memmap(prefix, allow_pickle=True), old_td())


def test_without_hard_links_an_unchanged_leaf_is_copied(tmp_path, monkeypatch):
    prefix = tmp_path / "ckpt"
    td = TensorDict({"a": torch.arange(6.0)}, batch_size=[])
    td.memmap_(prefix)

    def no_links(*args, **kwargs):
        raise OSError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    td.memmap_(prefix)
    assert TensorDict.load_memmap(prefix)["a"].tolist() == list(range(6))
    td["a"][0] = 9.0
    assert TensorDict.load_memmap(prefix)["a"][0].item() == 9.0  # td maps the saved file


def test_a_folder_holding_other_files_is_written_in_place(tmp_path):
    prefix = tmp_path / "run"
    old_td().memmap(prefix, allow_pickle=True)
    (prefix / "train.log").write_text("epoch 1")
    new_td().memmap(prefix, allow_pickle=True)
    assert (prefix / "train.log").read_text() == "epoch 1"  # never deleted with an old save
    assert siblings(prefix) == set()
    assert_same(TensorDict.load_memmap(prefix, allow_pickle=True), new_td())


def test_the_new_folder_keeps_the_permissions_of_the_old_one(tmp_path):
    prefix = tmp_path / "ckpt"
    old_td().memmap(prefix, allow_pickle=True)
    os.chmod(prefix, 0o750)
    new_td().memmap(prefix, allow_pickle=True)
    assert os.stat(prefix).st_mode & 0o7777 == 0o750


def test_without_renameat2_the_swap_takes_two_renames(tmp_path, monkeypatch):
    monkeypatch.setattr(folder_swap, "_exchange", lambda first, second: False)
    prefix = tmp_path / "ckpt"
    for td in (old_td(), new_td(), old_td()):
        td.memmap(prefix, allow_pickle=True)
        assert_same(TensorDict.load_memmap(prefix, allow_pickle=True), td)
        assert siblings(prefix) <= {"spare"}


def test_memmap_like_over_a_save_works_in_place(tmp_path):
    prefix = tmp_path / "ckpt"
    data = TensorDict({"x": torch.arange(5.0)}, batch_size=[5])
    data.memmap(prefix)
    like = data.memmap_like(prefix)
    assert like["x"].tolist() == list(range(5))  # the existing file keeps its bytes
    assert siblings(prefix) == set()


def test_saves_to_one_path_wait_for_each_other(tmp_path):
    prefix = tmp_path / "ckpt"
    old_td().memmap(prefix, allow_pickle=True)
    work = folder_swap.sibling(str(prefix), "new")
    os.mkdir(work)
    fd = os.open(work, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # as a save in progress holds it
    try:
        future = new_td().memmap(prefix, allow_pickle=True, return_early=True)
        time.sleep(0.3)
        assert not future.done()
    finally:
        os.close(fd)
    future.result(timeout=60)
    assert_same(TensorDict.load_memmap(prefix, allow_pickle=True), new_td())


def test_concurrent_saves_leave_one_whole_save(tmp_path):
    prefix = tmp_path / "ckpt"
    old_td().memmap(prefix, allow_pickle=True)
    sources = [TensorDict({"a": torch.full((64, 3), float(i)), "sub": {"c": torch.arange(64) + i}}, batch_size=[64])
               for i in range(4)]
    futures = [source.memmap(prefix, return_early=True, num_threads=2) for source in sources]
    for future in futures:
        future.result(timeout=120)
    loaded = TensorDict.load_memmap(prefix)
    value = int(loaded["a"][0, 0].item())
    assert_same(loaded, sources[value])
    assert siblings(prefix) == {"spare"}


# ---------------------------------------------------------------- failed saves
def test_a_save_refused_before_writing_leaves_the_old_save(tmp_path):
    prefix = tmp_path / "ckpt"
    old_td().memmap(prefix, allow_pickle=True)
    before = snapshot_tree(prefix)
    with pytest.raises(TypeError, match="allow_pickle=True"):
        new_td().memmap(prefix)
    assert snapshot_tree(prefix) == before and siblings(prefix) == set()


@pytest.mark.parametrize("num_threads", [0, 3])
@pytest.mark.parametrize("method", ["memmap", "memmap_"])
def test_a_save_failing_midway_leaves_the_old_save(tmp_path, monkeypatch, num_threads, method):
    prefix = tmp_path / "ckpt"
    old = TensorDict({f"k{i}": torch.full((5, 2), float(i)) for i in range(12)}, batch_size=[5])
    old.memmap(prefix)
    new = TensorDict({f"k{i}": torch.full((5, 2), -float(i)) for i in range(12)}, batch_size=[5])
    new.memmap(prefix)
    old.memmap(prefix)  # prefix holds old, its spare holds new's files
    write = saving.write_tensor_file
    calls = []

    def fail_on_the_fifth(path, tensor, **kwargs):
        calls.append(path)
        if len(calls) == 5:
            raise OSError(28, "No space left on device", path)
        return write(path, tensor, **kwargs)

    monkeypatch.setattr(saving, "write_tensor_file", fail_on_the_fifth)
    source = new.clone()
    with pytest.raises(OSError, match="No space left"):
        getattr(source, method)(prefix, num_threads=num_threads)
    assert not source.is_memmap()
    assert_same(TensorDict.load_memmap(prefix), old)
    assert siblings(prefix) == {"spare"}
    monkeypatch.undo()
    new.memmap(prefix)  # and the next save goes through
    assert_same(TensorDict.load_memmap(prefix), new)


def test_a_save_failing_at_its_last_meta_json_leaves_the_old_save(tmp_path, monkeypatch):
    prefix = tmp_path / "ckpt"
    old_td().memmap(prefix, allow_pickle=True)
    write_meta = saving.write_meta_atomic

    def fail_at_root(folder, meta):
        if folder == folder_swap.sibling(str(prefix), "new"):
            raise OSError(5, "Input/output error")
        write_meta(folder, meta)

    monkeypatch.setattr(saving, "write_meta_atomic", fail_at_root)
    with pytest.raises(OSError, match="Input/output"):
        new_td().memmap(prefix, allow_pickle=True)
    assert_same(TensorDict.load_memmap(prefix, allow_pickle=True), old_td())


# ---------------------------------------------------------------- recovery of an interrupted swap
def _interrupted_swap(tmp_path, with_new: bool):
    """The state a kill between the two renames of a swap leaves: no folder, the old one aside."""
    prefix = tmp_path / "ckpt"
    old_td().memmap(prefix, allow_pickle=True)
    os.rename(prefix, folder_swap.sibling(str(prefix), "old"))
    if with_new:
        new_td().memmap(tmp_path / "complete", allow_pickle=True)
        os.rename(tmp_path / "complete", folder_swap.sibling(str(prefix), "new"))
    return prefix


@pytest.mark.parametrize("with_new", [True, False], ids=["roll-forward", "roll-back"])
def test_a_load_finishes_an_interrupted_swap(tmp_path, with_new):
    prefix = _interrupted_swap(tmp_path, with_new)
    expected = new_td() if with_new else old_td()
    assert_same(TensorDict.load_memmap(prefix, allow_pickle=True), expected)
    assert prefix.is_dir()
    assert_same(TensorDict.load_memmap(prefix, allow_pickle=True), expected)


def test_a_sub_folder_of_an_interrupted_swap_loads(tmp_path):
    prefix = _interrupted_swap(tmp_path, with_new=True)
    assert TensorDict.load_memmap(prefix / "sub")["c"].tolist() == [10, 11, 12, 13]


def test_a_load_that_cannot_rename_reads_the_sibling_where_it_is(tmp_path, monkeypatch):
    prefix = _interrupted_swap(tmp_path, with_new=True)

    def read_only(*args, **kwargs):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(os, "rename", read_only)
    assert_same(TensorDict.load_memmap(prefix, allow_pickle=True, mode="r"), new_td())
    assert not prefix.exists()


def test_a_save_finishes_an_interrupted_swap_first(tmp_path):
    prefix = _interrupted_swap(tmp_path, with_new=True)
    third = TensorDict({"a": torch.full((4, 3), 3.0)}, batch_size=[4])
    third.memmap(prefix)
    assert_same(TensorDict.load_memmap(prefix), third)
    assert siblings(prefix) == {"spare"}


def test_a_missing_folder_without_siblings_still_reports_it_missing(tmp_path):
    with pytest.raises(FileNotFoundError):
        TensorDict.load_memmap(tmp_path / "nothing" / "here")


# ---------------------------------------------------------------- killed saves (processes)
_CHILD = textwrap.dedent(
    """
    import os, signal, sys, time
    sys.path.insert(0, {src!r})
    import torch
    import torchdict._folder_swap as folder_swap
    import torchdict.saving as saving
    from torchdict import TensorDict

    prefix, point, size, threads, exchange = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    if exchange == "off":
        folder_swap._exchange = lambda first, second: False

    def die():
        os.kill(os.getpid(), signal.SIGKILL)

    if point == "before-exchange":
        exchange_folders = folder_swap._exchange
        folder_swap._exchange = lambda first, second: die()
    elif point == "after-exchange":
        exchange_folders = folder_swap._exchange
        def exchange_then_die(first, second):
            exchange_folders(first, second)
            die()
        folder_swap._exchange = exchange_then_die
    elif point in ("after-aside", "before-spare"):  # the two-rename swap, and the retirement
        rename = os.rename
        def rename_then_die(source, target):
            if point == "before-spare" and target.endswith(".torchdict-spare"):
                die()
            rename(source, target)
            if point == "after-aside" and target.endswith(".torchdict-old"):
                die()
        os.rename = rename_then_die
    elif point == "after-first-leaf":
        write = saving.write_tensor_file
        def write_then_die(*args, **kwargs):
            write(*args, **kwargs)
            die()
        saving.write_tensor_file = write_then_die

    new = {{f"w{{i}}": torch.full((size,), 2.0 + i) for i in range(24)}}
    new["nested"] = {{f"v{{i}}": torch.full((size // 4,), -1.0 - i) for i in range(8)}}
    td = TensorDict(new, batch_size=[])
    td["note"] = "new"
    print("go", flush=True)
    start = time.perf_counter()
    td.memmap(prefix, num_threads=threads)
    print(time.perf_counter() - start, flush=True)
    """
)


def _old_save(size: int) -> TensorDict:
    old = {f"w{i}": torch.full((size,), 100.0 + i) for i in range(20)}
    old["nested"] = {f"v{i}": torch.full((size // 2,), 7.0) for i in range(5)}
    td = TensorDict(old, batch_size=[])
    td["note"] = "old"
    return td


def _new_save(size: int) -> TensorDict:
    new = {f"w{i}": torch.full((size,), 2.0 + i) for i in range(24)}
    new["nested"] = {f"v{i}": torch.full((size // 4,), -1.0 - i) for i in range(8)}
    td = TensorDict(new, batch_size=[])
    td["note"] = "new"
    return td


def _start_child(prefix, point: str, size: int, threads: int, exchange: str) -> subprocess.Popen:
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD.format(src=SRC), str(prefix), point, str(size), str(threads), exchange],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "go", child.stderr.read()
    return child


def _has_exchange(tmp_path) -> bool:
    first, second = tmp_path / "exchange-a", tmp_path / "exchange-b"
    first.mkdir()
    second.mkdir()
    return folder_swap._exchange(str(first), str(second))


def _loads_as_old_or_new(prefix, size: int) -> str:
    loaded = TensorDict.load_memmap(prefix)
    which = loaded["note"]
    assert_same(loaded, _old_save(size) if which == "old" else _new_save(size))
    return which


def _prepare_old(prefix, size: int, with_spare: bool) -> None:
    """An old save at ``prefix``; with a spare beside it (the files the next save rewrites in place)."""
    _old_save(size).memmap(prefix)
    if with_spare:
        _new_save(size).memmap(prefix)
        _old_save(size).memmap(prefix)


# When each kill comes, as a fraction of the same save's duration: from right at its start to after its end.
_KILL_MOMENTS = (0.0, 0.05, 0.15, 0.3, 0.45, 0.6, 0.75, 0.9, 1.0, 1.3)


@pytest.mark.slow
@pytest.mark.parametrize("exchange", ["on", "off"], ids=["renameat2", "two-renames"])
def test_a_save_killed_at_any_moment_loads_as_the_old_or_the_new_save(tmp_path, exchange, monkeypatch):
    """SIGKILL a save over an existing one at 10 moments spread over its duration (varied sizes)."""
    if exchange == "on" and not _has_exchange(tmp_path):
        pytest.skip("no renameat2(RENAME_EXCHANGE) here")
    if exchange == "off":
        monkeypatch.setattr(folder_swap, "_exchange", lambda first, second: False)  # for the timing runs
    seen = []
    for moment, fraction in enumerate(_KILL_MOMENTS):
        scale = (1 << 20) >> (moment % 3)  # 24 leaves of 4, 2 or 1 MB
        with_spare, threads = moment % 2 == 1, 1 + moment % 3
        # The duration of this very save, measured on an identical folder: the kill comes at a fraction of it.
        scratch = tmp_path / f"timing{moment}"
        _prepare_old(scratch, scale, with_spare)
        start = time.perf_counter()
        _new_save(scale).memmap(scratch, num_threads=threads)
        duration = time.perf_counter() - start
        prefix = tmp_path / f"ckpt{moment}"
        _prepare_old(prefix, scale, with_spare)
        child = _start_child(prefix, "none", scale, threads, exchange)
        time.sleep(duration * fraction)
        child.send_signal(signal.SIGKILL)
        child.communicate(timeout=240)
        seen.append(_loads_as_old_or_new(prefix, scale))
        _new_save(scale).memmap(prefix)  # and the next save cleans up after it
        assert_same(TensorDict.load_memmap(prefix), _new_save(scale))
        assert siblings(prefix) == {"spare"}
        shutil.rmtree(scratch)
    assert seen[0] == "old"  # killed as it starts: nothing of the new save is visible


@pytest.mark.slow
@pytest.mark.parametrize(
    "point, exchange, expected",
    [
        ("after-first-leaf", "on", "old"),
        ("before-exchange", "on", "old"),
        ("after-exchange", "on", "new"),
        ("before-spare", "on", "new"),
        ("after-aside", "off", "new"),
        ("before-spare", "off", "new"),
    ],
)
def test_a_save_killed_at_each_step_of_the_swap(tmp_path, point, exchange, expected):
    if exchange == "on" and not _has_exchange(tmp_path):
        pytest.skip("no renameat2(RENAME_EXCHANGE) here")
    size = 1024
    prefix = tmp_path / "ckpt"
    _old_save(size).memmap(prefix)
    child = _start_child(prefix, point, size, 2, exchange)
    _, err = child.communicate(timeout=240)
    assert child.returncode == -signal.SIGKILL, err
    if point == "after-aside":
        assert not prefix.exists()  # the moment between the two renames
    assert _loads_as_old_or_new(prefix, size) == expected
    _old_save(size).memmap(prefix)
    assert_same(TensorDict.load_memmap(prefix), _old_save(size))
    assert siblings(prefix) == {"spare"}


def test_non_tensor_data_round_trips_through_a_swap(tmp_path):
    prefix = tmp_path / "ckpt"
    TensorDict(a=torch.zeros(2), meta=NonTensorData("x")).memmap(prefix)
    TensorDict(a=torch.ones(2), meta=NonTensorData("y")).memmap(prefix)
    assert TensorDict.load_memmap(prefix)["meta"] == "y"


def test_the_working_directory_is_saved_in_place(tmp_path, monkeypatch):
    prefix = tmp_path / "ckpt"
    old_td().memmap(prefix, allow_pickle=True)
    monkeypatch.chdir(prefix)
    new_td().memmap(".", allow_pickle=True)
    assert os.getcwd() == str(prefix) and siblings(prefix) == set()
    assert_same(TensorDict.load_memmap(".", allow_pickle=True), new_td())
