"""map / map_iter: ``timeout=``, cleaning up on every exit the parent sees, and fn returning non-tensors.

What is checked after a failure is what a user would find: no worker process
left (``multiprocessing.active_children()`` and ``/proc``), no new entry in
``/dev/shm``, and no ``torchdict-map-*`` output folder in the temp folder
(pointed at a fresh directory per test). ``slow`` tests start real workers,
or a whole Python process to send SIGTERM / SIGINT to.
"""
from __future__ import annotations

import math
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest
import torch

from _helpers import is_running, running_children
from torchdict import TensorDict
from torchdict.parallel import WorkerError

LINUX = sys.platform.startswith("linux")


# ---------------------------------------------------------------------- functions given to map
def double_x(chunk):
    return TensorDict(y=chunk["x"] * 2, batch_size=chunk.batch_size)


def hang_on_four(chunk):
    """Chunk 2 (of chunks of 2) never ends; the others are quick."""
    if chunk["x"][0] == 4:
        time.sleep(60)
    return double_x(chunk)


def slow_on_four(chunk):
    if chunk["x"][0] == 4:
        time.sleep(0.3)
    return double_x(chunk)


def fail_on_four(chunk):
    if chunk["x"][0] == 4:
        raise ValueError("chunk 2 is rejected")
    return double_x(chunk)


def interrupt_on_four(chunk):
    if chunk["x"][0] == 4:
        raise KeyboardInterrupt
    return double_x(chunk)


def tensor_on_four(chunk):
    """A TensorDict for most chunks, a plain tensor for one: the results cannot be joined."""
    if chunk["x"][0] == 4:
        return chunk["x"]
    return double_x(chunk)


def returns_int(chunk):
    return 1


# ---------------------------------------------------------------------- helpers
def make_td(n=8):
    return TensorDict(x=torch.arange(float(n)), batch_size=[n])


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """A fresh temp folder for this test: map's output folders land there, and nowhere else."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def memmapped_td(folder, n=8):
    return make_td(n).memmap(str(folder / "source"))


def shm_entries():
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def lasting(entries):
    """Those of ``entries`` still in /dev/shm a moment later (others' short-lived files come and go)."""
    time.sleep(0.2)
    return entries & shm_entries()


class NothingLeft:
    """Snapshot of children and /dev/shm; ``check()`` asserts a job added nothing that lasts."""

    def __init__(self, tmp_folder):
        self.tmp_folder = tmp_folder
        self.children = running_children(os.getpid()) if LINUX else set()
        self.shm = shm_entries()

    def check(self):
        assert multiprocessing.active_children() == []
        if LINUX:
            assert running_children(os.getpid()) <= self.children
        assert lasting(shm_entries() - self.shm) == set()
        assert list(self.tmp_folder.iterdir()) == []


# ---------------------------------------------------------------------- bad arguments
@pytest.mark.parametrize("timeout,error", [
    (0, ValueError), (-1.5, ValueError), (float("nan"), ValueError), ("2", TypeError), (True, TypeError),
    ([1], TypeError),
])
@pytest.mark.parametrize("method", ["map", "map_iter"])
def test_bad_timeout_raises_before_anything_starts(timeout, error, method):
    td = make_td()
    with pytest.raises(error, match="timeout must be a"):
        getattr(td, method)(double_x, num_workers=2, timeout=timeout)
    assert not td["x"].is_shared()  # not even moved to shared memory
    assert multiprocessing.active_children() == []


@pytest.mark.parametrize("timeout", [None, 5, 2.5, math.inf])
def test_good_timeouts_are_accepted(timeout):
    td = make_td()
    assert torch.equal(td.map(double_x, num_workers=0, chunksize=2, timeout=timeout)["y"], td["x"] * 2)


# ---------------------------------------------------------------------- in-process (num_workers=0)
def test_in_process_an_overlong_chunk_is_reported_when_it_returns():
    with pytest.raises(TimeoutError, match=r"map: chunk 2 ran longer than timeout=0\.1 s .*cannot be stopped"):
        make_td().map(slow_on_four, num_workers=0, chunksize=2, timeout=0.1)
    with pytest.raises(TimeoutError, match=r"map_iter: chunk 2 ran longer than timeout=0\.1 s"):
        list(make_td().map_iter(slow_on_four, num_workers=0, chunksize=2, timeout=0.1))


def test_in_process_map_iter_does_not_count_the_loop_body():
    for _ in make_td().map_iter(double_x, num_workers=0, chunksize=2, timeout=0.05):
        time.sleep(0.1)


def test_fn_returning_an_int_is_a_clear_type_error():
    with pytest.raises(TypeError, match=r"fn returned 1 \(of type int\) for chunk 0; .*TensorDict .*, a tensor, "
                                        r"or None"):
        make_td().map(returns_int, num_workers=0, chunksize=2)
    # map_iter yields whatever fn returns
    assert list(make_td().map_iter(returns_int, num_workers=0, chunksize=2)) == [1, 1, 1, 1]


@pytest.mark.parametrize("fn,error", [(fail_on_four, ValueError), (interrupt_on_four, KeyboardInterrupt),
                                      (slow_on_four, TimeoutError), (tensor_on_four, TypeError)])
def test_a_failed_map_removes_its_output_folder(private_tmp, tmp_path, fn, error):
    td = memmapped_td(tmp_path)  # a memory-mapped source: the output goes to a folder of the temp dir
    with pytest.raises(error):
        td.map(fn, num_workers=0, chunksize=2, timeout=0.2)
    assert list(private_tmp.iterdir()) == []


def test_a_successful_map_keeps_its_output_folder_until_the_result_goes(private_tmp, tmp_path):
    result = memmapped_td(tmp_path).map(double_x, num_workers=0, chunksize=2, timeout=5)
    assert len(list(private_tmp.iterdir())) == 1
    del result
    import gc

    gc.collect()
    assert list(private_tmp.iterdir()) == []


# ---------------------------------------------------------------------- the SIGTERM handler
def sigterm_handler_seen(chunk):
    return TensorDict(default=torch.full(chunk.batch_size, signal.getsignal(signal.SIGTERM) is signal.SIG_DFL),
                      batch_size=chunk.batch_size)


def test_sigterm_handler_is_installed_only_while_map_runs():
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    seen = make_td().map(sigterm_handler_seen, num_workers=0, chunksize=4)["default"]
    assert not seen.any()  # ours, while it ran
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    with pytest.raises(ValueError):
        make_td().map(fail_on_four, num_workers=0, chunksize=2)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_handler_of_the_program_is_left_alone():
    def own_handler(signum, frame):
        pass

    previous = signal.signal(signal.SIGTERM, own_handler)
    try:
        def check(chunk):
            assert signal.getsignal(signal.SIGTERM) is own_handler
            return double_x(chunk)

        make_td().map(check, num_workers=0, chunksize=4)
        list(make_td().map_iter(check, num_workers=0, chunksize=4))
        assert signal.getsignal(signal.SIGTERM) is own_handler
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_map_in_another_thread_leaves_signals_alone():
    results = []
    thread = threading.Thread(target=lambda: results.append(make_td().map(double_x, num_workers=0, chunksize=4)))
    thread.start()
    thread.join()
    assert torch.equal(results[0]["y"], make_td()["x"] * 2)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


# ---------------------------------------------------------------------- workers
@pytest.mark.slow
@pytest.mark.parametrize("source", ["memmap", "shared"])
def test_map_timeout_stops_a_hung_worker_and_leaves_nothing(private_tmp, tmp_path, source):
    td = memmapped_td(tmp_path) if source == "memmap" else make_td()
    nothing_left = NothingLeft(private_tmp)
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"map: chunk 2 ran longer than timeout=2 s .*worker process \d+"):
        td.map(hang_on_four, num_workers=2, chunksize=2, timeout=2)
    assert time.monotonic() - started < 6
    nothing_left.check()


@pytest.mark.slow
def test_map_iter_timeout_stops_a_hung_worker_and_leaves_nothing(private_tmp):
    nothing_left = NothingLeft(private_tmp)
    received = []
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"map_iter: chunk 2 ran longer than timeout=2 s"):
        for batch in make_td().map_iter(hang_on_four, num_workers=2, chunksize=2, timeout=2):
            received.append(batch["y"])
    assert time.monotonic() - started < 6
    assert torch.equal(torch.cat(received), torch.arange(4.0) * 2)  # chunks 0 and 1 came through
    nothing_left.check()


@pytest.mark.slow
def test_a_generous_timeout_changes_no_result():
    td = make_td(40)
    for kwargs in ({"chunksize": 3}, {"chunksize": 0}, {"num_chunks": 5}):
        expected = td.map(double_x, num_workers=2, **kwargs)
        assert (td.map(double_x, num_workers=2, timeout=60, **kwargs) == expected).all()
    expected = [batch["y"] for batch in td.map_iter(double_x, num_workers=2, chunksize=7)]
    got = [batch["y"] for batch in td.map_iter(double_x, num_workers=2, chunksize=7, timeout=60.0)]
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    assert multiprocessing.active_children() == []


@pytest.mark.slow
def test_map_iter_timeout_does_not_count_the_loop_body():
    for _ in make_td().map_iter(double_x, num_workers=2, chunksize=2, timeout=0.5):
        time.sleep(0.7)
    assert multiprocessing.active_children() == []


@pytest.mark.slow
def test_fn_returning_an_int_in_a_worker_is_a_clear_type_error():
    with pytest.raises(TypeError, match=r"fn returned 1 \(of type int\) for chunk \d"):
        make_td().map(returns_int, num_workers=2, chunksize=2)
    assert multiprocessing.active_children() == []


def cleanups_seen(chunk):
    from torchdict.parallel import _termination

    return TensorDict(default=torch.full(chunk.batch_size, signal.getsignal(signal.SIGTERM) is signal.SIG_DFL),
                      jobs=torch.full(chunk.batch_size, len(_termination._cleanups)), batch_size=chunk.batch_size)


@pytest.mark.slow
@pytest.mark.skipif(not LINUX, reason="fork is Linux-only here")
def test_forked_workers_do_not_inherit_the_parent_cleanups():
    # Were they inherited, a SIGTERM to a worker (or a map run by fn) could kill the parent's other
    # workers and delete the parent's output folder.
    seen = make_td().map(cleanups_seen, num_workers=2, chunksize=2, mp_start_method="fork")
    assert seen["default"].all()
    assert (seen["jobs"] == 0).all()


def terminate_self_on_four(chunk):
    if chunk["x"][0] == 4:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    return double_x(chunk)


@pytest.mark.slow
def test_a_worker_ended_by_sigterm_is_reported_and_nothing_is_left(private_tmp, tmp_path):
    nothing_left = NothingLeft(private_tmp)
    with pytest.raises(WorkerError, match="killed by signal SIGTERM"):
        memmapped_td(tmp_path).map(terminate_self_on_four, num_workers=2, chunksize=2)
    nothing_left.check()


# ---------------------------------------------------------------------- the parent is stopped
_PARENT_SCRIPT = r"""
import os, sys, time
import torch
from torchdict import TensorDict

MARKS = sys.argv[1]

def hang_after_first(chunk):
    if chunk["x"][0] >= 2:
        open(os.path.join(MARKS, f"worker-{os.getpid()}"), "w").close()
        time.sleep(60)
    return TensorDict(y=chunk["x"] * 2, batch_size=chunk.batch_size)

if __name__ == "__main__":
    td = TensorDict(x=torch.arange(8.0), batch_size=[8]).memmap(os.path.join(MARKS, "source"))
    td.map(hang_after_first, num_workers=2, chunksize=2)
"""


@pytest.mark.slow
@pytest.mark.skipif(not LINUX, reason="reads /proc")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stopped_parent_leaves_no_output_folder_and_no_workers(tmp_path, signum):
    script = tmp_path / "parent.py"
    script.write_text(_PARENT_SCRIPT)
    marks = tmp_path / "marks"
    temp = tmp_path / "tmp"
    marks.mkdir()
    temp.mkdir()
    source = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    environment = {**os.environ, "TMPDIR": str(temp),
                   "PYTHONPATH": source + os.pathsep + os.environ.get("PYTHONPATH", "")}
    parent = subprocess.Popen([sys.executable, str(script), str(marks)], env=environment,
                              stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        # both workers hung in fn, and the output folder made (after chunk 0's result)
        while time.monotonic() < deadline and not (
            len(list(marks.glob("worker-*"))) == 2 and list(temp.glob("torchdict-map-*"))
        ):
            time.sleep(0.05)
        workers = [int(path.name.split("-")[1]) for path in marks.glob("worker-*")]
        assert len(workers) == 2 and list(temp.glob("torchdict-map-*"))
        parent.send_signal(signum)
        _, stderr = parent.communicate(timeout=10)
    finally:
        parent.kill()
        parent.wait()
    if signum == signal.SIGTERM:
        assert parent.returncode == -signal.SIGTERM, stderr  # ends as SIGTERM would have ended it
    else:
        assert "KeyboardInterrupt" in stderr
    assert list(temp.iterdir()) == []
    deadline = time.monotonic() + 5
    while any(is_running(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(is_running(pid) for pid in workers)


@pytest.mark.slow
@pytest.mark.skipif(not LINUX, reason="forkserver is tested on Linux")
def test_forkserver_workers_run_with_a_timeout():
    # A forkserver worker's parent process is the server, not the caller: it must not take that
    # for the caller's death (it used to exit at once). Its clock crosses with its arguments.
    td = make_td()
    assert torch.equal(td.map(double_x, num_workers=2, chunksize=2, mp_start_method="forkserver",
                              timeout=30)["y"], td["x"] * 2)
    assert multiprocessing.active_children() == []
