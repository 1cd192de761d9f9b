"""What torch.compile's Dynamo sees in place of torchdict's C helpers.

Dynamo traces Python bytecode; a C function is opaque to it (a graph break, or an error with
``fullgraph=True``). Each helper of ``_accel`` that eager code calls as a function (the C one,
or its pure-Python twin built on torch's C length slot) gets here a *traceable twin*: plain
Python over tensor shapes, with the same answers for the inputs torchdict gives it.
:func:`register` hands the pairs to ``torch._dynamo.substitute_in_graph``, so that eager
calls keep running C and traced calls run the twin.

This module is imported only once ``torch._dynamo`` is (``_accel.watch_for_dynamo``): it
must never be what imports it. The helpers that live in type slots (``td[key]``, a
tensorclass's ``data[i]`` and ``__init__``) need no registration: their classes keep
Python functions in their ``__dict__``, which is what Dynamo reads.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from . import _accel

__all__ = ["register", "registered", "traceable_twins"]

_Tensor = torch.Tensor


def tensor_len(value: Any) -> int:
    """The first size of a tensor, 0 for a 0-dim one (TypeError for anything else)."""
    if not isinstance(value, _Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(value).__name__}")
    return value.shape[0] if value.dim() else 0


def _is_unbatched(value: Any) -> bool:
    cls = _accel.unbatched_class
    return cls is not None and isinstance(value, cls)


def _fits(value: Any, first: int) -> bool:
    return isinstance(value, _Tensor) and not _is_unbatched(value) and value.dim() > 0 and value.shape[0] == first


def leaves_fit(source: dict, first: int) -> bool:
    """Every key of ``source`` a str and every value a tensor of first size ``first`` > 0."""
    if not isinstance(source, dict):
        raise TypeError("leaves_fit expects a dict")
    if first <= 0 or not source:
        return False
    for key, value in source.items():
        if not isinstance(key, str) or not _fits(value, first):
            return False
    return True


def lengths_fit(values: Any, first: int) -> bool:
    """Every item of the list or tuple ``values`` (at least one) a tensor of first size ``first`` > 0."""
    if not isinstance(values, (list, tuple)):
        raise TypeError("lengths_fit expects a list or a tuple")
    if first <= 0 or not values:
        return False
    for value in values:
        if not _fits(value, first):
            return False
    return True


def shape_fits(value: Any, batch_size: tuple) -> bool:
    """``value`` is a tensor whose shape starts with ``batch_size``."""
    if not isinstance(value, _Tensor) or _is_unbatched(value) or value.dim() < len(batch_size):
        return False
    return all(value.shape[i] == size for i, size in enumerate(batch_size))


def leaves_fit_batch(source: dict, batch_size: tuple) -> bool:
    """Every key of ``source`` (not empty) a str and every value a tensor whose shape starts with ``batch_size``."""
    if not isinstance(source, dict):
        raise TypeError("leaves_fit_batch expects a dict")
    if not source:
        return False
    for key, value in source.items():
        if not isinstance(key, str) or not shape_fits(value, batch_size):
            return False
    return True


def zip_dict(keys: Any, values: list, start: int, count: int) -> dict:
    """``{keys[i]: values[start + i]}`` for the first ``count`` keys of ``keys`` (a dict or a list)."""
    if start < 0 or count < 0 or start + count > len(values):
        raise ValueError("zip_dict: start and count out of range")
    return dict(zip(list(keys)[:count], values[start:start + count]))


def collect_tree(td: Any, batch_size: torch.Size, batch_member: Any = None) -> Optional[tuple]:
    """Always None: under tracing ``apply`` takes its per-level path (same calls, same results),
    which Dynamo unrolls as well as the one-pass walk and with less to trace."""
    return None


def traceable_twins() -> list:
    """``[(original, twin)]``: every helper eager code may call, with what Dynamo runs instead."""
    from . import _apply_tree

    pairs: list = [
        (_accel.py_tensor_len, tensor_len),  # torch's C length slot, the pure-Python twins' base
        (_accel.py_leaves_fit, leaves_fit),
        (_accel.py_lengths_fit, lengths_fit),
        (_accel.py_shape_fits, shape_fits),
        (_accel.py_leaves_fit_batch, leaves_fit_batch),
        (_accel.py_zip_dict, zip_dict),
        (_apply_tree.py_collect_tree, collect_tree),
    ]
    pairs += [(setter, _slot_setter(name)) for setter, name in _accel.descriptor_setters()]
    c_module = _accel._C
    if c_module is not None:
        pairs += [
            (c_module.tensor_len, tensor_len),
            (c_module.leaves_fit, leaves_fit),
            (c_module.lengths_fit, lengths_fit),
            (c_module.shape_fits, shape_fits),
            (c_module.leaves_fit_batch, leaves_fit_batch),
            (c_module.zip_dict, zip_dict),
            (c_module.collect_tree, collect_tree),
        ]
    return pairs


def _slot_setter(name: str) -> Any:
    """The traceable twin of ``descriptor_setter`` for the attribute ``name`` (Dynamo traces
    ``object.__setattr__`` on the instance, even for ``__dict__``)."""

    def set_attribute(instance: Any, value: Any) -> None:
        object.__setattr__(instance, name, value)

    return set_attribute


_REGISTERED: list = []


def register() -> None:
    """Give Dynamo the traceable twin of every helper (once; a pair Dynamo already knows is kept)."""
    if _REGISTERED:
        return
    from . import _compile_inplace

    _compile_inplace.install()  # ``td += t``: Dynamo traces the collection's own in-place operator
    for original, twin in traceable_twins():
        _substitute(original, twin)
    if not _REGISTERED:
        _REGISTERED.append(None)  # registered, though nothing needed it
    # A descriptor setter made from now on (a tensorclass defined later) is registered when made.
    _accel.on_new_setter = lambda setter, name: _substitute(setter, _slot_setter(name))


def _substitute(original: Any, twin: Any) -> None:
    from torch._dynamo.decorators import substitute_in_graph

    try:
        substitute_in_graph(original, skip_signature_check=True)(twin)
    except ValueError:  # Dynamo already has a rule for it (a later torch may handle it itself)
        return
    _REGISTERED.append(original)


def registered() -> list:
    """The originals registered with Dynamo so far (empty before torch._dynamo is imported)."""
    return [original for original in _REGISTERED if original is not None]
