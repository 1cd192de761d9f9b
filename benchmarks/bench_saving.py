"""Persistence benchmarks (issue 6): saving, lazy loading, memmap_like and reading a memmapped dataset.

Each row pits torchdict (and upstream tensordict) against one reference in the ``floor``
column, named in the row label:

- save of a state dict (50 float32 tensors) against ``torch.save``, ``safetensors.save_file``
  and raw per-tensor ``write`` calls from the same thread pool (the floor any saver can reach);
- lazy load against ``torch.load(mmap=True)`` and safetensors ``safe_open`` + ``get_tensor``;
- ``memmap_like`` of a 100k-image dataset (128x128x3 uint8) against ``ftruncate`` + ``torch.from_file``
  by hand;
- ``td[0]`` and 3 random items of the memmapped dataset against indexing the file-backed
  tensors by hand, warm (pages cached) and cold (pages evicted with ``posix_fadvise`` first).

Sizes are moderate by default (a 256 MB state dict, a 10k-image written dataset for the
cold reads); set ``TORCHDICT_BENCH_FULL=1`` (or run this file with ``--full``) for the sizes
of the issue: a 1 GB state dict and a 100k-image written dataset (4.9 GB of disk).
Files go to a temporary folder under ``TORCHDICT_BENCH_DIR`` (default: the system temp dir),
removed at exit.
"""
from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import time

import torch

from _harness import FLOOR, TORCHDICT, UPSTREAM, Case, for_libraries

FULL = bool(os.environ.get("TORCHDICT_BENCH_FULL"))
STATE_TENSORS = 50
STATE_BYTES = (1 << 30) if FULL else (256 << 20)
DATASET_ITEMS = 100_000  # memmap_like and warm reads: sparse files, no disk used
WRITTEN_ITEMS = 100_000 if FULL else 10_000  # cold reads need data really on disk
IMAGE_SHAPE = (128, 128, 3)
NUM_THREADS = min(8, os.cpu_count() or 1)
RANDOM_ITEMS = torch.tensor([1, 10_000 % WRITTEN_ITEMS + 7, WRITTEN_ITEMS // 2 + 3])

_ROOT: list = []


def _scratch(name: str) -> str:
    """A fresh folder for one case, under one temporary root removed at exit."""
    if not _ROOT:
        root = tempfile.mkdtemp(prefix="torchdict-bench-saving-", dir=os.environ.get("TORCHDICT_BENCH_DIR"))
        atexit.register(shutil.rmtree, root, True)
        _ROOT.append(root)
    path = os.path.join(_ROOT[0], name)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def _state_dict() -> dict:
    numel = STATE_BYTES // (4 * STATE_TENSORS)
    generator = torch.Generator().manual_seed(0)
    return {f"layer{i}.weight": torch.randn(numel // 1000, 1000, generator=generator) for i in range(STATE_TENSORS)}


def _byte_view(tensor: torch.Tensor) -> memoryview:
    import ctypes

    return memoryview((ctypes.c_char * tensor.nbytes).from_address(tensor.data_ptr())).cast("B")


def _raw_write(path: str, tensor: torch.Tensor) -> None:
    """What a careful user writes by hand: one plain write of the tensor's bytes."""
    view = _byte_view(tensor)
    with open(path, "wb", buffering=0) as handle:
        written = 0
        while written < len(view):
            written += handle.write(view[written:])


# --------------------------------------------------------------------------- save
def _new_target(data: dict, label: str) -> str:
    """A path that does not exist yet; the previous one of this label is deleted (untimed)."""
    counters = data.setdefault("counters", {})
    previous = counters.get(label)
    if previous is not None:
        shutil.rmtree(previous, ignore_errors=True) if os.path.isdir(previous) else os.remove(previous)
    count = data.setdefault("count", [0])
    count[0] += 1
    counters[label] = os.path.join(data["dir"], f"{label}-{count[0]}")
    return counters[label]


def _save_cases() -> list:
    def setup():
        return {"tensors": _state_dict(), "dir": _scratch("save")}

    def library(lib, data):
        td = lib.TensorDict(data["tensors"], batch_size=[])
        prefix = _new_target(data, lib.__name__)
        return lambda: td.memmap(prefix, num_threads=NUM_THREADS)

    def library_overwrite(lib, data):
        td = lib.TensorDict(data["tensors"], batch_size=[])
        prefix = os.path.join(data["dir"], f"{lib.__name__}-overwritten")
        return lambda: td.memmap(prefix, num_threads=NUM_THREADS)

    def torch_save(data):
        path = _new_target(data, "torch.save")
        return lambda: torch.save(data["tensors"], path)

    def torch_save_overwrite(data):
        path = os.path.join(data["dir"], "overwritten.pt")
        return lambda: torch.save(data["tensors"], path)

    def safetensors_save(data):
        from safetensors.torch import save_file

        path = _new_target(data, "safetensors")
        return lambda: save_file(data["tensors"], path)

    def raw_writes(data):
        from concurrent.futures import ThreadPoolExecutor

        folder = _new_target(data, "raw")
        items = [(os.path.join(folder, f"{key}.bin"), tensor) for key, tensor in data["tensors"].items()]
        pool = ThreadPoolExecutor(NUM_THREADS)

        def run():
            os.makedirs(folder)
            list(pool.map(lambda item: _raw_write(*item), items))

        return run

    size = f"{STATE_BYTES >> 20} MB"
    note = (f"{STATE_TENSORS} float32 tensors into a new folder (file) per call, {NUM_THREADS} writer threads "
            "for torchdict, tensordict and the raw writes.")
    return [
        Case(f"save {size} state dict (floor: torch.save)", setup=setup, fresh=True, max_samples=7,
             target="<= 0.33x floor", impls={**for_libraries(library), FLOOR: torch_save}, note=note),
        Case(f"save {size} state dict (floor: raw per-tensor writes)", setup=setup, fresh=True, max_samples=7,
             target="<= 1.11x floor", impls={TORCHDICT: for_libraries(library)[TORCHDICT], FLOOR: raw_writes}),
        Case(f"save {size} state dict (floor: safetensors.save_file)", setup=setup, fresh=True, max_samples=7,
             impls={TORCHDICT: for_libraries(library)[TORCHDICT], FLOOR: safetensors_save}),
        Case(f"save {size} over the previous save (floor: torch.save)", setup=setup, max_samples=7,
             impls={**for_libraries(library_overwrite), FLOOR: torch_save_overwrite},
             note="Same folder (file) every call: torchdict writes the new save beside the old one, into the "
                  "files of the save replaced the call before (rewritten in place), and swaps it in atomically."),
    ]


# --------------------------------------------------------------------------- lazy load
def _load_cases() -> list:
    def setup():
        import tensordict
        import torchdict

        tensors = _state_dict()
        folder = _scratch("load")
        torchdict.TensorDict(tensors).memmap(os.path.join(folder, "torchdict"))
        tensordict.TensorDict(tensors).memmap(os.path.join(folder, "tensordict"))
        torch.save(tensors, os.path.join(folder, "state.pt"))
        try:
            from safetensors.torch import save_file

            save_file(tensors, os.path.join(folder, "state.safetensors"))
        except ImportError:
            pass
        return folder

    def library(lib, folder):
        prefix = os.path.join(folder, lib.__name__)
        return lambda: lib.TensorDict.load_memmap(prefix)

    def torch_load(folder):
        path = os.path.join(folder, "state.pt")
        return lambda: torch.load(path, mmap=True)

    def safe_open_all(folder):
        from safetensors import safe_open

        path = os.path.join(folder, "state.safetensors")

        def run():
            with safe_open(path, "pt") as handle:
                return {key: handle.get_tensor(key) for key in handle.keys()}

        return run

    note = "Lazy: every implementation maps the files and returns all 50 tensors without reading them."
    return [
        Case("lazy load 50 tensors (floor: torch.load(mmap=True))", setup=setup,
             impls={**for_libraries(library), FLOOR: torch_load}, note=note),
        Case("lazy load 50 tensors (floor: safetensors safe_open)", setup=setup, target="<= 1x floor",
             impls={**for_libraries(library), FLOOR: safe_open_all}),
    ]


# --------------------------------------------------------------------------- datasets
def _dataset_source(lib, items: int):
    return lib.TensorDict(
        {"images": torch.zeros(IMAGE_SHAPE, dtype=torch.uint8).expand(items, *IMAGE_SHAPE),
         "labels": torch.zeros((), dtype=torch.int32).expand(items)},
        batch_size=[items],
    )


def _by_hand_allocate(folder: str, items: int) -> dict:
    """``memmap_like`` by hand: one sparse file per field, mapped."""
    result = {}
    for name, shape, dtype in (("images", (items, *IMAGE_SHAPE), torch.uint8), ("labels", (items,), torch.int32)):
        path = os.path.join(folder, f"{name}.bin")
        numel = torch.Size(shape).numel()
        with open(path, "wb") as handle:
            handle.truncate(numel * dtype.itemsize)
        result[name] = torch.from_file(path, shared=True, size=numel, dtype=dtype).view(shape)
    return result


def _memmap_like_cases() -> list:
    def library(lib, _):
        source = _dataset_source(lib, DATASET_ITEMS)
        prefix = _scratch(f"like-{lib.__name__}")
        return lambda: source.memmap_like(prefix)

    def floor(_):
        folder = _scratch("like-floor")
        return lambda: _by_hand_allocate(folder, DATASET_ITEMS)

    return [Case(f"memmap_like {DATASET_ITEMS // 1000}k images (floor: truncate + map by hand)",
                 target="<= 1.5x floor", impls={**for_libraries(library), FLOOR: floor},
                 note="4.9 GB of sparse files per implementation: no data is written.")]


_WRITTEN: list = []


def _written_dataset() -> str:
    """A dataset with every image really written (cold reads must hit the disk), flushed; built once."""
    if not _WRITTEN:
        _WRITTEN.append(_write_dataset())
    return _WRITTEN[0]


def _write_dataset() -> str:
    import torchdict

    folder = _scratch("written")
    data = _dataset_source(torchdict, WRITTEN_ITEMS).memmap_like(os.path.join(folder, "torchdict"))
    generator = torch.Generator().manual_seed(0)
    chunk = 1000
    for start in range(0, WRITTEN_ITEMS, chunk):
        stop = min(start + chunk, WRITTEN_ITEMS)
        data["images"][start:stop] = torch.randint(0, 256, (stop - start, *IMAGE_SHAPE), dtype=torch.uint8,
                                                   generator=generator)
    data["labels"].copy_(torch.arange(WRITTEN_ITEMS, dtype=torch.int32))
    import tensordict

    tensordict.TensorDict(
        {"images": data["images"].as_subclass(torch.Tensor), "labels": data["labels"].as_subclass(torch.Tensor)},
        batch_size=[WRITTEN_ITEMS]).memmap(os.path.join(folder, "tensordict"))
    for root, _, files in os.walk(folder):
        for name in files:
            with open(os.path.join(root, name), "rb+") as handle:
                os.fsync(handle.fileno())
    return folder


def _evict(folder: str) -> None:
    """Drop the folder's clean pages from the page cache (no root needed)."""
    for root, _, files in os.walk(folder):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _by_hand_open(folder: str) -> dict:
    """The file-backed tensors of the written dataset, mapped by hand (torch.from_file)."""
    items = WRITTEN_ITEMS
    images = torch.from_file(os.path.join(folder, "images.memmap"), shared=True,
                             size=items * 49152, dtype=torch.uint8).view(items, *IMAGE_SHAPE)
    labels = torch.from_file(os.path.join(folder, "labels.memmap"), shared=True, size=items, dtype=torch.int32)
    return {"images": images, "labels": labels}


def _read_cases() -> list:
    def library(index):
        def make(lib, folder):
            td = lib.TensorDict.load_memmap(os.path.join(folder, lib.__name__))
            return lambda: td[index]

        return for_libraries(make)

    def by_hand(index):
        def prepare(folder):
            tensors = _by_hand_open(os.path.join(folder, "torchdict"))
            return lambda: {key: tensor[index] for key, tensor in tensors.items()}

        return prepare

    def cold(lib_name):
        """Self-timed: evict the pages, map afresh, time one read of 3 random items."""

        def prepare(folder):
            if lib_name == FLOOR:
                def open_dataset():
                    tensors = _by_hand_open(os.path.join(folder, "torchdict"))
                    return lambda index: {key: tensor[index] for key, tensor in tensors.items()}
            else:
                import importlib

                lib = importlib.import_module(lib_name)  # ImportError drops the column

                def open_dataset():
                    return lib.TensorDict.load_memmap(os.path.join(folder, lib_name)).__getitem__

            def run():
                import gc

                gc.collect()  # drop earlier mappings so that their pages can be evicted
                _evict(folder)
                read = open_dataset()
                start = time.perf_counter_ns()
                read(RANDOM_ITEMS)
                return time.perf_counter_ns() - start

            return run

        return prepare

    return [
        Case("memmapped td[0] (floor: index the file-backed tensors by hand)", setup=_written_dataset,
             target="<= 1.5x floor", impls={**library(0), FLOOR: by_hand(0)}),
        Case("3 random items, warm (floor: by hand)", setup=_written_dataset,
             impls={**library(RANDOM_ITEMS), FLOOR: by_hand(RANDOM_ITEMS)}),
        Case("3 random items, cold (floor: by hand)", setup=_written_dataset, self_timed=True, max_samples=9,
             impls={TORCHDICT: cold(TORCHDICT), UPSTREAM: cold(UPSTREAM), FLOOR: cold(FLOOR)},
             note="Pages evicted with posix_fadvise(DONTNEED) before each sample; one read per sample."),
    ]


def cases() -> list:
    return _save_cases() + _load_cases() + _memmap_like_cases() + _read_cases()


if __name__ == "__main__":
    if "--full" in sys.argv:
        sys.argv.remove("--full")
        os.environ["TORCHDICT_BENCH_FULL"] = "1"
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import run

    sys.exit(run.main(["--suite", "saving", *sys.argv[1:]]))
