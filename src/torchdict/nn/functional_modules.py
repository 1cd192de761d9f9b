"""``torchdict.nn.functional_modules``: the two helpers upstream still ships here (deprecated there, removed in
tensordict 0.17) that put a tensor on a module under a name, as a parameter, a buffer or a plain attribute.

Upstream's other content of this module (patches of ``torch.vmap`` for TensorDicts) has no counterpart:
torchdict's collections are pytree nodes (``_pytree.py``), which ``torch.vmap`` handles as it is.
"""
from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import _global_parameter_registration_hooks

__all__: list = []


def _deprecated(name: str) -> None:
    warnings.warn(f"tensordict.nn.functional_modules.{name}() is deprecated and will be removed in TensorDict 0.17.",
                  DeprecationWarning, stacklevel=3)


def _place(storage: dict, module: nn.Module, name: str, tensor: Any) -> None:
    """Put ``tensor`` under ``name`` in a module's ``__dict__``-like ``storage``: a Parameter is registered as
    a parameter (global registration hooks run), a tensor replacing a buffer stays a buffer, anything else
    becomes a plain attribute."""
    storage["_parameters"].pop(name, None)
    was_buffer = name in storage["_buffers"]
    storage["_buffers"].pop(name, None)
    if isinstance(tensor, nn.Parameter):
        storage.pop(name, None)
        for hook in _global_parameter_registration_hooks.values():
            replaced = hook(module, name, tensor)
            if replaced is not None:
                tensor = replaced
        storage["_parameters"][name] = tensor
    elif was_buffer and isinstance(tensor, torch.Tensor):
        storage["_buffers"][name] = tensor
    else:
        storage[name] = tensor


def set_tensor(module: nn.Module, name: str, tensor: torch.Tensor) -> None:
    """Deprecated upstream: set ``module.<name>`` to ``tensor`` without ``nn.Module.__setattr__``'s checks."""
    _deprecated("set_tensor")
    _place(module.__dict__, module, name, tensor)


def set_tensor_dict(module_dict: dict, module: nn.Module, name: str, tensor: torch.Tensor) -> None:
    """Deprecated upstream: ``set_tensor`` on a module's ``__dict__`` given separately."""
    _deprecated("set_tensor_dict")
    _place(module_dict, module, name, tensor)
