"""``torchdict.persistent``: upstream's ``tensordict.persistent`` module, for code that imports from it.

``PersistentTensorDict`` (a collection kept in an HDF5 file or a zarr store) lives in
``torchdict.formats.h5``; this module only re-exports it. It is loaded when imported, never by
``import torchdict``.
"""
from .formats.h5 import PersistentTensorDict

__all__ = ["PersistentTensorDict"]
