"""Process-wide behaviour toggles, as upstream tensordict exposes them (and reads them from the environment).

- ``set_list_to_stack`` / ``list_to_stack``: whether ``td[key] = ["a", "b"]`` stores a ``NonTensorStack``
  (one value per batch element, the default) or one ``NonTensorData`` holding the whole list;
- ``set_capture_non_tensor_stack`` / ``capture_non_tensor_stack``: whether stacking equal non-tensor
  values gives one ``NonTensorData`` instead of a stack;
- ``set_lazy_legacy`` / ``lazy_legacy``: the legacy lazy mode (shape ops return lazy views that write
  through to their source, ``torch.stack`` a lazy stack);
- ``set_get_defaults_to_none`` / ``get_defaults_to_none``: whether ``get`` of a missing key without a
  default returns ``None`` (the default) or raises ``KeyError``;
- ``set_printoptions`` / ``get_printoptions``: what a repr shows.

Each ``set_*`` class works as a context manager, as a decorator, and with ``.set()`` for the rest of the
program. The first three write their mode into the environment variable upstream reads at import
(``LIST_TO_STACK``, ``CAPTURE_NONTENSOR_STACK``, ``LAZY_LEGACY_OP``), so worker processes inherit it.

This module is imported by ``import torchdict`` (the hot paths read its globals on their rare branches):
it stays tiny.
"""
from __future__ import annotations

import os
import warnings
from typing import Any, Optional

from torch.utils._contextlib import _DecoratorContextManager

__all__ = [
    "capture_non_tensor_stack", "get_defaults_to_none", "get_printoptions", "lazy_legacy", "list_to_stack",
    "set_capture_non_tensor_stack", "set_get_defaults_to_none", "set_lazy_legacy", "set_list_to_stack",
    "set_printoptions",
]

_TRUE = ("y", "yes", "t", "true", "on", "1")
_FALSE = ("n", "no", "f", "false", "off", "0")


def _parse_flag(text: str) -> bool:
    lowered = text.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(f"invalid truth value {text!r}")


def _from_env(name: str) -> Optional[bool]:
    """The mode an environment variable sets at import; None when unset (or ``none``)."""
    text = os.environ.get(name)
    if text is None or text.lower() == "none":
        return None
    try:
        return _parse_flag(text)
    except ValueError:
        return None


def _deprecated(what: str, replacement: str, stacklevel: int) -> None:
    warnings.warn(f"{what} is deprecated and will be removed in TensorDict 0.17. Use {replacement} instead.",
                  DeprecationWarning, stacklevel=stacklevel + 1)


# The current modes: None until set (then the default applies). Read by the hot paths' rare branches as
# ``_options.LIST_TO_STACK`` etc., so they are module globals rather than attributes of an object.
LIST_TO_STACK: Optional[bool] = _from_env("LIST_TO_STACK")
CAPTURE_NON_TENSOR_STACK: Optional[bool] = _from_env("CAPTURE_NONTENSOR_STACK")
LAZY_LEGACY: Optional[bool] = _from_env("LAZY_LEGACY_OP")
_env_defaults = os.environ.get("TD_GET_DEFAULTS_TO_NONE")
GET_DEFAULTS_TO_NONE: bool = True if _env_defaults is None else _parse_flag(_env_defaults)
del _env_defaults

_DEFAULTS = {"LIST_TO_STACK": True, "CAPTURE_NON_TENSOR_STACK": False, "LAZY_LEGACY": False}


def _mode(name: str, allow_none: bool) -> Optional[bool]:
    value = globals()[name]
    if value is None:
        return None if allow_none else _DEFAULTS[name]
    return value


def list_to_stack(allow_none: bool = False) -> Optional[bool]:
    """Whether a list written to a key becomes a ``NonTensorStack`` (``True`` unless turned off).

    >>> list_to_stack()
    True
    """
    return _mode("LIST_TO_STACK", allow_none)


def capture_non_tensor_stack(allow_none: bool = False) -> Optional[bool]:
    """Whether stacking equal non-tensor values gives one ``NonTensorData`` (``False`` unless turned on).

    >>> capture_non_tensor_stack()
    False
    """
    return _mode("CAPTURE_NON_TENSOR_STACK", allow_none)


def lazy_legacy(allow_none: bool = False) -> Optional[bool]:
    """Whether the (deprecated) legacy lazy mode is on.

    >>> lazy_legacy()
    False
    """
    return _mode("LAZY_LEGACY", allow_none)


class _Toggle(_DecoratorContextManager):
    """A mode held in a global of this module and mirrored in an environment variable.

    ``with`` / a decorated call restore the previous mode (and the environment) on exit; ``.set()``
    keeps the new one.
    """

    _global: str = ""
    _env: str = ""

    def __init__(self, mode: bool) -> None:
        super().__init__()
        self.mode = mode

    def clone(self) -> "_Toggle":
        # Each call of a decorated function gets its own copy (and only the decorator warns).
        copy = type(self).__new__(type(self))
        copy.mode = self.mode
        return copy

    def set(self) -> None:
        """Apply the mode for the rest of the program."""
        self._previous = globals()[self._global]
        self._previous_env = os.environ.get(self._env, _UNSET)
        globals()[self._global] = bool(self.mode)
        os.environ[self._env] = str(bool(self.mode))

    def __enter__(self) -> None:
        self.set()

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        globals()[self._global] = self._previous
        if self._previous_env is _UNSET:
            os.environ.pop(self._env, None)
        else:
            os.environ[self._env] = self._previous_env


_UNSET: Any = object()


class set_list_to_stack(_Toggle):
    """Whether ``td[key] = a_list`` stores a ``NonTensorStack`` (``True``, the default) or one
    ``NonTensorData`` (``False``, deprecated upstream: use ``td.set_non_tensor``).

    >>> from torchdict import TensorDict
    >>> td = TensorDict(batch_size=[2])
    >>> with set_list_to_stack(True):
    ...     td["x"] = ["a", "b"]
    >>> type(td.get("x")).__name__
    'NonTensorStack'
    """

    _global, _env = "LIST_TO_STACK", "LIST_TO_STACK"

    def __init__(self, mode: bool) -> None:
        super().__init__(mode)
        if not mode:
            _deprecated("set_list_to_stack(False)", "td.set_non_tensor(key, value) to store a list as one value",
                        stacklevel=2)


class set_capture_non_tensor_stack(_Toggle):
    """Whether stacking equal non-tensor values gives one ``NonTensorData`` (``True``, deprecated upstream)
    rather than a ``NonTensorStack`` (``False``, the default).

    >>> import torch
    >>> from torchdict import NonTensorData
    >>> with set_capture_non_tensor_stack(False):
    ...     type(torch.stack([NonTensorData("a"), NonTensorData("a")])).__name__
    'NonTensorStack'
    """

    _global, _env = "CAPTURE_NON_TENSOR_STACK", "CAPTURE_NONTENSOR_STACK"

    def __init__(self, mode: bool) -> None:
        super().__init__(mode)
        if mode:
            _deprecated("set_capture_non_tensor_stack(True)",
                        "NonTensorStack.data to get the single value of a stack of identical values", stacklevel=2)


class set_lazy_legacy(_Toggle):
    """The legacy lazy mode (deprecated upstream): ``unsqueeze`` / ``permute`` / ``transpose`` / ``view``
    return lazy views that read from and write to their source, and ``torch.stack`` a lazy stack.

    >>> with set_lazy_legacy(False):
    ...     lazy_legacy()
    False
    """

    _global, _env = "LAZY_LEGACY", "LAZY_LEGACY_OP"

    def __init__(self, mode: bool) -> None:
        super().__init__(mode)
        if mode:
            warnings.warn(
                "The legacy lazy mode, turned on with set_lazy_legacy(True) or LAZY_LEGACY_OP=1, is deprecated "
                "and will be removed in TensorDict 0.17. Shape operations such as unsqueeze and permute will then "
                "always return a tensordict, and torch.stack will stack densely: use lazy_stack to build a lazy "
                "stack.", DeprecationWarning, stacklevel=2)


_GET_DEFAULTS_REPLACEMENT = "td[key] to raise a KeyError for a missing key"


def set_get_defaults_to_none(set_to_none: bool = True) -> None:
    """Whether ``get(key)`` of a missing key without a default returns ``None`` (``True``) or raises
    ``KeyError`` (``False``). Deprecated upstream (``td[key]`` raises)."""
    global GET_DEFAULTS_TO_NONE
    _deprecated("set_get_defaults_to_none()", _GET_DEFAULTS_REPLACEMENT, stacklevel=2)
    GET_DEFAULTS_TO_NONE = bool(set_to_none)


def get_defaults_to_none(set_to_none: bool = True) -> bool:
    """Whether ``get(key)`` of a missing key returns ``None``; ``set_to_none`` is ignored (as upstream)."""
    _deprecated("get_defaults_to_none()", _GET_DEFAULTS_REPLACEMENT, stacklevel=2)
    return GET_DEFAULTS_TO_NONE


# ---------------------------------------------------------------------------------------------- printing
# torchdict prints the detailed (seed) repr by default: ``compact`` starts False, where upstream's starts True.
PRINT_OPTIONS: dict = {
    "show_batch_size": True, "show_device": True, "show_is_shared": True, "show_shape": True,
    "show_field_device": True, "show_dtype": True, "show_field_is_shared": True, "show_grad": False,
    "show_is_contiguous": False, "show_is_view": False, "show_storage_size": False, "plain": False,
    "sort_keys": "alphabetical", "compact": False, "html": True,
}
_DETAILED_ONLY = frozenset({"show_is_shared", "show_shape", "show_field_device", "show_field_is_shared", "show_grad",
                            "show_is_contiguous", "show_is_view", "show_storage_size", "plain"})
_QUIET = {"show_device": False, "show_is_shared": False, "show_field_device": False, "show_dtype": False,
          "show_field_is_shared": False}


class set_printoptions(_DecoratorContextManager):
    """Change what a repr shows: for a block (``with`` / decorator), or for good with ``.set()``.

    Options: ``show_batch_size``, ``show_device``, ``show_is_shared``, ``show_shape``, ``show_field_device``,
    ``show_dtype``, ``show_field_is_shared``, ``show_grad``, ``show_is_contiguous``, ``show_is_view``,
    ``show_storage_size``, ``plain`` (a value summary per tensor), ``sort_keys`` (``"alphabetical"``, ``None``
    for insertion order, or a key function on the entry's text), ``compact`` (upstream's one-line form,
    ``f32[3]`` per entry) and ``html``. ``verbose=False`` hides devices, dtypes and ``is_shared`` unless an
    option says otherwise. A detailed-form option given without ``compact`` turns the compact form off.

    >>> import torch
    >>> from torchdict import TensorDict
    >>> with set_printoptions(compact=True):
    ...     print(TensorDict(a=torch.zeros(3), batch_size=[3]))
    TensorDict(batch_size=[3], fields={a: f32[]})
    """

    def __init__(self, *, verbose: bool = True, **kwargs: Any) -> None:
        super().__init__()
        unknown = set(kwargs) - set(PRINT_OPTIONS)
        if unknown:
            raise TypeError(f"Unknown printoptions: {unknown}. Valid options: {sorted(PRINT_OPTIONS)}")
        if "compact" not in kwargs and not _DETAILED_ONLY.isdisjoint(kwargs):
            kwargs["compact"] = False
        if not verbose:
            kwargs = {**_QUIET, **kwargs}
        self._kwargs = kwargs

    def clone(self) -> "set_printoptions":
        copy = type(self).__new__(type(self))
        copy._kwargs = dict(self._kwargs)
        return copy

    def set(self) -> None:
        """Apply the options for the rest of the program."""
        self._previous = dict(PRINT_OPTIONS)
        PRINT_OPTIONS.update(self._kwargs)

    def __enter__(self) -> None:
        self.set()

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        PRINT_OPTIONS.update(self._previous)


def get_printoptions() -> dict:
    """A copy of the current print options.

    >>> get_printoptions()["show_dtype"]
    True
    """
    return dict(PRINT_OPTIONS)
