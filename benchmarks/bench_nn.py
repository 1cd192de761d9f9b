"""Modules benchmarks (issue 5): from_module, to_module as a context manager (with and
without a forward call), and the seed's vmap ensemble.

The model is ``Sequential(10 x Linear(8, 8))``: 20 parameters in 10 submodules. The
floors are what a careful user writes by hand:

- from_module: a recursive walk of ``_parameters`` / ``_buffers`` / ``_modules`` into
  nested dicts (skipping ``None`` entries and parameter-less submodules);
- to_module: the same walk swapping each entry of ``_parameters`` for the new value and
  putting the old ones back afterwards (no checks at all);
- the vmap ensemble: ``torch.vmap`` over ``torch.func.functional_call`` with the stacked
  parameters as a flat dict (``torch.func.stack_module_state``).
"""
from __future__ import annotations

import torch
from torch import nn

from _harness import FLOOR, TORCHDICT, Case, for_libraries

WIDTH = 8
DEPTH = 10


def _model() -> nn.Module:
    return nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(DEPTH)])


# --- floor helpers ---------------------------------------------------------------------


def _walk(module: nn.Module):
    """Nested dicts of the module's own parameters and buffers (None for an empty submodule)."""
    out = {}
    for name, param in module._parameters.items():
        if param is not None:
            out[name] = param
    for name, buffer in module._buffers.items():
        if buffer is not None:
            out[name] = buffer
    for name, child in module._modules.items():
        if child is not None:
            sub = _walk(child)
            if sub is not None:
                out[name] = sub
    return out or None


def _swap(module: nn.Module, values: dict) -> dict:
    """Swap nested ``values`` into the module's dicts; returns the old values, nested the same way."""
    old = {}
    params = module._parameters
    buffers = module._buffers
    for name, value in values.items():
        if isinstance(value, dict):
            old[name] = _swap(module._modules[name], value)
        elif name in params:
            old[name] = params[name]
            params[name] = value
        else:
            old[name] = buffers[name]
            buffers[name] = value
    return old


# --- cases -----------------------------------------------------------------------------


def _setup_pair():
    torch.manual_seed(0)
    return _model(), _model(), torch.randn(4, WIDTH)


def cases() -> list:
    def from_module_lib(lib, data):
        module, _, _ = data
        return lambda: lib.TensorDict.from_module(module)

    def from_module_floor(data):
        module, _, _ = data
        return lambda: _walk(module)

    def swap_lib(lib, data):
        module, other, _ = data
        params = lib.TensorDict.from_module(other)

        def run():
            with params.to_module(module):
                pass

        return run

    def swap_floor(data):
        module, other, _ = data
        values = _walk(other)

        def run():
            old = _swap(module, values)
            _swap(module, old)

        return run

    def forward_lib(lib, data):
        module, other, x = data
        params = lib.TensorDict.from_module(other)

        def run():
            with params.to_module(module):
                return module(x)

        return run

    def forward_floor(data):
        module, other, x = data
        values = _walk(other)

        def run():
            old = _swap(module, values)
            try:
                return module(x)
            finally:
                _swap(module, old)

        return run

    def forward_functional_call(data):
        module, other, x = data
        flat = dict(other.named_parameters())
        return lambda: torch.func.functional_call(module, flat, (x,))

    # The seed's example: two parameter sets of Sequential(Linear(3, 4)) over x of (2, 10, 3).
    def setup_seed():
        torch.manual_seed(0)
        module = nn.Sequential(nn.Linear(3, 4))
        members = [nn.Sequential(nn.Linear(3, 4)) for _ in range(2)]
        return module, members, torch.ones(2, 10, 3)

    def ensemble_lib(lib, data):
        module, members, x = data
        params = lib.TensorDict.from_modules(*members)

        def call_module(x, td):
            with td.to_module(module):
                return module(x)

        vmapped = torch.vmap(call_module)
        return lambda: vmapped(x, params)

    def ensemble_floor(data):
        module, members, x = data
        stacked, _ = torch.func.stack_module_state(members)

        def call_module(x, params):
            return torch.func.functional_call(module, params, (x,))

        vmapped = torch.vmap(call_module)
        return lambda: vmapped(x, stacked)

    def mlp_setup():
        torch.manual_seed(0)
        members = [nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)) for _ in range(5)]
        base = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)).to("meta")
        return base, members, torch.randn(64, 16)

    def mlp_lib(lib, data):
        base, members, x = data
        params = lib.TensorDict.from_modules(*members)

        def call(td, x):
            with td.to_module(base):
                return base(x)

        vmapped = torch.vmap(call, (0, None))
        return lambda: vmapped(params, x)

    def mlp_floor(data):
        base, members, x = data
        stacked, _ = torch.func.stack_module_state(members)

        def call(params, x):
            return torch.func.functional_call(base, params, (x,))

        vmapped = torch.vmap(call, (0, None))
        return lambda: vmapped(stacked, x)

    def from_modules_lib(lib, data):
        _, members, _ = data
        return lambda: lib.TensorDict.from_modules(*members)

    def from_modules_floor(data):
        _, members, _ = data
        return lambda: torch.func.stack_module_state(members)

    def pytree_lib(lib, data):
        module, _, _ = data
        params = lib.TensorDict.from_module(module)
        flatten, unflatten = torch.utils._pytree.tree_flatten, torch.utils._pytree.tree_unflatten

        def run():
            leaves, spec = flatten(params)
            return unflatten(leaves, spec)

        return run

    def pytree_floor(data):
        module, _, _ = data
        params = _walk(module)
        flatten, unflatten = torch.utils._pytree.tree_flatten, torch.utils._pytree.tree_unflatten

        def run():
            leaves, spec = flatten(params)
            return unflatten(leaves, spec)

        return run

    return [
        Case("from_module Sequential(10 x Linear)", setup=_setup_pair,
             impls={**for_libraries(from_module_lib), FLOOR: from_module_floor}, target="<= 1.5x floor"),
        Case("with p.to_module(m): pass", setup=_setup_pair,
             impls={**for_libraries(swap_lib), FLOOR: swap_floor}, target="<= 3x floor",
             note="p holds the parameters of another Sequential(10 x Linear); the floor swaps the same "
                  "Parameter objects in and out of the module's _parameters dicts by hand."),
        Case("with p.to_module(m): m(x)", setup=_setup_pair,
             impls={**for_libraries(forward_lib), FLOOR: forward_floor}, target="<= 1.3x floor"),
        Case("functional_call(m, p, x) (reference)", setup=_setup_pair,
             impls={TORCHDICT: for_libraries(forward_lib)[TORCHDICT], FLOOR: forward_functional_call},
             note="torchdict's `with p.to_module(m): m(x)` against torch.func.functional_call as the floor."),
        Case("seed vmap ensemble (2 x Linear(3, 4))", setup=setup_seed,
             impls={**for_libraries(ensemble_lib), FLOOR: ensemble_floor}, target="<= 1.05x floor",
             note="floor: torch.vmap(functional_call) over torch.func.stack_module_state's dict."),
        Case("vmap ensemble of 5 MLPs (meta base module)", setup=mlp_setup,
             impls={**for_libraries(mlp_lib), FLOOR: mlp_floor}, target="<= 1.05x floor"),
        Case("from_modules 5 MLPs", setup=mlp_setup,
             impls={**for_libraries(from_modules_lib), FLOOR: from_modules_floor}),
        Case("tree_flatten + tree_unflatten (20 params)", setup=_setup_pair,
             impls={**for_libraries(pytree_lib), FLOOR: pytree_floor},
             note="floor: the same nested structure as plain dicts."),
    ]

