"""Readers and writers for the file formats users keep their data in (HDF5, zarr, safetensors, Arrow, archives...).

Each format lives in its own module here and imports its third-party library only inside the functions that
need it, so importing this package costs nothing and pulls in no optional dependency. Nothing is imported
eagerly on purpose: the methods on every collection (``to_h5``, ``from_zarr``, ...) reach the modules on first use.
"""
