"""Shared helpers of the torchdict.nn differential tests: the same module built with upstream ``tensordict``
and with torchdict (same seed, so same weights), inputs built from the same tensors, results compared."""
from __future__ import annotations

from typing import Any, Callable, Tuple

import pytest
import torch

import torchdict
import torchdict.nn

tensordict = pytest.importorskip("tensordict")
import tensordict.nn  # noqa: E402

UPSTREAM = (tensordict, tensordict.nn)
OURS = (torchdict, torchdict.nn)


def both(build: Callable[[Any, Any], Any], seed: int = 0) -> Tuple[Any, Any]:
    """``build(lib, lib_nn)`` for upstream then torchdict, each after ``torch.manual_seed(seed)``."""
    torch.manual_seed(seed)
    upstream = build(*UPSTREAM)
    torch.manual_seed(seed)
    ours = build(*OURS)
    return upstream, ours


def pair(data: dict, batch_size: Any = ()) -> Tuple[Any, Any]:
    """An upstream TensorDict and a torchdict TensorDict over clones of the same tensors."""
    def clone(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: clone(item) for key, item in value.items()}
        return value.clone() if isinstance(value, torch.Tensor) else value

    return (tensordict.TensorDict(clone(data), batch_size=batch_size),
            torchdict.TensorDict(clone(data), batch_size=batch_size))


def leaves(td: Any) -> dict:
    """{key as tuple: value} over the leaves."""
    out = {}
    for key, value in td.items(include_nested=True, leaves_only=True):
        out[key if isinstance(key, tuple) else (key,)] = value
    return out


def assert_same_td(upstream: Any, ours: Any, *, exact: bool = True) -> None:
    assert tuple(upstream.batch_size) == tuple(ours.batch_size)
    up, mine = leaves(upstream), leaves(ours)
    assert sorted(up) == sorted(mine)
    for key, value in up.items():
        other = mine[key]
        if isinstance(value, torch.Tensor):
            assert isinstance(other, torch.Tensor), key
            assert value.shape == other.shape and value.dtype == other.dtype, key
            if exact:
                assert torch.equal(value.detach(), other.detach()), key
            else:
                torch.testing.assert_close(value.detach(), other.detach())


def assert_same_output(upstream: Any, ours: Any) -> None:
    if isinstance(upstream, tuple):
        assert isinstance(ours, tuple) and len(upstream) == len(ours)
        for a, b in zip(upstream, ours):
            assert_same_output(a, b)
    elif isinstance(upstream, torch.Tensor):
        assert isinstance(ours, torch.Tensor)
        assert torch.equal(upstream.detach(), ours.detach())
    elif upstream is None:
        assert ours is None
    else:
        assert_same_td(upstream, ours)


def outcome(call: Callable[[], Any]) -> Tuple[str, Any]:
    try:
        return "ok", call()
    except Exception as err:  # noqa: BLE001 - the type is what is compared
        return "error", err


def assert_same_outcome(upstream_call: Callable[[], Any], our_call: Callable[[], Any]) -> Tuple[Any, Any]:
    """Both succeed with equal results, or both raise an exception of the same type (or ours a subclass
    of upstream's)."""
    up_kind, up_value = outcome(upstream_call)
    our_kind, our_value = outcome(our_call)
    assert up_kind == our_kind, (up_value, our_value)
    if up_kind == "error":
        # upstream's private exception classes are compared through their builtin bases
        public = [base for base in type(up_value).__mro__
                  if base.__module__ == "builtins" and base not in (BaseException, object)]
        assert all(isinstance(our_value, base) for base in public), (type(up_value), type(our_value), our_value)
    else:
        assert_same_output(up_value, our_value)
    return up_value, our_value
