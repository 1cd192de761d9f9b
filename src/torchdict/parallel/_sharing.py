"""Getting a TensorDict's leaves across a process boundary without copying their data.

Two kinds of leaves cross for free:

- **file-backed** leaves (memory-mapped files): a :class:`MemoryMappedTensor`
  pickles as its file name, dtype, shape, strides and offset, and the
  receiver maps the same file;
- **shared-memory** leaves (``tensor.share_memory_()``): torch's
  multiprocessing reductions send a handle (a file descriptor) and the
  receiver maps the same pages.

:func:`share_in_place` moves every other CPU leaf into shared memory, once
(one copy of its bytes; the tensor keeps its identity, so every view of it,
and the caller's TensorDict, see the shared pages). :func:`for_transport`
re-labels plain tensors that are views of a mapped file (what slicing a
MemoryMappedTensor with ``narrow`` gives) as MemoryMappedTensor, so that they
too pickle by file name.
"""
from __future__ import annotations

from typing import Any

import torch

from .._apply import rewrap, unwrap
from .._base import TensorCollection

_Tensor = torch.Tensor


def tensor_leaves(collection: Any) -> list:
    """Every tensor leaf of a (nested) collection, depth first."""
    found: list = []
    _collect(unwrap(collection)._tensordict, found)
    return found


def _collect(storage: dict, found: list) -> None:
    for leaf in storage.values():
        if isinstance(leaf, _Tensor):
            found.append(leaf)
        elif isinstance(leaf, TensorCollection):
            _collect(unwrap(leaf)._tensordict, found)


def _check_cpu(leaf: torch.Tensor) -> None:
    if leaf.device.type != "cpu":
        raise ValueError(
            f"map/map_iter work on CPU tensordicts: found a leaf on {leaf.device}. "
            "Move the tensordict to the CPU first (td.to('cpu'))."
        )


def is_file_backed(leaf: torch.Tensor) -> bool:
    """True for a tensor whose storage is a shared mapping of a file."""
    return leaf.untyped_storage().filename is not None and leaf.is_shared()


def is_on_disk(collection: Any) -> bool:
    """True when every tensor leaf is backed by a file (a memory-mapped TensorDict)."""
    leaves = tensor_leaves(collection)
    return bool(leaves) and all(is_file_backed(leaf) for leaf in leaves)


def share_in_place(collection: Any) -> None:
    """Move every CPU tensor leaf that is neither shared nor file-backed into shared memory.

    Costs one copy of those leaves' bytes (``Tensor.share_memory_``). The
    leaves stay the same tensor objects, so in-place writes made by worker
    processes are visible through the caller's TensorDict.
    """
    for leaf in tensor_leaves(collection):
        _check_cpu(leaf)
        if not leaf.is_shared():
            leaf.share_memory_()


def for_transport(collection: Any) -> Any:
    """A shallow copy of ``collection`` whose file-backed plain tensors are MemoryMappedTensor.

    torch's reductions cannot pickle a plain tensor that views a mapped file;
    a MemoryMappedTensor can (by file name). Returns ``collection`` itself when
    nothing needs relabelling.
    """
    inner = unwrap(collection)
    storage = _relabel(inner._tensordict)
    if storage is None:
        return collection
    return rewrap(collection, inner._new_unsafe(storage, inner._batch_size, inner._device, inner._names))


def _relabel(storage: dict) -> Any:
    """A new storage dict with file views relabelled, or None when there is none."""
    from ..memmap import MemoryMappedTensor, _MappedFile

    changed = {}
    for key, leaf in storage.items():
        if isinstance(leaf, _Tensor):
            if type(leaf) is not MemoryMappedTensor and is_file_backed(leaf):
                filename = str(leaf.untyped_storage().filename)
                changed[key] = MemoryMappedTensor._wrap(leaf.detach(), _MappedFile(filename, True))
        elif isinstance(leaf, TensorCollection):
            inner = unwrap(leaf)
            sub = _relabel(inner._tensordict)
            if sub is not None:
                changed[key] = rewrap(leaf, inner._new_unsafe(sub, inner._batch_size, inner._device, inner._names))
    if not changed:
        return None
    return {key: changed.get(key, leaf) for key, leaf in storage.items()}


def shared_empty(shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised tensor allocated directly in shared memory (no copy, unlike share_memory_)."""
    nbytes = shape.numel() * dtype.itemsize
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    storage = torch.UntypedStorage._new_shared(nbytes)
    return torch.empty(0, dtype=dtype).set_(storage).view(shape)


# ---------------------------------------------------------------------- prefaulting
# A process touching a mapped file (or shared memory) for the first time takes one
# page fault per 4 KiB page; ``madvise(MADV_POPULATE_READ/WRITE)`` (Linux >= 5.14)
# maps a whole range in one system call. For the seed's image preprocessing this
# takes ~30% off each item. Read-populating never dirties file pages; write-populating
# is only used on output slots that are about to be overwritten anyway.
_MADV_POPULATE_READ = 22
_MADV_POPULATE_WRITE = 23
_PREFAULT_MAX_BYTES = 256 << 20  # don't pull a huge range into memory ahead of use
_PAGE = 4096
_madvise: Any = None  # None: not loaded yet; False: unavailable


def _load_madvise() -> Any:
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        function = libc.madvise
        function.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        function.restype = ctypes.c_int
        return function
    except (OSError, AttributeError):
        return False


def prefault(view: torch.Tensor, *, write: bool) -> None:
    """Map the pages behind ``view`` (a shared or file-backed tensor) in one system call.

    A no-op off Linux, on kernels without MADV_POPULATE_*, for non-shared
    memory, and for spans above 256 MiB.
    """
    global _madvise
    if _madvise is False or view.numel() == 0 or not view.is_shared():
        return
    if _madvise is None:
        _madvise = _load_madvise()
        if _madvise is False:
            return
    span = 1
    for size, stride in zip(view.shape, view.stride()):
        span += (size - 1) * stride
    start = view.data_ptr()
    end = start + span * view.element_size()
    aligned = start - start % _PAGE
    if end - aligned > _PREFAULT_MAX_BYTES:
        return
    if _madvise(aligned, end - aligned, _MADV_POPULATE_WRITE if write else _MADV_POPULATE_READ) != 0:
        import ctypes
        import errno

        if ctypes.get_errno() in (errno.EINVAL, errno.ENOSYS):
            _madvise = False  # an older kernel: stop trying
