"""The module layer's core: ``TensorDictModuleBase`` (modules that read ``in_keys`` from a tensordict and
write ``out_keys``), ``TensorDictModule`` (any callable on tensors, wired to keys), ``TensorDictModuleWrapper``,
``WrapModule`` and ``as_tensordict_module``; ``dispatch`` lives in ``_dispatch.py``.

Any tensor collection is accepted as input: a TensorDict, a lazy stack, a TensorDictBase built on the six
primitives, a tensorclass instance (read with ``get``, written with ``set``).
"""
from __future__ import annotations

import inspect
import warnings
from textwrap import indent
from typing import Any, Callable, Dict, List, MutableSequence, Optional, Sequence, Union

import torch
from torch import Tensor, nn
from torch.compiler import is_compiling

from .._keys import NestedKey, unravel_key_list
from ..base import TensorDictBase
from ..nontensor import NON_TENSOR_TYPES
from ..tensordict import TensorDict as _TensorDict
from ._dispatch import dispatch, make_tensordict, module_forward
from ._out_keys import reset_out_keys as _reset_out_keys, select_out_keys as _select_out_keys
from .utils import _set_skip_existing_None

__all__ = ["TensorDictModuleBase", "TensorDictModule", "TensorDictModuleWrapper", "WrapModule",
           "as_tensordict_module", "dispatch", "make_tensordict"]

_MISSING = object()


def _keys_property_of(cls: type, name: str) -> bool:
    return isinstance(cls.__dict__.get(name), property)


class TensorDictModuleBase(nn.Module):
    """Base of the modules whose ``forward`` reads ``in_keys`` from a tensordict and writes ``out_keys``.

    A subclass declares ``in_keys`` / ``out_keys`` as class attributes, sets them in ``__init__``, or
    overrides them as properties; it writes ``forward(self, tensordict)``. The base gives it
    ``select_out_keys`` / ``reset_out_keys`` and ``reset_parameters_recursive``.

    >>> import torch
    >>> from torchdict import TensorDict
    >>> from torchdict.nn import TensorDictModuleBase
    >>> class Double(TensorDictModuleBase):
    ...     in_keys = ["x"]
    ...     out_keys = ["y"]
    ...     def forward(self, tensordict):
    ...         return tensordict.set("y", tensordict["x"] * 2)
    >>> Double()(TensorDict(x=torch.ones(2)))["y"]
    tensor([2., 2.])
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> "TensorDictModuleBase":
        # Class-level lists become the defaults behind the base's properties (once per class).
        for name in ("in_keys", "out_keys"):
            if name in cls.__dict__ and not _keys_property_of(cls, name):
                keys = unravel_key_list(cls.__dict__[name])
                delattr(cls, name)
                if name == "in_keys":
                    setattr(cls, "_in_keys", keys)
                else:
                    setattr(cls, "_out_keys", keys)
                    setattr(cls, "_out_keys_apparent", keys)
                setattr(cls, name, getattr(TensorDictModuleBase, name))
        return super().__new__(cls)

    @staticmethod
    def is_tdmodule_compatible(module: Any) -> bool:
        """True when ``module`` has both ``in_keys`` and ``out_keys``."""
        return hasattr(module, "in_keys") and hasattr(module, "out_keys")

    @property
    def in_keys(self) -> List[NestedKey]:
        """The keys the module reads."""
        return self._in_keys

    @in_keys.setter
    def in_keys(self, value: Sequence[NestedKey]) -> None:
        self._in_keys = unravel_key_list(value)

    @property
    def out_keys(self) -> List[NestedKey]:
        """The keys the module writes (after ``select_out_keys``: the selected ones)."""
        return self._out_keys_apparent

    @out_keys.setter
    def out_keys(self, value: Sequence[NestedKey]) -> None:
        self._out_keys = self._out_keys_apparent = unravel_key_list(list(value))

    @property
    def out_keys_source(self) -> List[NestedKey]:
        """Every key the module writes, whatever ``select_out_keys`` kept."""
        return self._out_keys

    def select_out_keys(self, *out_keys: NestedKey) -> "TensorDictModuleBase":
        """Keep only ``out_keys`` in the module's output (in place; returns ``self``).

        The module still computes all its outputs and drops the others (inputs are never dropped); a call
        with tensors returns the selected outputs. ``reset_out_keys`` undoes it. A key that is not an out key
        raises a ``ValueError`` (also a ``RuntimeError``).
        """
        return _select_out_keys(self, out_keys)

    def reset_out_keys(self) -> "TensorDictModuleBase":
        """Undo ``select_out_keys``: every out key is written again. Returns ``self``."""
        return _reset_out_keys(self)

    def reset_parameters_recursive(self, parameters: Optional[TensorDictBase] = None) -> Optional[TensorDictBase]:
        """Call ``reset_parameters()`` on every submodule that has it.

        Without ``parameters`` the module's own parameters are reset (a warning when none could be). With a
        TensorDict of parameters (``TensorDict.from_module`` layout, no batch dims), those values are reset
        in place instead and a detached copy requiring grad, sharing their storage, is returned.
        """
        if parameters is None:
            if not _reset_children(self):
                warnings.warn("reset_parameters_recursive was called without the parameters argument and did "
                              "not find any parameters to reset")
            return None
        if parameters.ndim:
            raise RuntimeError(
                "reset_parameters_recursive does not support batched TensorDicts, ensure `batch_size` is "
                "empty and the parameters shape match their original shape."
            )
        source: Any = parameters
        detached = source.apply(lambda tensor: tensor.detach().requires_grad_(), inplace=False)
        with detached.to_module(self):
            _reset_children(self)
        return detached

    @property
    def __name__(self) -> str:
        # torch.vmap and torch.compile name the function they wrap: a module instance needs one.
        # type(self).__name__ is the class's name (type's data descriptor wins over this property).
        return type(self).__name__  # type: ignore[return-value]

    def __repr__(self) -> str:
        fields = [f"{name}={child}" for name, child in self.named_children()]
        wrapped = self.__dict__.get("module")
        if wrapped is not None:  # a plain callable is an attribute, not a child
            fields.insert(0, f"module={wrapped}")
        fields += [f"in_keys={self.in_keys}", f"out_keys={self.out_keys}"]
        body = indent(",\n".join(fields), "    ")
        return f"{type(self).__name__}(\n{body})"


def _reset_children(module: nn.Module) -> bool:
    reset_any = False
    for child in module.children():
        reset_any |= _reset_children(child)
        reset = getattr(child, "reset_parameters", None)  # a method of most layers (nn.Module declares none)
        if reset is not None:
            reset()
            reset_any = True
    return reset_any


def _describe_callable(module: Any) -> str:
    if isinstance(module, nn.Module):
        return str(module)
    try:
        return inspect.getsource(module).strip()
    except (OSError, TypeError):
        return repr(module)


class TensorDictModule(TensorDictModuleBase):
    """Wire a callable on tensors to keys of a tensordict.

    ``module(td)`` reads ``td[in_key]`` for each in key, calls the wrapped callable with them (positionally,
    or by keyword when ``in_keys`` is a dict), and writes its outputs at ``out_keys`` (an out key ``"_"``
    discards that output). A dict or tensordict result holding every out key is read by key.

    Args:
        module: the callable (usually an ``nn.Module``).
        in_keys: a key, a list of keys, or a dict: ``{argument_name: key}`` (default) or, with
            ``out_to_in_map=False``, ``{key: argument_name}``.
        out_keys: a key or a list of keys, one per output.

    Keyword Args:
        out_to_in_map: direction of a dict ``in_keys`` (see above).
        inplace: ``True`` (write into the input and return it), ``False`` (a new TensorDict with the outputs
            only) or ``"empty"`` (``td.empty()``: same class, batch size and device, outputs only). A
            ``tensordict_out`` given to the call wins.
        method: name of the method of ``module`` to call instead of ``module`` itself.
        method_kwargs: keyword arguments added to every call.
        strict: a missing input raises a ``KeyError``; otherwise ``None`` is passed (and an error the
            callable then raises about ``None`` becomes a ``KeyError`` naming the missing keys).
        get_kwargs: keyword arguments for the collection's ``get`` when reading inputs.

    Called with tensors instead of a tensordict, the module returns tensors (see ``dispatch``).

    >>> import torch
    >>> from torchdict import TensorDict
    >>> from torchdict.nn import TensorDictModule
    >>> module = TensorDictModule(torch.nn.Linear(3, 2), in_keys=["obs"], out_keys=[("out", "action")])
    >>> module(TensorDict(obs=torch.ones(4, 3), batch_size=[4]))["out", "action"].shape
    torch.Size([4, 2])
    >>> module(torch.ones(3)).shape
    torch.Size([2])
    """

    _plain_io = True  # see __init_subclass__
    _IN_KEY_ERR = "in_keys must be of type list, str or tuples of str, or dict."
    _OUT_KEY_ERR = "out_keys must be of type list, str or tuples of str."

    def __init__(self, module: Callable, in_keys: Union[NestedKey, List[NestedKey], Dict[Any, Any]],
                 out_keys: Union[NestedKey, List[NestedKey]], *, out_to_in_map: Optional[bool] = None,
                 inplace: Union[bool, str] = True, method: Optional[str] = None,
                 method_kwargs: Optional[dict] = None, strict: bool = False,
                 get_kwargs: Optional[dict] = None) -> None:
        super().__init__()
        self._kwargs: Optional[List[Any]]
        if out_to_in_map is not None and not isinstance(in_keys, dict):
            warnings.warn("out_to_in_map is not None but is only used when in_key is a dictionary.")
        if isinstance(in_keys, dict):
            pairs = list(in_keys.items())
            if out_to_in_map is None or out_to_in_map:  # {argument: key}
                self._kwargs = [argument for argument, _ in pairs]
                in_keys = [key for _, key in pairs]
            else:  # {key: argument}
                self._kwargs = [argument for _, argument in pairs]
                in_keys = [key for key, _ in pairs]
        else:
            if isinstance(in_keys, (str, tuple)):
                in_keys = [in_keys]
            elif not isinstance(in_keys, MutableSequence):
                raise ValueError(self._IN_KEY_ERR)
            self._kwargs = None
        if isinstance(out_keys, (str, tuple)):
            out_keys = [out_keys]
        elif not isinstance(out_keys, MutableSequence):
            raise ValueError(self._OUT_KEY_ERR)
        try:
            in_keys = unravel_key_list(list(in_keys))
        except Exception:
            raise ValueError(self._IN_KEY_ERR) from None
        try:
            out_keys = unravel_key_list(list(out_keys))
        except Exception:
            raise ValueError(self._OUT_KEY_ERR) from None
        if type(module) is type or (method is None and not callable(module)):
            raise ValueError(
                f"Module {module} if type {type(module)} is not callable. Typical accepted types are nn.Module "
                f"or TensorDictModule. If you need to call a specific method from your module, pass the "
                f"`method` keyword argument to the TensorDictModule constructor."
            )
        if inplace not in (None, True, False, "empty"):
            raise ValueError(
                f"The only accepted valued for inplace is `None`, `True`, `False`, or `'empty'`. "
                f"Got inplace={inplace} instead."
            )
        self.out_keys = out_keys
        self.in_keys = in_keys
        self.strict = strict
        if "_" in self.in_keys:
            warnings.warn('key "_" is for ignoring output, it should not be used in input keys', stacklevel=2)
        self.module = module
        self.inplace: Union[bool, str, None] = inplace  # None: TensorDictSequential's default (see there)
        self.method = method
        self.method_kwargs = method_kwargs if method_kwargs is not None else {}
        self._get_kwargs = get_kwargs if get_kwargs is not None else {}

    @property
    def is_functional(self) -> bool:
        """Deprecated upstream: whether ``module`` is a legacy ``functorch.make_functional`` module."""
        warnings.warn("TensorDictModule.is_functional is deprecated and will be removed in TensorDict 0.17.",
                      DeprecationWarning, stacklevel=2)
        from torch._functorch.make_functional import FunctionalModule, FunctionalModuleWithBuffers

        return isinstance(self.module, (FunctionalModule, FunctionalModuleWithBuffers))

    @property
    def device(self) -> torch.device:
        """Deprecated upstream: the device of the first parameter (``cpu`` without parameters)."""
        warnings.warn(
            "TensorDictModule.device is deprecated and will be removed in TensorDict 0.17. Modules may contain "
            "parameters and buffers on multiple devices; inspect the relevant module state explicitly instead.",
            DeprecationWarning, stacklevel=2)
        for parameter in self.parameters():
            return parameter.device
        return torch.device("cpu")

    # ---------------------------------------------------------------- the call
    def _read_input(self, tensordict: Any, key: NestedKey) -> Any:
        if self._get_kwargs:
            value = tensordict.get(key, _MISSING, **self._get_kwargs)
        else:
            value = tensordict.get(key, _MISSING)
        if value is _MISSING:
            if self.strict:
                raise KeyError(
                    f"{type(self).__name__} needs the in_key {key!r}, which is not in the input "
                    f"(its keys: {sorted(map(str, tensordict.keys(True)))}); module: "
                    f"{type(self.module).__name__}."
                )
            return None
        if type(value) in NON_TENSOR_TYPES:
            return value._read()
        return value

    def _call_module(self, tensors: Sequence[Any], **kwargs: Any) -> Any:
        kwargs.update(self.method_kwargs)
        if self.method is None:
            return self._wrapped()(*tensors, **kwargs)
        return getattr(self._wrapped(), self.method)(*tensors, **kwargs)

    def _as_output_tuple(self, result: Any) -> tuple:
        if result is None:
            return ()
        if type(result) is Tensor or type(result) is tuple:
            return result if type(result) is tuple else (result,)
        out_keys = self.out_keys_source
        if isinstance(result, dict):
            by_key = dict(zip(unravel_key_list(list(result.keys())), result.values()))
            if all(key in by_key for key in out_keys):
                return tuple(by_key[key] for key in out_keys)
        elif isinstance(result, TensorDictBase) and all(key in result for key in out_keys):
            return tuple(result.get(key) for key in out_keys)
        return result if isinstance(result, tuple) else (result,)

    def _write_to_tensordict(self, tensordict: Any, tensors: Sequence[Any], tensordict_out: Any = None,
                             out_keys: Optional[Sequence[NestedKey]] = None) -> Any:
        if out_keys is None:
            out_keys = self.out_keys_source
        if tensordict_out is None:
            if self.inplace is True:
                tensordict_out = tensordict
            elif self.inplace == "empty":
                tensordict_out = tensordict.empty()
            else:
                from ..tensordict import TensorDict

                tensordict_out = TensorDict()
        if len(tensors) > len(out_keys):
            raise RuntimeError(f"There are more tensors ({len(tensors)=}) than out_keys ({out_keys=}).")
        if len(out_keys) > len(tensors):
            raise RuntimeError("There are more out_keys than tensors.")
        if len(out_keys) == 1:
            if out_keys[0] != "_":
                tensordict_out.set(out_keys[0], tensors[0])
            return tensordict_out
        undo: list = []
        try:
            for key, value in zip(out_keys, tensors):
                if key == "_":
                    continue
                undo.append(_undo_record(tensordict_out, key))
                tensordict_out.set(key, value)
        except Exception:
            # The writes before the failing one are undone: the collection is as it was.
            for record in reversed(undo):
                _undo_write(tensordict_out, record)
            raise
        return tensordict_out

    def _wrapped(self) -> Any:
        # Read without nn.Module.__getattr__ (the slow path a submodule attribute takes).
        module = self._modules.get("module", _MISSING)
        return self.__dict__["module"] if module is _MISSING else module

    def _read_inputs(self, tensordict: Any) -> list:
        if self.strict or self._get_kwargs:
            return [self._read_input(tensordict, key) for key in self.in_keys]
        get = tensordict.get
        values = [get(key, None) for key in self.in_keys]
        for position, value in enumerate(values):
            if type(value) in NON_TENSOR_TYPES:  # a non-tensor entry is passed as its value, as td[key] gives it
                values[position] = value._read()
        return values

    def _missing_inputs_error(self, err: Exception, tensors: Sequence[Any], kwargs: dict) -> Optional[KeyError]:
        inputs = tensors if self._kwargs is None else [kwargs.get(name) for name in self._kwargs]
        missing = {key for key, value in zip(self.in_keys, inputs) if value is None}
        if missing and "None" in str(err):
            return KeyError(
                "Some tensors that are necessary for the module call may not have not been found in the input "
                f"tensordict: the following inputs are None: {missing} (module {type(self._wrapped()).__name__}, "
                f"in_keys={self.in_keys})."
            )
        return None

    def forward(self, tensordict: Any, *args: Any, tensordict_out: Any = None, **kwargs: Any) -> Any:
        """Read ``in_keys``, call the wrapped module, write ``out_keys`` (into ``tensordict_out`` if given)."""
        if type(tensordict) is _TensorDict and not args and tensordict_out is None and not kwargs:
            plan = self.__dict__.get("_call_plan", _MISSING)
            if plan is _MISSING:
                # Not made while torch.compile traces: storing it would be a side effect to replay.
                plan = None if is_compiling() else self._make_call_plan()
            if plan is not None and not plan[2] and not plan[3]:
                return self._planned_call(tensordict, plan[0], plan[1])
        try:
            if args:
                raise ValueError("Got a non-empty list of extra agruments, when none was expected.")
            values = self._read_inputs(tensordict)
            if self._kwargs is not None:
                kwargs.update(zip(self._kwargs, values))
                tensors: Sequence[Any] = ()
            else:
                tensors = values
            try:
                if self.method is None and not self.method_kwargs and type(self)._call_module is _BASE_CALL:
                    result = self._wrapped()(*tensors, **kwargs)
                else:
                    result = self._call_module(tensors, **kwargs)
            except Exception as err:
                missing = self._missing_inputs_error(err, tensors, kwargs)
                if missing is not None:
                    raise missing from err
                raise
            # The common case, one tensor written into the input: no tuple, no checks beyond set's own.
            if (type(result) is Tensor and tensordict_out is None and self.inplace is True
                    and len(self._out_keys) == 1 and type(self)._write_to_tensordict is _BASE_WRITE):
                key = self._out_keys[0]
                if key != "_":
                    tensordict.set(key, result)
                return tensordict
            return self._write_to_tensordict(tensordict, self._as_output_tuple(result), tensordict_out)
        except Exception as err:
            raise err from self._failure_cause()

    def _failure_cause(self) -> RuntimeError:
        """The cause attached to any error of a call: the wrapped callable and the keys."""
        description = indent(_describe_callable(self._wrapped()), "    ")
        return RuntimeError(f"TensorDictModule failed with operation\n{description}\n    in_keys={self.in_keys}\n"
                            f"    out_keys={self.out_keys}.")

    def _planned_call(self, tensordict: Any, in_keys: list, out_keys: list) -> Any:
        """``forward``'s steps for a call its plan allows (see ``_make_call_plan``), without their generality."""
        try:
            try:
                # ``td[key]`` (C) reads what ``_read_inputs`` reads: a tensor, a sub-tensordict, a non-tensor's
                # value. Anything unusual (a missing key) takes ``_read_inputs``.
                tensors = (tensordict[in_keys[0]],) if len(in_keys) == 1 else [tensordict[key] for key in in_keys]
            except Exception:
                tensors = self._read_inputs(tensordict)
            module: Any = self._modules.get("module", _MISSING)
            if module is _MISSING:
                module = self.__dict__["module"]
            try:
                result = module(*tensors)
            except Exception as err:
                missing = self._missing_inputs_error(err, tensors, {})
                if missing is not None:
                    raise missing from err
                raise
            if type(result) is Tensor and len(out_keys) == 1:
                key = out_keys[0]
                if key != "_":
                    tensordict[key] = result  # TensorDict's quick write: the checks of ``set``
                return tensordict
            return self._write_to_tensordict(tensordict, self._as_output_tuple(result), None)
        except Exception as err:
            raise err from self._failure_cause()

    def _make_call_plan(self) -> Optional[tuple]:
        """What ``forward`` on a plain TensorDict may take for granted, worked out once per configuration:
        ``None`` unless every option is at its default (inputs by position, no ``method``, written in place,
        not strict), the class keeps the base's reads, call and writes, and neither ``forward`` nor the
        call is replaced on the instance; else the keys and the option dicts to check (edited in place,
        they are not seen by ``__setattr__``). Any attribute set drops the plan."""
        plain = (type(self)._plain_io and self._kwargs is None and not self.strict and self.method is None
                 and self.inplace is True and self._compiled_call_impl is None and "forward" not in self.__dict__)
        plan = (self._in_keys, self._out_keys, self.method_kwargs, self._get_kwargs) if plain else None
        self.__dict__["_call_plan"] = plan
        return plan

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        self.__dict__.pop("_call_plan", None)

    def __delattr__(self, name: str) -> None:
        super().__delattr__(name)
        self.__dict__.pop("_call_plan", None)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # A subclass that changes how keys are read, the module called or outputs written takes the
        # general path of ``forward``.
        cls._plain_io = all(getattr(cls, name) is getattr(TensorDictModule, name) for name in _PLAIN_IO_MEMBERS)

    forward = module_forward(forward)

    # ---------------------------------------------------------------- attributes and pickling
    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)  # parameters, buffers, submodules
        except AttributeError:
            if name.startswith("_"):
                raise AttributeError(f"module {type(self).__name__} has no attribute named {name}.") from None
        module = self._modules["module"] if "module" in self._modules else self.__dict__.get("module", _MISSING)
        if module is _MISSING:
            raise AttributeError(f"module {type(self).__name__} has no attribute named {name}.")
        return getattr(module, name)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.pop("_call_plan", None)  # made again on the first call
        module = state.get("module")
        if module is not None and not isinstance(module, nn.Module):
            try:
                import cloudpickle
            except ImportError:  # plain pickle then: fine for module-level functions
                return state
            state["module"] = _Pickled(cloudpickle.dumps(module))
        return state

    def __setstate__(self, state: dict) -> None:
        module = state.get("module")
        if isinstance(module, _Pickled):
            import cloudpickle

            state["module"] = cloudpickle.loads(module.payload)
        self.__dict__.update(state)


_PLAIN_IO_MEMBERS = ("in_keys", "out_keys", "_read_inputs", "_call_module", "_write_to_tensordict",
                     "_as_output_tuple", "_wrapped",
                     "_planned_call", "_make_call_plan")
_BASE_CALL = TensorDictModule._call_module
_BASE_WRITE = TensorDictModule._write_to_tensordict


class _Pickled:
    """A callable serialised with cloudpickle (lambdas, closures) inside a module's pickled state."""

    __slots__ = ("payload",)

    def __init__(self, payload: bytes) -> None:
        self.payload = payload

    def __getstate__(self) -> bytes:
        return self.payload

    def __setstate__(self, payload: bytes) -> None:
        self.payload = payload


# Defined in their own modules, and part of this one's namespace as upstream's ``tensordict.nn.common``.
from ._undo import _undo_record, _undo_write  # noqa: E402
from ._wrappers import TensorDictModuleWrapper, WrapModule, as_tensordict_module  # noqa: E402
