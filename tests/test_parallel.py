"""TensorDict.map / map_iter: chunking, gathering, in-place edits, shuffling, failures.

Semantics are stated against plain torch: ``map`` equals ``torch.cat`` (or
``torch.stack`` for ``chunksize=0``) of ``fn`` over the chunks ``split`` gives.
Most tests run in-process (``num_workers=0``, same code path for cutting and
gathering); the ``slow`` ones start real worker processes, with ``fork`` and
``spawn``. Functions given to ``map`` live at module level so that ``spawn``
workers can import them.
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import sys

import pytest
import torch

from _helpers import is_running, running_children
from torchdict import MemoryMappedTensor, TensorDict
from torchdict.parallel import RemoteTraceback, WorkerError, WorkerPool

FORK_AND_SPAWN = [
    pytest.param("fork", marks=pytest.mark.skipif(sys.platform != "linux", reason="fork is Linux-only here")),
    "spawn",
]


# ---------------------------------------------------------------------- functions given to map
def double_x(chunk):
    return TensorDict(y=chunk["x"] * 2, batch_size=chunk.batch_size)


def double_x_nested(chunk):
    return TensorDict({"y": chunk["x"] * 2, "sub": {"z": chunk["x"].unsqueeze(-1).expand(*chunk.batch_size, 3)}},
                      batch_size=chunk.batch_size)


def process_data(data):
    """The seed's function: edits each item in place."""
    images = data.get("images").flip(-2).clone()
    labels = data.get("labels") // 10
    data.set_("images", images)
    data.set_("labels", labels)


def returns_none(chunk):
    return None


def first_element(chunk):
    return chunk[:1]


def fail_on_eight(chunk):
    if chunk["x"][0] == 8:
        raise ValueError("chunk starting at 8 is rejected")
    return chunk


def kill_on_eight(chunk):
    if chunk["x"][0] == 8:
        os.kill(os.getpid(), signal.SIGKILL)
    return double_x(chunk)


def worker_pid(chunk):
    return TensorDict(pid=torch.full(chunk.batch_size, os.getpid()), batch_size=chunk.batch_size)


def random_numbers(chunk):
    return TensorDict(r=torch.rand(chunk.batch_size), batch_size=chunk.batch_size)


def identity(chunk):
    return chunk


# ---------------------------------------------------------------------- helpers
def make_td(n=20):
    return TensorDict(x=torch.arange(float(n)), batch_size=[n])


def make_dataset(folder, n=24):
    """The seed's dataset layout (images + labels), memory-mapped, small."""
    data = TensorDict({"images": torch.zeros((8, 8, 3), dtype=torch.uint8),
                       "labels": torch.zeros((), dtype=torch.int)}, batch_size=[])
    data = data.expand(n).memmap_like(str(folder))
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (n, 8, 8, 3), dtype=torch.uint8, generator=generator)
    labels = torch.randint(0, 1000, (n,), dtype=torch.int, generator=generator)
    data["images"].copy_(images)
    data["labels"].copy_(labels)
    return data, images, labels


def torch_shm_segments(pids):
    """Entries of /dev/shm created by torch for the given processes (torch names them torch_<pid>_...)."""
    if not os.path.isdir("/dev/shm"):
        return set()
    prefixes = tuple(f"torch_{pid}_" for pid in pids)
    return {name for name in os.listdir("/dev/shm") if name.startswith(prefixes)}


def expected_cat(x, chunk_size):
    return torch.cat([piece * 2 for piece in x.split(chunk_size)])


# ---------------------------------------------------------------------- cutting and gathering (in-process)
@pytest.mark.parametrize("chunksize,num_chunks", [(3, None), (None, 4), (None, None), (50, None), (None, 50)])
def test_map_concatenates_results_in_order(chunksize, num_chunks):
    td = make_td(20)
    result = td.map(double_x, num_workers=0, chunksize=chunksize, num_chunks=num_chunks)
    assert result.batch_size == torch.Size([20])
    assert torch.equal(result["y"], td["x"] * 2)


def test_chunk_sizes_follow_split_and_chunk():
    seen = []

    def record(chunk):
        seen.append(chunk.batch_size[0])

    td = make_td(10)
    td.map(record, num_workers=0, chunksize=4)
    assert seen == [piece.shape[0] for piece in torch.arange(10).split(4)]
    seen.clear()
    td.map(record, num_workers=0, num_chunks=4)
    assert seen == [piece.shape[0] for piece in torch.arange(10).chunk(4)]
    seen.clear()
    td.map(record, num_workers=0, num_chunks=100)
    assert seen == [1] * 10


def test_chunksize_zero_passes_unbound_items_and_stacks():
    shapes = []

    def item_fn(item):
        shapes.append(item.batch_size)
        return TensorDict(y=item["x"] * 2)

    td = make_td(5)
    result = td.map(item_fn, num_workers=0, chunksize=0)
    assert shapes == [torch.Size([])] * 5
    assert result.batch_size == torch.Size([5])
    assert torch.equal(result["y"], torch.stack([x * 2 for x in td["x"].unbind(0)]))


def test_map_along_dim_1_with_nested_results():
    x = torch.arange(24.0).reshape(2, 12)
    td = TensorDict(x=x, batch_size=[2, 12])
    result = td.map(double_x_nested, dim=1, num_workers=0, chunksize=5)
    assert result.batch_size == torch.Size([2, 12])
    assert torch.equal(result["y"], torch.cat([piece * 2 for piece in x.split(5, dim=1)], dim=1))
    assert torch.equal(result["sub", "z"], x.unsqueeze(-1).expand(2, 12, 3))
    assert result["sub"].batch_size == torch.Size([2, 12])


def test_negative_dim_is_normalised():
    x = torch.arange(24.0).reshape(2, 12)
    td = TensorDict(x=x, batch_size=[2, 12])
    result = td.map(double_x, dim=-1, num_workers=0, chunksize=5)
    assert torch.equal(result["y"], x * 2)


def test_map_returns_none_when_fn_returns_none():
    assert make_td().map(returns_none, num_workers=0, chunksize=3) is None


def test_results_of_other_lengths_are_concatenated_like_torch_cat():
    td = make_td(10)
    result = td.map(first_element, num_workers=0, chunksize=4)
    assert torch.equal(result["x"], torch.cat([piece[:1] for piece in td["x"].split(4)]))


def test_results_that_are_tensors_are_concatenated():
    td = make_td(10)
    result = td.map(lambda chunk: chunk["x"] + 1, num_workers=0, chunksize=3)
    assert torch.equal(result, td["x"] + 1)


def test_out_is_written_and_returned():
    td = make_td(12)
    out = TensorDict(y=torch.zeros(12), batch_size=[12])
    result = td.map(double_x, num_workers=0, chunksize=5, out=out)
    assert result is out
    assert torch.equal(out["y"], td["x"] * 2)


def test_out_with_another_structure_raises():
    td = make_td(12)
    out = TensorDict(other=torch.zeros(12), batch_size=[12])
    with pytest.raises(RuntimeError, match=r"does not fit its place in out: out is a TensorDict with batch "
                                           r"size \[12\] and leaves \{'other': 'float32\[12\]'\}"):
        td.map(double_x, num_workers=0, chunksize=5, out=out)
    assert torch.equal(out["other"], torch.zeros(12))


def test_out_of_another_length_raises_before_any_work():
    calls = []
    td = make_td(12)
    out = TensorDict(y=torch.zeros(10), batch_size=[10])
    with pytest.raises(ValueError, match=r"out must hold the gathered result: 12 elements along dim 0, "
                                         r"got batch size \[10\]"):
        td.map(lambda chunk: calls.append(chunk), num_workers=0, chunksize=5, out=out)
    assert calls == []
    assert torch.equal(out["y"], torch.zeros(10))


def test_locked_source_gives_locked_chunks():
    td = make_td(6).lock_()
    states = []
    td.map(lambda chunk: states.append(chunk.is_locked), num_workers=0, chunksize=2)
    assert states == [True, True, True]


def test_memmapped_source_gives_memmapped_output(tmp_path):
    data, images, labels = make_dataset(tmp_path / "data", n=10)
    result = data.map(lambda item: TensorDict(label=item["labels"] + 1), num_workers=0, chunksize=0)
    assert isinstance(result["label"], MemoryMappedTensor)
    assert torch.equal(result["label"], labels + 1)


def test_empty_batch_dim_returns_out():
    td = TensorDict(x=torch.zeros(0, 3), batch_size=[0])
    assert td.map(double_x, num_workers=0) is None


# ---------------------------------------------------------------------- argument errors
def test_chunksize_and_num_chunks_together_raise():
    td = make_td()
    with pytest.raises(ValueError, match="Either chunksize or num_chunks must be provided, but not both."):
        td.map(double_x, num_workers=0, chunksize=2, num_chunks=2)


def test_zero_dim_tensordict_raises_index_error():
    td = TensorDict(x=torch.zeros(()))
    with pytest.raises(IndexError, match=r"Incompatible dim 0 for tensordict with shape torch.Size\(\[\]\)"):
        td.map(double_x, num_workers=0)


@pytest.mark.parametrize("kwargs,error,fragment", [
    ({"chunksize": -1}, ValueError, "chunksize must be a non-negative int"),
    ({"num_chunks": 0}, ValueError, "num_chunks must be a positive int"),
    ({"num_workers": -2}, ValueError, "num_workers must be a non-negative int"),
    ({"worker_threads": 0}, ValueError, "worker_threads must be a positive int"),
    ({"max_tasks_per_child": 0}, ValueError, "max_tasks_per_child must be a positive int"),
    ({"pool": object()}, TypeError, "pool must be a torchdict.parallel.WorkerPool"),
    ({"out": torch.zeros(20)}, TypeError, "out must be a TensorDict"),
    ({"dim": 1}, IndexError, "Incompatible dim 1"),
])
def test_bad_arguments_raise_and_change_nothing(kwargs, error, fragment):
    td = make_td()
    before = td["x"].clone()
    with pytest.raises(error, match=fragment):
        td.map(double_x, **{"num_workers": 0, **kwargs})
    assert torch.equal(td["x"], before)
    assert not td["x"].is_shared()


def test_fn_must_be_callable():
    with pytest.raises(TypeError, match="fn must be callable"):
        make_td().map("not a function", num_workers=0)


def test_pbar_without_tqdm_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)
    td = make_td()
    with pytest.raises(ImportError, match="pbar=True draws a progress bar with tqdm"):
        td.map(double_x, num_workers=0, pbar=True)
    with pytest.raises(ImportError, match="pbar=True draws a progress bar with tqdm"):
        td.map_iter(double_x, num_workers=0, pbar=True)  # at the call, not at the first iteration
    assert not td["x"].is_shared()


def test_pbar_shows_progress(capsys):
    pytest.importorskip("tqdm")
    make_td(8).map(double_x, num_workers=0, chunksize=2, pbar=True)
    assert "4/4" in capsys.readouterr().err


def test_map_iter_validates_at_call_time():
    with pytest.raises(ValueError, match="Either chunksize or num_chunks"):
        make_td().map_iter(double_x, num_workers=0, chunksize=1, num_chunks=1)


# ---------------------------------------------------------------------- map_iter (in-process)
def test_map_iter_yields_chunks_in_order():
    td = make_td(20)
    chunks = list(td.map_iter(identity, num_workers=0, chunksize=4))
    assert [chunk.batch_size for chunk in chunks] == [torch.Size([4])] * 5
    assert torch.equal(torch.cat([chunk["x"] for chunk in chunks]), td["x"])


def test_map_iter_shuffle_covers_every_item_once_and_follows_the_generator():
    td = make_td(23)

    def run(seed):
        generator = torch.Generator().manual_seed(seed)
        return torch.cat([c["x"] for c in td.map_iter(identity, num_workers=0, chunksize=5, shuffle=True,
                                                       generator=generator)])

    first = run(0)
    assert torch.equal(first.sort().values, td["x"])
    assert not torch.equal(first, td["x"])
    assert torch.equal(run(0), first)
    assert torch.equal(first, td["x"][torch.randperm(23, generator=torch.Generator().manual_seed(0))])


def test_map_iter_chunksize_zero_yields_items():
    td = make_td(3)
    assert [item.batch_size for item in td.map_iter(identity, num_workers=0, chunksize=0)] == [torch.Size([])] * 3


# ---------------------------------------------------------------------- worker processes
@pytest.mark.slow
@pytest.mark.parametrize("method", FORK_AND_SPAWN)
def test_seed_example_edits_memmapped_items_in_place(tmp_path, method):
    data, images, labels = make_dataset(tmp_path / "data", n=24)
    result = data.map(process_data, num_workers=2, chunksize=0, mp_start_method=method)
    assert result is None
    assert torch.equal(data["labels"], labels // 10)
    assert torch.equal(data["images"], images.flip(-2))
    assert multiprocessing.active_children() == []


@pytest.mark.slow
def test_workers_gather_results_in_order_into_shared_memory():
    td = make_td(50)
    result = td.map(double_x_nested, num_workers=2, chunksize=3)
    assert torch.equal(result["y"], expected_cat(td["x"], 3))
    assert torch.equal(result["sub", "z"], td["x"].unsqueeze(-1).expand(50, 3))
    assert result["y"].is_shared()
    assert td["x"].is_shared()  # the plain source was moved to shared memory, in place


@pytest.mark.slow
def test_workers_write_a_memmapped_output_for_a_memmapped_input(tmp_path):
    data, images, labels = make_dataset(tmp_path / "data", n=30)
    result = data.map(lambda chunk: TensorDict(label=chunk["labels"] * 3, batch_size=chunk.batch_size),
                      num_workers=2, chunksize=4)
    assert isinstance(result["label"], MemoryMappedTensor)
    assert os.path.exists(result["label"].filename)
    assert torch.equal(result["label"], labels * 3)


@pytest.mark.slow
def test_workers_write_into_out():
    td = make_td(30)
    out = TensorDict(y=torch.zeros(30), batch_size=[30])
    assert td.map(double_x, num_workers=2, chunksize=4, out=out) is out
    assert torch.equal(out["y"], td["x"] * 2)


@pytest.mark.slow
def test_chunks_of_other_lengths_are_gathered_by_workers():
    td = make_td(20)
    result = td.map(first_element, num_workers=2, chunksize=3)
    assert torch.equal(result["x"], torch.cat([piece[:1] for piece in td["x"].split(3)]))


@pytest.mark.slow
def test_map_iter_with_workers_is_in_order_and_shuffle_is_a_permutation():
    td = make_td(40)
    chunks = list(td.map_iter(double_x, num_workers=2, chunksize=3, prefetch=3))
    assert torch.equal(torch.cat([chunk["y"] for chunk in chunks]), td["x"] * 2)
    generator = torch.Generator().manual_seed(1)
    shuffled = torch.cat([c["x"] for c in td.map_iter(identity, num_workers=2, chunksize=6, shuffle=True,
                                                       generator=generator)])
    assert torch.equal(shuffled.sort().values, td["x"])
    assert torch.equal(shuffled, td["x"][torch.randperm(40, generator=torch.Generator().manual_seed(1))])


@pytest.mark.slow
def test_leaving_map_iter_early_stops_the_workers():
    td = make_td(40)
    for chunk in td.map_iter(identity, num_workers=2, chunksize=2):
        break
    import gc

    gc.collect()
    assert multiprocessing.active_children() == []


@pytest.mark.slow
def test_workers_get_different_seeds():
    td = make_td(8)
    result = td.map(random_numbers, num_workers=2, num_chunks=2, generator=torch.Generator().manual_seed(0))
    first, second = result["r"].split(4)
    assert not torch.equal(first, second)


@pytest.mark.slow
def test_max_tasks_per_child_replaces_workers():
    td = make_td(6)
    pids = td.map(worker_pid, num_workers=2, chunksize=1, max_tasks_per_child=1)["pid"]
    assert len(set(pids.tolist())) == 6
    assert os.getpid() not in pids.tolist()
    assert multiprocessing.active_children() == []


@pytest.mark.slow
def test_a_pool_keeps_its_workers_across_calls():
    from multiprocessing import resource_sharer

    resource_sharer.stop()  # an earlier test (a multiprocessing.Pool passing tensors) may have started its thread
    td = make_td(12)
    with WorkerPool(2) as pool:
        first = set(td.map(worker_pid, pool=pool, chunksize=3)["pid"].tolist())
        second = set(td.map(worker_pid, pool=pool, chunksize=3)["pid"].tolist())
        assert first == second == {worker.process.pid for worker in pool._workers}
        assert torch.equal(td.map(double_x, pool=pool, chunksize=5)["y"], td["x"] * 2)
        # a plain source and a shared output cross the pool's pipes as descriptors, not via a
        # resource_sharer thread in this process
        assert resource_sharer._resource_sharer._thread is None
    assert multiprocessing.active_children() == []


@pytest.mark.slow
@pytest.mark.parametrize("method", FORK_AND_SPAWN)
def test_exception_in_fn_is_raised_with_the_worker_traceback(method):
    td = make_td(20)
    with pytest.raises(ValueError, match="chunk starting at 8 is rejected") as info:
        td.map(fail_on_eight, num_workers=2, chunksize=4, mp_start_method=method)
    cause = info.value.__cause__
    assert isinstance(cause, RemoteTraceback)
    assert "in fail_on_eight" in str(cause)
    assert 'raise ValueError("chunk starting at 8 is rejected")' in str(cause)
    assert multiprocessing.active_children() == []


@pytest.mark.slow
@pytest.mark.parametrize("method", FORK_AND_SPAWN)
def test_killed_worker_raises_and_leaves_nothing_behind(method):
    td = make_td(20)
    with WorkerPool(2, mp_start_method=method) as pool:
        td.map(double_x, pool=pool, chunksize=10)  # start the workers, to know their pids
        pids = [os.getpid()] + [worker.process.pid for worker in pool._workers]
        segments_before = torch_shm_segments(pids)
        with pytest.raises(WorkerError, match="killed by signal SIGKILL"):
            td.map(kill_on_eight, pool=pool, chunksize=4)
        assert multiprocessing.active_children() == []
        assert torch_shm_segments(pids) <= segments_before
        if method == "fork":  # (spawn start-up is slow: checked once is enough)
            # the pool starts fresh workers for the next call
            assert torch.equal(td.map(double_x, pool=pool, chunksize=4)["y"], td["x"] * 2)
    assert multiprocessing.active_children() == []


@pytest.mark.slow
def test_killed_worker_in_map_iter_raises():
    td = make_td(20)
    with pytest.raises(WorkerError, match="SIGKILL"):
        list(td.map_iter(kill_on_eight, num_workers=2, chunksize=4))
    assert multiprocessing.active_children() == []


_ORPHAN_SCRIPT = r"""
import os, sys, time
import torch
from torchdict import TensorDict

def sleep_long(chunk):
    time.sleep(60)

if __name__ == "__main__":
    print(os.getpid(), flush=True)
    TensorDict(x=torch.zeros(4), batch_size=[4]).map(sleep_long, num_workers=2, chunksize=1)
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_workers_die_with_a_killed_parent(tmp_path):
    import subprocess
    import time

    script = tmp_path / "orphans.py"
    script.write_text(_ORPHAN_SCRIPT)
    source = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    environment = {**os.environ, "PYTHONPATH": source + os.pathsep + os.environ.get("PYTHONPATH", "")}
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=environment)
    try:
        pid = int(parent.stdout.readline())
        deadline = time.monotonic() + 60
        while len(running_children(pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        workers = running_children(pid)
        assert len(workers) == 2
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 10
    while any(is_running(worker) for worker in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(is_running(worker) for worker in workers)


@pytest.mark.slow
def test_docstring_examples_run():
    import doctest

    import torchdict.parallel._chunks
    import torchdict.parallel._pool
    import torchdict.parallel

    for module in (torchdict.parallel, torchdict.parallel._pool, torchdict.parallel._chunks):
        failures, attempted = doctest.testmod(module, extraglobs={"torch": torch, "TensorDict": TensorDict})
        assert failures == 0 and attempted > 0, module.__name__


@pytest.mark.slow
def test_seed_example_script_runs():
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    environment = {**os.environ, "PYTHONPATH": os.path.join(root, "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    completed = subprocess.run([sys.executable, os.path.join(root, "examples", "preprocess_map.py"), "--size", "40",
                                "--workers", "2"], capture_output=True, text=True, env=environment, timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert "preprocessed 40 images in place with 2 workers" in completed.stdout


# ---------------------------------------------------------------------- the pipe between parent and workers
def _link_pair():
    from torchdict.parallel._channel import Link

    left, right = multiprocessing.Pipe(duplex=True)
    return Link(left), Link(right)


def _sent_bytes(link, message):
    """Send ``message`` and return how many bytes the pickle took (descriptors excluded)."""
    sizes = []
    original = link.conn.send_bytes
    link.conn.send_bytes = lambda data: (sizes.append(len(data)), original(data))[1]
    try:
        link.send(message)
    finally:
        link.conn.send_bytes = original
    return sizes[0]


def test_shared_tensors_cross_the_pipe_as_descriptors_not_bytes():
    sender, receiver = _link_pair()
    td = TensorDict(x=torch.zeros(1_000_000), batch_size=[1_000_000])
    td["x"].share_memory_()
    assert _sent_bytes(sender, ("job", td)) < 2_000  # 4 MB of data, a few hundred bytes of message
    _, received = receiver.receive()
    received["x"][123] = 7.0  # the same pages
    assert td["x"][123] == 7.0


def test_memmapped_tensors_cross_the_pipe_as_file_names(tmp_path):
    sender, receiver = _link_pair()
    data, images, labels = make_dataset(tmp_path / "data", n=50)
    assert _sent_bytes(sender, data) < 2_000
    received = receiver.receive()
    assert isinstance(received["images"], MemoryMappedTensor)
    assert received["images"].filename == data["images"].filename
    assert torch.equal(received["labels"], labels)


def test_results_are_copied_once_into_lent_segments_that_are_reused_when_released():
    import gc

    sender, receiver = _link_pair()
    sender.send(TensorDict(y=torch.arange(1000.0), batch_size=[1000]))
    first = receiver.receive()
    assert torch.equal(first["y"], torch.arange(1000.0))
    assert len(sender.lent) == 1 and not sender.free
    del first
    gc.collect()
    receiver.send(("task", 1, 0, 1))  # the next message back tells the sender the segment is free
    sender.receive()
    assert len(sender.free) == 1 and not sender.lent
    sender.send(TensorDict(y=torch.ones(1000), batch_size=[1000]))
    second = receiver.receive()
    assert torch.equal(second["y"], torch.ones(1000))
    assert len(sender.lent) == 1 and not sender.free  # the same segment, lent again
    held = second  # a result still in use is never handed out again
    receiver.send(("task", 2, 0, 1))
    sender.receive()
    assert len(sender.lent) == 1 and torch.equal(held["y"], torch.ones(1000))
