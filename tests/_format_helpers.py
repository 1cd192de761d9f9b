"""Comparing what upstream tensordict and torchdict read from a file or a table (issue 21's format tests)."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

_STRUCTURE_KINDS = {"TensorDict", "LazyStackedTensorDict", "NonTensorData", "NonTensorStack"}


def kind(value: Any) -> str:
    """The kind of an entry, named the same in both libraries."""
    if isinstance(value, torch.Tensor):
        return "NestedTensor" if value.is_nested else "Tensor"
    name = type(value).__name__
    return name if name in _STRUCTURE_KINDS else "tensorclass"


def same_values(left: Any, right: Any) -> bool:
    """Python / numpy values equal (NaN equal to NaN, arrays element-wise, lists item by item)."""
    if isinstance(left, np.ndarray) or isinstance(right, np.ndarray):
        left, right = np.asarray(left), np.asarray(right)
        if left.shape != right.shape or left.dtype != right.dtype:
            return False
        if left.dtype.kind in "fc":
            return bool(np.array_equal(left, right, equal_nan=True))
        return bool(np.array_equal(left, right))
    if isinstance(left, (list, tuple)) and isinstance(right, (list, tuple)):
        return len(left) == len(right) and all(same_values(a, b) for a, b in zip(left, right))
    if isinstance(left, float) and isinstance(right, float) and left != left and right != right:
        return True
    return type(left) is type(right) and left == right


def assert_same(up: Any, ours: Any, path: str = "result") -> None:
    """``up`` (upstream) and ``ours`` hold the same structure, batch sizes, dtypes and values."""
    assert kind(up) == kind(ours), f"{path}: {kind(up)} vs {kind(ours)}"
    if isinstance(up, torch.Tensor):
        assert up.dtype == ours.dtype, f"{path}: {up.dtype} vs {ours.dtype}"
        if up.is_nested:
            assert [t.tolist() for t in up.unbind(0)] == [t.tolist() for t in ours.unbind(0)], path
            return
        assert up.shape == ours.shape, f"{path}: {up.shape} vs {ours.shape}"
        assert torch.equal(up, ours) or (up.is_floating_point() and torch.allclose(up, ours, equal_nan=True)), path
        return
    assert tuple(up.batch_size) == tuple(ours.batch_size), f"{path}: {up.batch_size} vs {ours.batch_size}"
    if kind(up) == "NonTensorData":
        assert same_values(up.data, ours.data), f"{path}: {up.data!r} vs {ours.data!r}"
        return
    if kind(up) == "NonTensorStack":
        assert same_values(list(up.tolist()), list(ours.tolist())), f"{path}: {up.tolist()} vs {ours.tolist()}"
        return
    if kind(up) == "TensorDict":
        assert up.device == ours.device, f"{path}: device {up.device} vs {ours.device}"
        assert list(up.names) == list(ours.names), f"{path}: names {up.names} vs {ours.names}"
    up_keys = sorted(up.keys())
    assert up_keys == sorted(ours.keys()), f"{path}: keys {up_keys} vs {sorted(ours.keys())}"
    for key in up_keys:
        assert_same(up.get(key), ours.get(key), f"{path}[{key!r}]")


def outcome(call: Any) -> Any:
    """``("ok", result)`` or ``("error", exception)``."""
    try:
        return "ok", call()
    except Exception as err:  # noqa: BLE001 -- the type is what the tests compare
        return "error", err


def assert_same_outcome(up_call: Any, our_call: Any, compare: Any = assert_same) -> Any:
    """Both calls give equal results, or raise exceptions of the same type; returns our outcome."""
    up, ours = outcome(up_call), outcome(our_call)
    assert up[0] == ours[0], f"upstream {up[0]} ({up[1]!r}), torchdict {ours[0]} ({ours[1]!r})"
    if up[0] == "error":
        assert isinstance(ours[1], type(up[1])) or isinstance(up[1], type(ours[1])), (up[1], ours[1])
    else:
        compare(up[1], ours[1])
    return ours
