"""Host-to-device transfer of a TensorDict: one consolidated copy against one copy per leaf.

Run on a machine with a CUDA device (``scripts/gpu_check.sh`` runs it); without one it says
so and exits with status 0. Side by side for torchdict and upstream tensordict (when
installed), it times:

1. a TensorDict of many small leaves (100 by default) sent to the GPU:
   * ``leaf by leaf``: ``td.to("cuda")`` (one host-to-device copy per leaf);
   * ``consolidated``: ``packed.to("cuda", non_blocking=True)`` of a TensorDict consolidated
     beforehand into pinned memory (one copy of one buffer);
   * ``consolidate + to``: ``td.consolidate(pin_memory=True).to("cuda", non_blocking=True)``,
     the packing timed too;
   target: consolidated at least 3x faster than leaf by leaf;
2. one large buffer (256 MiB by default): a consolidated TensorDict holding it, against a
   single pinned ``cudaMemcpy`` (``torch.empty(n, pin_memory=True).to("cuda", non_blocking=True)``);
   target: at least 90% of that copy's bandwidth.

Every timed call ends with a synchronisation, so the copies are counted in full. The whole
run takes well under a minute on an H200.

    python benchmarks/h2d_transfer.py [--leaves 100] [--leaf-shape 64,16] [--large-mib 256] [--repeat 50]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any, Callable, Optional

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if os.path.join(_ROOT, "src") not in sys.path:
    sys.path.insert(0, os.path.join(_ROOT, "src"))  # this checkout's torchdict

import torch  # noqa: E402

NO_DEVICE = "no CUDA device: the host-to-device benchmark needs one (nothing was measured)."


def libraries() -> dict:
    """``{label: module}``: torchdict, and upstream tensordict when it is installed."""
    import torchdict

    found = {"torchdict": torchdict}
    try:
        import tensordict
    except ImportError:
        return found
    found["tensordict"] = tensordict
    return found


def small_leaves(lib: Any, n_leaves: int, leaf_shape: tuple, seed: int = 0) -> Any:
    """A TensorDict of ``n_leaves`` float32 leaves of ``leaf_shape`` (batch: the first dim), in host memory."""
    generator = torch.Generator().manual_seed(seed)
    source = {f"leaf{i:03d}": torch.randn(leaf_shape, generator=generator) for i in range(n_leaves)}
    return lib.TensorDict(source, batch_size=leaf_shape[:1])


def large_buffer(lib: Any, n_bytes: int) -> Any:
    """A TensorDict holding one large float32 leaf of ``n_bytes`` bytes."""
    return lib.TensorDict(big=torch.ones(n_bytes // 4), batch_size=[])


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(run: Callable[[], Any], device: torch.device, repeat: int, warmup: int = 3) -> float:
    """Median seconds of ``run()`` followed by a device synchronisation."""
    for _ in range(warmup):
        run()
        synchronize(device)
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        synchronize(device)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def measure(device: str = "cuda", n_leaves: int = 100, leaf_shape: tuple = (64, 16), large_bytes: int = 256 << 20,
            repeat: int = 50, pin: bool = True, libs: Optional[dict] = None) -> dict:
    """``{(label, case): seconds}`` for every library and case, and ``("raw", "pinned copy")``."""
    target = torch.device(device)
    libs = libraries() if libs is None else libs
    results: dict = {}
    for label, lib in libs.items():
        td = small_leaves(lib, n_leaves, leaf_shape)
        packed = td.consolidate(pin_memory=pin)
        results[(label, "leaf by leaf")] = time_call(lambda: td.to(target), target, repeat)
        results[(label, "consolidated")] = time_call(lambda: packed.to(target, non_blocking=True), target, repeat)
        results[(label, "consolidate + to")] = time_call(
            lambda: td.consolidate(pin_memory=pin).to(target, non_blocking=True), target, max(repeat // 5, 3))
        big = large_buffer(lib, large_bytes).consolidate(pin_memory=pin)
        results[(label, "large consolidated")] = time_call(lambda: big.to(target, non_blocking=True), target,
                                                            max(repeat // 5, 3))
        del big
    raw = torch.empty(large_bytes, dtype=torch.uint8, pin_memory=pin)
    results[("raw", "pinned copy")] = time_call(lambda: raw.to(target, non_blocking=True), target,
                                                max(repeat // 5, 3))
    return results


def report(results: dict, large_bytes: int) -> str:
    """The table: times per library, and the ratios the targets are about."""
    labels = [label for label in ("torchdict", "tensordict") if (label, "leaf by leaf") in results]
    lines = ["| case | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels)]
    for case in ("leaf by leaf", "consolidated", "consolidate + to", "large consolidated"):
        cells = [f"{results[(label, case)] * 1e6:.1f} us" for label in labels]
        lines.append(f"| {case} | " + " | ".join(cells) + " |")
    raw = results[("raw", "pinned copy")]
    lines.append(f"| single pinned copy ({large_bytes >> 20} MiB) | {raw * 1e6:.1f} us |" + " |" * (len(labels) - 1))
    lines.append("")
    for label in labels:
        speedup = results[(label, "leaf by leaf")] / results[(label, "consolidated")]
        end_to_end = results[(label, "leaf by leaf")] / results[(label, "consolidate + to")]
        bandwidth = raw / results[(label, "large consolidated")]
        gbps = large_bytes / results[(label, "large consolidated")] / 1e9
        lines.append(f"{label}: consolidated {speedup:.2f}x faster than leaf by leaf (target >= 3x), "
                     f"consolidate + to {end_to_end:.2f}x; large buffer at {gbps:.1f} GB/s = "
                     f"{bandwidth:.0%} of a single pinned copy (target >= 90%)")
    if len(labels) == 2:
        ratio = results[("torchdict", "consolidated")] / results[("tensordict", "consolidated")]
        lines.append(f"torchdict / tensordict, consolidated: {ratio:.2f}x the time")
    return "\n".join(lines)


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--leaves", type=int, default=100)
    parser.add_argument("--leaf-shape", default="64,16")
    parser.add_argument("--large-mib", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=50)
    options = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(NO_DEVICE)
        return 0
    shape = tuple(int(size) for size in options.leaf_shape.split(","))
    large_bytes = options.large_mib << 20
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}: {options.leaves} leaves of {shape} float32; "
          f"{options.large_mib} MiB buffer")
    results = measure("cuda", options.leaves, shape, large_bytes, options.repeat)
    print(report(results, large_bytes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
