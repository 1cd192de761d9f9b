"""``TensorDict.from_schema``: a zero-filled collection from ``{key: (element shape, dtype)}``, stored where
``storage`` says (in memory, memory-mapped files, shared memory, an HDF5 file, a zarr store, a key-value server).

Every backend but the plain one is given a zero-stride source (one zero expanded to each entry's shape), so a
large buffer on disk or on a server is created without building it in memory first.
"""
from __future__ import annotations

from typing import Any, Dict, Literal, Optional, Sequence, Tuple

import torch

__all__ = ["from_schema", "STORAGES"]

STORAGES: tuple = (None, "memmap", "h5", "zarr", "shared", "redis", "dragonfly")
Schema = Dict[Any, Tuple[Sequence[int], torch.dtype]]


def from_schema(schema: Schema, batch_size: Any, storage: Optional[str], device: Any, kwargs: dict) -> Any:
    """See ``TensorDict.from_schema``."""
    from .tensordict import TensorDict

    batch = torch.Size(()) if batch_size is None else torch.Size(batch_size)
    if storage not in STORAGES:
        raise ValueError(f"Unknown storage backend {storage!r}. Expected one of None, 'memmap', 'h5', 'zarr', "
                         "'shared', 'redis', 'dragonfly'.")
    if storage in ("redis", "dragonfly"):
        from .store import TensorDictStore

        backend: Literal["redis", "dragonfly"] = "redis" if storage == "redis" else "dragonfly"
        return TensorDictStore.from_schema(schema, batch_size=batch, backend=backend, device=device, **kwargs)
    if storage is None or storage == "shared":
        zeros = {key: torch.zeros((*batch, *shape), dtype=dtype, device=device) for key, (shape, dtype) in schema.items()}
        result = TensorDict(zeros, batch_size=batch, device=device)
        return result.share_memory_() if storage == "shared" else result
    template = TensorDict({key: torch.zeros((), dtype=dtype).expand((*batch, *shape))
                           for key, (shape, dtype) in schema.items()}, batch_size=batch)
    if storage == "memmap":
        return template.memmap_like(kwargs.pop("prefix", None), **kwargs)
    from .formats.h5 import PersistentTensorDict

    return PersistentTensorDict.from_dict(template, kwargs.pop("filename"), batch_size=batch, device=device,
                                          backend=storage, **kwargs)
