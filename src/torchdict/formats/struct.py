"""numpy structured arrays <-> TensorDicts (``from_struct_array`` / ``to_struct_array``).

A structured array's shape is the batch size; each field is an entry. Reading shares memory with the array
where torch can view the field (a field whose item size doesn't divide the record size, or in a foreign byte
order, is copied); nested structured fields become nested TensorDicts, string / object fields a
``NonTensorData`` holding the field's array. Writing copies: tensor leaves become fields (their trailing dims
the field's shape), nested TensorDicts nested fields, strings ``"U"`` fields of at least 10 characters.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from ._batch_options import apply_batch_options, result_class

__all__ = ["from_struct_array", "to_struct_array"]

_MIN_STRING_WIDTH = 10  # upstream's fields of strings are at least "U10"


def read_struct_array(cls: Any, struct_array: Any, *, auto_batch_size: bool = False,
                      batch_dims: Optional[int] = None, device: Any = None, batch_size: Any = None) -> Any:
    """``cls.from_struct_array``: see :func:`from_struct_array`."""
    from .._constructors import _numeric_field

    target = result_class(cls)

    def build(array: Any, shape: Any) -> Any:
        entries = {}
        for name in array.dtype.names:
            field = array[name]
            if field.dtype.names is not None:
                entries[name] = build(field, field.shape)  # a nested level has its own array's shape
            elif field.dtype.kind in "biufc":
                entries[name] = _numeric_field(field)
            else:
                entries[name] = field
        return target(entries, batch_size=shape, device=device)

    result = build(struct_array, struct_array.shape if batch_size is None else batch_size)
    return apply_batch_options(result, "from_struct_array", auto_batch_size, batch_dims, batch_size)


def from_struct_array(struct_array: Any, *, auto_batch_size: bool = False, batch_dims: Optional[int] = None,
                      device: Any = None, batch_size: Any = None) -> Any:
    """A TensorDict with one entry per field of a numpy structured array, sharing its memory where it can.

    >>> import numpy as np
    >>> x = np.array([("Rex", 9), ("Fido", 3)], dtype=[("name", "U10"), ("age", "i4")])
    >>> td = from_struct_array(x)
    >>> x["age"] += 1
    >>> td.batch_size, td["age"]
    (torch.Size([2]), tensor([10,  4], dtype=torch.int32))
    """
    return read_struct_array(None, struct_array, auto_batch_size=auto_batch_size, batch_dims=batch_dims,
                             device=device, batch_size=batch_size)


def to_struct_array(td: Any) -> Any:
    """A numpy structured array of shape ``td.batch_size`` holding a copy of every entry (one field each).

    >>> import torch
    >>> from torchdict import TensorDict
    >>> to_struct_array(TensorDict(a=torch.tensor([1, 2]), b=torch.zeros(2, 3), batch_size=[2])).dtype
    dtype([('a', '<i8'), ('b', '<f4', (3,))])
    """
    import numpy as np

    values = {key: _field_value(value) for key, value in td.items()}
    if not values:
        raise ValueError("Cannot convert an empty tensordict to a structured array: it has no field.")
    batch_dims = len(td.batch_size)
    dtype = [(key, _field_dtype(value, batch_dims)) for key, value in values.items()]
    result = np.empty(tuple(td.batch_size), dtype=dtype)
    for key, value in values.items():
        result[key] = value
    return result


def _field_value(value: Any) -> Any:
    """What one entry writes into its field: a numpy array, or a Python value (non-tensor data)."""
    import numpy as np

    from .._base import is_tensor_collection
    from ..nontensor import NonTensorData, NonTensorStack

    if isinstance(value, NonTensorStack):
        value = value.tolist()
    elif isinstance(value, NonTensorData):
        value = value.data
    elif is_tensor_collection(value):
        return to_struct_array(value)
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    if isinstance(value, (list, tuple, str)):
        return np.array(value)
    return value


def _field_dtype(value: Any, batch_dims: int) -> Any:
    import numpy as np

    if not isinstance(value, np.ndarray):
        return f"U{_MIN_STRING_WIDTH}"  # a single non-array value: written as its string
    if value.dtype.kind in "US":
        width = max((len(str(item)) for item in value.flat), default=0)
        return f"U{max(_MIN_STRING_WIDTH, width)}"
    if value.ndim > batch_dims:
        return (value.dtype, value.shape[batch_dims:])
    return value.dtype
