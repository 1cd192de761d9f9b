"""Parallel preprocessing: TensorDict.map / map_iter against the hand-written alternatives.

Each case times one whole job (seconds, worker start-up included), so the cases
are *self-timed* with a few samples. The "floor" column is named in each row:

- the in-process loop ``for i in range(n): fn(data[i])`` (run with one torch thread,
  like each worker: two intra-op threads fighting other processes on a 2-core box
  make the loop several times slower, which would flatter ``map``);
- a hand-written ``multiprocessing.Pool`` whose initializer maps the dataset's
  files and whose tasks are index ranges (the best one can write by hand, with no
  TensorDict in the loop);
- a ``torch.utils.data.DataLoader`` over the same files, for ``map_iter``.

The dataset is the seed's: images ``(N, 128, 128, 3)`` uint8 and int labels,
memory-mapped; N is 2000 by default, 10000 with ``--full`` (or the environment
variable ``TORCHDICT_BENCH_FULL=1`` under ``run.py``). Every timed run loads the
dataset afresh (``load_memmap``), so the loop and the workers alike start with
unmapped pages.

    python benchmarks/bench_parallel.py [--full] [--samples 3]
    python benchmarks/run.py --suite parallel
"""
from __future__ import annotations

import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
_SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
if os.path.isdir(_SRC) and _SRC not in sys.path:
    sys.path.insert(0, _SRC)

from _harness import FLOOR, TORCHDICT, UPSTREAM, Case  # noqa: E402

WORKERS = 2
ITER_CHUNK = 64
SAMPLES = 3


def dataset_size() -> int:
    return 10_000 if os.environ.get("TORCHDICT_BENCH_FULL") == "1" else 2_000


# ---------------------------------------------------------------------- the jobs (module level: picklable)
def process_data(data):
    """The seed's memory-bound function: flip each image, divide its label by 10, in place."""
    images = data.get("images").flip(-2).clone()
    labels = data.get("labels") // 10
    data.set_("images", images)
    data.set_("labels", labels)


def median_brightness(data):
    """A CPU-bound function: the label becomes the image's median pixel (a 49k-element sort)."""
    pixels = data.get("images").flatten().float()
    data.set_("labels", pixels.sort().values[pixels.numel() // 2].to(torch.int))


def normalise(batch):
    """map_iter's job: images as floats in [0, 1], the labels kept."""
    return batch.empty().set("images", batch.get("images").float().div_(255)).set("labels", batch.get("labels"))


def nothing(chunk):
    return None


# plain-tensor versions, for the hand-written Pool and DataLoader
def process_plain(images, labels, index):
    images[index].copy_(images[index].flip(-2))
    labels[index] = labels[index] // 10


def median_plain(images, labels, index):
    pixels = images[index].flatten().float()
    labels[index] = pixels.sort().values[pixels.numel() // 2].to(torch.int)


PLAIN = {process_data: process_plain, median_brightness: median_plain}


# ---------------------------------------------------------------------- data
_DATASETS: dict = {}


def _make_dataset(lib, n: int) -> str:
    """The dataset written by ``lib`` (once per process; removed at exit)."""
    if (lib.__name__, n) in _DATASETS:
        return _DATASETS[lib.__name__, n]
    import atexit
    import shutil

    folder = tempfile.mkdtemp(prefix=f"bench-parallel-{lib.__name__}-")
    atexit.register(shutil.rmtree, folder, True)
    _DATASETS[lib.__name__, n] = folder
    data = lib.TensorDict({"images": torch.zeros((128, 128, 3), dtype=torch.uint8),
                           "labels": torch.zeros((), dtype=torch.int)}, batch_size=[])
    data = data.expand(n).memmap_like(folder)
    generator = torch.Generator().manual_seed(0)
    for start in range(0, n, 1000):
        stop = min(start + 1000, n)
        data["images"][start:stop] = torch.randint(0, 256, (stop - start, 128, 128, 3), dtype=torch.uint8,
                                                   generator=generator)
    data["labels"].copy_(torch.randint(0, 1000, (n,), dtype=torch.int, generator=generator))
    return folder


def _files(folder: str) -> tuple:
    """The dataset's raw files, found by name (torchdict and upstream both write <key>.memmap)."""
    return os.path.join(folder, "images.memmap"), os.path.join(folder, "labels.memmap")


def setup():
    import torchdict

    n = dataset_size()
    return {"n": n, "folder": _make_dataset(torchdict, n)}


def _timed(job) -> int:
    start = time.perf_counter_ns()
    job()
    return time.perf_counter_ns() - start


# ---------------------------------------------------------------------- hand-written references
_POOL_DATA: dict = {}


def _pool_init(images_path: str, labels_path: str, n: int) -> None:
    torch.set_num_threads(1)
    _POOL_DATA["images"] = torch.from_file(images_path, shared=True, size=n * 128 * 128 * 3,
                                           dtype=torch.uint8).view(n, 128, 128, 3)
    _POOL_DATA["labels"] = torch.from_file(labels_path, shared=True, size=n, dtype=torch.int)


def _pool_task(arguments: tuple) -> None:
    plain_fn, start, stop = arguments
    images, labels = _POOL_DATA["images"], _POOL_DATA["labels"]
    for index in range(start, stop):
        plain_fn(images, labels, index)


def hand_written_pool(folder: str, n: int, plain_fn) -> None:
    import multiprocessing

    step = max(1, n // (WORKERS * 16))
    tasks = [(plain_fn, start, min(start + step, n)) for start in range(0, n, step)]
    with multiprocessing.get_context("fork").Pool(WORKERS, _pool_init, (*_files(folder), n)) as pool:
        pool.map(_pool_task, tasks, chunksize=1)


class _ChunkDataset:
    """A map-style dataset over the files: item ``c`` is the normalised chunk ``c``."""

    def __init__(self, folder: str, n: int) -> None:
        self.folder, self.n = folder, n
        self.images = self.labels = None

    def __len__(self) -> int:
        return -(self.n // -ITER_CHUNK)

    def __getitem__(self, chunk: int) -> dict:
        if self.images is None:  # opened in each worker
            images_path, labels_path = _files(self.folder)
            self.images = torch.from_file(images_path, shared=True, size=self.n * 128 * 128 * 3,
                                          dtype=torch.uint8).view(self.n, 128, 128, 3)
            self.labels = torch.from_file(labels_path, shared=True, size=self.n, dtype=torch.int)
        start, stop = chunk * ITER_CHUNK, min((chunk + 1) * ITER_CHUNK, self.n)
        return {"images": self.images[start:stop].float().div_(255), "labels": self.labels[start:stop].clone()}


def _consume(batches) -> float:
    total = 0.0
    for batch in batches:
        total += float(batch["images"][0, 0, 0, 0])
    return total


# ---------------------------------------------------------------------- cases
def _map_case(fn, name: str, floor: str, target, note: str = "") -> Case:
    def torchdict_impl(data):
        from torchdict import TensorDict

        return lambda: _timed(
            lambda: TensorDict.load_memmap(data["folder"]).map(fn, num_workers=WORKERS, chunksize=0))

    def upstream_impl(data):
        import tensordict

        folder = _make_dataset(tensordict, data["n"])
        generator = torch.Generator()
        return lambda: _timed(lambda: tensordict.TensorDict.load_memmap(folder).map(
            fn, num_workers=WORKERS, chunksize=0, generator=generator))

    def loop_impl(data):
        from torchdict import TensorDict

        def job():
            previous = torch.get_num_threads()
            torch.set_num_threads(1)  # as in each worker; restored for the suites that run next
            try:
                source = TensorDict.load_memmap(data["folder"])
                for index in range(data["n"]):
                    fn(source[index])
            finally:
                torch.set_num_threads(previous)

        return lambda: _timed(job)

    def pool_impl(data):
        return lambda: _timed(lambda: hand_written_pool(data["folder"], data["n"], PLAIN[fn]))

    floor_impl = loop_impl if floor == "loop" else pool_impl
    return Case(name, setup=setup, impls={TORCHDICT: torchdict_impl, UPSTREAM: upstream_impl, FLOOR: floor_impl},
                target=target, self_timed=True, max_samples=SAMPLES, note=note)


def _overhead_case() -> Case:
    chunks = 4_000

    def make(lib):
        return lib.TensorDict(x=torch.zeros(chunks, 4), batch_size=[chunks])

    def torchdict_impl(data):
        import torchdict
        from torchdict.parallel import WorkerPool

        td = make(torchdict)
        pool = WorkerPool(WORKERS)
        td.map(nothing, pool=pool, chunksize=1)  # start the workers outside the timing
        return lambda: _timed(lambda: td.map(nothing, pool=pool, chunksize=1)) // chunks

    def upstream_impl(data):
        import multiprocessing

        import tensordict

        td = make(tensordict)
        pool = multiprocessing.get_context("fork").Pool(WORKERS)
        return lambda: _timed(lambda: td.map(nothing, pool=pool, chunksize=1)) // chunks

    def loop_impl(data):
        import torchdict

        td = make(torchdict)
        return lambda: _timed(lambda: [nothing(td[index:index + 1]) for index in range(chunks)]) // chunks

    return Case(f"per-chunk overhead ({chunks} chunks of 1, warm pool; floor: in-process loop)",
                impls={TORCHDICT: torchdict_impl, UPSTREAM: upstream_impl, FLOOR: loop_impl},
                self_timed=True, max_samples=SAMPLES,
                note="time per chunk of a job that does nothing: what the machinery costs.")


def _iter_case() -> Case:
    def torchdict_impl(data):
        from torchdict import TensorDict

        return lambda: _timed(lambda: _consume(TensorDict.load_memmap(data["folder"]).map_iter(
            normalise, num_workers=WORKERS, chunksize=ITER_CHUNK)))

    def upstream_impl(data):
        import tensordict

        folder = _make_dataset(tensordict, data["n"])
        generator = torch.Generator()
        return lambda: _timed(lambda: _consume(tensordict.TensorDict.load_memmap(folder).map_iter(
            normalise, num_workers=WORKERS, chunksize=ITER_CHUNK, generator=generator)))

    def dataloader_impl(data):
        from torch.utils.data import DataLoader

        def job():
            loader = DataLoader(_ChunkDataset(data["folder"], data["n"]), batch_size=None, num_workers=WORKERS,
                                multiprocessing_context="fork")
            _consume(loader)

        return lambda: _timed(job)

    return Case(f"map_iter, chunks of {ITER_CHUNK} images to float (floor: DataLoader)", setup=setup,
                impls={TORCHDICT: torchdict_impl, UPSTREAM: upstream_impl, FLOOR: dataloader_impl},
                target="<= 1x floor", self_timed=True, max_samples=SAMPLES)


def cases() -> list:
    n = dataset_size()
    return [
        _map_case(median_brightness, f"map CPU-bound, {n} images, 2 workers (floor: in-process loop)", "loop",
                  "<= 0.625x floor", note="0.625x floor = 1.6x faster than the loop."),
        _map_case(median_brightness, f"map CPU-bound, {n} images, 2 workers (floor: hand-written Pool)", "pool",
                  None, note="the Pool's function works on plain tensors: no TensorDict per element."),
        _map_case(process_data, f"map seed fn (memory-bound), {n} images, 2 workers (floor: in-process loop)",
                  "loop", "<= 1x floor"),
        _map_case(process_data, f"map seed fn (memory-bound), {n} images, 2 workers (floor: hand-written Pool)",
                  "pool", None),
        _overhead_case(),
        _iter_case(),
    ]


if __name__ == "__main__":
    import argparse

    import _harness

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="10000 images (default 2000)")
    parser.add_argument("--samples", type=int, default=SAMPLES)
    parser.add_argument("--filter", default=None, help="only cases whose name contains this text")
    parser.add_argument("--stat", choices=("median", "min"), default="min")
    args = parser.parse_args()
    if args.full:
        os.environ["TORCHDICT_BENCH_FULL"] = "1"
    SAMPLES = args.samples
    config = _harness.Config(samples=args.samples, statistic=args.stat)
    chosen = [case for case in cases() if args.filter is None or args.filter in case.name]
    results = _harness.run_cases(chosen, config, lambda name: print(f"[parallel] {name} ...", file=sys.stderr))
    print(_harness.format_markdown("parallel", results, config, _harness.environment()))
