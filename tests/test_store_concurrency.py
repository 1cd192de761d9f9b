"""TensorDictStore shared by processes: disjoint row writes from several processes lose nothing, and a reader
never sees a new shape paired with old bytes while another process keeps changing an entry's shape."""
from __future__ import annotations

import multiprocessing
import pickle
import sys
import time
import uuid

import pytest
import torch

from torchdict import TensorDict
from torchdict.store import TensorDictStore

pytestmark = pytest.mark.slow

ROWS, WORKERS, CHUNK = 10_000, 4, 125


def _context():
    return multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")


def _row_value(rows):
    """What row ``r`` holds once written: ``r`` in every column, and ``-r`` in the nested entry."""
    rows = rows.double()
    return TensorDict({"obs": rows[:, None].expand(-1, 6).float(), "next": {"r": -rows}}, batch_size=[len(rows)])


def _write_rows(pickled_store, rank):
    store = pickle.loads(pickled_store)
    mine = torch.arange(rank, ROWS, WORKERS)  # interleaved: neighbouring rows belong to other processes
    for start in range(0, len(mine), CHUNK):
        rows = mine[start:start + CHUNK]
        store[rows] = _row_value(rows)
    for row in mine[:50].tolist():  # and some one row at a time
        store[row] = _row_value(torch.tensor([row]))[0]


def test_processes_writing_disjoint_rows_lose_nothing(redis_server):
    store = TensorDictStore.from_schema({"obs": ([6], torch.float32), ("next", "r"): ([], torch.float64)},
                                        batch_size=[ROWS], unix_socket_path=redis_server.unix_socket_path,
                                        prefix=f"conc-{uuid.uuid4().hex[:6]}")
    try:
        context = _context()
        workers = [context.Process(target=_write_rows, args=(pickle.dumps(store), rank)) for rank in range(WORKERS)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(timeout=120)
            assert worker.exitcode == 0
        local = store.to_tensordict()
        expected = _row_value(torch.arange(ROWS))
        assert torch.equal(local["obs"], expected["obs"])
        assert torch.equal(local["next", "r"], expected["next", "r"])
    finally:
        store.clear_redis()


SHAPES = ((3, torch.float32), (7, torch.float64), (1, torch.int16))


def _reshape_forever(pickled_store, stop_at):
    store = pickle.loads(pickled_store)
    turn = 0
    while time.monotonic() < stop_at:
        width, dtype = SHAPES[turn % len(SHAPES)]
        store["x"] = torch.full((64, width), width, dtype=dtype)  # value == width: a torn read shows
        turn += 1


def _consistent(x):
    return x.numel() > 0 and bool((x == x.shape[-1]).all()) and dict(SHAPES)[x.shape[-1]] == x.dtype


@pytest.mark.parametrize("cache_metadata", [True, False])
def test_no_torn_reads_while_another_process_changes_the_shape(redis_server, cache_metadata):
    store = TensorDictStore(unix_socket_path=redis_server.unix_socket_path, prefix=f"torn-{uuid.uuid4().hex[:6]}",
                            batch_size=[64], cache_metadata=cache_metadata)
    store["x"] = torch.full((64, 3), 3.0)
    try:
        stop_at = time.monotonic() + 2.0
        writer = _context().Process(target=_reshape_forever, args=(pickle.dumps(store), stop_at))
        writer.start()
        reads = shapes = 0
        seen = set()
        index = torch.tensor([5, 7, 6, 40])
        while time.monotonic() < stop_at:
            for value in (store["x"], store[index]["x"], store[3:9]["x"], store.to_tensordict()["x"]):
                assert _consistent(value), value
                seen.add(value.shape[-1])
                reads += 1
            store[10:12] = TensorDict({}, batch_size=[2])  # an empty row write planned on a moving tree
        writer.join(timeout=30)
        assert writer.exitcode == 0
        shapes = len(seen)
        assert reads > 20 and shapes >= 2
    finally:
        store.clear_redis()


def _write_rows_while_reshaped(pickled_store, stop_at):
    store = pickle.loads(pickled_store)
    while time.monotonic() < stop_at:
        store[0:32] = 0  # written on whatever shape the entry has when the write runs


def test_row_writes_follow_a_shape_change(redis_server):
    """A row write planned on an old shape is retried on the new one, never applied with old offsets."""
    store = TensorDictStore(unix_socket_path=redis_server.unix_socket_path, prefix=f"rw-{uuid.uuid4().hex[:6]}",
                            batch_size=[64])
    store["x"] = torch.full((64, 3), 3.0)
    try:
        stop_at = time.monotonic() + 1.5
        writer = _context().Process(target=_write_rows_while_reshaped, args=(pickle.dumps(store), stop_at))
        writer.start()
        turn = 0
        while time.monotonic() < stop_at:
            width, dtype = SHAPES[turn % len(SHAPES)]
            store["x"] = torch.full((64, width), width, dtype=dtype)
            value = store["x"]
            # rows 0..31 are zero or width; rows 32.. are always width: offsets of another shape would spill
            assert bool((value[32:] == width).all()), value
            assert bool(((value[:32] == 0) | (value[:32] == width)).all())
            turn += 1
        writer.join(timeout=30)
        assert writer.exitcode == 0
    finally:
        store.clear_redis()
