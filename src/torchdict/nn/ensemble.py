"""``EnsembleModule``: ``num_copies`` independently initialised copies of a tensordict module, run in one
``torch.vmap`` call.

The copies are not modules: their parameters are one TensorDict with a leading batch dim of
``num_copies`` (``params_td``, registered through ``TensorDictParams`` so optimisers and ``state_dict`` see
them), swapped into the single wrapped module inside the vmapped function.

``torch.vmap`` walks its arguments and results as pytrees, several times per call (flatten, in_dims
broadcast over a placeholder tree, rebuild). A TensorDict input is therefore flattened here once, handed to
vmap as a list of tensors, and rebuilt inside the mapped function (and the output the other way), with the
same code vmap's own pytree walk would run (``torchdict._pytree``). An input tensor that comes back unchanged
as an output (an input key kept in the output tensordict) is not returned through vmap, which copes slowly
with a result that does not depend on the mapped dim: it is expanded here, as vmap would expand it.
``vmapped_forward`` (upstream's attribute) stays the general path: under ``torch.compile``, for inputs that
are not TensorDicts or tensorclasses, and when it was replaced (a chunked vmap, say).
"""
from __future__ import annotations

import warnings
from typing import Any, Optional

import torch
from torch.compiler import is_compiling

from .. import _pytree
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
        self._expand_input = expand_input
        self.vmapped_forward = torch.vmap(self._func_module_call, (None, 0) if expand_input else 0)
        self._default_vmapped_forward = self.vmapped_forward
        # Each copy gets its own initialisation, written into the stacked tensors.
        self.reset_parameters_recursive(stacked)
        self.params_td = TensorDictParams(stacked)

    def _slots(self) -> list:
        """(the dict holding it, name) for each parameter / buffer of the wrapped module, in key order.

        Looked up on every call (not kept): a submodule replaced since the last call is the one used."""
        root: Any = self._modules["module"]
        owners: dict = {}
        slots = []
        for key in self._param_keys:
            path = key[:-1]
            owner: Any = owners.get(path)
            if owner is None:
                owner = root
                for part in path:
                    owner = owner._modules[part]
                owners[path] = owner
            name = key[-1]
            parameters = owner._parameters
            slots.append((parameters if name in parameters else owner._buffers, name))
        return slots

    def _func_module_call(self, input: Any, params: Any) -> Any:
        if isinstance(params, TensorDictBase):  # one copy's parameters as a TensorDict (upstream's convention)
            # (a TensorDict or a lazy stack: vmap's slice of the stacked parameters; both have to_module)
            with params.to_module(self.module):  # type: ignore[attr-defined]
                return self.module(input)
        # One copy's tensors put in the module's slots for the call, and the module's own put back after
        # (what ``to_module`` does, without building the TensorDict of the previous values).
        slots = self._slots()
        previous = [store[name] for store, name in slots]
        try:
            for (store, name), value in zip(slots, params):
                store[name] = value
            children: Any = self._modules  # not through nn.Module.__getattr__ (its values typed Optional)
            return children["module"](input)
        finally:
            for (store, name), value in zip(slots, previous):
                store[name] = value

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """The wrapped module's output for each copy, stacked along a new first dim."""
        # The TensorDict inside TensorDictParams holds the very Parameter objects: gradients reach them.
        children: Any = self._modules  # self.params_td, without nn.Module.__getattr__
        params = children["params_td"]._param_td
        values = [params[key] for key in self._param_keys]
        if (type(tensordict) in _pytree._REGISTERED and self.vmapped_forward is self._default_vmapped_forward
                and not is_compiling()):
            return _FlatCall(self, tensordict, values).run()
        return self.vmapped_forward(tensordict, values)

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
        reset = self.module.reset_parameters_recursive(parameters)
        assert reset is not None  # given parameters, the module returns their reset copy
        return reset


class _FlatCall:
    """One call of an ensemble with a TensorDict (or tensorclass) input, through ``torch.vmap`` over lists of
    tensors (see the module docstring). Passed to the mapped function as its last argument (``in_dims``
    None: vmap hands it over untouched), it carries the structures in and out."""

    __slots__ = ("ensemble", "node", "leaves", "params", "out_node", "out_positions", "passed_through")

    def __init__(self, ensemble: EnsembleModule, tensordict: Any, params: list) -> None:
        self.ensemble = ensemble
        self.leaves, self.node = _pytree._flatten(tensordict)
        self.params = params
        self.out_node: Any = None  # the output's structure, when it is a collection
        self.out_positions: list = []  # where, among the output's leaves, those vmap returns go
        self.passed_through: list = []  # (position among the output's leaves, input tensor)

    def run(self) -> Any:
        expand_input = self.ensemble.__dict__.get("_expand_input", True)
        params = self.params
        result = (_VMAPPED_EXPANDED if expand_input else _VMAPPED)(self.leaves, params, self)
        if self.out_node is None:  # not a collection: vmap took it as it is
            return result
        positions = self.out_positions
        out_leaves: list = [None] * (len(positions) + len(self.passed_through))
        if len(positions) == 1:
            out_leaves[positions[0]] = result
        else:
            for position, value in zip(positions, result):
                out_leaves[position] = value
        for position, tensor in self.passed_through:
            # What vmap returns for a result that does not depend on the mapped dim.
            out_leaves[position] = tensor.unsqueeze(0).expand(params[0].shape[0], *tensor.shape)
        return _pytree._unflatten(out_leaves, self.out_node)

    def mapped(self, inputs: list, params: list, expand_input: bool) -> Any:
        """The mapped function's body: rebuild the input, run the module with one copy's parameters,
        flatten the output."""
        out = self.ensemble._func_module_call(_pytree._unflatten(inputs, self.node), params)
        if type(out) not in _pytree._REGISTERED:
            return out
        out_leaves, self.out_node = _pytree._flatten(out)
        # With expand_input, the inputs are the caller's own tensors (not mapped): one of them returned as
        # it is can skip vmap's way back.
        unmapped = {id(tensor) for tensor in inputs} if expand_input and params else ()
        returned = []
        for position, leaf in enumerate(out_leaves):
            if id(leaf) in unmapped:
                self.passed_through.append((position, leaf))
            else:
                self.out_positions.append(position)
                returned.append(leaf)
        # One tensor is vmap's quickest result to take apart.
        return returned[0] if len(returned) == 1 else tuple(returned)


def _mapped_expanded(inputs: list, params: list, call: _FlatCall) -> Any:
    return call.mapped(inputs, params, True)


def _mapped(inputs: list, params: list, call: _FlatCall) -> Any:
    return call.mapped(inputs, params, False)


_VMAPPED_EXPANDED = torch.vmap(_mapped_expanded, (None, 0, None))
_VMAPPED = torch.vmap(_mapped, (0, 0, None))
