"""MemoryMappedTensor: a ``torch.Tensor`` whose bytes live in a file (or in shared memory).

The file holds the raw little-endian elements in C order, with no header; dtype and
shape are kept by the caller (``meta.json`` for a saved TensorDict). Mapping is done
by ``torch.from_file(shared=True)``, so creating or opening a tensor costs one
``open`` + ``mmap`` and no data is read until it is touched.

This module also holds the raw file helpers used by :mod:`torchdict.saving`:
writing a tensor's bytes with plain ``write`` calls (no page faults through a
fresh mapping), allocating a sparse file of a given size, and mapping an existing
file after checking it is long enough.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import torch

from ._nofollow import check_file, open_in_folder

if TYPE_CHECKING:
    from typing import SupportsIndex

__all__ = ["MemoryMappedTensor"]

# Writes of non-contiguous (e.g. expanded) tensors are made contiguous this many
# bytes at a time, so saving ``x.expand(10**6, ...)`` never materialises the whole thing.
_CHUNK_BYTES = 64 << 20
# One write() call on Linux moves at most 0x7FFFF000 bytes; the loop handles the rest.
_FILE_MODE = 0o666  # filtered by the umask, like open()


class _MappedFile:
    """Where a MemoryMappedTensor's storage comes from; shared by all its views.

    ``identity`` is the mapped file's ``(st_dev, st_ino)`` when known. A save replaces a folder
    by a new one, so a path can come to name another file than the one a tensor maps; the
    identity tells them apart (None: unknown, the path is trusted).
    """

    __slots__ = ("path", "writable", "identity", "shape")

    def __init__(self, path: str, writable: bool, identity: tuple | None = None,
                 shape: torch.Size | None = None) -> None:
        self.path = path
        self.writable = writable
        self.identity = identity
        self.shape = shape  # the shape the file was mapped as (``parent_shape`` of its views)


def _as_shape(shape: Sequence[Any]) -> torch.Size:
    """Accept ``f(2, 3)``, ``f((2, 3))``, ``f([2, 3])`` and ``f(torch.Size([2, 3]))``."""
    if len(shape) == 1 and not isinstance(shape[0], int):
        shape = shape[0]
    return torch.Size(shape)


def _nbytes(dtype: torch.dtype, shape: torch.Size) -> int:
    return shape.numel() * dtype.itemsize


def _is_view_index(index: Any) -> bool:
    """True for indices that give a view in torch: ints, slices, None, Ellipsis and tuples of them."""
    kind = index.__class__
    if kind is int or kind is slice or index is None or index is Ellipsis:
        return True
    if kind is tuple:
        for item in index:
            kind = item.__class__
            if not (kind is int or kind is slice or item is None or item is Ellipsis):
                return False
        return True
    return False


class _FileOfBase:
    """``MemoryMappedTensor._mapped_file`` of a tensor that doesn't carry one: its base's.

    The file is recorded once, on the root tensor of a mapping (the one ``torch.from_file``
    made, a fresh tensor set on a shared storage, or the plain alias ``td[i]`` indexes, see
    ``plain_alias``); every view of it, and every view of those, has that root as ``_base`` (torch keeps a tensor subclass's Python object alive
    while views use it). So making a view, the hot path of reading a dataset item by item,
    only relabels its class and stores nothing. An anonymous (shared memory) tensor has
    no file anywhere: None. A non-data descriptor: a value in the instance dict wins.
    """

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        if instance is None:
            return self
        base = instance._base
        return None if base is None else getattr(base, "_mapped_file", None)


class MemoryMappedTensor(torch.Tensor):
    """A tensor backed by a file, or by anonymous shared memory when no file is given.

    Writes go straight to the file (``MAP_SHARED``). Integer and slice indexing return
    MemoryMappedTensor views of the same file; advanced indexing, arithmetic and every
    other op return plain tensors. A file-backed tensor pickles as its file name, dtype,
    shape, strides and offset, so sending it to another process copies no data.

    Example:
        >>> import tempfile, os
        >>> folder = tempfile.mkdtemp()
        >>> mmt = MemoryMappedTensor.zeros(3, 4, filename=os.path.join(folder, "x.memmap"))
        >>> mmt[1] = 7
        >>> row = mmt[1]
        >>> type(row).__name__, row.tolist()
        ('MemoryMappedTensor', [7.0, 7.0, 7.0, 7.0])
        >>> type(mmt + 1).__name__
        'Tensor'
    """

    # Ops on the subclass run at plain-tensor speed and return plain tensors; the only
    # results turned back into MemoryMappedTensor are basic-index views (see __getitem__).
    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]  # torch's idiom

    _mapped_file = _FileOfBase()

    # ------------------------------------------------------------------ wrapping
    @classmethod
    def _wrap(cls, tensor: torch.Tensor, mapped_file: _MappedFile | None) -> "MemoryMappedTensor":
        """``tensor`` (which the caller may still hold) seen as a MemoryMappedTensor, sharing its memory.

        With a file, the result is a new root tensor on the same storage (not a view of
        ``tensor``), so that it can carry the file for its own views (see _FileOfBase).
        """
        if mapped_file is None:
            return tensor.as_subclass(cls)
        root = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
        root.set_(tensor.untyped_storage(), tensor.storage_offset(), tensor.shape, tensor.stride())
        return _adopt(root, mapped_file)

    def __getitem__(self, index: Any) -> torch.Tensor:
        result = _tensor_getitem(self, index)
        kind = index.__class__
        if kind is int or kind is slice or _is_view_index(index):
            # ``result`` is a fresh view that nothing else references: relabel it in place
            # instead of creating a second alias with as_subclass (td[i] does this per leaf).
            # Its file is found through its base (_FileOfBase): nothing to store.
            result.__class__ = MemoryMappedTensor
        return result

    # ------------------------------------------------------------------ properties
    @property
    def filename(self) -> str:
        """The path of the backing file.

        Raises ``RuntimeError`` for a tensor in anonymous shared memory.
        """
        mapped_file = self._mapped_file
        if mapped_file is None:
            raise RuntimeError("The MemoryMappedTensor has no file associated.")
        return mapped_file.path

    def _has_file(self) -> bool:
        return self._mapped_file is not None

    @property
    def parent_shape(self) -> torch.Size:
        """The shape of the whole tensor this one is a view of (as mapped or created); deprecated, as upstream.

        Example:
            >>> import warnings
            >>> with warnings.catch_warnings():
            ...     warnings.simplefilter("ignore")
            ...     MemoryMappedTensor.zeros(4, 3)[1:3].parent_shape
            torch.Size([4, 3])
        """
        import warnings

        warnings.warn("MemoryMappedTensor.parent_shape is deprecated and will be removed in TensorDict 0.17.",
                      DeprecationWarning, stacklevel=2)
        mapped_file = self._mapped_file
        if mapped_file is not None and mapped_file.shape is not None:
            return mapped_file.shape
        base = self._base
        return self.shape if base is None else base.shape

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_tensor(
        cls,
        input: torch.Tensor,
        *,
        filename: str | os.PathLike | None = None,
        existsok: bool = False,
        copy_existing: bool = False,
        copy_data: bool = True,
        shape: Sequence[int] | None = None,
    ) -> "MemoryMappedTensor":
        """A MemoryMappedTensor holding a copy of ``input``.

        With ``filename=None`` the data goes to anonymous shared memory. With a file name,
        the bytes are written with plain file writes, then the file is mapped.
        ``copy_data=False`` only allocates (a sparse, zero-filled file). ``shape``
        broadcasts ``input`` to a larger shape.

        ``input`` is returned unchanged when it already lives where it is asked to
        (same file, or both anonymous). A file-backed ``input`` is only copied to a
        different file with ``copy_existing=True``.

        Example:
            >>> MemoryMappedTensor.from_tensor(torch.arange(3)).tolist()
            [0, 1, 2]
        """
        if not isinstance(input, torch.Tensor):
            raise TypeError(
                f"MemoryMappedTensor.from_tensor expects a torch.Tensor, got {type(input).__name__}. "
                "Convert it with torch.as_tensor first."
            )
        path = None if filename is None else os.fspath(filename)
        if isinstance(input, MemoryMappedTensor):
            source_file = input._mapped_file
            if path is None and source_file is None:
                return input
            if path is not None and source_file is not None:
                same = os.path.abspath(path) == os.path.abspath(source_file.path)
                if same and source_file.writable:
                    return input
                if not same and not copy_existing:
                    raise RuntimeError(
                        f"A filename was provided ({path}) but the tensor already has a file "
                        f"associated ({source_file.path}). To copy the tensor onto the new "
                        "location, pass copy_existing=True."
                    )
        if input.requires_grad:
            raise RuntimeError("MemoryMappedTensor.from_tensor is incompatible with tensor.requires_grad.")
        _check_storable(input, "input")
        target_shape = input.shape if shape is None else _as_shape(tuple(shape))
        source = input if shape is None else input.expand(target_shape)
        if path is None:
            result = _anonymous(input.dtype, target_shape)
            if copy_data:
                result.copy_(source)
            return result
        if copy_data:
            written = write_tensor_file(path, source, existsok=existsok)
        else:
            written = allocate_file(path, _nbytes(input.dtype, target_shape), existsok=existsok)
        return map_file(path, input.dtype, target_shape, written=written)

    @classmethod
    def from_filename(
        cls,
        filename: str | os.PathLike,
        dtype: torch.dtype,
        shape: Sequence[int],
        index: Any = None,
        mode: str | None = None,
    ) -> torch.Tensor:
        """Map an existing file holding raw elements of ``dtype`` in C order.

        ``mode`` is ``"r+"`` (writes go to the file), ``"r"`` (a private copy-on-write mapping,
        which also works on read-only files) or None (the default: ``"r+"`` when the file can be
        written, else ``"r"``). The file must hold
        at least the bytes the shape needs; extra trailing bytes are ignored.

        Example:
            >>> import tempfile, os
            >>> path = os.path.join(tempfile.mkdtemp(), "x.memmap")
            >>> _ = MemoryMappedTensor.from_tensor(torch.arange(6), filename=path)
            >>> MemoryMappedTensor.from_filename(path, torch.int64, [2, 3])[1].tolist()
            [3, 4, 5]
        """
        path = os.fspath(filename)
        if mode is None:  # as upstream: shared when the file can be written, copy-on-write otherwise
            mode = "r+" if os.access(path, os.W_OK) or not os.path.exists(path) else "r"
        result: torch.Tensor = map_file(path, dtype, torch.Size(shape), mode=mode)
        if index is not None:
            result = result[index]
        return result

    @classmethod
    def empty(cls, *size: Any, shape: Any = None, dtype: torch.dtype | None = None, device: Any = None,
              filename: str | os.PathLike | None = None, existsok: bool = False) -> "MemoryMappedTensor":
        """An uninitialised MemoryMappedTensor (new files and shared memory read as zeros).

        The shape is given as ints (``empty(2, 3)``), as one sequence (``empty((2, 3))``) or as the
        ``shape=`` keyword. ``device`` may only be ``None`` or the CPU. ``dtype`` defaults to
        ``torch.get_default_dtype()``.

        Example:
            >>> MemoryMappedTensor.empty(2, 3).shape, MemoryMappedTensor.empty(shape=[4]).shape
            (torch.Size([2, 3]), torch.Size([4]))
        """
        return _allocate(_shape_argument("empty", size, shape), dtype, filename, existsok, device)

    @classmethod
    def zeros(cls, *size: Any, shape: Any = None, dtype: torch.dtype | None = None, device: Any = None,
              filename: str | os.PathLike | None = None, existsok: bool = False) -> "MemoryMappedTensor":
        """A zero-filled MemoryMappedTensor; a new file is allocated sparsely, never written.

        Takes the shape and keywords of :meth:`empty`.

        Example:
            >>> MemoryMappedTensor.zeros((2,), dtype=torch.int32).tolist()
            [0, 0]
        """
        target = _shape_argument("zeros", size, shape)
        path = None if filename is None else os.fspath(filename)
        reused = path is not None and existsok and os.path.exists(path)
        result = _allocate(target, dtype, path, existsok, device)
        if reused:
            result.zero_()  # an existing file keeps its old bytes through ftruncate
        return result

    @classmethod
    def ones(cls, *size: Any, shape: Any = None, dtype: torch.dtype | None = None, device: Any = None,
             filename: str | os.PathLike | None = None, existsok: bool = False) -> "MemoryMappedTensor":
        """A MemoryMappedTensor filled with ones; takes the shape and keywords of :meth:`empty`.

        Example:
            >>> MemoryMappedTensor.ones(2).tolist()
            [1.0, 1.0]
        """
        result = _allocate(_shape_argument("ones", size, shape), dtype, filename, existsok, device)
        result.fill_(1)
        return result

    @classmethod
    def full(cls, *size: Any, fill_value: Any, shape: Any = None, dtype: torch.dtype | None = None,
             device: Any = None, filename: str | os.PathLike | None = None,
             existsok: bool = False) -> "MemoryMappedTensor":
        """A MemoryMappedTensor filled with ``fill_value`` (keyword-only, as in upstream).

        Takes the shape and keywords of :meth:`empty`; as there, ``dtype`` defaults to
        ``torch.get_default_dtype()`` whatever the type of ``fill_value`` (upstream does the same,
        where ``torch.full`` would infer it).

        Example:
            >>> MemoryMappedTensor.full((2,), fill_value=5, dtype=torch.int64).tolist()
            [5, 5]
        """
        result = _allocate(_shape_argument("full", size, shape), dtype, filename, existsok, device)
        result.fill_(fill_value)
        return result

    @classmethod
    def from_storage(cls, storage: Any, *, shape: Any = None, dtype: torch.dtype | None = None,
                     device: Any = None, index: Any = None, filename: str | os.PathLike | None = None,
                     handler: Any = None) -> torch.Tensor:
        """A MemoryMappedTensor viewing ``storage`` (an ``UntypedStorage`` or a ``TypedStorage``); nothing is copied.

        ``dtype`` reads the bytes as that dtype: an untyped storage defaults to ``torch.int64`` and a
        typed storage to its own dtype, which (as in upstream) must then be the default dtype. ``shape``
        views the result (1-d by default), ``index`` indexes it. The file is the storage's own
        (``UntypedStorage.from_file``) or ``filename``; a storage with a file of its own refuses a
        different ``filename``. ``handler`` is accepted for upstream's pickles and kept alive with the
        tensor.

        Example:
            >>> storage = torch.arange(6.0).untyped_storage()
            >>> MemoryMappedTensor.from_storage(storage, dtype=torch.float32, shape=(2, 3))[1].tolist()
            [3.0, 4.0, 5.0]
        """
        own_file = getattr(storage, "filename", None)
        if own_file is not None:
            if filename is None:
                filename = own_file
            elif os.fspath(filename) != os.fspath(own_file):
                raise RuntimeError(
                    "The storage is mapped from the file "
                    f"{own_file}, which differs from filename={os.fspath(filename)}: pass filename=None to "
                    "keep the storage's own file."
                )
        if device is not None and torch.device(device).type != "cpu":
            raise RuntimeError("Only CPU tensors are supported.")
        flat = _storage_view(storage, dtype)
        if shape is not None:
            flat = flat.view(_as_shape((shape,)) if not isinstance(shape, int) else torch.Size([shape]))
        mapped_file = None
        if filename is not None:
            path = os.fspath(filename)
            mapped_file = _MappedFile(path, True, _identity_or_none(path))
        result = cls._wrap(flat, mapped_file)
        if handler is not None:
            result.__dict__["_handler"] = handler
        return result if index is None else result[index]

    @classmethod
    def from_handler(cls, handler: Any, dtype: torch.dtype, shape: Any, index: Any = None) -> torch.Tensor:
        """A MemoryMappedTensor over the shared-memory buffer of ``handler`` (an object with a ``buffer``).

        Upstream 0.14 pickled anonymous MemoryMappedTensors as such a handler; this rebuilds them.
        The buffer is viewed, not copied, and kept alive with the tensor.

        Example:
            >>> import mmap
            >>> class Handler:
            ...     buffer = mmap.mmap(-1, 16)
            >>> MemoryMappedTensor.from_handler(Handler(), torch.int32, (2, 2)).tolist()
            [[0, 0], [0, 0]]
        """
        if isinstance(shape, torch.Tensor):
            raise TypeError("MemoryMappedTensor.from_handler: nested shapes (a tensor of shapes) are not supported.")
        flat = torch.frombuffer(memoryview(handler.buffer), dtype=dtype)
        result = cls._wrap(flat.reshape(torch.Size(shape)), None)
        result.__dict__["_handler"] = handler
        return result if index is None else result[index]

    @classmethod
    def empty_like(cls, input: torch.Tensor, *, filename: str | os.PathLike | None = None) -> "MemoryMappedTensor":
        """Same shape and dtype as ``input``, uninitialised (zeros for new storage)."""
        return cls.empty(input.shape, dtype=input.dtype, filename=filename)

    @classmethod
    def zeros_like(cls, input: torch.Tensor, *, filename: str | os.PathLike | None = None) -> "MemoryMappedTensor":
        """Same shape and dtype as ``input``, filled with zeros."""
        return cls.zeros(input.shape, dtype=input.dtype, filename=filename)

    @classmethod
    def ones_like(cls, input: torch.Tensor, *, filename: str | os.PathLike | None = None) -> "MemoryMappedTensor":
        """Same shape and dtype as ``input``, filled with ones."""
        return cls.ones(input.shape, dtype=input.dtype, filename=filename)

    @classmethod
    def full_like(cls, input: torch.Tensor, fill_value: Any, *,
                  filename: str | os.PathLike | None = None) -> "MemoryMappedTensor":
        """Same shape and dtype as ``input``, filled with ``fill_value``."""
        return cls.full(input.shape, fill_value=fill_value, dtype=input.dtype, filename=filename)

    # ------------------------------------------------------------------ pickling
    def __reduce_ex__(self, protocol: SupportsIndex) -> tuple:
        mapped_file = self._mapped_file
        if mapped_file is None:
            # Anonymous memory: let whatever pickler is running handle the plain tensor.
            # torch.multiprocessing shares the storage; plain pickle copies the data.
            return (_rebuild_anonymous, (self.as_subclass(torch.Tensor),))
        return (
            _rebuild_from_file,
            (
                mapped_file.path,
                mapped_file.writable,
                self.dtype,
                self.untyped_storage().nbytes(),
                tuple(self.shape),
                tuple(self.stride()),
                self.storage_offset(),
            ),
        )

    def __deepcopy__(self, memo: dict) -> "MemoryMappedTensor":
        # A deep copy must not alias the file; it lands in anonymous shared memory.
        result = _anonymous(self.dtype, self.shape)
        result.copy_(self)
        memo[id(self)] = result
        return result


_tensor_getitem = torch.Tensor.__getitem__

# --------------------------------------------------------------------- plain alias (td[i] speed)
# Indexing a tensor subclass costs torch a ``__torch_function__`` lookup by a fresh name string
# (~1.2k instructions, more than the rest of ``leaf[i]``'s Python side). ``td[i]`` reads a
# memory-mapped dataset item by item, so it indexes a cached plain-Tensor view of each leaf
# instead, and relabels the result. The cache lives in the leaf's ``__dict__`` and is dropped
# by every method that changes the leaf's layout, storage or autograd state in place.
PLAIN_ALIAS = "_plain_alias"


def plain_alias(mmt: MemoryMappedTensor) -> Any:
    """The plain tensor over ``mmt``'s memory that ``td[i]`` indexes (cached), or False when
    there is none (a root tensor that requires grad).

    A view of a view hangs on the root, not on ``mmt``, so ``mmt`` gets a plain view. A root
    can't: the view would hold it, and so its Python object would hold itself through its
    ``__dict__`` (a cycle the garbage collector can't see through torch). It gets a tensor
    set on its storage instead, which shares the memory but not the tensor, and so carries no
    autograd history (hence none for a root that requires grad)."""
    alias = mmt.__dict__.get(PLAIN_ALIAS)
    if alias is None:
        if mmt._base is not None:
            alias = torch.Tensor.as_subclass(mmt, torch.Tensor)
        elif mmt.requires_grad:
            alias = False
        else:
            alias = torch.empty((0,), dtype=mmt.dtype, device=mmt.device).set_(
                mmt.untyped_storage(), mmt.storage_offset(), mmt.size(), mmt.stride())
            # Views of the alias have it as _base, where _FileOfBase looks for the file.
            setattr(alias, "_mapped_file", mmt._mapped_file)  # a plain tensor: an attribute of its own
        mmt.__dict__[PLAIN_ALIAS] = alias
    return alias


def _forgetting_alias(name: str) -> Callable:
    inherited = getattr(torch.Tensor, name)

    def method(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        self.__dict__.pop(PLAIN_ALIAS, None)
        return inherited(self, *args, **kwargs)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"``torch.Tensor.{name}``, which also drops the plain alias ``td[i]`` indexes."
    return method


def _property_forgetting_alias(descriptor: Any) -> property:
    def setter(self: torch.Tensor, value: Any) -> None:
        self.__dict__.pop(PLAIN_ALIAS, None)
        descriptor.__set__(self, value)

    return property(descriptor.__get__, setter,
                    doc=f"``torch.Tensor.{descriptor.__name__}``; setting it drops the plain alias ``td[i]`` indexes.")


for _name in ("set_", "resize_", "resize_as_", "as_strided_", "squeeze_", "unsqueeze_", "transpose_", "t_",
              "swapdims_", "swapaxes_", "share_memory_", "requires_grad_", "detach_"):
    setattr(MemoryMappedTensor, _name, _forgetting_alias(_name))
# Properties replacing torch's attributes of the same name.
setattr(MemoryMappedTensor, "data", _property_forgetting_alias(torch._C.TensorBase.data))
setattr(MemoryMappedTensor, "requires_grad", _property_forgetting_alias(torch._C.TensorBase.requires_grad))


def _adopt(fresh: torch.Tensor, mapped_file: _MappedFile | None) -> MemoryMappedTensor:
    """Turn ``fresh``, a plain tensor this module has just created, into a MemoryMappedTensor.

    Assigning ``__class__`` costs ~0.1 µs where ``as_subclass`` builds a second tensor
    (~1 µs). Only for tensors no caller holds: the relabelling is visible to every holder.
    """
    fresh.__class__ = MemoryMappedTensor
    if mapped_file is not None:
        setattr(fresh, "_mapped_file", mapped_file)  # its class is MemoryMappedTensor now
    return fresh  # type: ignore[return-value]


def _rebuild_from_file(path: str, writable: bool, dtype: torch.dtype, storage_nbytes: int,
                       shape: tuple, stride: tuple, offset: int) -> MemoryMappedTensor:
    base = map_file(path, dtype, torch.Size([storage_nbytes // dtype.itemsize]),
                    mode="r+" if writable else "r")
    return _adopt(torch.Tensor.as_strided(base, shape, stride, offset), None)  # a view: the file is base's


def _rebuild_anonymous(tensor: torch.Tensor) -> MemoryMappedTensor:
    if not tensor.is_shared():
        tensor = tensor.share_memory_()
    return MemoryMappedTensor._wrap(tensor, None)


# ---------------------------------------------------------------------- raw helpers
_STRIDED = torch.strided


def _check_storable(tensor: torch.Tensor, key: object) -> None:
    """Refuse tensors that have no flat byte representation."""
    if tensor.layout is _STRIDED and not (tensor.is_nested or tensor.is_quantized or tensor.is_meta):
        return  # the common case in three cheap checks (``device.type`` builds a string)
    if tensor.layout is not torch.strided:
        raise TypeError(
            f"Cannot memory-map {key!r}: only strided (dense) tensors can be stored, got layout "
            f"{tensor.layout}. Convert it with .to_dense() first."
        )
    if tensor.is_nested:
        raise TypeError(f"Cannot memory-map {key!r}: nested tensors are not supported; pad them first.")
    if tensor.is_quantized:
        raise TypeError(f"Cannot memory-map {key!r}: quantized tensors are not supported.")
    if tensor.device.type == "meta":
        raise TypeError(f"Cannot memory-map {key!r}: it is on the meta device and has no data.")


def _anonymous(dtype: torch.dtype, shape: torch.Size) -> MemoryMappedTensor:
    """Zero-filled shared memory (no file), as a MemoryMappedTensor."""
    storage = torch.UntypedStorage._new_shared(_nbytes(dtype, shape))
    flat = torch.empty(0, dtype=dtype).set_(storage, 0, shape, _contiguous_strides(shape))
    return _adopt(flat, None)


def _contiguous_strides(shape: torch.Size) -> tuple:
    strides = []
    running = 1
    for size in reversed(shape):
        strides.append(running)
        running *= max(size, 1)
    return tuple(reversed(strides))


def _allocate(shape: torch.Size, dtype: torch.dtype | None, filename: Any, existsok: bool,
              device: Any = None) -> MemoryMappedTensor:
    if device is not None and torch.device(device).type != "cpu":
        raise RuntimeError("Only CPU tensors are supported.")
    dtype = torch.get_default_dtype() if dtype is None else dtype
    if any(size < 0 for size in shape):
        raise RuntimeError(f"Trying to create a MemoryMappedTensor with negative dimension in {list(shape)}.")
    if filename is None:
        return _anonymous(dtype, shape)
    path = os.fspath(filename)
    written = allocate_file(path, _nbytes(dtype, shape), existsok=existsok)
    return map_file(path, dtype, shape, written=written)


def _shape_argument(method: str, size: tuple, shape: Any) -> torch.Size:
    """The shape of ``empty`` / ``zeros`` / ``ones`` / ``full``: ints, one sequence, or ``shape=``."""
    if size and shape is not None:
        raise TypeError(f"MemoryMappedTensor.{method}() got the shape both as arguments and as shape=.")
    if not size:
        if shape is None:
            raise TypeError("Could not find the shape argument in the arguments.")
        size = (shape,)
    if len(size) == 1 and isinstance(size[0], torch.Tensor) and not isinstance(size[0], torch.Size):
        if size[0].dim() > 1:
            raise TypeError(f"MemoryMappedTensor.{method}(): nested shapes (a 2-d tensor of shapes) are not "
                            "supported; torchdict stores strided tensors only.")
        size = (tuple(size[0].tolist()),)
    return _as_shape(size)


def _storage_view(storage: Any, dtype: torch.dtype | None) -> torch.Tensor:
    """A 1-d tensor over all of ``storage``'s bytes, read as ``dtype``."""
    if isinstance(storage, torch.TypedStorage):
        if dtype is None and storage.dtype != torch.get_default_dtype():
            raise RuntimeError(
                f"Expected a Storage of type {str(torch.get_default_dtype()).split('.')[-1].capitalize()} "
                f"or an UntypedStorage, but got {str(storage.dtype).split('.')[-1].capitalize()}"
            )
        dtype = storage.dtype if dtype is None else dtype
        storage = storage.untyped()
    elif not isinstance(storage, torch.UntypedStorage):
        raise TypeError(f"MemoryMappedTensor.from_storage expects a torch storage, got {type(storage).__name__}.")
    dtype = torch.int64 if dtype is None else dtype
    if storage.device.type != "cpu":
        raise RuntimeError("Only CPU tensors are supported.")
    count = storage.nbytes() // dtype.itemsize
    return torch.empty(0, dtype=dtype).set_(storage, 0, (count,), (1,))


def _identity_or_none(path: str) -> tuple | None:
    try:
        return _identity(os.stat(path))
    except OSError:
        return None


_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT


def _identity(info: os.stat_result) -> tuple:
    return (info.st_dev, info.st_ino)


def file_identity(tensor: torch.Tensor) -> tuple | None:
    """``(st_dev, st_ino)`` of the file ``tensor`` maps, or None (not file-backed, or gone)."""
    mapped_file = getattr(tensor, "_mapped_file", None)
    if mapped_file is None:
        return None
    if mapped_file.identity is not None:
        return mapped_file.identity
    try:
        return _identity(os.stat(mapped_file.path))  # recorded without one: trust the path
    except OSError:
        return None


def _open_for_write(path: str, existsok: bool, source: tuple | None = None) -> int:
    """Open ``path`` for writing without following a symlink there.

    An existing file is rewritten in place (the page cache keeps its pages: 2-3x faster than a
    new file), except when that would change data seen through another name: a file with other
    hard links (a save links unchanged files into the folder that replaces the old one), or the
    very file ``source`` (the identity of the file the data is read from) maps. Such a file is
    replaced by a new one; the other names, and mappings of it, keep the old data.
    """
    flags = _WRITE_FLAGS if existsok else _WRITE_FLAGS | os.O_EXCL
    try:
        fd = open_in_folder(path, flags, _FILE_MODE, writing=True)
    except FileExistsError:
        raise RuntimeError(f"The file {path} already exists.") from None
    if existsok:
        info = os.fstat(fd)
        if info.st_nlink > 1 or (source is not None and source == _identity(info)):
            os.close(fd)
            os.unlink(path)
            fd = open_in_folder(path, flags | os.O_EXCL, _FILE_MODE, writing=True)
    return fd


def allocate_file(path: str, nbytes: int, *, existsok: bool = True) -> tuple:
    """Create (or resize) ``path`` to exactly ``nbytes`` bytes without writing them; returns its identity.

    ``ftruncate`` leaves a sparse file: the blocks are only allocated when written,
    so allocating a 50 GB dataset takes microseconds and no disk space.
    """
    fd = _open_for_write(path, existsok)
    try:
        os.ftruncate(fd, nbytes)
        return _identity(os.fstat(fd))
    finally:
        os.close(fd)


def _byte_view(tensor: torch.Tensor) -> memoryview:
    """A zero-copy byte view of a contiguous CPU tensor's memory."""
    import ctypes

    nbytes = tensor.numel() * tensor.element_size()
    buffer = (ctypes.c_char * nbytes).from_address(tensor.data_ptr())
    return memoryview(buffer).cast("B")


def _write_all(fd: int, tensor: torch.Tensor) -> None:
    if tensor.numel() == 0:
        return
    view = _byte_view(tensor)
    written = 0
    total = len(view)
    while written < total:
        written += os.write(fd, view[written:])


def write_tensor_file(path: str, tensor: torch.Tensor, *, existsok: bool = True) -> tuple:
    """Write ``tensor``'s elements (C order, native little-endian) to ``path`` with plain writes.

    A contiguous CPU tensor is written straight from its memory; anything else
    (strided, expanded, conjugated, on another device) is made contiguous one chunk
    of the leading dimension at a time, so memory use stays bounded. Returns the
    written file's identity (see :class:`_MappedFile`).
    """
    tensor = tensor.detach()
    if tensor.is_conj():
        tensor = tensor.resolve_conj()
    if tensor.is_neg():
        tensor = tensor.resolve_neg()
    # Writing a file from a mapping of that same file would read bytes already overwritten:
    # _open_for_write gives such a tensor a new file.
    fd = _open_for_write(path, existsok, file_identity(tensor))
    try:
        nbytes = tensor.numel() * tensor.element_size()
        if tensor.device.type == "cpu" and tensor.is_contiguous():
            _write_all(fd, tensor)
        elif tensor.dim() == 0 or nbytes <= _CHUNK_BYTES:
            _write_all(fd, tensor.to("cpu").contiguous())
        else:
            row_bytes = max(nbytes // tensor.shape[0], 1)
            rows_per_chunk = max(_CHUNK_BYTES // row_bytes, 1)
            for start in range(0, tensor.shape[0], rows_per_chunk):
                _write_all(fd, tensor[start:start + rows_per_chunk].to("cpu").contiguous())
        # Cut off the tail of a longer file that was there before.
        os.ftruncate(fd, nbytes)
        return _identity(os.fstat(fd))
    finally:
        os.close(fd)


def tensor_byte_chunks(tensor: torch.Tensor, chunk_bytes: int = 16 << 20) -> Iterator[memoryview]:
    """``tensor``'s elements (C order, native little-endian) as byte views of at most about ``chunk_bytes``.

    What :func:`write_tensor_file` writes, for writers that stream (an archive entry): a contiguous CPU
    tensor is viewed in place; anything else is made contiguous a few rows at a time.
    """
    tensor = tensor.detach()
    if tensor.is_conj():
        tensor = tensor.resolve_conj()
    if tensor.is_neg():
        tensor = tensor.resolve_neg()
    nbytes = tensor.numel() * tensor.element_size()
    if nbytes == 0:
        return
    if tensor.device.type == "cpu" and tensor.is_contiguous():
        pieces: Iterator[torch.Tensor] = iter((tensor,))
    elif tensor.dim() == 0 or nbytes <= chunk_bytes:
        pieces = iter((tensor.to("cpu").contiguous(),))
    else:
        rows = max(chunk_bytes // max(nbytes // tensor.shape[0], 1), 1)
        pieces = (tensor[start:start + rows].to("cpu").contiguous() for start in range(0, tensor.shape[0], rows))
    for piece in pieces:
        view = _byte_view(piece)
        for start in range(0, len(view), chunk_bytes):
            yield view[start:start + chunk_bytes]


def write_bytes_file(path: str, data: bytes) -> None:
    """Write ``data`` as the whole content of ``path`` (a pickled value), as write_tensor_file writes."""
    fd = _open_for_write(path, True)
    try:
        written = 0
        while written < len(data):
            written += os.write(fd, data[written:])
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


def map_file(path: str, dtype: torch.dtype, shape: torch.Size, *, mode: str = "r+",
             written: tuple | None = None, shown_path: str | None = None,
             in_saved_folder: bool = False) -> MemoryMappedTensor:
    """Map an existing file as a MemoryMappedTensor of ``dtype`` and ``shape``.

    The file must hold at least the bytes the shape needs (``torch.from_file`` would
    otherwise silently grow it, hiding a truncated file); extra bytes are ignored.
    ``written`` is the identity of a file this process has just written at that size: the
    size check is skipped. ``shown_path`` is the path the tensor reports (a save writes a
    file beside its final place, then moves it there). ``in_saved_folder=True`` refuses a
    symlink or a non-regular file at ``path`` (loading a saved folder). ``mode="r"`` maps
    copy-on-write: writes stay in this process.
    """
    if mode not in ("r", "r+"):
        raise ValueError(f"mode must be 'r' or 'r+', got {mode!r}.")
    needed = _nbytes(dtype, shape)
    if written is None:
        info = check_file(path, writing=False) if in_saved_folder else os.stat(path)
        written = _identity(info)
        size = info.st_size
        if size < needed:
            raise RuntimeError(
                f"The file {path} holds {size} bytes but {len(shape)}-dim {dtype} data of shape "
                f"{list(shape)} needs {needed} bytes: the file is truncated (was its save interrupted?)."
            )
    writable = mode == "r+"
    mapped_file = _MappedFile(path if shown_path is None else shown_path, writable, written, shape)
    if needed == 0:
        return _adopt(torch.empty(shape, dtype=dtype), mapped_file)
    root = _adopt(torch.from_file(path, shared=writable, size=needed // dtype.itemsize, dtype=dtype), mapped_file)
    if len(shape) == 1:
        return root
    # view(*ints) parses much faster than view(torch.Size); this runs once per leaf on load.
    # The view finds the file through its base, the root (see _FileOfBase).
    return _adopt(torch.Tensor.view(root, *shape) if shape else torch.Tensor.view(root, ()), None)
