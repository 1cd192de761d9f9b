"""Modules around other modules or functions: ``TensorDictModuleWrapper``, ``WrapModule`` and the
``as_tensordict_module`` decorator (all importable from ``torchdict.nn.common`` too, as upstream has them)."""
from __future__ import annotations

import inspect
from typing import Any, Callable, List, Optional, Sequence, Union

from .._keys import NestedKey, unravel_key_list
from ..base import TensorDictBase
from .common import TensorDictModule, TensorDictModuleBase

_MISSING = object()


class TensorDictModuleWrapper(TensorDictModuleBase):
    """Wrap a tensordict module: same keys, parameters and attributes, a ``forward`` a subclass may change.

    Attributes the wrapper lacks are read from ``td_module``; ``forward`` calls it as is.
    """

    def __init__(self, td_module: TensorDictModuleBase) -> None:
        super().__init__()
        # The wrapped module's hooks run when it is called: not copied here, which would run them twice.
        self.td_module = td_module

    @property
    def in_keys(self) -> List[NestedKey]:
        keys = self.__dict__.get("_in_keys", _MISSING)
        return self.td_module.in_keys if keys is _MISSING else keys

    @in_keys.setter
    def in_keys(self, value: Sequence[NestedKey]) -> None:
        self._in_keys = unravel_key_list(value)

    @property
    def out_keys(self) -> List[NestedKey]:
        return self.__dict__.get("_out_keys_apparent", self.td_module.out_keys)

    @out_keys.setter
    def out_keys(self, value: Sequence[NestedKey]) -> None:
        self.td_module.out_keys = value
        self._out_keys_apparent = self.td_module.out_keys

    @property
    def out_keys_source(self) -> List[NestedKey]:
        return self.td_module.out_keys_source

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name.startswith("__") or name in self.__dict__:
                raise AttributeError(f"attribute {name} not recognised in {type(self).__name__}") from None
        return getattr(self._modules["td_module"], name)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Call ``td_module`` with the same arguments."""
        return self.td_module(*args, **kwargs)


class WrapModule(TensorDictModuleBase):
    """A function from tensordict to tensordict as a module (``TensorDictSequential`` wraps plain callables
    in it). With ``inplace=True`` the result is written into the input, which is returned. ``in_keys`` /
    ``out_keys`` only describe the function to the sequence; they are not checked."""

    # Class-level keys, which TensorDictModuleBase.__init_subclass__ moves behind its properties.
    in_keys: List[NestedKey] = []  # type: ignore[override]
    out_keys: List[NestedKey] = []  # type: ignore[override]

    def __init__(self, func: Callable[[TensorDictBase], TensorDictBase], *, inplace: bool = False,
                 in_keys: Optional[List[NestedKey]] = None, out_keys: Optional[List[NestedKey]] = None) -> None:
        super().__init__()
        self.func = func
        self.inplace = inplace
        if in_keys is not None:
            self.in_keys = in_keys
        if out_keys is not None:
            self.out_keys = out_keys

    def forward(self, data: TensorDictBase) -> TensorDictBase:
        """``func(data)``, or ``data`` updated with it when ``inplace``."""
        result = self.func(data)
        if self.inplace and result is not data:
            return data.update(result)
        return result


class as_tensordict_module:
    """Decorator: turn a function (or method) of tensors into a tensordict module reading ``in_keys`` and
    writing ``out_keys``. The ``TensorDictModule`` is built on the first call; a method's module is shared by
    every instance, the instance being passed at each call.

    >>> import torch
    >>> from torchdict import TensorDict
    >>> from torchdict.nn import as_tensordict_module
    >>> @as_tensordict_module(in_keys=["x"], out_keys=["y"])
    ... def double(x):
    ...     return x * 2
    >>> double(TensorDict(x=torch.ones(2)))["y"]
    tensor([2., 2.])
    >>> double(x=torch.ones(2))
    tensor([2., 2.])
    """

    def __init__(self, *, in_keys: Union[List[NestedKey], NestedKey],
                 out_keys: Union[List[NestedKey], NestedKey]) -> None:
        self.in_keys = [in_keys] if isinstance(in_keys, (str, tuple)) else in_keys
        self.out_keys = [out_keys] if isinstance(out_keys, (str, tuple)) else out_keys

    def __call__(self, func: Callable) -> Callable:
        import functools

        decorator = self
        built: list = []
        takes_self = inspect.ismethod(func) or (
            inspect.isfunction(func) and "self" in inspect.signature(func).parameters)

        if takes_self:
            def call_with_instance(*args: Any, _as_tensordict_module_self: Any, **kwargs: Any) -> Any:
                return func(_as_tensordict_module_self, *args, **kwargs)

            @functools.wraps(func)
            def method(instance: Any, *args: Any, **kwargs: Any) -> Any:
                if not built:
                    built.append(TensorDictModule(call_with_instance, in_keys=decorator.in_keys,
                                                  out_keys=decorator.out_keys))
                return built[0](*args, _as_tensordict_module_self=instance, **kwargs)

            return method

        @functools.wraps(func)
        def function(*args: Any, **kwargs: Any) -> Any:
            if not built:
                built.append(TensorDictModule(func, in_keys=decorator.in_keys, out_keys=decorator.out_keys))
            return built[0](*args, **kwargs)

        return function
