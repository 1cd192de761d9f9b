"""``dispatch``: call a tensordict function with tensors (keyword or positional) instead of a tensordict.

The wrapper's first test is "is the input already a tensor collection?": ``module(td)`` costs one
``isinstance`` on top of the function. Only a call with tensors builds a TensorDict (``make_tensordict``),
calls the function on it and hands back the entries at the output keys.
"""
from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Optional, Sequence, Union

import torch
from torch.compiler import is_compiling

from .._base import TensorCollection, is_tensor_collection
from .._keys import NestedKey, key_to_tuple
from .utils import _dispatch_td_nn_modules, _set_skip_existing_None, _skip_existing

__all__ = ["dispatch", "make_tensordict", "module_forward"]


def make_tensordict(input_dict: Optional[dict] = None, batch_size: Any = None, device: Any = None,
                    auto_batch_size: Optional[bool] = None, **kwargs: Any) -> Any:
    """A TensorDict from a dict and/or keyword arguments (the keywords win on a clash).

    ``batch_size=None`` with ``auto_batch_size=True`` takes the largest leading shape the leaves share.

    >>> import torch
    >>> from torchdict.nn import make_tensordict
    >>> make_tensordict(a=torch.zeros(3, 4), b=torch.zeros(3, 5), auto_batch_size=True).batch_size
    torch.Size([3])
    """
    from ..tensordict import TensorDict

    if input_dict is not None:
        kwargs.update(input_dict)
    return TensorDict.from_dict(kwargs, batch_size=batch_size, device=device, auto_batch_size=auto_batch_size)


def _is_collection(value: Any) -> bool:
    return isinstance(value, TensorCollection) or is_tensor_collection(value)


def _argument_name(key: NestedKey, separator: str) -> str:
    return separator.join(key_to_tuple(key))


class dispatch:
    """Make a function of a tensordict callable with tensors.

    Decorates ``f(tensordict, ...)`` or a method ``f(self, tensordict, ...)``. Called with a tensor
    collection (first positional argument or ``tensordict=``), the function runs as written. Called with
    tensors, they are placed in a new TensorDict at the ``source`` keys (positionally in key order, or by
    keyword: a nested key ``("a", "b")`` is the keyword ``a_b`` with the default ``separator``), the
    function runs on it and the entries at the ``dest`` keys come back: one tensor for one key, else a
    tuple; a ``dest`` key ``"_"`` is left out. ``source`` / ``dest`` given as strings name attributes of
    the instance (``"in_keys"`` / ``"out_keys"`` by default). ``auto_batch_size=True`` gives the new
    TensorDict the leading shape its inputs share; ``False`` gives it an empty batch size.

    >>> import torch
    >>> from torchdict.nn import dispatch
    >>> @dispatch(source=[("obs", "x"), "y"], dest=["z"])
    ... def add(tensordict):
    ...     tensordict["z"] = tensordict["obs", "x"] + tensordict["y"]
    ...     return tensordict
    >>> add(obs_x=torch.ones(2), y=torch.ones(2))
    tensor([2., 2.])
    >>> add(torch.ones(2), torch.zeros(2))
    tensor([1., 1.])
    """

    DEFAULT_SEPARATOR = "_"
    DEFAULT_SOURCE = "in_keys"
    DEFAULT_DEST = "out_keys"

    def __new__(cls, separator: Any = DEFAULT_SEPARATOR,
                source: Union[str, Sequence[NestedKey]] = DEFAULT_SOURCE,
                dest: Union[str, Sequence[NestedKey]] = DEFAULT_DEST, auto_batch_size: bool = True) -> Any:
        if callable(separator):  # bare ``@dispatch``: decorate at once
            decorator = super().__new__(cls)
            cls.__init__(decorator)
            return decorator(separator)
        return super().__new__(cls)

    def __init__(self, separator: str = DEFAULT_SEPARATOR,
                 source: Union[str, Sequence[NestedKey]] = DEFAULT_SOURCE,
                 dest: Union[str, Sequence[NestedKey]] = DEFAULT_DEST, auto_batch_size: bool = True) -> None:
        self.separator = separator
        self.source = source
        self.dest = dest
        self.auto_batch_size = auto_batch_size

    def __call__(self, func: Callable) -> Callable:
        bound_self = func.__self__ if inspect.ismethod(func) else None
        is_method = bound_self is None and _first_parameter(func) == "self"
        for position, name in enumerate(inspect.signature(func).parameters):
            if position == 0 and (is_method or name == "self"):
                is_method = True
                continue
            if name != "tensordict":
                raise RuntimeError(
                    f"the first argument of the wrapped function must be named 'tensordict'. Got {name} instead."
                )
            break
        if not _dispatch_td_nn_modules():
            return func
        decorator = self

        if is_method:
            @functools.wraps(func)
            def dispatched_method(*args: Any, **kwargs: Any) -> Any:
                if len(args) > 1 and (isinstance(args[1], TensorCollection) or is_tensor_collection(args[1])) \
                        and args[0] is not None:
                    return func(*args, **kwargs)
                if not _dispatch_td_nn_modules():
                    return func(*args, **kwargs)
                return decorator._call_with_tensors(func, args[0], args[1:], kwargs, True)

            wrapper = dispatched_method
        else:
            @functools.wraps(func)
            def dispatched_function(*args: Any, **kwargs: Any) -> Any:
                if args and _is_collection(args[0]):
                    return func(*args, **kwargs)
                if not _dispatch_td_nn_modules():
                    return func(*args, **kwargs)
                return decorator._call_with_tensors(func, bound_self, args, kwargs, False)

            wrapper = dispatched_function
        setattr(wrapper, "__signature__", _optional_signature(func))
        return wrapper

    def _keys(self, spec: Any, instance: Any) -> Any:
        if isinstance(spec, str):
            if instance is None:
                raise RuntimeError(
                    "The in keys must be passed to dispatch when func is not a method but a function."
                )
            return getattr(instance, spec)
        return spec

    def _call_with_tensors(self, func: Callable, instance: Any, args: tuple, kwargs: dict,
                           is_method: bool) -> Any:
        source = self._keys(self.source, instance)
        tensordict = None
        if args:
            if _is_collection(args[0]):
                tensordict, args = args[0], args[1:]
        elif _is_collection(kwargs.get("tensordict")) and all(
            _argument_name(key, self.separator) != "tensordict" for key in source
        ):
            # ``f(tensordict=td)`` is the tensordict call by keyword, unless an input is named so.
            tensordict = kwargs.pop("tensordict")
        if tensordict is not None:
            return func(instance, tensordict, *args, **kwargs) if is_method else func(tensordict, *args, **kwargs)

        dest = self._keys(self.dest, instance)
        values = {}
        for key in source:
            name = _argument_name(key, self.separator)
            if args:
                values[key] = args[0]
                args = args[1:]
                if name in kwargs:
                    raise RuntimeError("Duplicated argument in args and kwargs.")
            elif name in kwargs:
                values[key] = kwargs.pop(name)
        tensordict = make_tensordict(values, batch_size=None if self.auto_batch_size else torch.Size([]),
                                     auto_batch_size=self.auto_batch_size)
        out = func(instance, tensordict, *args, **kwargs) if is_method else func(tensordict, *args, **kwargs)
        outputs = tuple(out[key] for key in dest if key != "_")
        return outputs[0] if len(outputs) == 1 else outputs

    def get_source(self, func: Callable, self_func: Any) -> Any:
        """The input keys ``source`` stands for (an attribute of ``self_func`` when it is a string).

        Deprecated upstream (removed in tensordict 0.17); kept for code that calls it.
        """
        import warnings

        warnings.warn("dispatch.get_source() is deprecated and will be removed in TensorDict 0.17.",
                      DeprecationWarning, stacklevel=2)
        return getattr(self_func, self.source) if isinstance(self.source, str) else self.source


def module_forward(func: Callable) -> Callable:
    """``dispatch(auto_batch_size=False)`` over ``_set_skip_existing_None()``: the decorators of the library's
    own ``forward(self, tensordict, ...)`` methods, fused into one wrapper for the call with a tensor
    collection (the one the module layer makes on every call), which then costs one frame instead of two.
    Calls with tensors, and calls while skipping is on, take the two decorators' own paths."""
    skipping = _set_skip_existing_None()(func)
    dispatched = dispatch(auto_batch_size=False)(skipping)
    if dispatched is skipping:  # keyword calls off (DISPATCH_TDNN_MODULES=0)
        return skipping
    slot = _skip_existing

    @functools.wraps(func)
    def forward(*args: Any, **kwargs: Any) -> Any:
        if len(args) > 1 and args[0] is not None and (isinstance(args[1], TensorCollection)
                                                      or is_tensor_collection(args[1])):
            # ``slot.get_mode()``, without the call while no thread has a mode of its own.
            skip_mode = slot.get_mode() if slot._has_thread_values else slot._value
            if skip_mode:
                return skipping(*args, **kwargs)
            try:
                return func(*args, **kwargs)
            finally:
                # A module that turned skipping on and left it so: the caller gets its own mode back.
                if (slot.get_mode() if slot._has_thread_values else slot._value) is not skip_mode \
                        and not is_compiling():
                    slot.set_mode(skip_mode)
        return dispatched(*args, **kwargs)

    setattr(forward, "__signature__", getattr(dispatched, "__signature__"))
    return forward


def _first_parameter(func: Callable) -> Optional[str]:
    code = getattr(func, "__code__", None)
    if not inspect.isfunction(func) or code is None or code.co_argcount == 0:
        return None
    return code.co_varnames[0]


def _optional_signature(func: Callable) -> inspect.Signature:
    """The function's signature with its required positional parameters made optional (``None``): a
    call with tensors by keyword leaves them out."""
    parameters = []
    keyword_part = False
    for parameter in inspect.signature(func).parameters.values():
        keyword_part = keyword_part or parameter.kind in (inspect.Parameter.KEYWORD_ONLY,
                                                          inspect.Parameter.VAR_KEYWORD)
        if not keyword_part and parameter.default is inspect.Parameter.empty:
            # ``*args`` too, as upstream shows it: ``forward(self=None, tensordict=None, args=None, *, ...)``
            parameter = inspect.Parameter(parameter.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None)
        parameters.append(parameter)
    return inspect.Signature(parameters)
