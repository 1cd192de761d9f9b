"""zarr: ``to_zarr`` / ``from_zarr`` (upstream's names and parameters), over zarr 3.

A zarr store opens as a :class:`~torchdict.formats.h5.PersistentTensorDict` with the zarr backend
(``formats/_zarr_backend.py``): entries are read when asked for, ``td[index]`` reads the selected rows (whole
chunks, as zarr reads; ``to_zarr(..., chunks=(n,))`` sets the row chunk), writes go through to the store.
The layout is upstream's, so stores written by either library open in the other. zarr is imported only
when a store is used.
"""
from __future__ import annotations

from typing import Any, Optional

from ._h5_files import open_file, write_file
from ._h5_rows import _as_collection
from .h5 import PersistentTensorDict

__all__ = ["to_zarr", "from_zarr"]


def to_zarr(collection: Any, filename: Any, *, allow_pickle: Optional[bool] = None,
            **kwargs: Any) -> PersistentTensorDict:
    """Write ``collection`` to a new zarr store at ``filename`` (a folder, or a ``zarr`` store object).

    Each level's batch size and dim names are stored, so :func:`from_zarr` restores them. Non-tensor values
    are stored as JSON, or pickled when JSON can't hold them. ``kwargs`` go to ``zarr.Group.create_array``:
    each array is one uncompressed chunk unless ``chunks=`` (leading dims) or ``compressors=`` say otherwise.
    At a path, nothing is there until the store is complete; a folder holding other files is never replaced.
    ``allow_pickle`` is the returned tensordict's policy for pickled values (``None``: allowed, this call
    wrote them).
    """
    if allow_pickle is not None and not isinstance(allow_pickle, bool):
        raise TypeError("allow_pickle must be a bool or None.")
    return write_file(_as_collection(collection), filename, "zarr", "to_zarr", allow_pickle, kwargs)


def from_zarr(zarr_file: Any, *, mode: str = "r", auto_batch_size: bool = False, batch_dims: Optional[int] = None,
              batch_size: Any = None, non_tensor_as_stack: bool = False,
              allow_pickle: Optional[bool] = None) -> PersistentTensorDict:
    """Open the zarr store ``zarr_file`` (a folder or a zarr store object) as a
    :class:`~torchdict.formats.h5.PersistentTensorDict` (entries read when asked for).

    Without ``batch_size``, each group's recorded batch size is used (a store another tool wrote: the largest
    its arrays share). Pickled non-tensor values are refused unless ``allow_pickle=True`` (upstream 0.15
    reads them with a warning when it is ``None``; torchdict never unpickles by default).
    """
    return open_file(zarr_file, "zarr", "from_zarr", mode, auto_batch_size, batch_dims, batch_size,
                     non_tensor_as_stack, allow_pickle)
