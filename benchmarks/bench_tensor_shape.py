"""Tensor semantics benchmarks (issue 3): indexing, indexed writes, shape ops, stack/cat,
unbind/split, and the lazy-preallocation loop.

Every case uses the same tree of leaves: 20 float leaves and a ``"sub"`` dict of 4 more
(24 leaves), each of shape ``batch + (8,)``. The floor is the hand-written recursion over
that nested dict doing the same tensor op on every leaf (with the feature dims kept
generic, ``leaf.shape[n:]``, as code that doesn't know its leaves must do).
"""
from __future__ import annotations

import torch

from _harness import FLOOR, Case, for_libraries

FEATURES = 8
TOP_LEAVES = 20
SUB_LEAVES = 4
N_PREALLOCATE = 1000


def tree(batch: tuple) -> dict:
    """20 leaves and a ``"sub"`` dict of 4 leaves, every leaf of shape ``batch + (8,)``."""
    source = {f"key{i}": torch.randn(*batch, FEATURES) for i in range(TOP_LEAVES)}
    source["sub"] = {f"x{i}": torch.randn(*batch, FEATURES) for i in range(SUB_LEAVES)}
    return source


def leafwise(fn):
    """The floor: ``fn`` on every leaf of a nested dict."""

    def walk(node: dict) -> dict:
        return {key: walk(value) if type(value) is dict else fn(value) for key, value in node.items()}

    return walk


def leafwise_many(fn, count: int):
    """The floor for ops with several results (unbind, split): ``count`` nested dicts."""

    def walk(node: dict) -> list:
        results = [{} for _ in range(count)]
        for key, value in node.items():
            pieces = walk(value) if type(value) is dict else fn(value)
            for result, piece in zip(results, pieces):
                result[key] = piece
        return results

    return walk


def combine(fn):
    """The floor for stack/cat: ``fn([leaf of each dict])`` key by key."""

    def walk(nodes: list) -> dict:
        first = nodes[0]
        return {key: walk([node[key] for node in nodes]) if type(value) is dict else fn([node[key] for node in nodes])
                for key, value in first.items()}

    return walk


def write_at(target: dict, index, source: dict) -> None:
    for key, value in source.items():
        if type(value) is dict:
            write_at(target[key], index, value)
        else:
            target[key][index] = value


def _unary_case(name: str, batch: tuple, op, floor_op, target: str, note: str = "") -> Case:
    def setup():
        return tree(batch)

    def library(lib, source):
        td = lib.TensorDict(source, batch_size=list(batch))
        return lambda: op(td)

    def floor(source):
        walk = leafwise(floor_op)
        return lambda: walk(source)

    return Case(name, setup=setup, impls={**for_libraries(library), FLOOR: floor}, target=target, note=note)


def _index_cases() -> list:
    batch = (64,)
    mask = torch.rand(64) > 0.5
    rows = torch.randperm(64)[:16]
    return [
        _unary_case("index int: td[3]", batch, lambda td: td[3], lambda leaf: leaf[3], "<= 1.15x floor"),
        _unary_case("index slice: td[4:40:2]", batch, lambda td: td[4:40:2], lambda leaf: leaf[4:40:2],
                    "<= 1.15x floor"),
        _unary_case("index mask: td[bool mask]", batch, lambda td: td[mask], lambda leaf: leaf[mask],
                    "<= 1.15x floor", note="a 1-d bool mask on dim 0; the floor indexes each leaf with it"),
        _unary_case("index tensor: td[long tensor]", batch, lambda td: td[rows], lambda leaf: leaf[rows],
                    "<= 1.0x floor", note="16 rows of 64; the floor uses advanced indexing per leaf"),
    ]


def _setitem_case() -> Case:
    batch = (64,)

    def setup():
        return tree(batch), tree(())

    def library(lib, data):
        source, row = data
        td = lib.TensorDict(source, batch_size=list(batch))
        value = lib.TensorDict(row, batch_size=[])
        return lambda: td.__setitem__(3, value)

    def floor(data):
        source, row = data
        return lambda: write_at(source, 3, row)

    return Case("setitem int: td[3] = td_row", setup=setup, impls={**for_libraries(library), FLOOR: floor},
                target="<= 1.35x floor",
                note="torchdict checks every leaf's shape before the first write (a failed write changes "
                     "nothing); the floor writes leaf by leaf and may fail half-way")


def _shape_cases() -> list:
    batch = (8, 8)
    return [
        _unary_case("view(-1)", batch, lambda td: td.view(-1),
                    lambda leaf: leaf.view(64, *leaf.shape[2:]), "<= 1.2x floor"),
        _unary_case("reshape(4, 16)", batch, lambda td: td.reshape(4, 16),
                    lambda leaf: leaf.reshape(4, 16, *leaf.shape[2:]), "<= 1.2x floor"),
        _unary_case("unsqueeze(0)", batch, lambda td: td.unsqueeze(0), lambda leaf: leaf.unsqueeze(0),
                    "<= 1.2x floor"),
        _unary_case("permute(1, 0)", batch, lambda td: td.permute(1, 0),
                    lambda leaf: leaf.permute(1, 0, *range(2, leaf.dim())), "<= 1.2x floor"),
    ]


def _split_cases() -> list:
    batch = (16,)

    def setup():
        return tree(batch)

    def unbind_library(lib, source):
        td = lib.TensorDict(source, batch_size=list(batch))
        return lambda: td.unbind(0)

    def unbind_floor(source):
        walk = leafwise_many(lambda leaf: leaf.unbind(0), batch[0])
        return lambda: walk(source)

    def split_library(lib, source):
        td = lib.TensorDict(source, batch_size=list(batch))
        return lambda: td.split(4, 0)

    def split_floor(source):
        walk = leafwise_many(lambda leaf: leaf.split(4, 0), batch[0] // 4)
        return lambda: walk(source)

    return [
        Case("unbind(0) of 16", setup=setup, impls={**for_libraries(unbind_library), FLOOR: unbind_floor},
             target="<= 1.2x floor"),
        Case("split(4) of 16", setup=setup, impls={**for_libraries(split_library), FLOOR: split_floor},
             target="<= 1.2x floor"),
    ]


def _combine_cases() -> list:
    batch = (16,)

    def setup():
        return [tree(batch) for _ in range(10)]

    def cases_for(name: str, torch_fn):
        def library(lib, sources):
            tds = [lib.TensorDict(source, batch_size=list(batch)) for source in sources]
            return lambda: torch_fn(tds, 0)

        def floor(sources):
            walk = combine(lambda leaves: torch_fn(leaves, 0))
            return lambda: walk(sources)

        return Case(name, setup=setup, impls={**for_libraries(library), FLOOR: floor}, target="<= 1.2x floor")

    return [cases_for("torch.stack of 10", torch.stack), cases_for("torch.cat of 10", torch.cat)]


def _step() -> dict:
    """One step of an RL-style rollout, as returned by the seed's ``foo()``."""
    return {
        "obs": torch.randn(4),
        "action": torch.randn(2),
        "reward": torch.randn(1),
        "done": torch.zeros(1, dtype=torch.bool),
        "next": {"obs": torch.randn(4)},
    }


def _preallocation_case() -> Case:
    def setup():
        return [_step() for _ in range(N_PREALLOCATE)]

    def library(lib, steps):
        items = [lib.TensorDict(step, batch_size=[]) for step in steps]

        def run():
            data = lib.TensorDict({}, batch_size=[N_PREALLOCATE])
            for i, item in enumerate(items):
                data[i] = item
            return data

        return run

    def allocate(step: dict) -> dict:
        return {key: allocate(value) if type(value) is dict
                else torch.zeros((N_PREALLOCATE,) + value.shape, dtype=value.dtype)
                for key, value in step.items()}

    def floor(steps):
        def run():
            data = None
            for i, step in enumerate(steps):
                if data is None:
                    data = allocate(step)
                write_at(data, i, step)
            return data

        return run

    return Case(f"preallocation loop (N={N_PREALLOCATE})", setup=setup,
                impls={**for_libraries(library), FLOOR: floor}, target="<= 1.5x floor",
                note="data = TensorDict({}, [N]); data[i] = step for each step (5 leaves, one nested); "
                     "the floor allocates zeros on the first step and writes leaf by leaf")


def cases() -> list:
    return [
        *_index_cases(),
        _setitem_case(),
        *_shape_cases(),
        *_split_cases(),
        *_combine_cases(),
        _preallocation_case(),
    ]
