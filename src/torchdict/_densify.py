"""``densify``: a TensorDict with every lazy stack it holds made dense.

A lazy stack's entries are stacked along its stack dim when their shapes agree, and put in a nested tensor
(``torch.nested``, of the requested layout) along the stack dim when they do not (a nested tensor's ragged
dim must come first: other stack dims are refused, by torch). A key only some members hold is refused
(``KeyError``): the members must share their keys.
"""
from __future__ import annotations

from typing import Any

import torch

from ._apply import rewrap, unwrap
from ._base import TensorCollection


def densify(td: Any, layout: torch.layout) -> Any:
    from .lazy import LazyStackedTensorDict

    if isinstance(td, LazyStackedTensorDict):
        return _dense_stack(td, layout)
    inner = unwrap(td)
    storage = {}
    for key, value in inner._tensordict.items():
        if isinstance(value, LazyStackedTensorDict):
            value = _dense_stack(value, layout)
        elif isinstance(value, TensorCollection):
            value = rewrap(value, densify(unwrap(value), layout))
        storage[key] = value
    return inner._new_like(storage)


def _dense_stack(stack: Any, layout: torch.layout) -> Any:
    from .tensordict import TensorDict

    members = [densify(member, layout) for member in stack.tensordicts]
    keys = list(members[0].keys())
    for member in members[1:]:
        if set(member.keys()) != set(keys):
            raise KeyError(f"densify: the members of the lazy stack hold different keys ({sorted(keys)} and "
                           f"{sorted(member.keys())}).")
    dim = stack.stack_dim
    storage = {}
    for key in keys:
        values = [member.get(key) for member in members]
        first = values[0]
        if isinstance(first, torch.Tensor):
            if all(value.shape == first.shape for value in values):
                storage[key] = torch.stack(values, dim)
            else:
                if dim != 0:
                    raise RuntimeError("densify: members of different shapes make a nested tensor, whose ragged "
                                       "dim must be the first: the stack dim must be 0.")
                storage[key] = torch.nested.as_nested_tensor(values, layout=layout)
        else:
            storage[key] = torch.stack(values, dim)
    return TensorDict._new_unsafe(storage, stack.batch_size, stack.device)
