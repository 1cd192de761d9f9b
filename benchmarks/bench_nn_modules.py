"""The module layer (issue 19): TensorDictModule, TensorDictSequential, dispatch and EnsembleModule.

The network is a 3-layer MLP (16 -> 32 -> 32 -> 4, tanh) on a batch of 32. The floors are the same network
called by hand on the tensors: for a module and a sequence, the layers on ``x``; for a keyword call, the same;
for the ensemble, ``torch.vmap`` over ``torch.func.functional_call`` with the 10 copies' stacked parameters.
"""
from __future__ import annotations

import importlib
import warnings

import torch
from torch import nn

from _harness import FLOOR, Case, for_libraries

NUM_COPIES = 10


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))


def _nn(lib):
    return importlib.import_module(lib.__name__ + ".nn")


def _setup():
    torch.manual_seed(0)
    return _mlp(), torch.randn(32, 16)


def cases() -> list:
    def module_lib(lib, data):
        net, x = data
        module = _nn(lib).TensorDictModule(net, in_keys=["x"], out_keys=["y"])
        td = lib.TensorDict(x=x, batch_size=[32])
        return lambda: module(td)

    def module_floor(data):
        net, x = data
        return lambda: net(x)

    def sequence_lib(lib, data):
        net, x = data
        lnn = _nn(lib)
        seq = lnn.TensorDictSequential(
            lnn.TensorDictModule(net[0], in_keys=["x"], out_keys=["h0"]),
            lnn.TensorDictModule(net[1], in_keys=["h0"], out_keys=["h1"]),
            lnn.TensorDictModule(nn.Sequential(net[2], net[3]), in_keys=["h1"], out_keys=["h2"]),
            lnn.TensorDictModule(net[4], in_keys=["h2"], out_keys=["y"]),
        )
        td = lib.TensorDict(x=x, batch_size=[32])
        return lambda: seq(td)

    def sequence_floor(data):
        net, x = data
        first, second, third = net[0], net[1], nn.Sequential(net[2], net[3])
        last = net[4]
        return lambda: last(third(second(first(x))))

    def dispatch_lib(lib, data):
        net, x = data
        module = _nn(lib).TensorDictModule(net, in_keys=["x"], out_keys=["y"])
        return lambda: module(x=x)

    def ensemble_setup():
        torch.manual_seed(0)
        members = [_mlp() for _ in range(NUM_COPIES)]
        return _mlp(), members, torch.randn(32, 16)

    def ensemble_lib(lib, data):
        net, _, x = data
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ensemble = _nn(lib).EnsembleModule(_nn(lib).TensorDictModule(net, in_keys=["x"], out_keys=["y"]),
                                               num_copies=NUM_COPIES)
        td = lib.TensorDict(x=x, batch_size=[32])
        return lambda: ensemble(td)

    def ensemble_floor(data):
        net, members, x = data
        stacked, _ = torch.func.stack_module_state(members)
        vmapped = torch.vmap(lambda params, x: torch.func.functional_call(net, params, (x,)), (0, None))
        return lambda: vmapped(stacked, x)

    return [
        Case("TensorDictModule(3-layer MLP, batch 32)", setup=_setup,
             impls={**for_libraries(module_lib), FLOOR: module_floor}, target="<= 1.3x floor"),
        Case("TensorDictSequential of 4 modules", setup=_setup,
             impls={**for_libraries(sequence_lib), FLOOR: sequence_floor}, target="<= 1.3x floor"),
        Case("module(x=tensor) (dispatch)", setup=_setup,
             impls={**for_libraries(dispatch_lib), FLOOR: module_floor}, target="<= 2x floor"),
        Case(f"EnsembleModule of {NUM_COPIES}", setup=ensemble_setup,
             impls={**for_libraries(ensemble_lib), FLOOR: ensemble_floor}, target="<= 1.1x floor"),
    ]
