"""The file-format readers of a tensorclass: ``MyClass.from_pandas(df)``, ``from_csv``, ``from_json``,
``from_parquet``, ``from_struct_array``, ``from_h5`` and ``from_zarr``.

Each one reads a TensorDict with the :mod:`torchdict.formats` reader of the same name (same parameters, same
batch-size rules), then wraps it in the class, as upstream does: every top-level key must be a field (a
``ValueError`` otherwise), a field the file lacks is ``None`` (declared defaults are not filled), and nested
levels stay TensorDicts even under a field annotated with a tensorclass. ``__post_init__`` runs, as for any
instance built from new data.

A tensorclass keeps its fields in memory (its ``__dict__`` is the storage of one TensorDict), so
``from_h5`` / ``from_zarr`` read the whole file and close it, where upstream wraps the open file
(``TensorDict.from_h5`` gives the file-backed collection); see docs/compat.md.
The format modules (and pandas, pyarrow, h5py, zarr) are imported when a reader is called.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Optional

import torch

from ._delegation import _keys_error
from ..tensordict import TensorDict

if TYPE_CHECKING:
    from typing_extensions import Self

    # The readers are classmethods of TensorClass, built on its TensorDict API.
    from ._delegation import TensorDictMethods
else:
    TensorDictMethods = object

__all__ = ["FormatReadersMixin"]


def _check_keys(cls: type[TensorDictMethods], keys: Any) -> None:
    extra = set(keys) - cls._tc_field_set
    if extra:
        raise _keys_error(cls, extra)


def _as_instance(cls: type[TensorDictMethods], td: TensorDict) -> Any:
    """``td`` (a fresh TensorDict the reader built) as an instance of ``cls``: its keys must be fields."""
    _check_keys(cls, td._tensordict)
    return cls._from_tensordict_unchecked(td)


def _read_file(cls: type[TensorDictMethods], persistent: Any, owns_store: bool) -> Any:
    """The open file's entries read into memory, as an instance of ``cls``; the file is closed after."""
    try:
        _check_keys(cls, persistent.keys())  # before reading anything
        return cls._from_tensordict_unchecked(persistent.to_tensordict())
    finally:
        if owns_store:
            persistent.close()


class FormatReadersMixin(TensorDictMethods):
    """The ``from_<format>`` classmethods of ``TensorClass`` (a base of it)."""

    __slots__ = ()

    # ------------------------------------------------------------------ tables
    @classmethod
    def from_pandas(cls, dataframe: Any, *, auto_batch_size: bool = False, batch_dims: Optional[int] = None,
                    device: Any = None, batch_size: Optional[torch.Size] = None, separator: Optional[str] = None,
                    dtype: Optional[torch.dtype] = None) -> "Self":
        """An instance with one field per column of ``dataframe`` (see ``TensorDict.from_pandas``).

        >>> import pandas as pd
        >>> from torchdict import TensorClass
        >>> class Row(TensorClass):
        ...     a: torch.Tensor
        ...     b: torch.Tensor
        >>> Row.from_pandas(pd.DataFrame({"a": [1, 2], "b": [0.5, 1.5]})).b
        tensor([0.5000, 1.5000], dtype=torch.float64)
        """
        from ..formats.tabular import read_pandas

        return _as_instance(cls, read_pandas(None, dataframe, auto_batch_size=auto_batch_size,
                                             batch_dims=batch_dims, device=device, batch_size=batch_size,
                                             separator=separator, dtype=dtype))

    @classmethod
    def from_csv(cls, path: Any, *, auto_batch_size: bool = False, batch_dims: Optional[int] = None,
                 device: Any = None, batch_size: Optional[torch.Size] = None, separator: Optional[str] = None,
                 dtype: Optional[torch.dtype] = None, **kwargs: Any) -> "Self":
        """An instance with one field per column of a CSV file (``kwargs`` go to ``pandas.read_csv``)."""
        from ..formats.tabular import read_csv

        return _as_instance(cls, read_csv(None, path, auto_batch_size=auto_batch_size, batch_dims=batch_dims,
                                          device=device, batch_size=batch_size, separator=separator, dtype=dtype,
                                          **kwargs))

    @classmethod
    def from_json(cls, path: Any, *, auto_batch_size: bool = False, batch_dims: Optional[int] = None,
                  device: Any = None, batch_size: Optional[torch.Size] = None, separator: Optional[str] = None,
                  dtype: Optional[torch.dtype] = None, lines: bool = False, **kwargs: Any) -> "Self":
        """An instance with one field per key of a JSON array of records (JSON Lines with ``lines=True``)."""
        from ..formats.tabular import read_json

        return _as_instance(cls, read_json(None, path, auto_batch_size=auto_batch_size, batch_dims=batch_dims,
                                           device=device, batch_size=batch_size, separator=separator, dtype=dtype,
                                           lines=lines, **kwargs))

    @classmethod
    def from_parquet(cls, path: Any, *, auto_batch_size: bool = False, batch_dims: Optional[int] = None,
                     device: Any = None, batch_size: Optional[torch.Size] = None, separator: Optional[str] = None,
                     dtype: Optional[torch.dtype] = None, columns: Optional[list] = None, **kwargs: Any) -> "Self":
        """An instance with one field per column of a Parquet file (only ``columns`` when given)."""
        from ..formats.tabular import read_parquet

        return _as_instance(cls, read_parquet(None, path, auto_batch_size=auto_batch_size, batch_dims=batch_dims,
                                              device=device, batch_size=batch_size, separator=separator,
                                              dtype=dtype, columns=columns, **kwargs))

    # ------------------------------------------------------------------ numpy structured arrays
    @classmethod
    def from_struct_array(cls, struct_array: Any, *, auto_batch_size: bool = False,
                          batch_dims: Optional[int] = None, device: Any = None,
                          batch_size: Optional[torch.Size] = None) -> "Self":
        """An instance with one field per field of a numpy structured array (sharing its memory where it can).

        >>> import numpy as np
        >>> from torchdict import TensorClass
        >>> class Dog(TensorClass):
        ...     name: str
        ...     age: torch.Tensor
        >>> dogs = Dog.from_struct_array(np.array([("Rex", 9), ("Fido", 3)], dtype=[("name", "U10"), ("age", "i4")]))
        >>> dogs.batch_size, dogs.age
        (torch.Size([2]), tensor([9, 3], dtype=torch.int32))
        """
        from ..formats.struct import read_struct_array

        return _as_instance(cls, read_struct_array(None, struct_array, auto_batch_size=auto_batch_size,
                                                   batch_dims=batch_dims, device=device, batch_size=batch_size))

    # ------------------------------------------------------------------ files of arrays
    @classmethod
    def from_h5(cls, filename: Any, *, mode: str = "r", auto_batch_size: bool = False,
                batch_dims: Optional[int] = None, batch_size: Optional[torch.Size] = None,
                non_tensor_as_stack: bool = False) -> "Self":
        """An instance holding the HDF5 file's datasets, read into memory (the file is closed after).

        Opened as ``TensorDict.from_h5`` opens it (``mode``, batch-size options); for a collection that reads
        and writes the file lazily, use ``TensorDict.from_h5``. Needs ``torchdict[h5]``.
        """
        from ..formats.h5 import from_h5

        persistent = from_h5(filename, mode=mode, auto_batch_size=auto_batch_size, batch_dims=batch_dims,
                             batch_size=batch_size, non_tensor_as_stack=non_tensor_as_stack)
        return _read_file(cls, persistent, owns_store=True)  # from_h5 opened its own h5py.File

    @classmethod
    def from_zarr(cls, filename: Any, *, mode: str = "r", auto_batch_size: bool = False,
                  batch_dims: Optional[int] = None, batch_size: Optional[torch.Size] = None,
                  non_tensor_as_stack: bool = False, allow_pickle: Optional[bool] = None) -> "Self":
        """An instance holding the zarr store's arrays, read into memory (a store opened from a path is closed
        after; a store object passed in is left open). Needs ``torchdict[zarr]``."""
        from ..formats.zarr import from_zarr

        persistent = from_zarr(filename, mode=mode, auto_batch_size=auto_batch_size, batch_dims=batch_dims,
                               batch_size=batch_size, non_tensor_as_stack=non_tensor_as_stack,
                               allow_pickle=allow_pickle)
        return _read_file(cls, persistent, owns_store=isinstance(filename, (str, bytes, os.PathLike)))
