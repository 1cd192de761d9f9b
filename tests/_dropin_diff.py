"""Differential machinery of the drop-in tests: equal inputs built in upstream ``tensordict`` and torchdict,
results reduced to plain comparable values, exceptions to their builtin kind.

A *spec* (drawn by :func:`specs`) says how to build a TensorDict: batch shape (rank 0-3), entries at nested
keys with dtypes and feature shapes, and a seed for the values; :func:`build` makes the same TensorDict in
either library.
"""
from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any, Callable

import numpy as np
import pytest
import torch
from hypothesis import strategies as st

import torchdict

upstream = pytest.importorskip("tensordict")
LIBS = (upstream, torchdict)

DTYPES = (torch.float32, torch.float64, torch.int64, torch.int32, torch.bool)


@dataclasses.dataclass(frozen=True)
class Spec:
    batch: tuple
    entries: tuple  # ((key path, dtype, feature shape), ...)
    seed: int


@st.composite
def specs(draw: Callable, min_rank: int = 0, max_rank: int = 3, float_only: bool = False,
          max_entries: int = 3) -> Spec:
    rank = draw(st.integers(min_rank, max_rank))
    batch = tuple(draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank)))
    count = draw(st.integers(1, max_entries))
    names = ["a", "b", "c", "d"]
    entries = []
    used: set = set()
    for position in range(count):
        nested = draw(st.booleans())
        path = ("n", names[position]) if nested else (names[position],)
        if path in used:
            continue
        used.add(path)
        dtype = torch.float32 if float_only else draw(st.sampled_from(DTYPES))
        feature = tuple(draw(st.lists(st.integers(1, 2), max_size=2)))
        entries.append((path, dtype, feature))
    return Spec(batch, tuple(entries), draw(st.integers(0, 2 ** 16)))


def values_of(spec: Spec) -> dict:
    """The raw tensors of a spec (the same objects' values for both libraries)."""
    generator = torch.Generator().manual_seed(spec.seed)
    out = {}
    for path, dtype, feature in spec.entries:
        shape = spec.batch + feature
        if dtype is torch.bool:
            value = torch.rand(shape, generator=generator) > 0.5
        elif dtype.is_floating_point:
            value = (torch.randn(shape, generator=generator) * 3).to(dtype)
        else:
            value = torch.randint(-5, 6, shape, generator=generator).to(dtype)
        out[path] = value
    return out


def build(lib: Any, spec: Spec) -> Any:
    """The TensorDict of ``spec`` in ``lib`` (fresh tensors: the two libraries never share one)."""
    source: dict = {}
    for path, value in values_of(spec).items():
        level = source
        for part in path[:-1]:
            level = level.setdefault(part, {})
        level[path[-1]] = value.clone()
    return lib.TensorDict(source, batch_size=spec.batch)


def exception_kind(error: BaseException) -> type:
    """The builtin exception class an error is (``MessageKeyError`` -> ``KeyError``)."""
    for kind in type(error).__mro__:
        if kind.__module__ == "builtins":
            return kind
    return type(error)


def plain(value: Any) -> Any:
    """A library-independent form of a result: collections by class name, batch size and entries."""
    if isinstance(value, torch.Tensor):
        tensor = value.detach()
        if tensor.is_nested:
            return ("nested", str(tensor.dtype), [plain(item) for item in tensor.unbind()])
        data = tensor.cpu()
        if data.dtype in (torch.bfloat16, torch.float16):
            data = data.float()
        return ("tensor", str(tensor.dtype), tuple(tensor.shape), _tolist(data))
    if isinstance(value, torch.Size):
        return ("size", tuple(value))
    for lib in LIBS:
        if isinstance(value, (lib.NonTensorData,)):
            return ("nontensor", type(value).__name__, tuple(value.batch_size), _plain_value(value.data))
        if isinstance(value, lib.NonTensorStack):
            return ("nontensorstack", tuple(value.batch_size), _plain_value(value.tolist()))
    if hasattr(value, "batch_size") and hasattr(value, "keys") and callable(value.keys):
        entries = {}
        for key in value.keys():
            entries[key] = plain(value.get(key))
        return ("collection", type(value).__name__, tuple(value.batch_size), entries)
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [plain(item) for item in value])
    if isinstance(value, dict):
        return ("dict", {key: plain(item) for key, item in value.items()})
    return _plain_value(value)


def _tolist(tensor: torch.Tensor) -> Any:
    if tensor.is_complex():
        return [(_num(item.real), _num(item.imag)) for item in tensor.reshape(-1).tolist()]
    return _nan_safe(tensor.tolist())


def _nan_safe(value: Any) -> Any:
    if isinstance(value, list):
        return [_nan_safe(item) for item in value]
    return _num(value)


def _num(value: Any) -> Any:
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return round(value, 4)
    return value


def _plain_value(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return ("ndarray", value.tolist())
    if isinstance(value, list):
        return [_plain_value(item) for item in value]
    return value


def outcome(make: Callable[[], Any]) -> Any:
    """``("value", plain result)`` or ``("raises", builtin kind)``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return ("value", plain(make()))
        except Exception as error:  # noqa: BLE001 - the kind is what is compared
            return ("raises", exception_kind(error))


def same_outcome(call: Callable[[Any], Any]) -> tuple:
    """``call(lib)`` in both libraries; asserts equal outcomes and returns them."""
    theirs = outcome(lambda: call(upstream))
    ours = outcome(lambda: call(torchdict))
    assert ours == theirs, f"\nupstream:  {theirs}\ntorchdict: {ours}"
    return ours


def snapshot(td: Any) -> Any:
    """Everything observable of a TensorDict (to check that a failed call changed nothing)."""
    return (tuple(td.batch_size), td.is_locked, plain(td))
