"""Saving and loading TensorDicts (memmap, memmap_, memmap_like, load_memmap), stated against plain torch."""
from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
from concurrent.futures import Future

import pytest
import torch

from torchdict import MemoryMappedTensor, NonTensorData, NonTensorStack, TensorDict
from torchdict.saving import key_to_filename

from _dtype_samples import ALL_DTYPES, sample
from _helpers import assert_same_snapshot, snapshot

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")


def same_bits(left: torch.Tensor, right: torch.Tensor) -> bool:
    """Same dtype, shape and bytes (works for every dtype, NaNs and float8 included)."""
    if left.dtype != right.dtype or left.shape != right.shape:
        return False
    return torch.equal(left.contiguous().reshape(-1).view(torch.uint8), right.contiguous().reshape(-1).view(torch.uint8))


def assert_same_content(actual: TensorDict, expected: TensorDict) -> None:
    """Same batch size, same keys in the same order, same leaves (tensors bit for bit)."""
    assert actual.batch_size == expected.batch_size
    assert list(actual.keys(include_nested=True)) == list(expected.keys(include_nested=True))
    for key in expected.keys(include_nested=True):
        want, got = expected.get(key), actual.get(key)
        if isinstance(want, torch.Tensor):
            assert isinstance(got, torch.Tensor), key
            assert same_bits(got, want.detach().resolve_conj()), key
        elif isinstance(want, (NonTensorData, NonTensorStack)):
            assert type(got) is type(want), key
            assert got.batch_size == want.batch_size and got.tolist() == want.tolist(), key
        else:
            assert got.batch_size == want.batch_size, key


def files_under(folder) -> set:
    found = set()
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            found.add(os.path.relpath(os.path.join(root, name), folder))
    return found


def make_td() -> TensorDict:
    td = TensorDict(
        {
            "obs": torch.randn(4, 3),
            "key 1": torch.arange(4),
            "nested": {"mask": torch.tensor([True, False, True, True]), "deeper": {"x": torch.ones(4, 2, 2)}},
        },
        batch_size=[4],
    )
    td["text"] = "a string!"
    return td


# ---------------------------------------------------------------- round trips
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_every_dtype_round_trips_bit_for_bit(tmp_path, dtype):
    source = TensorDict({"x": sample(dtype), "scalar": sample(dtype, ())[()].expand(3)}, batch_size=[3])
    saved = source.memmap(tmp_path)
    loaded = TensorDict.load_memmap(tmp_path)
    for result in (saved, loaded):
        assert_same_content(result, source)
        assert type(result["x"]) is MemoryMappedTensor


@pytest.mark.parametrize(
    "leaf, batch_size",
    [
        (torch.tensor(2.5), []),  # 0-dim
        (torch.zeros(0, 3), [0]),  # empty
        (torch.arange(12.0).view(3, 4).t(), [4]),  # non-contiguous
        (torch.arange(3.0).expand(5, 3), [5]),  # expanded (stride 0)
        (torch.arange(10.0)[::3], [4]),  # strided
        (torch.complex(torch.ones(2), torch.ones(2)).conj(), [2]),  # lazy conjugate
    ],
    ids=["0-dim", "empty", "transposed", "expanded", "strided", "conj"],
)
def test_any_layout_round_trips_as_a_dense_c_order_file(tmp_path, leaf, batch_size):
    source = TensorDict({"x": leaf}, batch_size=batch_size)
    source.memmap(tmp_path)
    assert_same_content(TensorDict.load_memmap(tmp_path), source)
    assert os.path.getsize(tmp_path / "x.memmap") == leaf.numel() * leaf.element_size()


def test_nested_and_non_tensor_entries_round_trip(tmp_path):
    source = make_td()
    source.set_non_tensor("config", {"lr": 0.1, "layers": [1, 2, None], "name": "ü"})
    source.set_non_tensor("count", 3)
    source["per_item"] = ["a", "b", "c", "d"]
    loaded = TensorDict.load_memmap(source.memmap(tmp_path).saved_path)
    assert_same_content(loaded, source)
    assert loaded["text"] == "a string!" and loaded["per_item"] == ["a", "b", "c", "d"]
    assert loaded.get_non_tensor("config") == {"lr": 0.1, "layers": [1, 2, None], "name": "ü"}
    assert loaded.get_non_tensor("count") == 3


def test_names_batch_size_and_device_are_kept(tmp_path):
    source = TensorDict({"x": torch.zeros(2, 3, 4)}, batch_size=[2, 3], names=["env", "time"])
    loaded = TensorDict.load_memmap(source.memmap(tmp_path).saved_path)
    assert loaded.names == ["env", "time"] and loaded.batch_size == (2, 3)
    assert loaded.device == torch.device("cpu")


def test_parameters_are_saved_without_their_grad(tmp_path):
    weight = torch.nn.Parameter(torch.randn(4, 3))
    saved = TensorDict({"weight": weight}).memmap(tmp_path)
    assert not saved["weight"].requires_grad and torch.equal(saved["weight"], weight.detach())


# ---------------------------------------------------------------- the result of memmap
def test_memmap_returns_a_locked_cpu_copy_and_leaves_the_source_alone(tmp_path):
    source = make_td()
    before = snapshot(source)
    saved = source.memmap(tmp_path)
    assert_same_snapshot(before, snapshot(source))
    assert saved is not source and saved.is_locked and saved.is_memmap()
    assert saved.device == torch.device("cpu")
    assert saved["nested"].is_memmap() and saved["nested"].saved_path == str(tmp_path / "nested")
    assert saved.saved_path == str(tmp_path)
    assert saved["key 1"].filename == str(tmp_path / "key%201.memmap")
    assert saved["nested", "deeper", "x"].filename == str(tmp_path / "nested" / "deeper" / "x.memmap")
    assert_same_content(saved, source)


def test_writes_to_a_saved_td_reach_the_files(tmp_path):
    saved = make_td().memmap(tmp_path)
    saved["obs"][1] = 42.0
    saved.set_("key 1", torch.full((4,), 9))
    loaded = TensorDict.load_memmap(tmp_path)
    assert torch.equal(loaded["obs"][1], torch.full((3,), 42.0))
    assert loaded["key 1"].tolist() == [9, 9, 9, 9]


def test_loaded_td_is_unlocked_lazy_and_not_memmap(tmp_path):
    make_td().memmap(tmp_path)
    loaded = TensorDict.load_memmap(tmp_path)
    assert not loaded.is_locked and not loaded.is_memmap()
    assert all(type(loaded.get(key)) is MemoryMappedTensor for key in ["obs", ("nested", "deeper", "x")])
    with pytest.raises(AttributeError, match="The tensordict has no saved path"):
        loaded.saved_path
    loaded["obs"][0] = -1.0  # a mapping, not a copy: the write lands in the file
    assert torch.equal(TensorDict.load(tmp_path)["obs"][0], torch.full((3,), -1.0))


def test_unlocking_a_memmap_td_clears_is_memmap(tmp_path):
    saved = make_td().memmap(tmp_path)
    saved.unlock_()
    assert not saved.is_memmap()


def test_memmap_without_prefix_uses_anonymous_shared_memory():
    source = make_td()
    saved = source.memmap()
    assert saved.is_memmap() and saved.is_locked
    assert type(saved["obs"]) is MemoryMappedTensor and saved["obs"].is_shared()
    with pytest.raises(RuntimeError, match="no file associated"):
        saved["obs"].filename
    assert_same_content(saved, source)


def test_save_and_load_are_aliases(tmp_path):
    source = make_td()
    saved = source.save(tmp_path)
    assert saved.is_memmap()
    assert_same_content(TensorDict.load(tmp_path), source)


@pytest.mark.parametrize("num_threads", [0, 1, 3])
def test_thread_pool_writes_the_same_files(tmp_path, num_threads):
    source = TensorDict({f"k{i}": torch.randn(5, i + 1) for i in range(12)}, batch_size=[5])
    source.memmap(tmp_path, num_threads=num_threads)
    assert_same_content(TensorDict.load_memmap(tmp_path, num_threads=num_threads), source)


@pytest.mark.parametrize("num_threads", [0, 3])
def test_a_file_that_cannot_be_written_fails_the_save_from_any_thread(tmp_path, num_threads):
    source = TensorDict({f"k{i}": torch.randn(5, i + 1) for i in range(12)}, batch_size=[5])
    before = snapshot(source)
    (tmp_path / "k7.memmap").mkdir()  # open() of this leaf's file fails in whichever thread takes it
    with pytest.raises(IsADirectoryError):
        source.memmap_(tmp_path, num_threads=num_threads)
    assert not (tmp_path / "meta.json").exists()  # the folder is not a complete save
    assert_same_snapshot(before, snapshot(source))
    assert not source.is_memmap()


def test_return_early_gives_a_future_of_the_saved_td(tmp_path):
    source = make_td()
    future = source.memmap(tmp_path, return_early=True, num_threads=2)
    assert isinstance(future, Future)
    saved = future.result(timeout=60)
    assert saved.is_memmap()
    assert_same_content(TensorDict.load_memmap(tmp_path), source)


def test_memmap_in_place_replaces_the_leaves(tmp_path):
    td = make_td()
    nested = td["nested"]
    assert td.memmap_(tmp_path) is td
    assert td.is_locked and td.is_memmap() and td.saved_path == str(tmp_path)
    assert td["nested"] is nested and type(td["nested", "mask"]) is MemoryMappedTensor
    td["obs"].zero_()
    assert not TensorDict.load_memmap(tmp_path)["obs"].any()


def test_failed_memmap_in_place_changes_nothing(tmp_path):
    td = make_td()
    td["bad"] = b"bytes are not JSON"
    before = snapshot(td)
    with pytest.raises(TypeError, match="allow_pickle=True"):
        td.memmap_(tmp_path / "out")
    assert_same_snapshot(before, snapshot(td))
    assert not td.is_memmap()
    assert not (tmp_path / "out").exists()  # refused before anything was written


# ---------------------------------------------------------------- overwriting and existing files
def test_existsok_false_refuses_before_writing_anything(tmp_path):
    make_td().memmap(tmp_path)
    meta_before = (tmp_path / "meta.json").read_bytes()
    other = make_td()
    with pytest.raises(RuntimeError, match=r"The file .*\.memmap already exists\."):
        other.memmap(tmp_path, existsok=False)
    assert (tmp_path / "meta.json").read_bytes() == meta_before
    other.memmap(tmp_path / "fresh", existsok=False)  # a new folder is fine


def test_saving_again_over_a_previous_save_replaces_it(tmp_path):
    TensorDict({"x": torch.ones(10), "y": torch.ones(3)}, batch_size=[]).memmap(tmp_path)
    source = TensorDict({"x": torch.arange(4.0)}, batch_size=[4])
    source.memmap(tmp_path)
    loaded = TensorDict.load_memmap(tmp_path)
    assert_same_content(loaded, source)
    assert os.path.getsize(tmp_path / "x.memmap") == 16  # the old, longer file was cut


def test_a_file_backed_leaf_is_copied_elsewhere_only_with_copy_existing(tmp_path):
    make_td().memmap(tmp_path / "a")
    loaded = TensorDict.load_memmap(tmp_path / "a")
    with pytest.raises(RuntimeError, match="copy_existing=True"):
        loaded.memmap(tmp_path / "b")
    copied = loaded.memmap(tmp_path / "b", copy_existing=True)
    copied["obs"].zero_()
    assert loaded["obs"].any() and not TensorDict.load_memmap(tmp_path / "b")["obs"].any()


def test_saving_a_loaded_td_back_to_its_own_folder_keeps_the_data(tmp_path):
    source = make_td()
    source.memmap(tmp_path)
    loaded = TensorDict.load_memmap(tmp_path)
    loaded.memmap(tmp_path)
    assert_same_content(TensorDict.load_memmap(tmp_path), source)


def test_saving_a_strided_view_of_a_file_over_that_file(tmp_path):
    source = torch.arange(10.0)
    TensorDict({"x": source}, batch_size=[10]).memmap(tmp_path)
    loaded = TensorDict.load_memmap(tmp_path)
    every_other = TensorDict({"x": loaded["x"][::2]}, batch_size=[5])  # a view into x.memmap
    every_other.memmap(tmp_path)
    assert TensorDict.load_memmap(tmp_path)["x"].tolist() == source[::2].tolist()


# ---------------------------------------------------------------- sub-folders
def test_a_sub_folder_loads_on_its_own(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 3))
    params = TensorDict({name: {"weight": layer.weight.detach(), "bias": layer.bias.detach()}
                         for name, layer in model.named_children()})
    params.memmap(tmp_path, num_threads=2)
    assert files_under(tmp_path) == {
        "meta.json", "0", "0/meta.json", "0/weight.memmap", "0/bias.memmap",
        "1", "1/meta.json", "1/weight.memmap", "1/bias.memmap",
    }
    assert os.path.getsize(tmp_path / "0" / "weight.memmap") == 48
    first = TensorDict.load_memmap(tmp_path / "0")
    assert torch.equal(first["weight"], model[0].weight) and torch.equal(first["bias"], model[0].bias)


# ---------------------------------------------------------------- memmap_like
def test_memmap_like_allocates_sparse_zero_files_of_the_full_size(tmp_path):
    image = torch.full((128, 128, 3), 7, dtype=torch.uint8)
    data = TensorDict({"images": image.expand(10_000, 128, 128, 3), "labels": torch.ones((), dtype=torch.int32)
                       .expand(10_000)}, batch_size=[10_000])
    like = data.memmap_like(tmp_path)
    images = tmp_path / "images.memmap"
    assert os.path.getsize(images) == 10_000 * 128 * 128 * 3
    assert os.stat(images).st_blocks * 512 < (1 << 20)  # no data written
    assert like.is_memmap() and like.is_locked and like.batch_size == (10_000,)
    assert like["images"].shape == (10_000, 128, 128, 3) and like["labels"].dtype == torch.int32
    assert not like["images"][1234].any() and not like["labels"].any()
    picked = like["images"][torch.tensor([1, 5000, 9999])]
    assert type(picked) is torch.Tensor and type(like["images"][3]) is MemoryMappedTensor
    like["labels"][7] = 3
    assert TensorDict.load_memmap(tmp_path)["labels"][7].item() == 3


def test_memmap_like_of_the_seed_dataset_size_stays_sparse(tmp_path):
    data = TensorDict({"images": torch.zeros((128, 128, 3), dtype=torch.uint8).expand(1_000_000, 128, 128, 3),
                       "labels": torch.zeros((), dtype=torch.int).expand(1_000_000)}, batch_size=[1_000_000])
    like = data.memmap_like(tmp_path)
    assert os.path.getsize(tmp_path / "images.memmap") == 1_000_000 * 49152
    assert os.stat(tmp_path / "images.memmap").st_blocks * 512 < (1 << 20)
    like["images"][500_000] = 255
    assert like["images"][torch.tensor([1, 10000, 500000])].sum().item() == 255 * 49152


def test_memmap_like_again_on_the_same_folder_keeps_it_loadable(tmp_path):
    source = make_td()
    first = source.memmap_like(tmp_path)
    first["obs"][0] = 5.0
    meta = (tmp_path / "meta.json").read_bytes()
    again = source.memmap_like(tmp_path)  # same layout: existing bytes and meta.json are kept
    assert (tmp_path / "meta.json").read_bytes() == meta
    assert torch.equal(again["obs"][0], torch.full((3,), 5.0))
    other = TensorDict({"obs": torch.zeros(4, 7, dtype=torch.float64)}, batch_size=[4])
    other.memmap_like(tmp_path)  # a different layout rewrites meta.json
    loaded = TensorDict.load_memmap(tmp_path)
    assert loaded["obs"].shape == (4, 7) and loaded["obs"].dtype == torch.float64
    assert list(loaded.keys()) == ["obs"]


def test_memmap_like_keeps_non_tensor_data_and_nesting(tmp_path):
    source = make_td()
    like = source.memmap_like(tmp_path)
    assert list(like.keys(include_nested=True)) == list(source.keys(include_nested=True))
    assert like["text"] == "a string!" and not like["obs"].any()
    assert like["nested", "deeper", "x"].shape == (4, 2, 2)


# ---------------------------------------------------------------- key escaping
TRAVERSAL_KEYS = ["../x", "/abs", "a/b", ".", "..", "nul\x00byte", "k" * 300, "ключ", "日本語", "", "%", "%~",
                  "meta.json", "x.memmap", "back\\slash", "tab\tkey", "\udcff"]


def test_hostile_keys_round_trip_and_stay_inside_the_prefix(tmp_path):
    prefix = tmp_path / "p"
    source = TensorDict({key: torch.tensor(float(i)) for i, key in enumerate(TRAVERSAL_KEYS)})
    for i, key in enumerate(TRAVERSAL_KEYS):
        source[key + "/sub" if key else "sub"] = {key: torch.tensor(i)}
    source.memmap(prefix)
    assert os.listdir(tmp_path) == ["p"]  # nothing was created beside the prefix
    for name in files_under(prefix):
        path = os.path.realpath(prefix / name)
        assert path.startswith(str(prefix) + os.sep)
        assert len(os.path.basename(name).encode("utf-8", "surrogatepass")) <= 255
    loaded = TensorDict.load_memmap(prefix)
    assert_same_content(loaded, source)


@pytest.mark.parametrize(
    "key, name",
    [("plain", "plain"), ("key 1", "key%201"), ("a/b", "a%2Fb"), ("..", "%2E%2E"), (".", "%2E"), ("", "%"),
     ("100%", "100%25"), ('<>:"|?*\\', "%3C%3E%3A%22%7C%3F%2A%5C"), ("nul\x00", "nul%00"), ("del\x7f", "del%7F"),
     ("ключ", "ключ"), ("..x", "..x")],
)
def test_key_escaping_matches_upstream(key, name):
    assert key_to_filename(key) == name


def test_long_keys_are_hashed_to_distinct_short_names():
    first, second = "x" * 300 + "1", "x" * 300 + "2"
    assert key_to_filename(first) != key_to_filename(second)
    assert len(key_to_filename("é" * 300).encode("utf-8")) <= 200
    assert "%~" in key_to_filename(first) and "%~" not in key_to_filename("%~")


@pytest.mark.parametrize("key", ["meta.json", "x.memmap", "y.pickle", "z.json"])
def test_folder_names_never_look_like_files_beside_them(key):
    name = key_to_filename(key, directory=True)
    assert name != "meta.json" and not name.endswith((".memmap", ".pickle", ".json"))


# ---------------------------------------------------------------- pickling is opt-in
class _MakesFileWhenUnpickled:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_non_json_values_are_refused_without_allow_pickle(tmp_path):
    for value in [b"bytes", {1, 2}, 1 + 2j, object()]:
        td = TensorDict(v=value)
        with pytest.raises(TypeError, match="Pass allow_pickle=True"):
            td.memmap(tmp_path / "out")
        assert not (tmp_path / "out").exists()
    stack = TensorDict(batch_size=[2])
    stack["s"] = ["text", b"bytes"]
    with pytest.raises(TypeError, match="of type bytes"):
        stack.memmap(tmp_path / "out")


def test_pickled_values_load_only_with_allow_pickle(tmp_path):
    source = TensorDict(batch_size=[2])
    source["blob"] = b"\x00\x01"
    source["pair"] = {1, 2}
    source["mixed"] = ["text", b"bytes"]
    source.memmap(tmp_path, allow_pickle=True)
    with pytest.raises(RuntimeError, match="Refusing to load pickled non-tensor data"):
        TensorDict.load_memmap(tmp_path)
    loaded = TensorDict.load_memmap(tmp_path, allow_pickle=True)
    assert loaded["blob"] == b"\x00\x01" and loaded["pair"] == {1, 2} and loaded["mixed"] == ["text", b"bytes"]


def test_loading_without_allow_pickle_never_unpickles(tmp_path):
    marker = tmp_path / "unpickled"
    TensorDict(v=b"x").memmap(tmp_path / "out", allow_pickle=True)
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    pickle_file = tmp_path / "out" / meta["entries"]["v"]["pickle"]
    pickle_file.write_bytes(pickle.dumps(_MakesFileWhenUnpickled(str(marker))))
    with pytest.raises(RuntimeError, match="Refusing"):
        TensorDict.load_memmap(tmp_path / "out")
    assert not marker.exists()


# ---------------------------------------------------------------- damaged folders
def test_a_folder_without_meta_json_is_refused(tmp_path):
    (tmp_path / "x.memmap").write_bytes(b"\x00" * 8)
    with pytest.raises(FileNotFoundError, match="did not finish"):
        TensorDict.load_memmap(tmp_path)
    with pytest.raises(FileNotFoundError, match="No such file or directory"):
        TensorDict.load_memmap(tmp_path / "missing")


def test_a_truncated_leaf_file_is_refused(tmp_path):
    make_td().memmap(tmp_path)
    with open(tmp_path / "nested" / "deeper" / "x.memmap", "r+b") as handle:
        handle.truncate(10)
    with pytest.raises(RuntimeError, match="truncated"):
        TensorDict.load_memmap(tmp_path)
    assert os.path.getsize(tmp_path / "nested" / "deeper" / "x.memmap") == 10  # not grown back


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda meta: meta["entries"]["obs"].update(file="../../escape.memmap"), "unsafe file name"),
        (lambda meta: meta["entries"]["nested"].update(dir=".."), "unsafe file name"),
        (lambda meta: meta["entries"]["obs"].update(dtype="os.system"), "unknown dtype"),
        (lambda meta: meta["entries"]["obs"].update(shape=[5, 3]), "does not start with the batch size"),
        (lambda meta: meta.update(version=99), "newer than this torchdict"),
    ],
    ids=["file-traversal", "dir-traversal", "dtype", "shape", "version"],
)
def test_a_tampered_meta_json_is_refused(tmp_path, edit, message):
    make_td().memmap(tmp_path)
    meta = json.loads((tmp_path / "meta.json").read_text())
    edit(meta)
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=message):
        TensorDict.load_memmap(tmp_path)


_KILLED_SAVE = textwrap.dedent(
    """
    import os, signal, sys
    sys.path.insert(0, {src!r})
    import torch
    import torchdict.saving as saving
    from torchdict import TensorDict

    prefix, point = sys.argv[1], sys.argv[2]
    root = os.path.abspath(prefix)
    # Over an earlier save, the new one is written in a hidden sibling, then swapped in.
    roots = (root, os.path.join(os.path.dirname(root), "." + os.path.basename(root) + ".torchdict-new"))

    def die():
        os.kill(os.getpid(), signal.SIGKILL)

    if point == "after-first-leaf":
        write = saving.write_tensor_file
        def write_then_die(*args, **kwargs):
            write(*args, **kwargs)
            die()
        saving.write_tensor_file = write_then_die
    elif point == "before-root-meta":  # every leaf and the sub-folder metas are written
        write_meta = saving.write_meta_atomic
        def die_at_root(folder, payload):
            if folder in roots:
                die()
            write_meta(folder, payload)
        saving.write_meta_atomic = die_at_root
    elif point == "before-rename":  # the root's temporary meta file is complete
        replace = os.replace
        def die_before_root_rename(source, target):
            if target in [os.path.join(folder, "meta.json") for folder in roots]:
                die()
            replace(source, target)
        os.replace = die_before_root_rename
    td = TensorDict({{"a": torch.full((64,), 2.0), "b": torch.full((64, 2), 3), "sub": {{"c": torch.ones(64)}},
                      "s": "text"}}, batch_size=[64])
    td.memmap(prefix, num_threads=int(sys.argv[3]))
    """
)


def _run_killed_save(prefix, point, num_threads=0):
    script = _KILLED_SAVE.format(src=SRC)
    return subprocess.run([sys.executable, "-c", script, str(prefix), point, str(num_threads)],
                          capture_output=True, timeout=240)


@pytest.mark.slow
@pytest.mark.parametrize("point", ["after-first-leaf", "before-root-meta", "before-rename"])
@pytest.mark.parametrize("over_previous_save", [False, True], ids=["fresh", "overwrite"])
def test_a_save_killed_midway_never_loads_half_a_save(tmp_path, point, over_previous_save):
    prefix = tmp_path / "ckpt"
    old = TensorDict({"a": torch.zeros(64), "sub": {"c": torch.zeros(64)}}, batch_size=[64])
    if over_previous_save:
        old.memmap(prefix)
    completed = _run_killed_save(prefix, point)
    assert completed.returncode == -signal.SIGKILL, completed.stderr.decode()
    if over_previous_save:  # the new save was written beside the old one, which stays whole
        assert_same_content(TensorDict.load_memmap(prefix), old)
    else:
        with pytest.raises(FileNotFoundError, match="did not finish"):
            TensorDict.load_memmap(prefix)


@pytest.mark.slow
def test_the_same_save_not_killed_loads(tmp_path):
    completed = _run_killed_save(tmp_path / "ckpt", "none", num_threads=2)
    assert completed.returncode == 0, completed.stderr.decode()
    loaded = TensorDict.load_memmap(tmp_path / "ckpt")
    assert loaded["b"].sum().item() == 64 * 2 * 3 and loaded["s"] == "text"


# ---------------------------------------------------------------- upstream tensordict 0.15.x folders
def _write_json(path, payload, compact=False):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    separators = (",", ":") if compact else None
    with open(path, "w") as handle:
        json.dump(payload, handle, separators=separators)


def _tensor_meta(tensor):
    return {"device": "cpu", "shape": list(tensor.shape), "dtype": str(tensor.dtype), "is_nested": False}


def _write_raw(path, tensor):
    with open(path, "wb") as handle:
        handle.write(bytes(tensor.contiguous().reshape(-1).view(torch.uint8).tolist()))


TD_TYPE = "<class 'tensordict._td.TensorDict'>"


def test_upstream_legacy_artifact_loads(tmp_path):
    """The upstream test artifact `mmap_example` as described in BEHAVIOUR.md §3, byte for byte."""
    _write_json(tmp_path / "meta.json",
                {"nested": {"type": "TensorDict"}, "shape": [2, 1], "device": "cpu", "_type": TD_TYPE})
    _write_json(tmp_path / "nested" / "meta.json", {
        "int64": {"device": "cpu", "shape": [2, 1], "dtype": "torch.int64", "is_nested": False},
        "string": {"type": "NonTensorData"},
        "bfloat16": {"device": "cpu", "shape": [2, 1], "dtype": "torch.bfloat16", "is_nested": False},
        "shape": [2, 1], "device": "cpu", "_type": TD_TYPE,
    })
    _write_json(tmp_path / "nested" / "string" / "meta.json",
                {"_type": "<class 'tensordict.tensorclass.NonTensorData'>", "data": ["a string!"], "_metadata": None})
    (tmp_path / "nested" / "int64.memmap").write_bytes(
        bytes([1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0]))  # 17 bytes: one extra
    (tmp_path / "nested" / "bfloat16.memmap").write_bytes(bytes([0x80, 0x3F, 0x80, 0x3F, 0x0A, 0x00]))
    loaded = TensorDict.load_memmap(tmp_path)
    assert loaded.batch_size == (2, 1)
    assert loaded["nested", "int64"].tolist() == [[1], [2]]
    assert loaded["nested", "bfloat16"].dtype == torch.bfloat16
    assert loaded["nested", "bfloat16"].tolist() == [[1.0], [1.0]]
    assert loaded["nested", "string"] == ["a string!"]
    alone = TensorDict.load(tmp_path / "nested")
    assert alone.batch_size == (2, 1) and alone["int64"].tolist() == [[1], [2]]


def test_upstream_0_15_folder_loads(tmp_path):
    weight, bias, obs = torch.randn(2, 4, 3), torch.randn(2, 4), torch.randn(2, 5)
    _write_json(tmp_path / "meta.json", {
        "0": {"type": "TensorDict"},
        "key 1": _tensor_meta(obs),
        "text": {"type": "NonTensorData"},
        "labels": {"type": "NonTensorStack"},
        "..": {"type": "TensorDict"},
        "shape": [2], "device": "cpu", "_type": TD_TYPE, "_format_version": 1, "_class": "tensordict:TensorDict",
        "_names": ["batch"],
    })
    _write_raw(tmp_path / "key%201.memmap", obs)
    _write_json(tmp_path / "0" / "meta.json", {
        "weight": _tensor_meta(weight), "bias": _tensor_meta(bias),
        "shape": [2], "device": "cpu", "_type": TD_TYPE, "_format_version": 1, "_class": "tensordict:TensorDict",
    })
    _write_raw(tmp_path / "0" / "weight.memmap", weight)
    _write_raw(tmp_path / "0" / "bias.memmap", bias)
    _write_json(tmp_path / "text" / "meta.json", {"_type": "<class 'tensordict.tensorclass.NonTensorData'>",
                                                  "data": "hello", "_metadata": None, "_is_non_tensor": True})
    _write_json(tmp_path / "labels" / "meta.json", {
        "_type": "<class 'tensordict.tensorclass.NonTensorStack'>", "_format_version": 1,
        "_class": "tensordict:NonTensorStack", "stack_dim": 0, "device": None, "data": ["a", "b"]}, compact=True)
    _write_json(tmp_path / "%2E%2E" / "meta.json", {"x": _tensor_meta(torch.zeros(2)), "shape": [2],
                                                     "device": "cpu", "_class": "tensordict:TensorDict"})
    _write_raw(tmp_path / "%2E%2E" / "x.memmap", torch.ones(2))
    loaded = TensorDict.load_memmap(tmp_path)
    assert list(loaded.keys()) == ["0", "key 1", "text", "labels", ".."]
    assert loaded.batch_size == (2,) and loaded.names == ["batch"]
    assert torch.equal(loaded["0", "weight"], weight) and torch.equal(loaded["0", "bias"], bias)
    assert torch.equal(loaded["key 1"], obs) and type(loaded["key 1"]) is MemoryMappedTensor
    assert loaded["text"] == "hello" and loaded["labels"] == ["a", "b"]
    assert loaded["..", "x"].tolist() == [1.0, 1.0]
    assert torch.equal(TensorDict.load_memmap(tmp_path / "0")["weight"], weight)


def test_upstream_legacy_raw_file_names_load(tmp_path):
    value = torch.arange(3.0)
    _write_json(tmp_path / "meta.json", {"key 1": _tensor_meta(value), "shape": [3], "device": "cpu",
                                         "_type": TD_TYPE})
    _write_raw(tmp_path / "key 1.memmap", value)
    assert TensorDict.load_memmap(tmp_path)["key 1"].tolist() == [0.0, 1.0, 2.0]


def test_upstream_pickled_non_tensor_needs_allow_pickle(tmp_path):
    _write_json(tmp_path / "meta.json", {"blob": {"type": "NonTensorData"}, "shape": [], "device": "cpu",
                                         "_class": "tensordict:TensorDict"})
    _write_json(tmp_path / "blob" / "meta.json", {"_type": "<class 'tensordict.tensorclass.NonTensorData'>",
                                                  "_metadata": None, "_is_non_tensor": True})
    (tmp_path / "blob" / "other.pickle").write_bytes(pickle.dumps({"data": b"raw"}))
    with pytest.raises(RuntimeError, match="Refusing to load pickled non-tensor data"):
        TensorDict.load_memmap(tmp_path)
    assert TensorDict.load_memmap(tmp_path, allow_pickle=True)["blob"] == b"raw"


def test_upstream_unknown_class_is_refused_without_importing(tmp_path):
    _write_json(tmp_path / "meta.json", {"_type": "<class 'os.Popen'>", "shape": [], "device": "cpu"})
    with pytest.raises(RuntimeError, match="Could not find the class os.Popen"):
        TensorDict.load_memmap(tmp_path)


# ---------------------------------------------------------------- tensor collection classes (tensorclass hook)
from torchdict import _saved_classes  # noqa: E402
from torchdict import saving as saving_module  # noqa: E402
from torchdict._base import TensorCollection  # noqa: E402


class Pair(TensorCollection):
    """The smallest collection following the tensorclass protocol (``_tensordict``, ``_rewrap``)."""

    def __init__(self, td):
        self._tensordict = td

    batch_size = property(lambda self: self._tensordict.batch_size)
    device = property(lambda self: self._tensordict.device)

    def _rewrap(self, td):
        return Pair(td)

    @classmethod
    def from_tensordict(cls, td):
        return cls(td)


def test_a_collection_class_is_saved_by_name_and_loaded_when_registered(tmp_path, monkeypatch):
    monkeypatch.setattr(_saved_classes, "_SAVED_CLASSES", {})
    pair = Pair(TensorDict({"left": torch.arange(3), "right": torch.ones(3)}, batch_size=[3]))
    holder = TensorDict({"pair": pair}, batch_size=[3])
    saved = holder.memmap(tmp_path)
    assert type(saved["pair"]) is Pair and type(saved["pair"]._tensordict["left"]) is MemoryMappedTensor
    meta = json.loads((tmp_path / "pair" / "meta.json").read_text())
    assert meta["class"] == f"{__name__}:Pair"
    loaded = TensorDict.load_memmap(tmp_path)
    assert type(loaded["pair"]) is Pair and loaded["pair"]._tensordict["left"].tolist() == [0, 1, 2]
    alone = TensorDict.load_memmap(tmp_path / "pair")
    assert type(alone) is Pair


def test_an_unregistered_collection_class_is_refused_on_load(tmp_path, monkeypatch):
    saving_module.save_collection(Pair(TensorDict({"left": torch.arange(3)}, batch_size=[3])), tmp_path)
    monkeypatch.setattr(_saved_classes, "_SAVED_CLASSES", {})
    with pytest.raises(RuntimeError, match=f"Could not find the class {__name__}:Pair"):
        TensorDict.load_memmap(tmp_path)
    saving_module.register_saved_class(Pair)
    assert type(TensorDict.load_memmap(tmp_path)) is Pair


def test_the_functional_api_stays_importable_from_torchdict_saving(tmp_path):
    from torchdict._persistence_mixin import PersistenceMixin
    from torchdict.saving import load_memmap, register_saved_class

    source = make_td()
    source.memmap(tmp_path)
    assert_same_content(load_memmap(tmp_path), source)
    assert issubclass(TensorDict, PersistenceMixin) and register_saved_class(Pair) is Pair
