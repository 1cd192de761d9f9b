"""Turning user values into valid leaves of a TensorDict.

Everything written into a TensorDict through a public entry point passes
through :func:`to_leaf` once: numbers become tensors, mappings become
TensorDicts, anything else becomes :class:`NonTensorData`, and the leading
dimensions are checked against the batch size.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

import torch

from . import _options
from ._accel import tensor_len  # re-exported: the first size of a tensor, the cheapest batch check
from ._base import TensorCollection
from ._errors import batch_mismatch_error
from ._unbatched import UnbatchedTensor, with_batch_size
from .nontensor import NonTensorData, NonTensorStack

_Tensor = torch.Tensor
_NUMBER_TYPES = (bool, int, float)


def quick_batch_len(batch_size: torch.Size) -> int:
    """What a TensorDict keeps in ``_batch_len``, the write check that needs no ``shape``.

    ``0`` for an empty batch (every tensor fits); ``n`` for a one-dim batch ``[n]`` with
    ``n > 0`` (a tensor fits when its :data:`tensor_len` is ``n``); ``-1`` for any other
    batch, or when not yet known: no tensor has that length, so the full check runs.
    A batch ``[0]`` gets ``-1`` because a 0-dim tensor's C length is 0 too.

    >>> quick_batch_len(torch.Size([16])), quick_batch_len(torch.Size([])), quick_batch_len(torch.Size([4, 2]))
    (16, 0, -1)
    """
    if not batch_size:
        return 0
    return batch_size[0] if len(batch_size) == 1 and batch_size[0] > 0 else -1


def parse_batch_size(batch_size: Any) -> torch.Size:
    if batch_size is None:
        return torch.Size(())
    if type(batch_size) is torch.Size:
        return batch_size
    if type(batch_size) is list or type(batch_size) is tuple:  # the common spellings, first
        try:
            return torch.Size(batch_size)
        except TypeError:
            pass
    if isinstance(batch_size, int) and not isinstance(batch_size, bool):
        return torch.Size((batch_size,))
    if isinstance(batch_size, torch.Tensor) and batch_size.dim() <= 1:
        return torch.Size(batch_size.reshape(-1).tolist())
    if isinstance(batch_size, (list, tuple)):
        try:
            return torch.Size(batch_size)
        except TypeError:
            pass
    raise ValueError(
        "batch size was not specified when creating the TensorDict instance and it could not be "
        "retrieved from source."
    )


def parse_device(device: Any) -> Optional[torch.device]:
    if device is None:
        return None
    if type(device) is torch.device and (device.index is not None or device.type != "cuda"):
        return device
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        # Writes land on a concrete device: "cuda" means the current one.
        index = torch.cuda.current_device() if torch.cuda.is_available() else 0
        device = torch.device("cuda", index)
    return device


def _is_numpy(value: Any) -> bool:
    return type(value).__module__ == "numpy"


def _numpy_to_leaf(value: Any) -> Any:
    dtype = getattr(value, "dtype", None)
    if dtype is not None and dtype.kind in "biufc":
        return torch.as_tensor(value)
    return None


def _sequence_to_leaf(value: Any, batch_size: torch.Size, device: Optional[torch.device]) -> Any:
    if value and all(isinstance(item, TensorCollection) for item in value):
        return torch.stack(list(value), 0)
    if value and all(isinstance(item, _Tensor) for item in value):
        return torch.stack(list(value), 0)

    def numeric(item: Any) -> bool:
        if isinstance(item, (list, tuple)):
            return all(numeric(sub) for sub in item)
        return isinstance(item, _NUMBER_TYPES)

    if numeric(value):
        try:
            return torch.tensor(value, device=device)
        except (TypeError, ValueError, RuntimeError):
            pass
    if _options.LIST_TO_STACK is False or isinstance(value, tuple):
        # A tuple, or any sequence under set_list_to_stack(False), is one value, which upstream stores as an array.
        return NonTensorData(_as_array(value), batch_size, device)
    stack = NonTensorStack.from_nested_list(list(value) if isinstance(value, tuple) else value)
    return stack


def _as_array(value: Any) -> Any:
    import numpy

    try:
        return numpy.array(value)
    except ValueError:  # ragged nesting: numpy refuses it as a regular array
        array = numpy.empty(len(value), dtype=object)
        array[:] = list(value)
        return array


def fits_batch(shape: torch.Size, batch_size: torch.Size) -> bool:
    """True when ``shape`` starts with ``batch_size``.

    Slicing a ``torch.Size`` costs about three times as much as indexing it, and
    this check runs on every write, so the usual 0-, 1- and 2-dim batches are
    compared item by item.

    >>> fits_batch(torch.Size([3, 4]), torch.Size([3]))
    True
    """
    n_batch = len(batch_size)
    if n_batch == 1:
        return len(shape) >= 1 and shape[0] == batch_size[0]
    if n_batch == 0:
        return True
    if n_batch == 2:
        return len(shape) >= 2 and shape[0] == batch_size[0] and shape[1] == batch_size[1]
    return shape[:n_batch] == batch_size


def check_tensor(value: torch.Tensor, key: Any, batch_size: torch.Size, device: Optional[torch.device],
                 non_blocking: bool = False) -> torch.Tensor:
    if type(value) is not _Tensor and isinstance(value, UnbatchedTensor):
        # No batch dims to check: stored as an alias carrying the batch size it is stored under.
        if device is not None and value.device != device:
            value = value.to(device, non_blocking=non_blocking)
        return with_batch_size(value, batch_size)
    if not fits_batch(value.shape, batch_size):
        raise batch_mismatch_error(batch_size, value.shape, key)
    if device is not None and value.device != device:
        value = value.to(device, non_blocking=non_blocking)
    return value


def adopt_collection(value: Any, key: Any, batch_size: torch.Size, device: Optional[torch.device]) -> Any:
    """Fit a TensorDict (or tensorclass) under a parent with ``batch_size``/``device``."""
    if value.batch_size[: len(batch_size)] != batch_size:
        # Like upstream: a sub-collection whose leaves fit the parent's batch is
        # re-batched to it; otherwise the batch-size setter raises. A locked one can't
        # change its batch size: a shallow copy of it is re-batched (upstream always copies).
        if value.is_locked:
            value = value.copy()
        value.batch_size = batch_size
    if device is not None and value.device != device:
        value = value.to(device)
    return value


def to_leaf(value: Any, key: Any, batch_size: torch.Size, device: Optional[torch.device],
            non_blocking: bool = False) -> Any:
    """Convert ``value`` into a leaf that fits a TensorDict's batch size and device."""
    if isinstance(value, _Tensor):
        return check_tensor(value, key, batch_size, device, non_blocking)
    if isinstance(value, TensorCollection):
        return adopt_collection(value, key, batch_size, device)
    if isinstance(value, NonTensorData):
        if value.batch_size[: len(batch_size)] != batch_size:
            value = value._with_batch_size(batch_size)
        return value if device is None or value.device == device else value._to_device(device)
    if type(value) is NonTensorStack:
        if value.batch_size[: len(batch_size)] != batch_size:
            raise batch_mismatch_error(batch_size, value.batch_size, key)
        return value if device is None or value.device == device else value._to_device(device)
    if isinstance(value, Mapping):
        from .tensordict import TensorDict

        return TensorDict(value, batch_size=batch_size, device=device)
    tensor: Any = None
    if isinstance(value, _NUMBER_TYPES):
        tensor = torch.tensor(value, device=device)
    elif _is_numpy(value):
        tensor = _numpy_to_leaf(value)
    elif isinstance(value, (list, tuple)):
        tensor = _sequence_to_leaf(value, batch_size, device)
    if tensor is None:
        return NonTensorData(value, batch_size, device)
    return to_leaf(tensor, key, batch_size, device, non_blocking)
