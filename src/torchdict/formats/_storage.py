"""What a file-backed collection needs from its storage library, and the parts HDF5 and zarr share.

:class:`~torchdict.formats.h5.PersistentTensorDict` talks to its file only through a *backend*
(``formats/_h5_backend.py`` for h5py, ``formats/_zarr_backend.py`` for zarr): a small object that knows the
library's nodes (groups and arrays), how a tensor, a non-tensor value and a stack of them are laid out, and
how a file is opened, closed and pickled. The layout is upstream tensordict's, so files written by either
library open in the other:

- a tensor is an array of the same shape and dtype; a nested collection is a group;
- a ``NonTensorStack`` is an array of its elements with the attribute ``__tensordict_stack__`` (its shape);
- HDF5: a ``str`` is a variable-length string dataset marked ``__tensordict_str__``; other non-tensor
  values are an opaque dataset of their numpy form; no batch size is stored (it is inferred on open);
- zarr: a non-tensor value is a ``uint8`` array of its JSON (or pickle) bytes marked
  ``__tensordict_non_tensor__``; each group stores ``{"batch_size": [...], "names": [...]}`` in its
  ``__tensordict__`` attribute.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch

__all__ = [
    "STACK_ATTR", "TENSOR", "DATA", "STACK", "GROUP", "torch_dtype_of", "numpy_of", "unstorable_dtype_error",
    "ReadOnlyStorageError", "native", "all_of_type", "make_backend",
]

STACK_ATTR = "__tensordict_stack__"
_BACKENDS = ("h5", "zarr")

# The kinds of node a backend reports.
TENSOR, DATA, STACK, GROUP = "tensor", "data", "stack", "group"

_NUMPY_TO_TORCH = {
    np.dtype(np.bool_): torch.bool, np.dtype(np.uint8): torch.uint8, np.dtype(np.int8): torch.int8,
    np.dtype(np.int16): torch.int16, np.dtype(np.int32): torch.int32, np.dtype(np.int64): torch.int64,
    np.dtype(np.uint16): torch.uint16, np.dtype(np.uint32): torch.uint32, np.dtype(np.uint64): torch.uint64,
    np.dtype(np.float16): torch.float16, np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64,
    np.dtype(np.complex64): torch.complex64, np.dtype(np.complex128): torch.complex128,
}
_STORABLE = frozenset(_NUMPY_TO_TORCH.values())


class ReadOnlyStorageError(OSError, ValueError):
    """A write to a file opened read-only.

    Both an ``OSError`` and a ``ValueError``: h5py raises one or the other depending on the operation
    (writing into a dataset, creating one), and code written for upstream catches either.
    """


def torch_dtype_of(dtype: Any) -> Optional[torch.dtype]:
    """The torch dtype an array of numpy ``dtype`` reads as, or None when it is not a tensor's."""
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        return None
    if dtype.byteorder not in ("=", "|"):
        dtype = dtype.newbyteorder("=")
    return _NUMPY_TO_TORCH.get(dtype)


def native(array: Any) -> np.ndarray:
    """``array`` in native byte order (torch reads nothing else)."""
    array = np.asarray(array)
    if array.dtype.byteorder not in ("=", "|"):
        array = array.astype(array.dtype.newbyteorder("="))
    return array


def unstorable_dtype_error(what: str, key: Any, dtype: torch.dtype, format_name: str) -> TypeError:
    """The error for a tensor whose dtype the format can't hold (bfloat16, float8, complex32, ...)."""
    return TypeError(
        f"{what} can't store the {dtype} tensor at key {key!r}: {format_name} has no {dtype} type (tensors "
        f"are written through numpy, which lacks it). Cast it first, e.g. td.float() or td.to(torch.float32).")


def numpy_of(tensor: torch.Tensor, what: str, key: Any, format_name: str) -> np.ndarray:
    """``tensor`` as a numpy array to write (no copy for a contiguous CPU tensor)."""
    if tensor.dtype not in _STORABLE:
        raise unstorable_dtype_error(what, key, tensor.dtype, format_name)
    if tensor.requires_grad:
        # as upstream: the file can't keep the graph, and silently dropping it hides a bug
        raise RuntimeError("Cannot set a tensor that has requires_grad=True.")
    if tensor.is_conj():
        tensor = tensor.resolve_conj()
    if tensor.is_neg():
        tensor = tensor.resolve_neg()
    return tensor.detach().cpu().numpy()


def check_storable(tensor: torch.Tensor, what: str, key: Any, format_name: str) -> None:
    if tensor.dtype not in _STORABLE:
        raise unstorable_dtype_error(what, key, tensor.dtype, format_name)
    if tensor.requires_grad:
        raise RuntimeError("Cannot set a tensor that has requires_grad=True.")


def all_of_type(values: Any, ndim: int, cls: type) -> bool:
    """Whether every element of the ``ndim``-deep nested list ``values`` is exactly a ``cls``."""
    if ndim == 0:
        return type(values) is cls
    return all(all_of_type(value, ndim - 1, cls) for value in values)


def python_value(value: Any) -> Any:
    """A numpy scalar as the Python value it holds; anything else as it is."""
    if isinstance(value, np.generic):
        return value.item()
    return value


def make_backend(name: str, what: str, locking: Any = None) -> Any:
    """The backend object for ``name`` (its library imported now; an ImportError names the extra)."""
    if name == "h5":
        from ._h5_backend import H5Backend

        return H5Backend(what, locking)
    if name == "zarr":
        from ._zarr_backend import ZarrBackend

        return ZarrBackend(what)
    # upstream's error type for an unknown backend
    raise NotImplementedError(f"Unknown backend {name!r}. Supported backends are {sorted(_BACKENDS)}.")
