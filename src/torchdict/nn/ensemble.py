"""``EnsembleModule``: ``num_copies`` independently initialised copies of a tensordict module, run in one
``torch.vmap`` call.

The copies are not modules: their parameters are one TensorDict with a leading batch dim of
``num_copies`` (``params_td``, registered through ``TensorDictParams`` so optimisers and ``state_dict`` see
them), swapped into the single wrapped module inside the vmapped function.
"""
from __future__ import annotations

import warnings
from typing import Any, Optional

import torch

from .._params import TensorDictParams
from ..base import TensorDictBase
from .common import TensorDictModuleBase

__all__ = ["EnsembleModule"]


class EnsembleModule(TensorDictModuleBase):
    """Run ``num_copies`` copies of ``module`` (each with its own freshly reset parameters) at once.

    The output gains a leading dim of size ``num_copies``. With ``expand_input=True`` (default) every copy sees
    the same input; with ``False`` the input's first batch dim must already be ``num_copies`` and copy ``i``
    reads slice ``i``.

    >>> import torch
    >>> from torchdict import TensorDict
    >>> from torchdict.nn import EnsembleModule, TensorDictModule
    >>> ensemble = EnsembleModule(TensorDictModule(torch.nn.Linear(3, 2), ["x"], ["y"]), num_copies=4)
    >>> ensemble(TensorDict(x=torch.ones(5, 3), batch_size=[5]))["y"].shape
    torch.Size([4, 5, 2])
    """

    def __init__(self, module: TensorDictModuleBase, num_copies: int, expand_input: bool = True) -> None:
        super().__init__()
        self.in_keys = module.in_keys
        self.out_keys = module.out_keys
        from ..tensordict import TensorDict

        stacked = TensorDict.from_module(module).expand(num_copies).to_tensordict()
        self.module = module
        # The copies' tensors reach vmap as a flat list, in the order of ``_param_keys``: no pytree walk of
        # the nested parameter TensorDict on each call.
        self._param_keys = [key if isinstance(key, tuple) else (key,)
                            for key in stacked.keys(include_nested=True, leaves_only=True)]
        self.vmapped_forward = torch.vmap(self._func_module_call, (None, 0) if expand_input else 0)
        # Each copy gets its own initialisation, written into the stacked tensors.
        self.reset_parameters_recursive(stacked)
        self.params_td = TensorDictParams(stacked)

    def _slots(self) -> list:
        """(the dict holding it, name) for each parameter / buffer of the wrapped module, in key order."""
        slots = []
        for key in self._param_keys:
            owner = self.module
            for part in key[:-1]:
                owner = owner._modules[part]
            store = owner._parameters if key[-1] in owner._parameters else owner._buffers
            slots.append((store, key[-1]))
        return slots

    def _func_module_call(self, input: Any, params: Any) -> Any:
        if isinstance(params, TensorDictBase):  # one copy's parameters as a TensorDict (upstream's convention)
            with params.to_module(self.module):
                return self.module(input)
        # One copy's tensors put in the module's slots for the call, and the module's own put back after
        # (what ``to_module`` does, without building the TensorDict of the previous values).
        slots = self._slots()
        previous = [store[name] for store, name in slots]
        try:
            for (store, name), value in zip(slots, params):
                store[name] = value
            return self.module(input)
        finally:
            for (store, name), value in zip(slots, previous):
                store[name] = value

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """The wrapped module's output for each copy, stacked along a new first dim."""
        # The TensorDict inside TensorDictParams holds the very Parameter objects: gradients reach them.
        params = self.params_td._param_td
        return self.vmapped_forward(tensordict, [params.get(key) for key in self._param_keys])

    def reset_parameters_recursive(self, parameters: Optional[TensorDictBase] = None) -> TensorDictBase:
        """Reset the given stacked parameters in place, copy by copy (a ``ValueError`` without them: the
        ensemble's parameters only exist as that TensorDict). Returns them as a lazy stack of the copies."""
        if parameters is None:
            raise ValueError("Ensembles are functional and require passing a TensorDict of parameters to "
                             "reset_parameters_recursive")
        if parameters.ndim:
            from ..lazy import LazyStackedTensorDict

            # Index rather than unbind: unbind's outputs are views of one op, and resetting one in place
            # would forbid touching the others.
            copies = [parameters[i] for i in range(parameters.shape[0])]
            for copy in copies:
                self.reset_parameters_recursive(copy)
            return LazyStackedTensorDict.lazy_stack(copies, 0)
        others = [name for name, _ in self.named_children() if name not in ("module", "params_td")]
        if others:
            warnings.warn("EnsembleModule.reset_parameters_recursive() only resets parameters of self.module, "
                          "but other parameters were detected. These parameters will not be reset.")
        return self.module.reset_parameters_recursive(parameters)
