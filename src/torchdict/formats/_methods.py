"""``FormatsMixin``: the file-format methods of every collection (``to_h5``, ``from_zarr``, ...).

A base of :class:`~torchdict.TensorDictBase`, so ``TensorDict``, lazy stacks and file-backed collections all
have them. Each method is a thin shim that imports its format module inside the body: ``import torchdict``
must not load h5py, zarr or the format code, and this class stays a handful of small functions.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import torch

if TYPE_CHECKING:
    from typing import Literal


class FormatsMixin:
    """Readers and writers of the formats in :mod:`torchdict.formats`, as methods of a collection."""

    __slots__ = ()

    # ------------------------------------------------------------------ HDF5
    def to_h5(self, filename: Any, **kwargs: Any) -> Any:
        """Write this collection to a new HDF5 file at ``filename``; returns a ``PersistentTensorDict`` on it.

        ``kwargs`` go to ``h5py.Group.create_dataset`` (e.g. ``compression="gzip"``). Needs ``torchdict[h5]``.
        """
        from .h5 import to_h5

        return to_h5(self, filename, **kwargs)

    @classmethod
    def from_h5(cls, filename: Any, *, mode: str = "r", auto_batch_size: bool = False,
                batch_dims: Optional[int] = None, batch_size: Optional[torch.Size] = None,
                non_tensor_as_stack: bool = False) -> Any:
        """Open the HDF5 file ``filename`` as a ``PersistentTensorDict`` (entries are read when asked for)."""
        from .h5 import from_h5

        return from_h5(filename, mode=mode, auto_batch_size=auto_batch_size, batch_dims=batch_dims,
                       batch_size=batch_size, non_tensor_as_stack=non_tensor_as_stack)

    # ------------------------------------------------------------------ zarr
    def to_zarr(self, filename: Any, *, allow_pickle: Optional[bool] = None, **kwargs: Any) -> Any:
        """Write this collection to a new zarr store at ``filename``; returns a ``PersistentTensorDict`` on it.

        ``kwargs`` go to ``zarr.Group.create_array`` (e.g. ``chunks=(16,)``). Needs ``torchdict[zarr]``.
        """
        from .zarr import to_zarr

        return to_zarr(self, filename, allow_pickle=allow_pickle, **kwargs)

    @classmethod
    def from_zarr(cls, filename: Any, *, mode: str = "r", auto_batch_size: bool = False,
                  batch_dims: Optional[int] = None, batch_size: Optional[torch.Size] = None,
                  non_tensor_as_stack: bool = False, allow_pickle: Optional[bool] = None) -> Any:
        """Open the zarr store ``filename`` as a ``PersistentTensorDict`` (entries are read when asked for)."""
        from .zarr import from_zarr

        return from_zarr(filename, mode=mode, auto_batch_size=auto_batch_size, batch_dims=batch_dims,
                         batch_size=batch_size, non_tensor_as_stack=non_tensor_as_stack,
                         allow_pickle=allow_pickle)

    # ------------------------------------------------------------------ tables (pandas / CSV / JSON / Parquet)
    def to_pandas(self, *, separator: Optional[str] = None) -> Any:
        """A ``pandas.DataFrame``, one column per leaf (``separator`` joins nested keys). Needs ``torchdict[arrow]``."""
        from .tabular import to_pandas

        return to_pandas(self, separator=separator)

    def to_csv(self, path: Any, *, separator: Optional[str] = None, **kwargs: Any) -> None:
        """Write a CSV file, one column per leaf, with ``pandas.DataFrame.to_csv`` (``kwargs`` go to it)."""
        from .tabular import to_csv

        to_csv(self, path, separator=separator, **kwargs)

    def to_json(self, path: Any, *, separator: Optional[str] = None, lines: bool = False, **kwargs: Any) -> None:
        """Write a JSON array of records (JSON Lines with ``lines=True``), one field per leaf, with pandas."""
        from .tabular import to_json

        to_json(self, path, separator=separator, lines=lines, **kwargs)

    def to_parquet(self, path: Any, *, separator: Optional[str] = None, **kwargs: Any) -> None:
        """Write a Parquet file, one column per leaf, with ``pyarrow.parquet.write_table`` (``kwargs`` go to it)."""
        from .tabular import to_parquet

        to_parquet(self, path, separator=separator, **kwargs)

    @classmethod
    def from_pandas(cls, dataframe: Any, *, auto_batch_size: bool = False, batch_dims: Optional[int] = None,
                    device: Any = None, batch_size: Optional[torch.Size] = None, separator: Optional[str] = None,
                    dtype: Optional[torch.dtype] = None) -> Any:
        """One entry per column of a DataFrame, batch size ``[num_rows]`` (see ``torchdict.formats.tabular``)."""
        from .tabular import read_pandas

        return read_pandas(cls, dataframe, auto_batch_size=auto_batch_size, batch_dims=batch_dims, device=device,
                           batch_size=batch_size, separator=separator, dtype=dtype)

    @classmethod
    def from_csv(cls, path: Any, *, auto_batch_size: bool = False, batch_dims: Optional[int] = None,
                 device: Any = None, batch_size: Optional[torch.Size] = None, separator: Optional[str] = None,
                 dtype: Optional[torch.dtype] = None, **kwargs: Any) -> Any:
        """One entry per column of a CSV file read with ``pandas.read_csv`` (``kwargs`` go to it)."""
        from .tabular import read_csv

        return read_csv(cls, path, auto_batch_size=auto_batch_size, batch_dims=batch_dims, device=device,
                        batch_size=batch_size, separator=separator, dtype=dtype, **kwargs)

    @classmethod
    def from_json(cls, path: Any, *, auto_batch_size: bool = False, batch_dims: Optional[int] = None,
                  device: Any = None, batch_size: Optional[torch.Size] = None, separator: Optional[str] = None,
                  dtype: Optional[torch.dtype] = None, lines: bool = False, **kwargs: Any) -> Any:
        """One entry per field of a JSON array of records (JSON Lines with ``lines=True``), read with pandas."""
        from .tabular import read_json

        return read_json(cls, path, auto_batch_size=auto_batch_size, batch_dims=batch_dims, device=device,
                         batch_size=batch_size, separator=separator, dtype=dtype, lines=lines, **kwargs)

    @classmethod
    def from_parquet(cls, path: Any, *, auto_batch_size: bool = False, batch_dims: Optional[int] = None,
                     device: Any = None, batch_size: Optional[torch.Size] = None, separator: Optional[str] = None,
                     dtype: Optional[torch.dtype] = None, columns: Optional[list] = None, **kwargs: Any) -> Any:
        """One entry per column of a Parquet file read with ``pyarrow.parquet.read_table`` (only ``columns``)."""
        from .tabular import read_parquet

        return read_parquet(cls, path, auto_batch_size=auto_batch_size, batch_dims=batch_dims, device=device,
                            batch_size=batch_size, separator=separator, dtype=dtype, columns=columns, **kwargs)

    # ------------------------------------------------------------------ numpy structured arrays
    def to_struct_array(self) -> Any:
        """A numpy structured array of shape ``batch_size``, one field per entry (a copy)."""
        from .struct import to_struct_array

        return to_struct_array(self)

    @classmethod
    def from_struct_array(cls, struct_array: Any, *, auto_batch_size: bool = False,
                          batch_dims: Optional[int] = None, device: Any = None,
                          batch_size: Optional[torch.Size] = None) -> Any:
        """One entry per field of a numpy structured array (sharing its memory where torch can view it)."""
        from .struct import read_struct_array

        return read_struct_array(cls, struct_array, auto_batch_size=auto_batch_size, batch_dims=batch_dims,
                                 device=device, batch_size=batch_size)

    # ------------------------------------------------------------------ MosaicML streaming
    def to_mds(self, *, columns: Optional[dict] = None, out: Any, keep_local: bool = False,
               compression: Optional[str] = None, hashes: Optional[list] = None,
               size_limit: Any = 1 << 26, writer: Any = None, finish_writer: Optional[bool] = None,
               **kwargs: Any) -> None:
        """Write an MDS dataset (one sample per element of the first batch dim). Needs ``torchdict[mds]``."""
        from .mds import to_mds

        to_mds(self, columns=columns, out=out, keep_local=keep_local, compression=compression, hashes=hashes,
               size_limit=size_limit, writer=writer, finish_writer=finish_writer, **kwargs)

    # ------------------------------------------------------------------ key-value stores
    def to_store(self, *, backend: Literal["redis", "dragonfly"] = "redis", host: str = "localhost",
                 port: int = 6379, db: int = 0,
                 unix_socket_path: Optional[str] = None, prefix: str = "tensordict", device: Any = None,
                 **kwargs: Any) -> Any:
        """A copy of this collection in a Redis-protocol server (:class:`torchdict.store.TensorDictStore`;
        a lazy stack gives a ``LazyStackedTensorDictStore``). Needs ``torchdict[store]``."""
        from ..base import TensorDictBase
        from ..store import TensorDictStore

        assert isinstance(self, TensorDictBase)  # the only class this mixin is a base of
        return TensorDictStore.from_tensordict(self, backend=backend, host=host, port=port, db=db,
                                               unix_socket_path=unix_socket_path, prefix=prefix, device=device,
                                               **kwargs)
