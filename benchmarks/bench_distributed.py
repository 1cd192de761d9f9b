"""Distributed benchmarks (issue 8): send/recv and all_reduce over gloo on loopback.

The transfers run in two spawned worker processes (rank 0 sends, rank 1 receives)
that stay up for the whole suite; the harness process only drives them through
pipes. Each sample asks both ranks to run ``loops`` transfers between two barriers
and reports the slower rank's time per transfer, so the cases are *self-timed*.

Columns:
- torchdict: ``td.send(1)`` / ``td.recv(0)`` (the packed protocol, structure checked);
- tensordict: upstream's ``send`` / ``recv`` (one message per leaf), if installed;
- floor: one ``dist.send`` / ``dist.recv`` of a single uint8 tensor holding the same
  bytes (for all_reduce: one ``dist.all_reduce`` of a single flat tensor).

Run with the suite runner (``python benchmarks/run.py --suite distributed``) or on its
own (``python benchmarks/bench_distributed.py [--quick]``), which prints the same table.
Before timing, every implementation's first transfer is checked: the receiver must
hold exactly the sender's values.
"""
from __future__ import annotations

import atexit
import datetime
import importlib.util
import os
import socket
import sys
import time

import torch

from _harness import FLOOR, TORCHDICT, UPSTREAM, Case

SMALL_LEAVES = 100
SMALL_SHAPE = (16, 3)
BIG_LEAVES = 4
BIG_BYTES = 100 << 20  # 100 MiB in BIG_LEAVES float32 leaves
MIN_SAMPLE_S = 0.03  # a sample runs enough transfers to last this long
WORKER_TIMEOUT_S = 120.0


# --------------------------------------------------------------------------- data (built in each worker)
def _sources(case: str, rank: int) -> dict:
    """Plain tensors of the case: the sender's hold values, the receiver's zeros."""
    generator = torch.Generator().manual_seed(1234)
    if case in ("small", "small_per_leaf", "all_reduce"):
        tensors = {f"key{i}": torch.randn(SMALL_SHAPE, generator=generator) for i in range(SMALL_LEAVES)}
    else:
        numel = BIG_BYTES // 4 // BIG_LEAVES
        tensors = {f"key{i}": torch.full((numel,), float(i + 1)) for i in range(BIG_LEAVES)}
    if case == "all_reduce" or rank == 0:
        return tensors
    return {key: torch.zeros_like(value) for key, value in tensors.items()}


def _total_bytes(tensors: dict) -> int:
    return sum(value.numel() * value.element_size() for value in tensors.values())


class _Job:
    """One implementation of one case on one rank: ``run()`` does a transfer, ``check()`` validates it."""

    def __init__(self, case: str, label: str, rank: int) -> None:
        import torch.distributed as dist

        self.dist = dist
        tensors = _sources(case, rank)
        expected = _sources(case, 0)
        batch = [SMALL_SHAPE[0]] if case != "big" else []
        peer = 1 - rank
        if label == FLOOR:
            nbytes = _total_bytes(tensors)
            if case == "all_reduce":
                flat = torch.cat([value.reshape(-1) for value in tensors.values()])
                self.run = lambda: dist.all_reduce(flat)
                self.check = lambda: None
                return
            flat = torch.zeros(nbytes, dtype=torch.uint8) if rank == 1 else torch.cat(
                [value.reshape(-1).view(torch.uint8) for value in tensors.values()])
            self.run = (lambda: dist.send(flat, peer)) if rank == 0 else (lambda: dist.recv(flat, peer))
            self.check = lambda: None
            return
        library = importlib.import_module("torchdict" if label == TORCHDICT else "tensordict")
        td = library.TensorDict(tensors, batch_size=batch)
        if case == "all_reduce":
            self.run = lambda: td.all_reduce()
            self.check = lambda: None
            return
        # Upstream's send is per-leaf already; torchdict's needs the switch.
        options = {"per_leaf": True} if case == "small_per_leaf" and label == TORCHDICT else {}
        self.run = (lambda: td.send(peer, **options)) if rank == 0 else (lambda: td.recv(peer, **options))

        def check() -> None:
            if rank == 1:
                for key, value in expected.items():
                    if not torch.equal(td[key], value):
                        raise AssertionError(f"{label} {case}: leaf {key} arrived wrong")

        self.check = check


def _serve(rank: int, port: int, connection) -> None:
    """A worker: join the gloo group, then run timing requests until told to stop."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))
    jobs: dict = {}
    try:
        while True:
            request = connection.recv()
            if request is None:
                break
            case, label, loops = request
            try:
                job = jobs.get((case, label))
                if job is None:
                    job = jobs[(case, label)] = _Job(case, label, rank)
                    dist.barrier()
                    job.run()  # warm-up, and the correctness check
                    job.check()
                dist.barrier()
                start = time.perf_counter_ns()
                for _ in range(loops):
                    job.run()
                dist.barrier()
                connection.send(("ok", time.perf_counter_ns() - start))
            except Exception as error:  # reported to the harness, which shows it under the table
                connection.send(("error", f"{type(error).__name__}: {error}"))
    finally:
        dist.destroy_process_group()


class _Pair:
    """Two worker processes, ranks 0 and 1 of a gloo group on 127.0.0.1."""

    def __init__(self) -> None:
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.connections = []
        self.processes = []
        for rank in range(2):
            parent_end, child_end = context.Pipe()
            process = context.Process(target=_serve, args=(rank, port, child_end), daemon=True)
            process.start()
            self.connections.append(parent_end)
            self.processes.append(process)
        self.loops: dict = {}

    def _request(self, case: str, label: str, loops: int) -> int:
        for connection in self.connections:
            connection.send((case, label, loops))
        replies = []
        for connection in self.connections:
            if not connection.poll(WORKER_TIMEOUT_S):
                self.close()
                raise RuntimeError(f"{label} {case}: a worker did not answer within {WORKER_TIMEOUT_S} s")
            replies.append(connection.recv())
        errors = [text for status, text in replies if status != "ok"]
        if errors:
            raise RuntimeError(errors[0])
        return max(elapsed for _, elapsed in replies)

    def measure(self, case: str, label: str) -> float:
        """Nanoseconds per transfer, over enough transfers to last ``MIN_SAMPLE_S``."""
        loops = self.loops.get((case, label))
        if loops is None:
            per_call = self._request(case, label, 1)
            loops = self.loops[(case, label)] = max(1, min(500, int(MIN_SAMPLE_S * 1e9 / max(per_call, 1))))
        return self._request(case, label, loops) / loops

    def close(self) -> None:
        for connection in self.connections:
            try:
                connection.send(None)
            except (OSError, ValueError):
                pass
        for process in self.processes:
            process.join(10)
            if process.is_alive():
                process.kill()
        self.connections, self.processes = [], []


_PAIR: _Pair | None = None


def _pair() -> _Pair:
    global _PAIR
    if _PAIR is None or not _PAIR.processes:
        _PAIR = _Pair()
        atexit.register(_PAIR.close)
    return _PAIR


def _impl(case: str, label: str):
    def prepare(data):
        if label == UPSTREAM and importlib.util.find_spec("tensordict") is None:
            raise ImportError("tensordict")
        pair = _pair()
        return lambda: pair.measure(case, label)

    return prepare


def _impls(case: str) -> dict:
    return {label: _impl(case, label) for label in (TORCHDICT, UPSTREAM, FLOOR)}


def cases() -> list:
    small = f"{SMALL_LEAVES} leaves of {list(SMALL_SHAPE)} float32 ({SMALL_LEAVES * 16 * 3 * 4 // 1024} KiB)"
    return [
        Case(f"send/recv {SMALL_LEAVES} small leaves", impls=_impls("small"), self_timed=True,
             target=">= 3x faster than upstream",
             note=f"{small}; torchdict: header + one packed message, then the receiver's ack (2 hops)."),
        Case(f"send/recv {SMALL_LEAVES} small leaves, per_leaf=True", impls=_impls("small_per_leaf"),
             self_timed=True, note="torchdict's upstream-compatible mode: one message per leaf."),
        Case(f"send/recv {BIG_BYTES >> 20} MiB ({BIG_LEAVES} leaves)", impls=_impls("big"), self_timed=True,
             max_samples=7, target="<= 1.25x floor",
             note="<= 1.25x floor is >= 80% of the single-tensor throughput; leaves >= 1 MiB travel "
                  "straight from and into their own memory."),
        Case(f"all_reduce {SMALL_LEAVES} small leaves", impls=_impls("all_reduce"), self_timed=True,
             note="torchdict reduces one flat buffer per dtype; upstream one all_reduce per leaf."),
    ]


if __name__ == "__main__":
    import _harness

    config = _harness.Config.quick() if "--quick" in sys.argv else _harness.Config()
    results = _harness.run_cases(cases(), config, lambda name: print(f"[distributed] {name} ...", file=sys.stderr))
    print(_harness.format_markdown("distributed", results, config, _harness.environment()))
    if _PAIR is not None:
        _PAIR.close()
