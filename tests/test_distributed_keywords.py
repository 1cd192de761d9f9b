"""Upstream's keywords of the collectives, differentially over two gloo processes: ``broadcast(device=,
_tensorclass_type=)``, ``all_reduce(bucket_bytes=)`` and ``reduce(bucket_bytes=, return_premature=)``.

Both libraries run the same scenarios in one process group (two ranks on 127.0.0.1, started once for the
file); each rank reports what it saw, and the tests compare upstream's report with torchdict's, rank by rank.
"""
from __future__ import annotations

import multiprocessing
import os
import sys
import tempfile

import pytest

pytest.importorskip("tensordict")

_WORKER = r'''
import sys, traceback, torch
sys.path.insert(0, {src!r})
import torch.distributed as dist
import tensordict
import torchdict


@tensordict.tensorclass
class PointUp:
    x: torch.Tensor
    tag: str = "p"


@torchdict.tensorclass
class PointOurs:
    x: torch.Tensor
    tag: str = "p"


POINTS = {{tensordict: PointUp, torchdict: PointOurs}}


def values(td):
    return {{str(key): value.tolist() if isinstance(value, torch.Tensor) else value
            for key, value in td.items(True, True)}}


def sample(lib, rank):
    # keys set in sorted order: upstream buckets in insertion order, torchdict in sorted-key order
    return lib.TensorDict(a=torch.full((3,), float(rank + 1)), b=torch.arange(5.) * (rank + 1),
                          c=torch.arange(2) + rank, d=torch.ones(300) * (rank + 1),
                          n={{"e": torch.full((2,), 10. * (rank + 1))}})


def wait(items):
    for item in items:
        item.wait()


def scenario_broadcast_device(lib, rank):
    td = lib.TensorDict(a=torch.full((2, 3), float(rank + 1)), n={{"b": torch.arange(2) + rank}}, batch_size=[2])
    result = td.broadcast(0, device="cpu")
    return type(result).__name__, values(result), str(result["a"].device), list(result.batch_size)


def scenario_broadcast_tensorclass_type(lib, rank):
    point = POINTS[lib]
    td = lib.TensorDict(x=torch.full((2,), float(rank)), batch_size=[2])
    result = td.broadcast(0, _tensorclass_type=f"{{__name__}}.{{point.__name__}}")
    name = type(result).__name__.replace(point.__name__, "Point")
    instance = point(x=torch.full((2,), float(rank + 5)), batch_size=[2]).broadcast(0)
    return name, result.get("x").tolist(), type(instance).__name__.replace(point.__name__, "Point"), instance.x.tolist()


def scenario_all_reduce_buckets(lib, rank):
    out = []
    for bucket_bytes in (1, 16, 64, 1 << 20):
        td = sample(lib, rank)
        assert td.all_reduce(bucket_bytes=bucket_bytes) is None
        handles = (td2 := sample(lib, rank)).all_reduce(async_op=True, bucket_bytes=bucket_bytes)
        count = len(handles)
        wait(handles)
        out.append((bucket_bytes, values(td), count, values(td2)))
    return out


def scenario_all_reduce_bad_bucket_bytes(lib, rank):
    td = sample(lib, rank)
    try:
        td.all_reduce(bucket_bytes=0)
    except Exception as error:
        return type(error).__name__, values(td) == values(sample(lib, rank))
    return "no error"


def scenario_reduce_buckets(lib, rank):
    out = []
    for bucket_bytes in (8, 1 << 20):
        td = sample(lib, rank)
        td.reduce(1, bucket_bytes=bucket_bytes)
        td2 = sample(lib, rank)
        handles = td2.reduce(1, async_op=True, return_premature=True, bucket_bytes=bucket_bytes)
        count = len(handles)
        wait(handles)
        out.append((bucket_bytes, values(td) if rank == 1 else None, count, values(td2) if rank == 1 else None))
    return out


SCENARIOS = [scenario_broadcast_device, scenario_broadcast_tensorclass_type, scenario_all_reduce_buckets,
             scenario_all_reduce_bad_bucket_bytes, scenario_reduce_buckets]


def run(rank, world, path, queue):
    dist.init_process_group("gloo", init_method="file://" + path, rank=rank, world_size=world)
    torch.set_num_threads(1)
    report = {{}}
    for scenario in SCENARIOS:
        for lib in (tensordict, torchdict):
            try:
                report[(scenario.__name__, lib.__name__)] = ("value", scenario(lib, rank))
            except Exception:
                report[(scenario.__name__, lib.__name__)] = ("error", traceback.format_exc())
            dist.barrier()
    queue.put((rank, report))
    dist.destroy_process_group()
'''


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dist_keywords")
    (folder / "dropin_dist_kw_worker.py").write_text(
        _WORKER.format(src=os.path.join(os.path.dirname(__file__), "..", "src")))
    sys.path.insert(0, str(folder))  # the spawned workers import the module through the parent's sys.path
    try:
        import dropin_dist_kw_worker

        context = multiprocessing.get_context("spawn")
        queue = context.Queue()
        store = tempfile.mktemp(dir=folder)
        processes = [context.Process(target=dropin_dist_kw_worker.run, args=(rank, 2, store, queue), daemon=True)
                     for rank in range(2)]
        for process in processes:
            process.start()
        results = dict(queue.get(timeout=240) for _ in processes)
        for process in processes:
            process.join(60)
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("dropin_dist_kw_worker", None)
    return results


def _compare(reports, scenario):
    for rank, report in reports.items():
        theirs = report[(scenario, "tensordict")]
        ours = report[(scenario, "torchdict")]
        assert theirs[0] == "value", f"upstream failed on rank {rank}:\n{theirs[1]}"
        assert ours == theirs, f"rank {rank}\nupstream:  {theirs}\ntorchdict: {ours}"
    return {rank: report[(scenario, "torchdict")][1] for rank, report in reports.items()}


@pytest.mark.slow
def test_broadcast_device(reports):
    results = _compare(reports, "scenario_broadcast_device")
    assert results[1][1] == {"a": [[1.0] * 3] * 2, "('n', 'b')": [0, 1]}


@pytest.mark.slow
def test_broadcast_tensorclass_type(reports):
    results = _compare(reports, "scenario_broadcast_tensorclass_type")
    assert results[1] == ("Point", [0.0, 0.0], "Point", [5.0, 5.0])


@pytest.mark.slow
def test_all_reduce_bucket_bytes(reports):
    results = _compare(reports, "scenario_all_reduce_buckets")
    counts = [count for _, _, count, _ in results[0]]
    assert counts[0] > counts[-1]  # 1 byte: a bucket per leaf; 1 MiB: one per dtype
    assert results[0][0][1]["a"] == [3.0] * 3


@pytest.mark.slow
def test_all_reduce_refuses_a_bad_bucket_size_on_every_rank(reports):
    results = _compare(reports, "scenario_all_reduce_bad_bucket_bytes")
    assert results[0] == ("ValueError", True)


@pytest.mark.slow
def test_reduce_bucket_bytes_with_return_premature(reports):
    results = _compare(reports, "scenario_reduce_buckets")
    assert results[1][0][3]["('n', 'e')"] == [30.0, 30.0]
