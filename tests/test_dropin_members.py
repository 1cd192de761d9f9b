"""The TensorDict members added for drop-in parity with upstream tensordict 0.15.3, checked against upstream
(equal results or the same exception kind), against plain torch, on the generic TensorDictBase and lazy stacks,
and (for those that change the TensorDict) that a failed call changes nothing. Also the ``@tensorclass``
options ``tensor_only`` / ``skip_post_init_on_rebuild`` / ``cast_filter``, ``map(pool=...)`` with a
``multiprocessing.Pool`` / ``concurrent.futures`` executor, and the distributed members (gloo, slow)."""
from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import sys
import tempfile

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import torchdict
from _dropin_diff import build, outcome, plain, same_outcome, snapshot, specs, upstream

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")


def _missing_members() -> list:
    owned_elsewhere = {  # persistence, device moves, formats, the store, compile (other parts of the port)
        "consolidate", "from_consolidated", "is_consolidated", "pin_memory_", "record_stream", "load_",
        "load_memmap_", "make_memmap", "make_memmap_from_storage", "make_memmap_from_tensor", "memmap_refresh_",
        "from_csv", "from_h5", "from_json", "from_pandas", "from_parquet", "from_struct_array", "from_zarr",
        "to_csv", "to_h5", "to_json", "to_mds", "to_pandas", "to_parquet", "to_store", "to_struct_array", "to_zarr",
        "pack",
    }
    theirs = {name for name in dir(upstream.TensorDict) if not name.startswith("_")}
    return sorted(name for name in theirs - owned_elsewhere if not hasattr(torchdict.TensorDict, name))


def test_every_public_member_of_upstreams_tensordict_exists():
    assert _missing_members() == []


def _td(lib):
    return lib.TensorDict(a=torch.arange(12.).view(2, 3, 2), n={"b": torch.arange(6).view(2, 3)}, s="x",
                          batch_size=[2, 3])


CASES = [
    "td.fliplr()", "td.flipud()", "td.rot90()", "td.rot90(2, (1, 0))", "td.rot90(3, (0, 1))", "td.rot90(1, (0, 0))",
    "td[0].fliplr()", "td[0].rot90()", "td.pad([1, 0, 0, 1])", "td.pad([1, 1], value=-1)", "td.as_tensor()",
    "td.cat_from_tensordict()", "two.cat_from_tensordict(1)", "two.cat_from_tensordict(sorted=True)",
    "two.cat_from_tensordict(sorted=['c', 'a'])", "two.cat_from_tensordict(sorted=['a'])",
    "two.stack_from_tensordict()", "two.stack_from_tensordict(1, out=torch.empty(2, 2, 3))",
    "td.stack_from_tensordict()", "two.cat_tensors('a', 'c', out_key='x')",
    "two.cat_tensors('a', 'c', out_key=('x', 'y'), dim=1, keep_entries=True)",
    "two.stack_tensors('a', 'c', out_key='x', dim=-1)", "two.cat_tensors('a', 'zz', out_key='x')",
    "two.stack_tensors('a', 'c', out_key='a')", "two.stack_tensors(out_key='a')",
    "td.entry_class('a')", "td.entry_class(('n', 'b'))", "td.entry_class('zz')",
    "td.new_tensor(torch.zeros(4))", "td.new_tensor([1, 2])", "td.new_tensor(td)",
    "td.new_tensor(torch.zeros(4), dtype=torch.float64, requires_grad=True)", "td.densify()",
    "lib.lazy_stack([lib.TensorDict(a=torch.zeros(2)), lib.TensorDict(a=torch.ones(2))]).densify()",
    "td.to_padded_tensor()", "nested.to_padded_tensor(padding=-1)", "nested.to_padded_tensor(mask_key='mask')",
    "td.attrs(fields=('dtype',))['a'].tgt_dtype", "td.attrs()['n', 'b'].tgt_shape",
    "td.rename_keys({'a': 'z', ('n', 'b'): 'c'})", "td.rename_keys({'zz': 'c'})",
    "td.rename_keys({'zz': 'c'}, strict=False)",
    "td.from_dict_instance({'a': torch.zeros(2, 3, 2), 'n': {'b': torch.zeros(2, 3)}}, batch_size=[2, 3])",
]


@pytest.mark.parametrize("expression", CASES)
def test_members_as_upstream(expression):
    def run(lib):
        td = _td(lib)
        two = lib.TensorDict(a=torch.zeros(2, 3), c=torch.ones(2, 3), batch_size=[2])
        nested = lib.TensorDict(a=torch.nested.nested_tensor([torch.zeros(2), torch.ones(3)], layout=torch.jagged),
                                batch_size=[2])
        before = snapshot(two)
        result = outcome(lambda: eval(expression))
        if result[0] == "raises":
            assert snapshot(two) == before  # a failed call changed nothing
        return result, plain(two)

    same_outcome(run)


@given(spec=specs(min_rank=2), k=st.integers(-3, 3), dims=st.sampled_from([(0, 1), (1, 0), (0, -1)]))
@settings(max_examples=25)
def test_rot90_fliplr_flipud_match_torch(spec, k, dims):
    td = build(torchdict, spec)
    for key, leaf in td.items(True, True):
        assert torch.equal(td.rot90(k, dims)[key], torch.rot90(leaf, k, tuple(d % td.batch_dims for d in dims)))
        assert torch.equal(td.fliplr()[key], leaf.flip(1))
        assert torch.equal(td.flipud()[key], leaf.flip(0))
    same_outcome(lambda lib: build(lib, spec).rot90(k, dims))


@given(spec=specs(float_only=True), data=st.lists(st.integers(1, 3), max_size=2))
@settings(max_examples=25)
def test_new_tensor_matches_upstream(spec, data):
    source = torch.arange(float(torch.Size(data).numel())).view(data)
    same_outcome(lambda lib: build(lib, spec).new_tensor(source))


@given(spec=specs(), pad=st.lists(st.integers(0, 2), min_size=0, max_size=4))
@settings(max_examples=25)
def test_pad_member_matches_upstream(spec, pad):
    pad = pad[: 2 * len(spec.batch)]
    if len(pad) % 2:
        pad = pad[:-1]
    same_outcome(lambda lib: build(lib, spec).pad(pad, value=1))


def test_backward():
    def run(lib):
        x = torch.ones(3, requires_grad=True)
        y = torch.ones(2, requires_grad=True)
        results = []
        lib.TensorDict(a=(x * 2).sum(), n={"c": (x * 3).sum()}).backward()
        results.append(x.grad.tolist())
        x.grad = None
        lib.TensorDict(a=x * 2, batch_size=[3]).backward(gradient=lib.TensorDict(a=torch.ones(3), batch_size=[3]))
        results.append(x.grad.tolist())
        x.grad = None
        lib.TensorDict(a=(x * 2).sum() + (y * 2).sum()).backward(inputs=[y])
        results.append((x.grad, y.grad.tolist()))
        results.append(outcome(lambda: lib.TensorDict(a=x * 2, batch_size=[3]).backward()))
        results.append(outcome(lambda: lib.TensorDict(a=torch.zeros(2)).backward()))
        results.append(outcome(lambda: lib.TensorDict(a=x * 2, b=x * 3, batch_size=[3]).backward(
            gradient=lib.TensorDict(a=torch.ones(3), batch_size=[3]))))
        return results

    same_outcome(run)


def test_new_members_work_on_the_generic_base_and_lazy_stacks():
    stack = torchdict.lazy_stack([torchdict.TensorDict(a=torch.arange(3.), b=torch.ones(3)),
                                  torchdict.TensorDict(a=torch.arange(3.) + 3, b=torch.zeros(3))])
    dense = stack.to_tensordict()
    assert plain(stack.flipud()) == plain(dense.flipud())
    assert plain(stack.pad([0, 1])) == plain(dense.pad([0, 1]))
    assert torch.equal(stack.cat_from_tensordict(), dense.cat_from_tensordict())
    assert stack.entry_class("a") is torch.Tensor
    stack.stack_tensors("a", "b", out_key="c")
    assert sorted(stack.keys()) == ["c"] and stack["c"].shape == (2, 2, 3)


# ------------------------------------------------------------------------------------------------ tensorclass
def _post_init_calls(lib, skip):
    calls = []

    @lib.tensorclass(skip_post_init_on_rebuild=skip)
    class P:
        x: torch.Tensor

        def __post_init__(self):
            calls.append(tuple(self.batch_size))

    p = P(x=torch.zeros(3), batch_size=[3])
    p[0], p[1:], p.clone(), torch.stack([p, p]), p.apply(lambda x: x + 1), p.empty()
    P.from_tensordict(lib.TensorDict(x=torch.zeros(2), batch_size=[2]))
    return calls


@pytest.mark.parametrize("skip", [False, True])
def test_skip_post_init_on_rebuild(skip):
    same_outcome(lambda lib: _post_init_calls(lib, skip))


@pytest.mark.parametrize("options", [dict(tensor_only=True), dict(tensor_only=True, autocast=True),
                                     dict(tensor_only=True, nocast=True)])
def test_tensor_only(options):
    def run(lib):
        @lib.tensorclass(**options)
        class Q:
            x: torch.Tensor
            y: torch.Tensor = None

        q = Q(x=1, batch_size=[])
        return type(q.x).__name__, plain(q.x), q.y

    same_outcome(run)

    def refused(lib):
        @lib.tensorclass(tensor_only=True)
        class R:
            x: torch.Tensor
            s: str

    same_outcome(refused)


def test_cast_filter_option():
    def run(lib):
        @lib.tensorclass(cast_filter=lib.is_inexact)
        class C:
            f: torch.Tensor
            i: torch.Tensor

        class D(C):
            pass

        class E(lib.TensorClass, cast_filter=lib.is_inexact):
            f: torch.Tensor
            i: torch.Tensor

        c = C(f=torch.zeros(2), i=torch.zeros(2, dtype=torch.long), batch_size=[2])
        d = D(f=torch.zeros(2), i=torch.zeros(2, dtype=torch.long), batch_size=[2])
        e = E(f=torch.zeros(2), i=torch.zeros(2, dtype=torch.long), batch_size=[2])
        return (c.float64().f.dtype, c.float64().i.dtype, c.float64(cast_filter=None).i.dtype,
                c.bfloat16().i.dtype, d.double().i.dtype, e.half().i.dtype, c.type(torch.float64).i.dtype)

    same_outcome(run)


# ------------------------------------------------------------------------------------------------ map(pool=...)
def _double(chunk):
    return chunk.apply(lambda x: x * 2)


def _with_y(chunk):
    return chunk.set("y", chunk["x"] + 1)


@pytest.mark.slow
def test_map_with_a_multiprocessing_pool_and_executors():
    td = torchdict.TensorDict(x=torch.arange(8.), batch_size=[8])
    expected = td["x"] * 2
    context = multiprocessing.get_context("spawn")
    with context.Pool(2) as pool:
        assert torch.equal(td.map(_double, pool=pool, chunksize=3)["x"], expected)
        assert torch.equal(td.map(_with_y, pool=pool, num_chunks=2)["y"], td["x"] + 1)
        assert [chunk["x"].tolist() for chunk in td.map_iter(_double, pool=pool, chunksize=4)] == [
            [0.0, 2.0, 4.0, 6.0], [8.0, 10.0, 12.0, 14.0]]
        out = td.clone().zero_()
        assert td.map(_double, pool=pool, out=out) is out and torch.equal(out["x"], expected)
    with concurrent.futures.ThreadPoolExecutor(2) as executor:
        assert torch.equal(td.map(_double, pool=executor, chunksize=0)["x"], expected)
    with concurrent.futures.ProcessPoolExecutor(2, mp_context=context) as executor:
        assert torch.equal(td.map(_double, pool=executor)["x"], expected)


# ------------------------------------------------------------------------------------------------ distributed
_WORKER = r'''
import sys, torch
sys.path.insert(0, {src!r})
import torch.distributed as dist
from torchdict import TensorDict

def run(rank, world, path, queue):
    dist.init_process_group("gloo", init_method="file://" + path, rank=rank, world_size=world)
    out = {{}}
    td = TensorDict(a=torch.full((2, 3), float(rank + 1)), n={{"b": torch.arange(2) + rank}}, s="x", batch_size=[2])
    if rank == 0:
        td.init_remote(dst=1)
    else:
        got = TensorDict.from_remote_init(src=0)
        out["remote"] = (got["a"].tolist(), got["n", "b"].tolist(), got["s"], tuple(got.batch_size))
    parts = [TensorDict(a=torch.full((1,), float(10 + r)), batch_size=[1]) for r in range(world)] if rank == 0 else None
    out["scatter"] = td.scatter(0, parts)["a"].tolist()
    if rank == 0:
        holder = TensorDict(a=torch.zeros(world - 1, 2, 3), n={{"b": torch.zeros(world - 1, 2, dtype=torch.int64)}},
                            s="x", batch_size=[world - 1, 2])
        out["gather"] = (holder.gather_and_stack(0) is holder, holder["a"][:, 0, 0].tolist())
    else:
        out["gather"] = td.gather_and_stack(0)
    summed = TensorDict(a=torch.full((3,), float(rank + 1)), b=torch.ones(2) * (rank + 1))
    summed.reduce(0)
    bucketed = TensorDict(a=torch.full((3,), float(rank + 1)), b=torch.ones(2) * (rank + 1))
    bucketed.reduce(0, bucket_bytes=1 << 20)
    if rank == 0:
        out["reduce"] = (summed["a"].tolist(), summed["b"].tolist(), bucketed["a"].tolist(), bucketed["b"].tolist())
    if rank == 0:
        td.init_remote(use_broadcast=True)
    else:
        out["broadcast"] = TensorDict.from_remote_init(src=0, use_broadcast=True)["a"].tolist()
    queue.put((rank, out))
    dist.destroy_process_group()
'''


@pytest.mark.slow
def test_distributed_members_over_gloo(tmp_path):
    module_path = tmp_path / "dropin_dist_worker.py"
    module_path.write_text(_WORKER.format(src=os.path.join(os.path.dirname(__file__), "..", "src")))
    sys.path.insert(0, str(tmp_path))  # the spawned workers import the module through the parent's sys.path
    try:
        import dropin_dist_worker

        context = multiprocessing.get_context("spawn")
        queue = context.Queue()
        store = tempfile.mktemp(dir=tmp_path)
        processes = [context.Process(target=dropin_dist_worker.run, args=(rank, 2, store, queue))
                     for rank in range(2)]
        for process in processes:
            process.start()
        results = dict(queue.get(timeout=120) for _ in processes)
        for process in processes:
            process.join(60)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("dropin_dist_worker", None)
    assert results[1]["remote"] == ([[1.0] * 3] * 2, [0, 1], "x", (2,))
    assert results[0]["scatter"] == [10.0] and results[1]["scatter"] == [11.0]
    assert results[0]["gather"] == (True, [2.0]) and results[1]["gather"] is None
    assert results[0]["reduce"] == ([3.0] * 3, [3.0] * 2, [3.0] * 3, [3.0] * 2)
    assert results[1]["broadcast"] == [[1.0] * 3] * 2


def test_async_pipe_members_await_the_pipe():
    import asyncio

    class Pipe:
        def __init__(self):
            self.sent = None

        async def asend(self, td):
            self.sent = td

        async def arecv(self, td, device=None):
            return td.apply(lambda x: x + 1)

    td = torchdict.TensorDict(a=torch.zeros(2), batch_size=[2])
    pipe = Pipe()
    asyncio.run(td.asend(pipe))
    assert pipe.sent is td
    assert asyncio.run(td.arecv(pipe))["a"].tolist() == [1.0, 1.0]
