"""torch.compile benchmarks (issue 20): core ops eager and compiled, torchdict beside upstream.

Each op has two rows: ``<op> eager`` and ``<op> compiled`` (``torch.compile(fullgraph=True)``,
compiled untimed in the prepare step). The floor is the same job on a plain dict of tensors
compiled the same way. The backend is ``TORCHDICT_BENCH_COMPILE_BACKEND`` (default ``eager``:
Dynamo's graph run eagerly, which shows what tracing takes off, the Python of the
containers; ``inductor`` adds kernel fusion, at a compile time of seconds per op on a CPU).

Data: a TensorDict of 8 float leaves of shape [64, 16] (one of them nested), batch [64].
"""
from __future__ import annotations

import os
from typing import Any, Callable

import torch

from _harness import FLOOR, Case, for_libraries

BATCH = 64
BACKEND = os.environ.get("TORCHDICT_BENCH_COMPILE_BACKEND", "eager")


def _source() -> dict:
    generator = torch.Generator().manual_seed(0)
    source: dict = {f"x{i}": torch.randn(BATCH, 16, generator=generator) for i in range(7)}
    source["nested"] = {"y": torch.randn(BATCH, 16, generator=generator)}
    return source


def _index(td: Any) -> Any:
    return td[3]


def _arith(td: Any) -> Any:
    return (td * 2 + 1)["x0"]


def _apply(td: Any) -> Any:
    return td.apply(torch.relu)


def _stack_view(td: Any) -> Any:
    return torch.stack([td, td]).view(-1)


def _get_set(td: Any) -> Any:
    out = td.clone()
    out["z"] = out["x0"] + out["nested", "y"]
    return out


_OPS: dict = {"td[i]": _index, "(td * 2 + 1)[key]": _arith, "apply(relu)": _apply,
              "stack + view": _stack_view, "clone + get/set": _get_set}


def _floor_ops() -> dict:
    def flat(source: dict) -> dict:
        return {key: value for key, value in source.items() if isinstance(value, torch.Tensor)}

    return {
        "td[i]": lambda d: {k: (v[3] if isinstance(v, torch.Tensor) else {kk: vv[3] for kk, vv in v.items()})
                            for k, v in d.items()},
        "(td * 2 + 1)[key]": lambda d: {k: v * 2 + 1 for k, v in flat(d).items()}["x0"],
        "apply(relu)": lambda d: {k: (torch.relu(v) if isinstance(v, torch.Tensor)
                                      else {kk: torch.relu(vv) for kk, vv in v.items()}) for k, v in d.items()},
        "stack + view": lambda d: {k: torch.stack([v, v]).view(-1, *v.shape[1:]) for k, v in flat(d).items()},
        "clone + get/set": lambda d: {**{k: v.clone() for k, v in flat(d).items()}, "z": d["x0"] + d["nested"]["y"]},
    }


def _compiled(fn: Callable) -> Callable:
    torch._dynamo.reset()  # each op compiles on its own (no recompile limit across cases)
    return torch.compile(fn, fullgraph=True, backend=BACKEND)


def cases() -> list[Case]:
    result = []
    floors = _floor_ops()
    for name, op in _OPS.items():
        def eager(lib: Any, source: dict, op: Callable = op) -> Callable:
            td = lib.TensorDict(source, batch_size=[BATCH])
            return lambda: op(td)

        def compiled(lib: Any, source: dict, op: Callable = op) -> Callable:
            td = lib.TensorDict(source, batch_size=[BATCH])
            fn = _compiled(op)
            fn(td)  # compile now, untimed
            return lambda: fn(td)

        def floor_eager(source: dict, job: Callable = floors[name]) -> Callable:
            return lambda: job(source)

        def floor_compiled(source: dict, job: Callable = floors[name]) -> Callable:
            fn = _compiled(job)
            fn(source)
            return lambda: fn(source)

        result.append(Case(f"{name} eager", setup=_source, impls={**for_libraries(eager), FLOOR: floor_eager}))
        result.append(Case(f"{name} compiled", setup=_source,
                           impls={**for_libraries(compiled), FLOOR: floor_compiled},
                           note=f"compiled with torch.compile(fullgraph=True, backend={BACKEND!r})"))
    return result
