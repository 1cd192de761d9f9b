"""consolidate(): every tensor leaf of a TensorDict as a view into one flat byte storage.

A consolidated TensorDict moves between devices in one copy (``to(device)`` copies the
storage once and re-views it), and can be written to a file that :func:`from_consolidated`
maps back. The layout is upstream tensordict's, byte for byte, so files written by either
library load in the other:

* the tensor leaves, depth first in storage order (a level's entries in order, a nested
  collection's leaves where it stands), each as its raw bytes followed by zero padding up
  to a multiple of 8 bytes;
* in a file, then: the JSON *metadata* of the tree, then its length as a little-endian
  int64. Per level: ``{"cls", "non_tensors": {key: [data, batch, device]}, "leaves":
  {key: [dtype, shape, start, stop, pad]}, "cls_metadata": {"device", "names",
  "batch_size", "is_locked"}, <sub key>: <its level>...}``.

The result is locked (its leaves can be written in place, its keys can't change) and keeps
its state in the ``_consolidated`` slot: ``{"storage", "metadata", "count", ...}``.
:func:`is_consolidated` checks that the leaves still are the storage's views.
"""
from __future__ import annotations

import json
import os
import tempfile
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from ._apply import rebuild, tensor_leaves, unwrap
from ._base import TensorCollection
from ._future import TensorDictFuture
from .nontensor import NonTensorData, NonTensorStack
from ._unbatched import UnbatchedTensor

__all__ = ["consolidate", "is_consolidated", "from_consolidated", "to_consolidated", "ConsolidateFuture"]

_Tensor = torch.Tensor
_ALIGN = 8  # every leaf starts at a multiple of 8 bytes (upstream's padding)
_DTYPES = (torch.bfloat16, torch.bool, torch.complex128, torch.complex32, torch.complex64, torch.float16,
           torch.float32, torch.float64, torch.int16, torch.int32, torch.int64, torch.int8, torch.uint8,
           torch.uint16, torch.uint32, torch.uint64)
_DTYPE_BY_NAME = {str(dtype): dtype for dtype in _DTYPES}


# ---------------------------------------------------------------------------- the plan
class _Plan:
    """The leaves of a tree in storage order, their padded byte sizes, and the metadata."""

    __slots__ = ("leaves", "sizes", "total", "metadata")

    def __init__(self, td: Any) -> None:
        self.leaves: list = []
        self.sizes: list = []
        self.total = 0
        self.metadata = self._level(td, type(td))

    def _level(self, td: Any, cls: type) -> dict:
        level: dict = {"cls": _class_name(cls), "non_tensors": {}, "leaves": {}, "cls_metadata": _cls_metadata(td)}
        for key, value in td._tensordict.items():
            if isinstance(value, _Tensor):
                if isinstance(value, UnbatchedTensor):  # upstream's refusal (its layout has no place for one)
                    raise NotImplementedError(
                        f"UnbatchedTensor entries cannot be consolidated yet, but {key!r} is one.")
                self._add_leaf(level, key, value)
            elif isinstance(value, NonTensorData):
                level["non_tensors"][key] = (value.data, list(value.batch_size),
                                             None if value.device is None else str(value.device))
            elif type(value) is NonTensorStack:
                level["non_tensors"][key] = (value.tolist(), list(value.batch_size),
                                             None if value.device is None else str(value.device))
            elif isinstance(value, TensorCollection) and type(getattr(unwrap(value), "_tensordict", None)) is dict:
                level[key] = self._level(unwrap(value), type(value))
            else:
                raise TypeError(f"consolidate() cannot hold the entry {key!r} of type {type(value).__name__}: "
                                "call to_tensordict() on it (a lazy stack becomes a TensorDict) first.")
        return level

    def _add_leaf(self, level: dict, key: str, leaf: torch.Tensor) -> None:
        if leaf.is_nested or leaf.layout is not torch.strided:
            raise RuntimeError(f"consolidate() takes strided tensors only; the leaf {key!r} has layout {leaf.layout}.")
        if leaf.dtype not in _DTYPE_BY_NAME.values():
            raise TypeError(f"consolidate() cannot store the dtype {leaf.dtype} of the leaf {key!r}.")
        size = leaf.numel() * leaf.element_size()
        pad = -size % _ALIGN
        start = self.total
        self.total = start + size + pad
        self.leaves.append(leaf)
        self.sizes.append(size + pad)
        level["leaves"][key] = (str(leaf.dtype), list(leaf.shape), start, self.total, pad)


def _class_name(cls: type) -> str:
    # Upstream names its own classes by name and a tensorclass by str(cls).
    from .tensordict import TensorDict

    return "TensorDict" if cls is TensorDict or issubclass(cls, TensorDict) else str(cls)


def _cls_metadata(td: Any) -> dict:
    names = td._names
    return {"device": None if td._device is None else str(td._device),
            "names": list(names) if names is not None else [None] * len(td._batch_size),
            "batch_size": list(td._batch_size), "is_locked": bool(td._is_locked)}


# ---------------------------------------------------------------------------- copying
def _flat_bytes(leaf: torch.Tensor, device: torch.device, non_blocking: bool) -> torch.Tensor:
    """``leaf``'s bytes as a flat uint8 tensor on ``device`` (a copy only where needed)."""
    if leaf.device != device:
        leaf = leaf.to(device, non_blocking=non_blocking)
    if leaf.requires_grad:
        leaf = leaf.detach()
    if not leaf.is_contiguous() or (leaf.dim() and leaf.stride(-1) != 1):
        leaf = leaf.clone(memory_format=torch.contiguous_format)
    return leaf.reshape(-1).view(torch.uint8)


def _copy_leaves(plan: _Plan, storage: torch.Tensor, first: int, stop: int, offsets: list,
                 non_blocking: bool) -> None:
    """Write leaves ``first:stop`` of the plan (and their padding) into ``storage``, in one cat."""
    pieces = []
    zeros = None
    for position in range(first, stop):
        flat = _flat_bytes(plan.leaves[position], storage.device, non_blocking)
        pieces.append(flat)
        pad = plan.sizes[position] - flat.numel()
        if pad:
            if zeros is None:
                zeros = torch.zeros(_ALIGN, dtype=torch.uint8, device=storage.device)
            pieces.append(zeros[:pad])
    if pieces:
        torch.cat(pieces, out=storage[offsets[first]:offsets[stop]])


def _chunks(sizes: list, parts: int) -> list:
    """``[(first, stop)]``: the leaves cut into runs of about equal byte size."""
    total = sum(sizes)
    target = max(1, -(-total // parts))
    chunks, first, running = [], 0, 0
    for position, size in enumerate(sizes):
        running += size
        if running >= target:
            chunks.append((first, position + 1))
            first, running = position + 1, 0
    if first < len(sizes):
        chunks.append((first, len(sizes)))
    return chunks


def _views(plan: _Plan, storage: torch.Tensor) -> list:
    """One view of ``storage`` per leaf of the plan, with the leaf's dtype and shape."""
    views = []
    for chunk, leaf in zip(storage.split(plan.sizes), plan.leaves):
        view = chunk.view(leaf.dtype)
        numel = leaf.numel()
        if view.numel() != numel:
            view = view[:numel]
        views.append(view.view(leaf.shape))
    return views


def sync_transfers() -> None:
    """Wait for the copies queued so far on the current accelerator stream (not for all its work)."""
    if torch.compiler.is_compiling():
        return
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        event = torch.cuda.Event()
        event.record()
        event.synchronize()
    elif hasattr(torch, "accelerator") and torch.accelerator.is_available():
        torch.accelerator.synchronize()


# ---------------------------------------------------------------------------- consolidate
#: What ``consolidate(num_threads=n, return_early=True)`` returns (upstream's ``TensorDictFuture``):
#: ``result()`` waits for the copies and returns the consolidated collection.
ConsolidateFuture = TensorDictFuture


def consolidate(td: Any, filename: Any = None, *, num_threads: Optional[int] = 0, device: Any = None,
                non_blocking: bool = False, inplace: bool = False, return_early: bool = False,
                use_buffer: bool = False, share_memory: bool = False, pin_memory: bool = False,
                metadata: bool = False) -> Any:
    """See ``TensorDict.consolidate``."""
    if is_consolidated(td) and not _repin(td, filename, inplace, return_early, num_threads, device, pin_memory):
        return _already_consolidated(td, filename, device, share_memory)
    num_threads = num_threads or 0
    if return_early and num_threads > 1:
        if use_buffer:
            raise NotImplementedError("return_early=True is not supported with use_buffer=True in `consolidate`: "
                                      "the buffer must be written to the file once the copies are done.")
        if non_blocking:
            raise NotImplementedError("return_early=True is not supported with non_blocking=True in `consolidate`: "
                                      "the storage cannot be synchronized once the copies are done.")
    plan = _Plan(td)
    target = torch.device(device) if device is not None else None
    record: dict = {"metadata": plan.metadata if (filename is not None or metadata) else None}
    file_storage: Optional[torch.Tensor] = None
    if filename is None:
        place = target if target is not None else td._device
        storage = torch.empty(plan.total, dtype=torch.uint8, device=place, pin_memory=pin_memory)
        if share_memory and storage.device.type == "cpu":
            storage.share_memory_()
    else:
        if target is not None and target != torch.device("cpu"):
            raise RuntimeError("device and filename are mutually exclusive arguments.")
        footer = _footer(plan.metadata)
        if use_buffer:
            storage = torch.empty(plan.total, dtype=torch.uint8).share_memory_()
        else:
            file_storage = _map_file(filename, plan.total + len(footer))
            file_storage[plan.total:] = torch.frombuffer(bytearray(footer), dtype=torch.uint8)
            storage = file_storage[:plan.total]
    offsets = [0]
    for size in plan.sizes:
        offsets.append(offsets[-1] + size)
    futures: list = []
    if num_threads > 1 and len(plan.leaves) > 1 or (return_early and num_threads > 1):
        executor = ThreadPoolExecutor(num_threads)
        futures = [executor.submit(_copy_leaves, plan, storage, first, stop, offsets, non_blocking)
                   for first, stop in _chunks(plan.sizes, num_threads)]
        executor.shutdown(wait=False)
        if not return_early:
            for future in futures:
                future.result()
            futures = []
    else:
        _copy_leaves(plan, storage, 0, len(plan.leaves), offsets, non_blocking)
    if non_blocking and (target is None or target.type != "cuda") and not futures:
        sync_transfers()  # copies into host memory must be over before the host reads them
    result = _assemble(td, plan, storage, inplace, filename, target)
    record["storage"] = storage
    record["count"] = len(plan.leaves)
    if filename is not None:
        if use_buffer:
            with open(filename, "wb") as handle:
                handle.write(storage.numpy().tobytes())
                handle.write(_footer(plan.metadata))
        record["filename"] = Path(filename).resolve()
        record["file_id"] = _file_id(filename)
    unwrap(result)._consolidated = record
    unwrap(result)._lock_tree()
    if futures:
        return ConsolidateFuture(futures, result)
    return result


def _assemble(td: Any, plan: _Plan, storage: torch.Tensor, inplace: bool, filename: Any,
              target: Optional[torch.device]) -> Any:
    """The consolidated TensorDict: ``td``'s structure over the views (``td`` itself when ``inplace``)."""
    views = _views(plan, storage)
    if inplace:
        _replace_in_place(unwrap(td), iter(views))
        if filename is not None and td._device is not None and td._device.type != "cpu":
            td.clear_device_()
        return td
    if filename is not None:
        device: Any = torch.device("cpu")
    elif target is not None and td._device is not None:
        device = storage.device
    else:
        device = td._device
    inner = unwrap(td)
    result = rebuild(inner, iter(views), inner._batch_size, non_tensor=_shallow_copy, device=device)
    return td._rewrap(result) if inner is not td else result


def _shallow_copy(leaf: Any, batch_size: torch.Size) -> Any:
    # Locking the result must not lock the caller's non-tensor wrappers: a new wrapper, the same value.
    return leaf.clone(recurse=False)


def _replace_in_place(td: Any, views: Any, device: Any = None) -> None:
    """Put ``views`` in place of ``td``'s tensor leaves, in order (``device``: also set on each level)."""
    storage = td._tensordict
    if device is not None:
        td._device = device
    for key, value in storage.items():
        if isinstance(value, _Tensor):
            storage[key] = next(views)
        elif isinstance(value, TensorCollection):
            _replace_in_place(unwrap(value), views, device)


def _repin(td: Any, filename: Any, inplace: bool, return_early: bool, num_threads: Any, device: Any,
           pin_memory: bool) -> bool:
    """An already consolidated td consolidated again only to pin its storage (as upstream)."""
    storage = unwrap(td)._consolidated["storage"]
    return (pin_memory and filename is None and not inplace and not (return_early and (num_threads or 0) > 1)
            and (device is None or torch.device(device).type == "cpu") and storage.device.type == "cpu"
            and torch.accelerator.is_available() and not storage.is_pinned())


def _already_consolidated(td: Any, filename: Any, device: Any, share_memory: bool) -> Any:
    record = unwrap(td)._consolidated
    storage = record["storage"]
    if filename is not None:
        if record.get("filename") == Path(filename).resolve() and record.get("file_id") == _file_id(filename):
            _rewrite_footer(filename, record, td)
        else:
            reason = ("it has no file of its own to rewrite (it was consolidated in memory or loaded with "
                      "from_consolidated)" if record.get("filename") is None
                      else "only the file it was consolidated into is rewritten")
            warnings.warn(f"consolidate(filename={str(filename)!r}) writes nothing: the tensordict is already "
                          f"consolidated, and {reason}. Call td.contiguous().consolidate(filename=...) to write a "
                          "new file.", UserWarning, stacklevel=4)
    ignored = []
    if device is not None:
        try:
            wanted = torch.device(device)
        except (RuntimeError, TypeError):
            wanted = storage.device
        if wanted.type != storage.device.type or (
                wanted.type != "cpu" and wanted.index is not None and wanted.index != storage.device.index):
            ignored.append(f"device={str(wanted)!r}")
    if share_memory and filename is None and storage.device.type == "cpu" and not storage.is_shared():
        ignored.append("share_memory=True")
    if ignored:
        warnings.warn(f"consolidate() ignores {' and '.join(ignored)} on a tensordict that is already consolidated, "
                      "and returns it as is. Call td.contiguous().consolidate(...) to get a new consolidated "
                      "tensordict that honours them.", FutureWarning, stacklevel=4)
    return td


def is_consolidated(td: Any) -> bool:
    """True while every tensor leaf of ``td`` is still a view of the storage ``consolidate()`` made."""
    inner = unwrap(td)
    record = getattr(inner, "_consolidated", None)
    if record is None:
        return False
    leaves = tensor_leaves(inner)
    if len(leaves) != record["count"]:
        return False
    storage = record["storage"]
    if not leaves:
        return True
    # A leaf's first byte inside the storage's bytes (one data_ptr() call; building each leaf's storage
    # object to compare would cost about as much as the copy of a hundred small leaves).
    start = storage.data_ptr()
    stop = start + storage.numel() * storage.element_size()
    device = storage.device
    for leaf in leaves:
        if not start <= leaf.data_ptr() <= stop or leaf.device != device:  # (an empty leaf may sit at the end)
            return False
    return True


# ---------------------------------------------------------------------------- files
def _footer(metadata: dict) -> bytes:
    """The metadata as JSON, then its length (int64, little-endian): what follows the leaves in a file."""
    try:
        text = json.dumps(metadata).encode("utf-8")
    except TypeError as error:
        raise RuntimeError("consolidate(filename=...) writes the non-tensor entries as JSON, and one of them is "
                           f"not JSON-serializable: {error}") from error
    return text + len(text).to_bytes(8, "little", signed=True)


def _file_id(filename: Any) -> Optional[tuple]:
    try:
        stat = os.stat(filename)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino, stat.st_size


def _map_file(filename: Any, size: int) -> torch.Tensor:
    """A shared memory map of ``size`` bytes of ``filename`` (a larger file is replaced, not truncated:
    other TensorDicts may map it)."""
    path = os.fspath(filename)
    try:
        larger = os.path.getsize(path) > size
    except OSError:
        larger = False
    if larger:
        target = os.path.realpath(path)
        handle, scratch = tempfile.mkstemp(prefix=".torchdict-", dir=os.path.dirname(target) or ".")
        os.close(handle)
        os.replace(scratch, target)
    return torch.from_file(path, shared=True, size=size, dtype=torch.uint8)


def _rewrite_footer(filename: Any, record: dict, td: Any) -> None:
    """Write the current batch sizes and names into the footer of the td's own file."""
    plan_metadata = _Plan(unwrap(td)).metadata
    data_size = record["storage"].numel()
    footer = json.dumps(plan_metadata).encode("utf-8")
    room = os.path.getsize(filename) - data_size - 8
    if len(footer) > room:
        raise RuntimeError("The new metadata does not fit the file: call td.contiguous().consolidate(filename=...).")
    footer = footer.ljust(room)
    with open(filename, "r+b") as handle:
        handle.seek(data_size)
        handle.write(footer + len(footer).to_bytes(8, "little", signed=True))
    record["metadata"] = plan_metadata
    record["file_id"] = _file_id(filename)


def from_consolidated(filename: Any) -> Any:
    """The TensorDict (or tensorclass) a ``consolidate(filename=...)`` call wrote, read back.

    Its leaves are views into one copy-on-write memory map of the file: in-place writes don't
    reach the file. It is consolidated, and locked only if the original was locked when written.
    Files written by upstream tensordict load too.
    """
    size = os.path.getsize(filename)
    if size < 8:
        raise RuntimeError(f"{filename} is not a consolidated TensorDict file (it is too short).")
    mapped = torch.from_file(os.fspath(filename), shared=False, size=size, dtype=torch.uint8)
    length = int.from_bytes(bytes(mapped[-8:].tolist()), "little", signed=True)
    if length <= 0 or length > size - 8:
        raise RuntimeError(f"{filename} is not a consolidated TensorDict file (bad metadata length).")
    metadata = json.loads(bytes(mapped[size - 8 - length:size - 8].tolist()).decode("utf-8"))
    storage = mapped[:size - 8 - length]
    return _load_level(metadata, storage, parent=None)


def _load_level(metadata: dict, storage: torch.Tensor, parent: Optional[dict]) -> Any:
    from .tensordict import TensorDict

    metadata = dict(metadata)
    non_tensors = metadata.pop("non_tensors")
    leaves = metadata.pop("leaves")
    cls = _find_class(metadata.pop("cls"))
    cls_metadata = dict(metadata.pop("cls_metadata"))
    metadata.pop("size", None)
    batch_size = torch.Size(cls_metadata["batch_size"])
    device = None if cls_metadata.get("device") is None else torch.device(cls_metadata["device"])
    entries: dict = {}
    for key, (data, batch, data_device) in non_tensors.items():
        entries[key] = NonTensorData(data, torch.Size(batch),
                                     None if data_device is None else torch.device(data_device))
    count = 0
    for key, spec in leaves.items():
        dtype_name, shape, start, stop, pad = spec[:5]
        if len(spec) > 5 or key.startswith("<NJT"):
            raise RuntimeError("This consolidated file holds nested (jagged) tensors, which torchdict does not load.")
        dtype = _DTYPE_BY_NAME.get(dtype_name)
        if dtype is None:
            raise RuntimeError(f"Unknown dtype {dtype_name!r} in a consolidated file.")
        value = storage[start:stop].view(dtype)
        shape = torch.Size(shape)
        if pad:
            value = value[:shape.numel()]
        entries[key] = value.view(shape)
        count += 1
    record: dict = {"storage": storage, "metadata": None, "count": 0}
    for key, sub in metadata.items():
        entries[key] = _load_level(sub, storage, record)
    names = cls_metadata.get("names")
    if names is not None and all(name is None for name in names):
        names = None
    td = TensorDict._new_unsafe(entries, batch_size, device, list(names) if names is not None else None)
    record["count"] = len(tensor_leaves(td))
    td._consolidated = record
    if cls_metadata.get("is_locked"):
        td._lock_tree()
    if cls is not TensorDict:
        return cls._from_tensordict_unchecked(td) if hasattr(cls, "_from_tensordict_unchecked") else cls(td)
    return td


def _find_class(name: Any) -> type:
    from .tensordict import TensorDict

    if name in ("TensorDict", "TensorDictParams"):
        return TensorDict
    from ._saved_classes import _SAVED_CLASSES

    for cls in _SAVED_CLASSES.values():
        if str(cls) == name:
            return cls
    shown = str(name).removeprefix("<class '").removesuffix("'>")
    raise RuntimeError(f"Could not find the class {shown} of a consolidated tensordict. Import the module that "
                       "defines it, or define it, before loading the file.")


# ---------------------------------------------------------------------------- to(device)
def to_consolidated(td: Any, device: torch.device, non_blocking: Optional[bool], pin: bool = False,
                    inplace: bool = False) -> Any:
    """``td`` (consolidated) on ``device``: its storage copied once, the leaves re-viewed on the copy
    (``inplace=True``: into ``td`` itself, which stays consolidated and locked)."""
    inner = unwrap(td)
    record = inner._consolidated
    storage = record["storage"]
    if pin:
        storage = pin_tensor(storage)
    moved = storage.to(device, non_blocking=True)
    # One typed view of the moved bytes per dtype, then one as_strided per leaf: the leaves keep their
    # offsets and strides in the shared storage, at one cheap call each (building each view from
    # the untyped storage costs two calls with device parsing: the copy itself is cheaper than that for
    # a hundred small leaves).
    typed: dict = {}

    def view_on(leaf: torch.Tensor) -> torch.Tensor:
        dtype = leaf.dtype
        base = typed.get(dtype)
        if base is None:
            usable = moved.numel() - moved.numel() % dtype.itemsize
            base = typed[dtype] = moved[:usable].view(dtype)
        return base.as_strided(leaf.shape, leaf.stride(), leaf.storage_offset())

    views = [view_on(leaf) for leaf in tensor_leaves(inner)]
    if inplace:
        _replace_in_place(inner, iter(views), device)
        result = inner
    else:
        result = rebuild(inner, iter(views), inner._batch_size, non_tensor=_shallow_copy, device=device)
    result._consolidated = {"storage": moved, "metadata": record.get("metadata"), "count": len(views)}
    result._lock_tree()
    if not non_blocking:
        # A copy to an accelerator with non_blocking=False, or from one (the host will read the
        # result), waits for its stream; non_blocking=True never waits.
        if (device.type not in ("cpu", "meta") and non_blocking is False) or storage.device.type not in ("cpu", "meta"):
            sync_transfers()
    if inplace:
        return td
    return td._rewrap(result) if inner is not td else result


# ---------------------------------------------------------------------------- pin_memory / record_stream
#: The pinning of one tensor (tests swap in a stand-in on machines without an accelerator).
pin_tensor: Callable[[torch.Tensor], torch.Tensor] = _Tensor.pin_memory
#: ``tensor.record_stream(stream)`` (tests swap in a stand-in on machines without CUDA).
record_tensor_stream: Callable[[torch.Tensor, Any], None] = _Tensor.record_stream


def pin_memory(td: Any, num_threads: Optional[int] = None, inplace: bool = False) -> Any:
    """Every tensor leaf in page-locked memory (``inplace=True``: replaced in ``td``, returned)."""
    inner = unwrap(td)
    leaves = tensor_leaves(inner)
    pinned = _pin_all(leaves, num_threads)
    if inplace:
        if inner._is_locked:
            # As upstream: a locked TensorDict keeps its leaves (its keys, and entries, can't change).
            return td
        _replace_in_place(inner, iter(pinned))
        return td
    result = rebuild(inner, iter(pinned), inner._batch_size)
    if inner._is_locked:
        result._lock_tree()
    return td._rewrap(result) if inner is not td else result


def _pin_all(leaves: list, num_threads: Optional[int]) -> list:
    # One pinned copy per distinct tensor: a leaf held under two keys stays one tensor.
    distinct = list({id(leaf): leaf for leaf in leaves}.values())
    pin = pin_tensor
    if num_threads:
        with ThreadPoolExecutor(min(num_threads, max(len(distinct), 1))) as executor:
            copies = list(executor.map(pin, distinct))
    else:
        copies = [pin(leaf) for leaf in distinct]
    found = {id(leaf): copy for leaf, copy in zip(distinct, copies)}
    return [found[id(leaf)] for leaf in leaves]


def record_stream(td: Any, stream: Any) -> Any:
    """Mark every tensor leaf as used by ``stream`` (see ``torch.Tensor.record_stream``); returns ``td``."""
    inner = unwrap(td)
    current = getattr(inner, "_stream", None)
    if current is not None and current != stream:
        raise RuntimeError("A stream is already associated with this TensorDict instance.")
    for leaf in tensor_leaves(inner):
        record_tensor_stream(leaf, stream)
    inner._stream = stream
    return td
