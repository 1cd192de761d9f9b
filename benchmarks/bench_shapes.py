"""The everyday operations across shapes (issue 22): batch ranks 1-3, 1 / 10 / 100 leaves, flat and nested.

The other suites time each operation on the shape it was written for; this one sweeps the shapes users
have (RL data is ``[envs, time, ...]``, models hold hundreds of parameters, observations nest) so a fast
path that holds for one batch dimension only shows up as a slow row here.

Every case builds the same tree for the three columns: ``leaves`` tensors of shape ``batch + (5,)``,
flat, or (``nested``) split evenly over three levels ``{"a": {...}, "b": {"c": {...}}}``. The floor is
the hand-written recursion over that nested dict that a careful user would write: it checks what the
operation needs checked (construction and writes compare each leaf's leading dims with the batch) and
runs the same tensor op on every leaf.

Run ``python benchmarks/run.py --suite shapes`` (``--quick`` for a short run); the table is in
``docs/benchmarks.md``.
"""
from __future__ import annotations

import itertools

import torch

from _harness import FLOOR, Case, for_libraries

FEATURES = 5
BATCHES = {1: (16,), 2: (4, 8), 3: (2, 4, 4)}
LEAF_COUNTS = (1, 10, 100)


def tree(batch: tuple, leaves: int, nested: bool) -> dict:
    """``leaves`` tensors of shape ``batch + (5,)``: flat, or spread over three nested levels."""
    tensors = [torch.randn(*batch, FEATURES) for _ in range(leaves)]
    if not nested:
        return {f"k{i}": tensor for i, tensor in enumerate(tensors)}
    third = max(1, leaves // 3)
    top = {f"k{i}": tensor for i, tensor in enumerate(tensors[:third])}
    top["a"] = {f"k{i}": tensor for i, tensor in enumerate(tensors[third:2 * third])}
    top["b"] = {"c": {f"k{i}": tensor for i, tensor in enumerate(tensors[2 * third:])}}
    return top


def _walk(fn):
    def walk(node: dict) -> dict:
        return {key: walk(value) if type(value) is dict else fn(value) for key, value in node.items()}

    return walk


def _checked_copy(batch: tuple):
    """The floor of construction: a new nested dict, each leaf's leading dims compared with the batch."""
    n = len(batch)

    def build(node: dict) -> dict:
        out = {}
        for key, value in node.items():
            if type(value) is dict:
                out[key] = build(value)
            else:
                if value.shape[:n] != batch:
                    raise RuntimeError("batch mismatch")
                out[key] = value
        return out

    return build


def _cases_for(rank: int, leaves: int, nested: bool) -> list:
    batch = BATCHES[rank]
    label = f"rank {rank}, {leaves} leaves, {'nested' if nested else 'flat'}"
    flat_view = (-1,)
    last = len(batch)

    def setup():
        return tree(batch, leaves, nested)

    def make(op):
        def library(lib, source):
            td = lib.TensorDict(source, batch_size=list(batch))
            return lambda: op(td)

        return library

    def floor_of(leaf_op):
        def floor(source):
            walk = _walk(leaf_op)
            return lambda: walk(source)

        return floor

    def construct(lib, source):
        return lambda: lib.TensorDict(source, batch_size=list(batch))

    def construct_floor(source):
        build = _checked_copy(torch.Size(batch))
        return lambda: build(source)

    def setitem(lib, source):
        td = lib.TensorDict(source, batch_size=list(batch))
        value = torch.zeros(*batch, FEATURES)
        return lambda: td.__setitem__("k0", value)

    def setitem_floor(source):
        value = torch.zeros(*batch, FEATURES)
        size = torch.Size(batch)

        def run():
            if value.shape[:len(size)] != size:
                raise RuntimeError("batch mismatch")
            source["k0"] = value

        return run

    def update(lib, source):
        td = lib.TensorDict(source, batch_size=list(batch))
        other = lib.TensorDict(tree(batch, leaves, nested), batch_size=list(batch))
        return lambda: td.update(other)

    def update_floor(source):
        other = tree(batch, leaves, nested)

        def merge(target: dict, new: dict) -> None:
            for key, value in new.items():
                if type(value) is dict:
                    merge(target[key], value)
                else:
                    target[key] = value

        return lambda: merge(source, other)

    cases = [
        Case(f"construct ({label})", setup=setup, impls={**for_libraries(construct), FLOOR: construct_floor}),
        Case(f"td['k0'] = t ({label})", setup=setup, impls={**for_libraries(setitem), FLOOR: setitem_floor}),
        Case(f"update(other) ({label})", setup=setup, impls={**for_libraries(update), FLOOR: update_floor}),
        Case(f"td[1] ({label})", setup=setup, impls={**for_libraries(make(lambda td: td[1])),
                                                     FLOOR: floor_of(lambda leaf: leaf[1])}),
        Case(f"td[0:2] ({label})", setup=setup, impls={**for_libraries(make(lambda td: td[0:2])),
                                                       FLOOR: floor_of(lambda leaf: leaf[0:2])}),
        Case(f"view(-1) ({label})", setup=setup,
             impls={**for_libraries(make(lambda td: td.view(*flat_view))),
                    FLOOR: floor_of(lambda leaf: leaf.view(-1, *leaf.shape[last:]))}),
        Case(f"unsqueeze(0) ({label})", setup=setup, impls={**for_libraries(make(lambda td: td.unsqueeze(0))),
                                                            FLOOR: floor_of(lambda leaf: leaf.unsqueeze(0))}),
        Case(f"apply(x * 2) ({label})", setup=setup, impls={**for_libraries(make(lambda td: td.apply(lambda x: x * 2))),
                                                            FLOOR: floor_of(lambda leaf: leaf * 2)}),
        Case(f"clone() ({label})", setup=setup, impls={**for_libraries(make(lambda td: td.clone())),
                                                       FLOOR: floor_of(lambda leaf: leaf.clone())}),
        Case(f"to('cpu') ({label})", setup=setup, impls={**for_libraries(make(lambda td: td.to("cpu"))),
                                                         FLOOR: floor_of(lambda leaf: leaf.to("cpu"))}),
    ]
    if rank > 1:
        cases.append(Case(f"permute (reversed batch) ({label})", setup=setup,
                          impls={**for_libraries(make(lambda td: td.permute(*reversed(range(rank))))),
                                 FLOOR: floor_of(lambda leaf: leaf.permute(*reversed(range(rank)),
                                                                           *range(rank, leaf.dim())))}))
    return cases


def cases() -> list:
    return [case for rank, leaves, nested in itertools.product(BATCHES, LEAF_COUNTS, (False, True))
            for case in _cases_for(rank, leaves, nested)]
