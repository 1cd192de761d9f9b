"""Process-wide switches of the module layer: ``set_skip_existing`` / ``skip_existing`` and whether
``dispatch`` accepts keyword calls.

A switch is a ``ModeSlot``: one process-wide value, plus an optional per-thread value that a
``thread_local=True`` block sets (and that then also captures the blocks that thread enters without the
flag, as upstream's switches behave).
"""
from __future__ import annotations

import functools
import inspect
import os
import threading
from typing import Any, Callable

from torch.compiler import is_compiling
from torch.utils._contextlib import _DecoratorContextManager

from .._keys import NestedKey, unravel_key_list

__all__ = ["set_skip_existing", "skip_existing", "ModeSlot"]

_UNSET = object()


class _ThreadValue(threading.local):
    value: Any = _UNSET


class ModeSlot:
    """A switch read on every module call: a process-wide value and, once some thread asked for its own,
    a per-thread one that wins in that thread."""

    __slots__ = ("_value", "_local", "_has_thread_values")

    def __init__(self, default: Any = None) -> None:
        self._value = default
        self._local = _ThreadValue()
        # Reads skip the thread-local lookup until a thread sets a value of its own.
        self._has_thread_values = False

    def get_mode(self) -> Any:
        if self._has_thread_values:
            value = self._local.value
            if value is not _UNSET:
                return value
        return self._value

    def set_mode(self, value: Any) -> None:
        if self._has_thread_values and self._local.value is not _UNSET:
            self._local.value = value
        else:
            self._value = value

    def get_thread_mode(self) -> Any:
        return self._local.value

    def set_thread_mode(self, value: Any) -> None:
        self._has_thread_values = True
        self._local.value = value


def _env_flag(name: str, default: str) -> bool:
    value = os.environ.get(name, default).strip().lower()
    if value in ("1", "true", "t", "yes", "y", "on"):
        return True
    if value in ("0", "false", "f", "no", "n", "off"):
        return False
    raise ValueError(f"invalid truth value {value!r} for the environment variable {name}")


# DISPATCH_TDNN_MODULES=0 makes ``dispatch`` return the decorated function itself (tensordict calls only).
_dispatch_tdnn_modules = ModeSlot(default=_env_flag("DISPATCH_TDNN_MODULES", "True"))
_skip_existing = ModeSlot(default=False)


def _dispatch_td_nn_modules() -> bool:
    """Whether ``dispatch`` turns keyword calls into tensordict calls."""
    return _dispatch_tdnn_modules.get_mode()


class _set_dispatch_td_nn_modules(_DecoratorContextManager):
    """Turns the keyword-call path of ``dispatch`` on or off inside a block (calls only: functions decorated
    while it is off are still wrapped)."""

    def __init__(self, mode: bool) -> None:
        self.mode = mode
        self._saved: list = []

    def clone(self) -> "_set_dispatch_td_nn_modules":
        return type(self)(self.mode)

    def __enter__(self) -> None:
        previous = _dispatch_tdnn_modules.get_mode()
        # Writing an unchanged value would still change what torch.compile guards on.
        if previous != self.mode:
            self._saved.append(previous)
            _dispatch_tdnn_modules.set_mode(self.mode)
        else:
            self._saved.append(_UNSET)

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        previous = self._saved.pop()
        if previous is not _UNSET:
            _dispatch_tdnn_modules.set_mode(previous)


def skip_existing() -> "bool | list[NestedKey]":
    """The current skip mode: ``False`` (default), ``True`` or a list of keys (see ``set_skip_existing``).

    >>> from torchdict.nn import set_skip_existing, skip_existing
    >>> skip_existing()
    False
    >>> with set_skip_existing(["a", ("b", "c")]):
    ...     skip_existing()
    ['a', ('b', 'c')]
    """
    return _skip_existing.get_mode()


def _check_tensordict_first(func: Callable) -> None:
    for position, name in enumerate(inspect.signature(func).parameters):
        if position == 0:
            continue  # self
        if name != "tensordict":
            raise RuntimeError("the first argument of the wrapped function must be named 'tensordict'.")
        break


def _outputs_present(skip_mode: Any, module: Any, tensordict: Any, in_key_attr: str, out_key_attr: str) -> bool:
    """True when a module may be skipped: every out key is already there, none is also an input, and
    (for a list mode) every out key is one the mode names."""
    in_keys = getattr(module, in_key_attr)
    out_keys = getattr(module, out_key_attr)
    if skip_mode is not True and not all(key in skip_mode for key in out_keys):
        return False
    present = tensordict.keys(True)
    if not all(key in present for key in out_keys):
        return False
    return not any(key in out_keys for key in in_keys)


class set_skip_existing(_DecoratorContextManager):
    """Skip the modules whose outputs are already in the input tensordict.

    As a context manager it sets what ``skip_existing()`` returns inside the block: ``True`` (every module
    whose ``out_keys`` are all present returns its input untouched), ``False``, or a list of keys (only
    modules whose ``out_keys`` are all in the list may be skipped). A module that reads one of its own
    outputs always runs. As a decorator of ``forward(self, tensordict, ...)`` it applies that test with
    ``mode`` before the method; ``mode=None`` (decorators only) follows the enclosing block instead.

    >>> import torch
    >>> from torchdict import TensorDict
    >>> from torchdict.nn import TensorDictModule, set_skip_existing
    >>> add_one = TensorDictModule(lambda x: x + 1, in_keys=["x"], out_keys=["y"])
    >>> data = TensorDict(x=torch.zeros(()), y=torch.zeros(()))
    >>> with set_skip_existing():
    ...     add_one(data)["y"]
    tensor(0.)
    >>> add_one(data)["y"]
    tensor(1.)
    """

    def __init__(self, mode: "bool | list[NestedKey] | None" = True, in_key_attr: str = "in_keys",
                 out_key_attr: str = "out_keys", *, thread_local: bool = False) -> None:
        self.mode = unravel_key_list(mode) if isinstance(mode, list) else mode
        self.in_key_attr = in_key_attr
        self.out_key_attr = out_key_attr
        self.thread_local = thread_local
        self._called = False

    def clone(self) -> "set_skip_existing":
        copy = type(self)(self.mode, self.in_key_attr, self.out_key_attr, thread_local=self.thread_local)
        copy._called = self._called
        return copy

    def __call__(self, func: Callable) -> Callable:  # type: ignore[override]  # the wrapper, not func's type
        self._called = True
        _check_tensordict_first(func)
        decorator = self

        @functools.wraps(func)
        def skipping_forward(module: Any, tensordict: Any, *args: Any, **kwargs: Any) -> Any:
            skip_mode = skip_existing()
            if skip_mode and _outputs_present(skip_mode, module, tensordict, decorator.in_key_attr,
                                              decorator.out_key_attr):
                return tensordict
            return func(module, tensordict, *args, **kwargs)

        # The parent class runs the wrapper inside this object's block (``mode`` set during the call).
        return super().__call__(skipping_forward)

    def __enter__(self) -> None:
        if self.mode and is_compiling():
            raise RuntimeError("skip_existing is not compatible with TorchDynamo.")
        self.prev = _skip_existing.get_thread_mode() if self.thread_local else _skip_existing.get_mode()
        if self.mode is not None:
            if self.thread_local:
                _skip_existing.set_thread_mode(self.mode)
            else:
                _skip_existing.set_mode(self.mode)
        elif not self._called:
            raise RuntimeError(
                f"It seems you are using {type(self).__name__} as a context manager with ``None`` input. "
                f"This behaviour is not allowed."
            )

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        if self.thread_local:
            _skip_existing.set_thread_mode(self.prev)
        else:
            _skip_existing.set_mode(self.prev)


class _set_skip_existing_None(set_skip_existing):
    """The decorator the library's own ``forward`` methods carry: follow the enclosing block's mode.

    Unlike ``set_skip_existing(None)`` it enters no block per call (one mode read when skipping is off), which
    keeps the common path cheap and ``torch.compile`` free of context-manager frames.
    """

    in_key_attr = "in_keys"
    out_key_attr = "out_keys"

    def __init__(self) -> None:
        self.mode = None
        self.thread_local = False
        self._called = False

    def clone(self) -> "_set_skip_existing_None":
        return type(self)()

    def __call__(self, func: Callable) -> Callable:  # type: ignore[override]  # the wrapper, not func's type
        self._called = True
        _check_tensordict_first(func)

        @functools.wraps(func)
        def forward_unless_present(module: Any, tensordict: Any, *args: Any, **kwargs: Any) -> Any:
            skip_mode = _skip_existing.get_mode()
            if skip_mode:
                if is_compiling():
                    raise RuntimeError("skip_existing is not compatible with torch.compile.")
                if _outputs_present(skip_mode, module, tensordict, "in_keys", "out_keys"):
                    return tensordict
            try:
                return func(module, tensordict, *args, **kwargs)
            finally:
                # A module that changed the mode and left it changed: give the caller its own back.
                if _skip_existing.get_mode() is not skip_mode and not is_compiling():
                    _skip_existing.set_mode(skip_mode)

        return forward_unless_present


# Upstream's ``tensordict.nn.utils`` also holds the distribution helpers and the log-prob switch; torchdict
# defines them with the probabilistic modules and reaches them from here on first access (PEP 562), so
# ``from torchdict.nn.utils import mappings`` keeps working without this module importing them.
_DEFINED_ELSEWHERE = {
    "mappings": ".distributions.utils",
    "inv_softplus": ".distributions.utils",
    "biased_softplus": ".distributions.utils",
    "expln": ".distributions.utils",
    "add_custom_mapping": ".distributions.utils",
    "composite_lp_aggregate": "._modes",
    "set_composite_lp_aggregate": "._modes",
}


def __getattr__(name: str) -> Any:
    module_name = _DEFINED_ELSEWHERE.get(name)
    if module_name is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module_name, __package__), name)
