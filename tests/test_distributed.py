"""send / recv / isend / irecv and collectives over torch.distributed (gloo on 127.0.0.1).

The multi-process checks run as *scenarios* inside one spawned process group per
world size (2 and 4 ranks), so the cost of starting processes and importing torch
is paid twice for the whole file. Each scenario runs on every rank and reports
"ok" or its traceback; each test below asserts on one scenario. Every join has a
hard deadline and the process groups use a 30 s timeout, so nothing can hang.

The expected values are rebuilt independently on each rank from a seed, and leaves
are compared bit for bit (a transport must not change a single bit, NaNs included).
"""
from __future__ import annotations

import datetime
import json
import os
import shutil
import socket
import tempfile
import time
import traceback

import pytest
import torch

from torchdict import NonTensorData, NonTensorStack, TensorDict
from torchdict.distributed import _wire
from torchdict import distributed as td_dist
from torchdict.distributed import StructureMismatchError

# ----------------------------------------------------------------------------- shared data

_DTYPES = [
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64, torch.complex128,
    torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool,
    torch.uint16, torch.uint32, torch.uint64, torch.float8_e4m3fn, torch.float8_e5m2,
]


def _random(shape, dtype, generator):
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype, generator=generator)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=generator).to(dtype)
    if dtype is torch.bool:
        return torch.rand(shape, generator=generator) > 0.5
    low = 0 if dtype in (torch.uint8, torch.uint16, torch.uint32, torch.uint64) else -100
    return torch.randint(low, 100, shape, generator=generator).to(dtype)


def every_dtype_td(seed: int) -> TensorDict:
    """A nested TensorDict covering every dtype, 0-dim and empty leaves, odd layouts and non-tensors.

    ``seed=0`` gives zeros (the receiver's buffer); other seeds give random values.
    """
    generator = torch.Generator().manual_seed(seed)

    def make(shape, dtype):
        return torch.zeros(shape, dtype=dtype) if seed == 0 else _random(shape, dtype, generator)

    td = TensorDict(batch_size=[3])
    for dtype in _DTYPES:
        name = str(dtype)[6:]
        td[name] = make((3, 2), dtype)
        td["scalars", name] = make((3,), dtype)
    td["empty"] = make((3, 0, 4), torch.float32)
    td["nested", "deeper", "x"] = make((3, 5), torch.int64)
    td["nested", "deeper", "wide"] = make((3, 2, 2), torch.float64)
    td["nested", "sub"] = TensorDict({"y": make((3, 4, 2), torch.float32)}, batch_size=[3, 4])
    # 1.5 MiB: large enough to travel as its own message, straight into the receiver's memory.
    td["big"] = make((3, 131072), torch.float32)
    # Non-contiguous on both sides: a transposed view (packed) and a strided big leaf (direct).
    td["transposed"] = make((4, 3), torch.float32).t()
    td["big_strided"] = make((3, 262144), torch.float32)[:, ::2]
    td["label"] = "zero" if seed == 0 else f"seed-{seed}"
    td["per_item"] = NonTensorStack(*([None, 0, ""] if seed == 0 else [{"k": [1, 2]}, 2.5, "é"]))
    return td


def zero_dim_td(seed: int) -> TensorDict:
    generator = torch.Generator().manual_seed(seed)
    return TensorDict({name: (torch.zeros((), dtype=dtype) if seed == 0 else _random((), dtype, generator))
                       for name, dtype in (("f", torch.float32), ("b", torch.bool), ("c", torch.complex64),
                                           ("h", torch.bfloat16))}, batch_size=[])


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    a, b = a.resolve_conj().resolve_neg().contiguous(), b.resolve_conj().resolve_neg().contiguous()
    return torch.equal(a.view(-1).view(torch.uint8), b.view(-1).view(torch.uint8))


def assert_same_td(got: TensorDict, expected: TensorDict) -> None:
    """Same keys, and every leaf equal bit for bit (non-tensor values equal)."""
    got_keys = sorted(got.keys(True, True), key=str)
    assert got_keys == sorted(expected.keys(True, True), key=str)
    for key in got_keys:
        left, right = got.get(key), expected.get(key)
        if isinstance(right, torch.Tensor):
            assert same_bits(left, right), key
        else:
            assert left == right, (key, left, right)


def leaf_pointers(td: TensorDict) -> dict:
    return {key: value.data_ptr() for key, value in td.items(True, True) if isinstance(value, torch.Tensor)}


def expect_error(error_type, fragments, call):
    try:
        call()
    except error_type as error:
        for fragment in fragments:
            assert fragment in str(error), (fragment, str(error))
        return error
    raise AssertionError(f"expected {error_type.__name__}")


# ----------------------------------------------------------------------------- world of 2
def scenario_seed_example(rank, world, workdir):
    """The seed: isend on worker 1, irecv on worker 0, of a 0-d nested TensorDict."""
    import torch.distributed as dist

    data = TensorDict({"a": torch.zeros(()), ("b", "c"): torch.ones(())}, [])
    if rank == 1:
        data["a"] = torch.tensor(2.5)
        data["b", "c"] = torch.tensor(-1.0)
        assert data.isend(dst=0) == 1  # like upstream: the last tag, init_tag + 2 leaves - 1
    else:
        assert data.irecv(src=1) is None
        assert data["a"].item() == 2.5 and data["b", "c"].item() == -1.0
    dist.barrier()


def scenario_every_dtype(rank, world, workdir):
    """Nested TensorDicts of every dtype arrive intact, in place, in both modes and both directions."""
    if rank == 0:
        every_dtype_td(seed=1).send(dst=1)
        zero_dim_td(seed=2).send(dst=1, init_tag=40)
        zero_dim_td(seed=3).send(dst=1, init_tag=7, pseudo_rand=True)
        received = zero_dim_td(seed=0).lock_()
        received.recv(src=1)
        assert_same_td(received, zero_dim_td(seed=4))
    else:
        target = every_dtype_td(seed=0)
        pointers = leaf_pointers(target)
        n_leaves = 2 * len(_DTYPES) + 7 + 2  # per-dtype leaves, 7 other tensors, 2 non-tensor values
        assert target.recv(src=0) == n_leaves - 1
        assert_same_td(target, every_dtype_td(seed=1))
        assert leaf_pointers(target) == pointers  # written in place: same storages
        assert isinstance(target._tensordict["label"], NonTensorData)
        assert target["per_item"] == [{"k": [1, 2]}, 2.5, "é"]
        scalars = zero_dim_td(seed=0)
        assert scalars.recv(src=0, init_tag=40) == 40 + 4 - 1
        assert_same_td(scalars, zero_dim_td(seed=2))
        scalars = zero_dim_td(seed=0)
        scalars.recv(src=0, init_tag=7, pseudo_rand=True)
        assert_same_td(scalars, zero_dim_td(seed=3))
        # A locked receiver still takes in-place writes.
        zero_dim_td(seed=4).send(dst=0)


def scenario_per_leaf(rank, world, workdir):
    """per_leaf=True: one message per leaf, tags init_tag, init_tag + 1, ... (upstream's protocol)."""
    import torch.distributed as dist

    tensors_only = every_dtype_td(seed=5).exclude("label", "per_item")
    n_leaves = len(list(tensors_only.keys(True, True)))
    if rank == 0:
        tensors_only.send(dst=1, per_leaf=True, init_tag=10)
        assert tensors_only.isend(dst=1, per_leaf=True, init_tag=200) == 200 + n_leaves - 1
        works = tensors_only.isend(dst=1, per_leaf=True, init_tag=300, return_early=True)
        assert len(works) == n_leaves
        for work in works:
            work.wait()
        # The tags really are init_tag, init_tag + 1, ...: a plain dist.send with tag 21 fills key #2.
        dist.send(torch.full((3,), 9.0), dst=1, tag=21)
        dist.send(torch.full((2,), 8.0), dst=1, tag=20)
        expect_error(NotImplementedError, ["is not supported"],
                     lambda: TensorDict(s="text").send(dst=1, per_leaf=True))
    else:
        received = tensors_only.apply(torch.zeros_like)
        assert received.recv(src=0, per_leaf=True, init_tag=10) == 10 + n_leaves - 1
        assert_same_td(received, tensors_only)
        received = tensors_only.apply(torch.zeros_like)
        assert received.irecv(src=0, per_leaf=True, init_tag=200) is None
        assert_same_td(received, tensors_only)
        received = tensors_only.apply(torch.zeros_like)
        works = received.irecv(src=0, per_leaf=True, init_tag=300, return_premature=True)
        for work in works:
            work.wait()
        assert_same_td(received, tensors_only)
        plain = TensorDict(a=torch.zeros(2), b=torch.zeros(3))
        assert plain.recv(src=0, per_leaf=True, init_tag=20) == 21
        assert plain["a"].tolist() == [8.0, 8.0] and plain["b"].tolist() == [9.0, 9.0, 9.0]
    dist.barrier()


def scenario_async_overlap(rank, world, workdir):
    """isend/irecv return at once, the transfer runs while this rank computes, wait() completes it."""
    import torch.distributed as dist

    def payload(seed):
        generator = torch.Generator().manual_seed(seed)
        return TensorDict(small=torch.randn(4, 3, generator=generator),
                          big=torch.randn(4, 100_000, generator=generator),
                          note=f"n{seed}", batch_size=[4])

    # 1. The sender returns at once although the receiver only shows up 1 s later.
    if rank == 0:
        sent = payload(1)
        start = time.perf_counter()
        handles = sent.isend(dst=1, return_early=True)
        assert time.perf_counter() - start < 0.5
        assert not handles[0].is_completed()
        product = torch.randn(200, 200) @ torch.randn(200, 200)  # compute meanwhile
        sent["small"].add_(100)  # small leaves were copied at call time: this doesn't travel
        assert all(handle.wait() for handle in handles)
        assert handles[0].is_completed() and product.shape == (200, 200)
    else:
        time.sleep(1.0)
        received = payload(0).apply(torch.zeros_like)
        received.irecv(src=0)
        assert_same_td(received.exclude("note"), payload(1).exclude("note"))
        assert received["note"] == "n1"
    dist.barrier()
    # 2. The receiver returns at once although the sender only sends 1 s later;
    #    packed leaves and non-tensors are written by wait(), not before.
    if rank == 1:
        received = payload(0).apply(torch.zeros_like)
        received["note"] = "unchanged"
        start = time.perf_counter()
        handles = received.irecv(src=0, return_premature=True)
        assert time.perf_counter() - start < 0.5
        product = torch.randn(200, 200) @ torch.randn(200, 200)
        for _ in range(200):  # the data arrives (the sender sends after 1 s), but is not unpacked yet
            if handles[0].is_completed():
                break
            time.sleep(0.05)
        assert handles[0].is_completed()
        assert received["small"].abs().sum().item() == 0 and received["note"] == "unchanged"
        for handle in handles:
            handle.wait()
        assert_same_td(received.exclude("note"), payload(2).exclude("note"))
        assert received["note"] == "n2" and product.shape == (200, 200)
    else:
        time.sleep(1.0)
        payload(2).send(dst=1)
    dist.barrier()


def scenario_mismatch(rank, world, workdir):
    """Different structures: a clear error on both sides, nothing written, and the pair still works."""
    import torch.distributed as dist

    if rank == 0:
        sent = TensorDict(a=torch.ones(3), b=torch.ones(2), same=torch.ones(1), batch_size=[])
        expect_error(StructureMismatchError, ["structure mismatch", "'b'", "'c'", "'a' is float32[3]"],
                     lambda: sent.send(dst=1))
        # dtype-only difference
        expect_error(StructureMismatchError, ["'x' is float32[2] on the sender but float64[2]"],
                     lambda: TensorDict(x=torch.ones(2)).isend(dst=1))
        # async: the error comes out of wait()
        handles = TensorDict(x=torch.ones(5)).isend(dst=1, return_early=True)
        expect_error(StructureMismatchError, ["structure mismatch"], handles[0].wait)
        # a value JSON can't carry: the sender raises TypeError, the receiver learns why
        bad = TensorDict(x=torch.ones(2))
        bad.set_non_tensor("obj", object())
        expect_error(TypeError, ["'obj'", "JSON"], lambda: bad.send(dst=1))
        # the receiver can't write in place: both sides fail
        expect_error(RuntimeError, ["refused", "expanded"], lambda: TensorDict(e=torch.ones(3, 2)).send(dst=1))
        # a large payload (sent only after the ack) that doesn't match
        expect_error(StructureMismatchError, ["'big' is float32[2, 300000] on the sender"],
                     lambda: TensorDict(big=torch.ones(2, 300_000)).send(dst=1))
        # the channel is clean afterwards
        TensorDict(a=torch.arange(3.0)).send(dst=1)
    else:
        target = TensorDict(a=torch.zeros(4), c=torch.zeros(2), same=torch.zeros(1), batch_size=[])
        expect_error(StructureMismatchError, ["structure mismatch", "unchanged", "'b'", "'c'",
                                              "'a' is float32[4] on the receiver but float32[3]"],
                     lambda: target.recv(src=0))
        assert all(value.abs().sum() == 0 for value in target.values())
        expect_error(StructureMismatchError, ["structure mismatch"],
                     lambda: TensorDict(x=torch.zeros(2, dtype=torch.float64)).irecv(src=0))
        expect_error(StructureMismatchError, ["'x' is float32[4] on the receiver but float32[5]"],
                     lambda: TensorDict(x=torch.zeros(4)).recv(src=0))
        holder = TensorDict(x=torch.zeros(2))
        holder.set_non_tensor("obj", None)
        expect_error(RuntimeError, ["sender failed", "TypeError", "'obj'"], lambda: holder.recv(src=0))
        expanded = TensorDict(e=torch.zeros(3, 1).expand(3, 2))
        expect_error(RuntimeError, ["expanded"], lambda: expanded.recv(src=0))
        expect_error(StructureMismatchError, ["'big' is float32[2, 300001] on the receiver"],
                     lambda: TensorDict(big=torch.zeros(2, 300_001)).recv(src=0))
        clean = TensorDict(a=torch.zeros(3))
        clean.recv(src=0)
        assert clean["a"].tolist() == [0.0, 1.0, 2.0]
    dist.barrier()


def scenario_collectives_pair(rank, world, workdir):
    import torch.distributed as dist

    _check_collectives(rank, world)
    # group_dst / group_src: ranks named inside a group
    pair = dist.new_group([0, 1])
    if rank == 0:
        TensorDict(v=torch.arange(4)).send(group=pair, group_dst=1)
    else:
        got = TensorDict(v=torch.zeros(4, dtype=torch.int64))
        got.recv(group=pair, group_src=0)
        assert got["v"].tolist() == [0, 1, 2, 3]
    dist.barrier()


def scenario_shared_scratch(rank, world, workdir):
    """A TensorDict memory-mapped on a shared folder is opened by another rank: no data is sent."""
    import torch.distributed as dist

    if not hasattr(TensorDict, "load_memmap") or not hasattr(TensorDict, "memmap"):
        dist.barrier()
        dist.barrier()
        return
    prefix = os.path.join(workdir, "scratch")
    if rank == 0:
        local = TensorDict(obs=torch.arange(12.0).view(3, 4), meta={"id": torch.arange(3)}, batch_size=[3])
        mapped = local.memmap(prefix)
    dist.barrier()  # the only communication: a barrier
    if rank == 1:
        opened = TensorDict.load_memmap(prefix)
        assert opened["obs"].tolist() == torch.arange(12.0).view(3, 4).tolist()
        opened["obs"][1] = -1.0  # writes go to the shared file
        opened["meta", "id"][2] = 42
    dist.barrier()
    if rank == 0:
        assert mapped["obs"][1].tolist() == [-1.0] * 4
        assert mapped["meta", "id"].tolist() == [0, 1, 42]


def scenario_timeout(rank, world, workdir):
    """A peer that never answers: the call fails within the group's timeout instead of hanging."""
    import torch.distributed as dist

    quick = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=2))
    if rank == 0:
        start = time.perf_counter()
        expect_error(Exception, [], lambda: TensorDict(a=torch.zeros(2)).recv(src=1, group=quick, init_tag=999))
        assert time.perf_counter() - start < 20
    dist.barrier()


# ----------------------------------------------------------------------------- world of 4
def _check_collectives(rank, world):
    import torch.distributed as dist

    # broadcast: every rank ends with the source's values, non-tensors included, in place
    source = world - 1
    td = TensorDict(w=torch.full((3, 2), float(rank)), n={"i": torch.tensor([rank] * 3)},
                    tag=f"rank{rank}", batch_size=[3])
    pointers = leaf_pointers(td)
    assert td.broadcast(src=source) is td
    assert td["w"].eq(float(source)).all() and td["n", "i"].tolist() == [source] * 3
    assert td["tag"] == f"rank{source}" and leaf_pointers(td) == pointers
    # all_reduce: equals the sum (or max) over ranks computed by hand, big leaves too
    values = {"small": torch.arange(6.0).view(2, 3), "ints": torch.arange(4), "big": torch.ones(2, 300_000)}
    td = TensorDict({key: value * (rank + 1) for key, value in values.items()}, batch_size=[])
    td["text"] = "kept"
    td.all_reduce()
    total = sum(range(1, world + 1))
    for key, value in values.items():
        assert torch.equal(td[key], value * total), key
    assert td["text"] == "kept"
    td = TensorDict(m=torch.tensor([rank, -rank]))
    handles = td.all_reduce(op=dist.ReduceOp.MAX, async_op=True)
    for handle in handles:
        handle.wait()
    assert td["m"].tolist() == [world - 1, 0]
    # all_gather: stacked along a new leading dim, item r is rank r's TensorDict
    local = TensorDict(x=torch.full((2,), float(rank)), sub={"y": torch.tensor([[rank] * 3] * 2)},
                       big=torch.full((2, 300_000), rank, dtype=torch.int16), who=f"r{rank}", batch_size=[2])
    gathered = local.all_gather()
    assert gathered.batch_size == torch.Size([world, 2])
    assert gathered["sub"].batch_size == torch.Size([world, 2])
    for other in range(world):
        assert gathered["x"][other].tolist() == [float(other)] * 2
        assert gathered["sub", "y"][other].tolist() == [[other] * 3] * 2
        assert gathered["big"][other].eq(other).all()
        assert gathered["who"][other] == [f"r{other}"] * 2
    # mismatch on one rank: every rank raises, naming it, and nobody hangs
    odd_one = world - 1
    shape = (3,) if rank != odd_one else (4,)
    for call in (lambda td: td.all_reduce(), lambda td: td.all_gather(), lambda td: td.broadcast(src=0)):
        expect_error(StructureMismatchError, ["structure mismatch", f"rank {odd_one}"],
                     lambda: call(TensorDict(z=torch.zeros(shape))))
    # a rank failing before the exchange (a non-JSON value on the source): every rank raises
    odd = TensorDict(z=torch.zeros(2))
    odd.set_non_tensor("obj", object() if rank == 0 else None)
    if rank == 0:
        expect_error(TypeError, ["'obj'"], lambda: odd.broadcast(src=0))
    else:
        expect_error(RuntimeError, ["rank 0", "TypeError"], lambda: odd.broadcast(src=0))
    dist.barrier()


def scenario_collectives_quad(rank, world, workdir):
    _check_collectives(rank, world)


def scenario_ring(rank, world, workdir):
    """Every rank sends to the next and receives from the previous one, asynchronously."""
    import torch.distributed as dist

    mine = TensorDict(v=torch.full((5,), float(rank)), s=f"from {rank}", batch_size=[5])
    incoming = TensorDict(v=torch.zeros(5), s="", batch_size=[5])
    sends = mine.isend(dst=(rank + 1) % world, return_early=True)
    receives = incoming.irecv(src=(rank - 1) % world, return_premature=True)
    for handle in sends + receives:
        handle.wait()
    previous = (rank - 1) % world
    assert incoming["v"].tolist() == [float(previous)] * 5 and incoming["s"] == f"from {previous}"
    # a sub-group broadcast
    group = dist.new_group([1, 2])
    if rank in (1, 2):
        td = TensorDict(k=torch.tensor(rank))
        td.broadcast(src=2, group=group)
        assert td["k"].item() == 2
    dist.barrier()


def consolidated_td(seed: int) -> TensorDict:
    """Leaves of several dtypes and odd byte sizes (padding in the storage), nested, 0-dim, and a non-tensor."""
    generator = torch.Generator().manual_seed(seed)

    def make(shape, dtype):
        return torch.zeros(shape, dtype=dtype) if seed == 0 else _random(shape, dtype, generator)

    return TensorDict({"f": make((3, 5), torch.float32), "h": make((3,), torch.float16),
                       "n": {"i": make((3, 2), torch.int64), "b": make((3, 7), torch.bool),
                             "deep": {"c": make((3,), torch.complex64)}},
                       "d": make((3, 1), torch.float64), "label": "same on both sides"}, batch_size=[3])


def scenario_consolidated(rank, world, workdir):
    """consolidated=True: the consolidated storage travels as one message on tag 0 (upstream's protocol), into
    the receiver's consolidated storage; upstream tensordict on the sending side interoperates."""
    import torch.distributed as dist
    import tensordict as upstream

    if rank == 0:
        consolidated_td(seed=1).send(dst=1, consolidated=True)  # consolidated for the call
        packed = consolidated_td(seed=2).consolidate()
        works = packed.isend(dst=1, consolidated=True, return_early=True)
        assert len(works) == 1
        for work in works:
            work.wait()
        assert consolidated_td(seed=3).consolidate().isend(dst=1, consolidated=True) is None
        consolidated_td(seed=4).send(dst=1, consolidated=True)  # received by a plain dist.recv: one message
        theirs = upstream.TensorDict(consolidated_td(seed=5).to_dict(), batch_size=[3])
        theirs.send(dst=1, consolidated=True)  # upstream -> torchdict
        receiver = consolidated_td(seed=0).consolidate(metadata=True)
        assert receiver.irecv(src=1, consolidated=True) is None
        assert_same_td(receiver, consolidated_td(seed=6))
        ours_to_theirs = upstream.TensorDict(consolidated_td(seed=0).to_dict(), batch_size=[3]).consolidate(
            metadata=True)
        ours_to_theirs.recv(src=1, consolidated=True)  # torchdict -> upstream
        expected = consolidated_td(seed=7)
        for key in expected.keys(True, True):
            if isinstance(expected.get(key), torch.Tensor):
                assert same_bits(ours_to_theirs.get(key), expected.get(key)), key
    else:
        receiver = consolidated_td(seed=0).consolidate(metadata=True)
        pointers = leaf_pointers(receiver)
        assert receiver.recv(src=0, consolidated=True) is None
        assert_same_td(receiver, consolidated_td(seed=1))
        assert leaf_pointers(receiver) == pointers and receiver.is_consolidated()  # in place, one storage
        works = receiver.irecv(src=0, consolidated=True, return_premature=True)
        assert len(works) == 1
        for work in works:
            work.wait()
        assert_same_td(receiver, consolidated_td(seed=2))
        assert receiver.irecv(src=0, consolidated=True) is None
        assert_same_td(receiver, consolidated_td(seed=3))
        storage = receiver._consolidated["storage"]
        raw = torch.zeros_like(storage)
        dist.recv(raw, src=0, tag=0)
        assert torch.equal(raw, consolidated_td(seed=4).consolidate()._consolidated["storage"])
        assert receiver.recv(src=0, consolidated=True, init_tag=99, pseudo_rand=True) is None  # tags ignored
        assert_same_td(receiver, consolidated_td(seed=5))
        not_packed = consolidated_td(seed=0)
        before = not_packed.clone()
        expect_error(AttributeError, ["consolidate(metadata=True)"],
                     lambda: not_packed.recv(src=0, consolidated=True))  # before any message: nothing pending
        assert_same_td(not_packed, before)
        consolidated_td(seed=6).send(dst=0, consolidated=True)
        consolidated_td(seed=7).consolidate().send(dst=0, consolidated=True)
    dist.barrier()


_SCENARIOS = {
    2: [scenario_seed_example, scenario_every_dtype, scenario_per_leaf, scenario_async_overlap, scenario_mismatch,
        scenario_collectives_pair, scenario_shared_scratch, scenario_timeout, scenario_consolidated],
    4: [scenario_collectives_quad, scenario_ring],
}


# ----------------------------------------------------------------------------- process management
def _worker(rank: int, world: int, port: int, workdir: str) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    import torch.distributed as dist

    results: dict = {}
    path = os.path.join(workdir, f"rank{rank}.json")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=30))
    try:
        for scenario in _SCENARIOS[world]:
            try:
                scenario(rank, world, workdir)
                results[scenario.__name__] = "ok"
            except BaseException:
                results[scenario.__name__] = traceback.format_exc()
            try:  # realign the ranks (a failed scenario may have left a peer waiting until its timeout)
                dist.barrier()
            except Exception:
                pass
            with open(path, "w") as handle:  # written after each scenario: survives a later kill
                json.dump(results, handle)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _context():
    """A start method that never forks this (threaded) pytest process.

    A forkserver imports torch and this module once, then forks each rank from its own
    clean, single-threaded process: several seconds cheaper per rank than spawn on a
    small machine. Spawn where there is no forkserver.
    """
    import multiprocessing

    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", "torch.distributed", "torchdict", __name__])
    return context


def _run_world(world: int, deadline_s: float = 150.0) -> dict:
    context = _context()
    workdir = tempfile.mkdtemp(prefix=f"torchdict-dist{world}-")
    port = _free_port()
    processes = [context.Process(target=_worker, args=(rank, world, port, workdir), daemon=True)
                 for rank in range(world)]
    for process in processes:
        process.start()
    deadline = time.monotonic() + deadline_s
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    hung = [rank for rank, process in enumerate(processes) if process.is_alive()]
    for process in processes:
        if process.is_alive():
            process.kill()
            process.join(5)
    per_rank = {}
    for rank in range(world):
        try:
            with open(os.path.join(workdir, f"rank{rank}.json")) as handle:
                per_rank[rank] = json.load(handle)
        except (OSError, ValueError):
            per_rank[rank] = {}
    shutil.rmtree(workdir, ignore_errors=True)
    return {"per_rank": per_rank, "hung": hung, "exitcodes": [process.exitcode for process in processes]}


def _assert_scenario(outcome: dict, name: str) -> None:
    problems = []
    for rank, results in outcome["per_rank"].items():
        result = results.get(name)
        if result is None:
            state = "hung (killed at the deadline)" if rank in outcome["hung"] else (
                f"exited with code {outcome['exitcodes'][rank]}")
            problems.append(f"rank {rank}: no result for {name}; the process {state}")
        elif result != "ok":
            problems.append(f"rank {rank}:\n{result}")
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)


@pytest.fixture(scope="module")
def pair():
    return _run_world(2)


@pytest.fixture(scope="module")
def quad():
    return _run_world(4)


# ----------------------------------------------------------------------------- multi-process tests
@pytest.mark.slow
def test_seed_example(pair):
    _assert_scenario(pair, "scenario_seed_example")


@pytest.mark.slow
def test_nested_every_dtype_in_place(pair):
    _assert_scenario(pair, "scenario_every_dtype")


@pytest.mark.slow
def test_per_leaf_protocol_and_tags(pair):
    _assert_scenario(pair, "scenario_per_leaf")


@pytest.mark.slow
def test_isend_irecv_overlap_compute(pair):
    _assert_scenario(pair, "scenario_async_overlap")


@pytest.mark.slow
def test_mismatch_raises_on_both_sides(pair):
    _assert_scenario(pair, "scenario_mismatch")


@pytest.mark.slow
def test_collectives_two_ranks(pair):
    _assert_scenario(pair, "scenario_collectives_pair")


@pytest.mark.slow
def test_shared_scratch_memmap(pair):
    if not hasattr(TensorDict, "load_memmap") or not hasattr(TensorDict, "memmap"):
        pytest.skip("saving (memmap / load_memmap) is not available yet")
    _assert_scenario(pair, "scenario_shared_scratch")


@pytest.mark.slow
def test_unanswered_transfer_times_out(pair):
    _assert_scenario(pair, "scenario_timeout")


@pytest.mark.slow
def test_consolidated_sends_one_buffer_as_upstream(pair):
    _assert_scenario(pair, "scenario_consolidated")


@pytest.mark.slow
def test_collectives_four_ranks(quad):
    _assert_scenario(quad, "scenario_collectives_quad")


@pytest.mark.slow
def test_ring_and_subgroup_four_ranks(quad):
    _assert_scenario(quad, "scenario_ring")


# ----------------------------------------------------------------------------- single-process tests
@pytest.mark.parametrize("method, peer", [("send", "dst"), ("recv", "src"), ("isend", "dst"), ("irecv", "src")])
def test_peer_arguments_are_checked_before_anything(method, peer):
    td = TensorDict(a=torch.ones(2))
    before = td["a"].clone()
    call = getattr(td, method)
    expect_error(ValueError, [f"`{peer}`", f"`group_{peer}`"], lambda: call())
    expect_error(ValueError, [f"`{peer}`", f"`group_{peer}`"], lambda: call(**{peer: 0, f"group_{peer}": 0},
                                                                            group=object()))
    expect_error(ValueError, ["`group` must be passed"], lambda: call(**{f"group_{peer}": 0}))
    expect_error(ValueError, ["per_leaf", "consolidated"], lambda: call(0, per_leaf=True, consolidated=True))
    assert torch.equal(td["a"], before)


def _pack_roundtrip(source: TensorDict, target: TensorDict) -> None:
    """What the wire does, without the wire: pack the sender's leaves, unpack into the receiver's."""
    cpu = torch.device("cpu")
    sent, received = _wire.Survey(_wire.walk(source)), _wire.Survey(_wire.walk(target))
    assert sent.fingerprint == received.fingerprint
    outgoing, incoming = _wire.Packs.borrow(sent, cpu), _wire.Packs.borrow(received, cpu)
    assert outgoing is not incoming  # two transfers in flight never share buffers
    outgoing.fill(sent)
    for (total, _), source_buffer, target_buffer in zip(sent.packs, outgoing.buffers, incoming.buffers):
        assert source_buffer.dtype == torch.uint8 and source_buffer.numel() == total
        target_buffer.copy_(source_buffer)
    incoming.drain(received)
    for index in sent.direct:
        target_bytes, copy_back = _wire.recv_target(received.leaves[index][1], cpu)
        target_bytes.copy_(_wire.send_view(sent.leaves[index][1], cpu))
        if copy_back is not None:
            copy_back()
    items = _wire.decode_non_tensor(_wire.encode_non_tensor(sent.leaves, sent.non_tensor))
    _wire.set_non_tensor(received.leaves, received.non_tensor, items)
    outgoing.release()
    incoming.release()


def test_packing_roundtrip_every_dtype():
    source, target = every_dtype_td(seed=9), every_dtype_td(seed=0)
    pointers = leaf_pointers(target)
    _pack_roundtrip(source, target)
    assert_same_td(target, source)
    assert leaf_pointers(target) == pointers


def test_packing_roundtrip_conjugate_negative_and_grad_leaves():
    values = torch.randn(4, dtype=torch.complex64)
    source = TensorDict(conj=values.conj(), neg=values.conj().imag, param=torch.nn.Parameter(torch.randn(3)),
                        zero_dim=torch.tensor(True))
    target = TensorDict(conj=torch.zeros(4, dtype=torch.complex64), neg=torch.zeros(4),
                        param=torch.nn.Parameter(torch.zeros(3)), zero_dim=torch.tensor(False))
    _pack_roundtrip(source, target)
    assert torch.equal(target["conj"], values.conj().resolve_conj())
    assert torch.equal(target["neg"], -values.imag)
    assert torch.equal(target["param"].detach(), source["param"].detach())
    assert target["zero_dim"].item() is True and target["param"].requires_grad


def test_plan_packs_small_leaves_per_dtype_and_sends_large_ones_directly():
    td = TensorDict(a=torch.zeros(3), b=torch.zeros(2, dtype=torch.int64), c=torch.zeros(5),
                    big=torch.zeros(1 << 18), s="x")
    leaves = _wire.walk(td)
    assert [path for path, *_ in leaves] == [("a",), ("b",), ("big",), ("c",), ("s",)]  # sorted, like upstream
    plan = _wire.Survey(leaves)
    assert len(plan.packs) == 1
    total, groups = plan.packs[0]
    assert [(dtype, indices) for dtype, indices, _, _ in groups] == [(torch.float32, [0, 3]), (torch.int64, [1])]
    assert [offset % _wire.ALIGN for _, _, offset, _ in groups] == [0, 0] and total % _wire.ALIGN == 0
    assert plan.direct == [2] and plan.non_tensor == [4]


def test_fingerprint_tracks_keys_shapes_dtypes_not_values():
    def fingerprint(td):
        return _wire.Survey(_wire.walk(td)).fingerprint

    base = TensorDict(a=torch.zeros(3), n={"b": torch.zeros(2, dtype=torch.int64)}, s="x")
    assert fingerprint(base) == fingerprint(TensorDict(a=torch.ones(3), n={"b": torch.ones(2, dtype=torch.int64)},
                                                       s="other value"))
    variants = [
        TensorDict(a=torch.zeros(4), n={"b": torch.zeros(2, dtype=torch.int64)}, s="x"),
        TensorDict(a=torch.zeros(3), n={"b": torch.zeros(2, dtype=torch.int32)}, s="x"),
        TensorDict(a=torch.zeros(3), n={"c": torch.zeros(2, dtype=torch.int64)}, s="x"),
        TensorDict(a=torch.zeros(3), n={"b": torch.zeros(2, dtype=torch.int64)}),
        TensorDict(a=torch.zeros(3), b=torch.zeros(2, dtype=torch.int64), s="x"),
    ]
    assert len({fingerprint(base)} | {fingerprint(variant) for variant in variants}) == 6


def test_packs_are_reused_for_the_same_structure_only():
    cpu = torch.device("cpu")
    survey = _wire.Survey(_wire.walk(TensorDict(a=torch.zeros(3), b=torch.zeros(2, dtype=torch.int64))))
    first = _wire.Packs.borrow(survey, cpu)
    first.release()
    again = _wire.Packs.borrow(survey, cpu)
    assert again is first
    other = _wire.Survey(_wire.walk(TensorDict(a=torch.zeros(4), b=torch.zeros(2, dtype=torch.int64))))
    assert _wire.Packs.borrow(other, cpu) is not first
    again.release()


def test_non_json_value_is_refused_with_its_key():
    td = TensorDict(a=torch.zeros(1))
    td.set_non_tensor(("deep", "obj"), {1, 2})
    leaves = _wire.walk(td)
    plan = _wire.Survey(leaves)
    expect_error(TypeError, ["('deep', 'obj')", "JSON"], lambda: _wire.encode_non_tensor(leaves, plan.non_tensor))


def test_sparse_leaf_is_refused_with_its_key():
    td = TensorDict(sp=torch.eye(3).to_sparse())
    expect_error(TypeError, ["'sp'", "dense"], lambda: _wire.Survey(_wire.walk(td)))


def test_mismatch_message_names_every_difference():
    mine = [[["a"], "float32", [3]], [["x", "y"], "int64", [2]], [["only_me"], "bool", []]]
    theirs = [[["a"], "float32", [4]], [["x", "y"], "int32", [2]], [["only_them"], "non-tensor", [1]]]
    message = _wire.difference(mine, theirs, "here", "there")
    for fragment in ["keys only on here: 'only_me'", "keys only on there: 'only_them'",
                     "'a' is float32[3] on here but float32[4] on there",
                     "('x', 'y') is int64[2] on here but int32[2] on there"]:
        assert fragment in message


def test_pseudo_random_tags_follow_upstream_chain():
    pytest.importorskip("numpy")
    # Upstream tensordict documents this chain for seed 10: 6756, 1717, 4410, ...
    chain, seed = [], 10
    for _ in range(3):
        seed = td_dist._next_pseudo_tag(seed)
        chain.append(seed)
    assert chain == [6756, 1717, 4410]
    assert td_dist._tags(5, False, 3) == [5, 6, 7] and td_dist._last_tag(5, False, 0) == 4
