"""The persistence members of TensorDict: ``memmap`` / ``memmap_`` / ``memmap_like`` / ``save`` / ``load_memmap`` /
``load`` and the members around them (``load_memmap_``, ``memmap_refresh_``, ``make_memmap*``, ``pack``, ...).

Each member is a thin front over the engines: :mod:`torchdict.saving` plans and writes a save,
:mod:`torchdict._loading` loads one, :mod:`torchdict._memmap_members` holds the in-place members.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ._base import tensordict_class
from .memmap import MemoryMappedTensor
from .saving import _load_memmap, save_collection

if TYPE_CHECKING:
    from ._host import TensorDictHost
else:
    TensorDictHost = object

__all__ = ["PersistenceMixin"]


class PersistenceMixin(TensorDictHost):
    """memmap / memmap_ / memmap_like / save / load_memmap / load and the members around them, on TensorDict."""

    __slots__ = ()

    def memmap(self, prefix: Any = None, copy_existing: bool = False, *, num_threads: int = 0,
               return_early: bool = False, share_non_tensor: bool = False, existsok: bool = True,
               robust_key: bool | None = True, archive: bool | None = None,
               compression: str | int | None = None, atomic: bool = False, allow_pickle: bool = False) -> Any:
        """A new, locked, memory-mapped copy on the CPU, written to folder ``prefix``.

        Every tensor leaf becomes a :class:`MemoryMappedTensor` backed by
        ``prefix/<key>.memmap`` (anonymous shared memory when ``prefix`` is None and this
        TensorDict was not loaded from or saved to a folder); nested TensorDicts become
        sub-folders; non-tensor values go to ``meta.json`` as JSON (anything else needs
        ``allow_pickle=True``). The source is unchanged. ``num_threads`` writes files from a
        thread pool; ``return_early=True`` returns a ``concurrent.futures.Future`` at once.
        ``existsok=False`` refuses to overwrite files. A leaf already mapped from another file
        is copied only with ``copy_existing=True``.

        ``archive=True`` (the default for a ``prefix`` ending in ``.tdz``) writes one zip file
        instead and returns it loaded, unlocked (``compression`` compresses its tensor entries).
        ``atomic=True`` writes a new folder beside ``prefix`` and renames it into place.
        ``robust_key`` is accepted (keys are always escaped). ``share_non_tensor=True`` shares the non-tensor
        values between the processes holding the result: a value written in place (``set_``, ``update_``,
        ``td[i] = ...``) in one is read by the others (it lives in the folder's ``meta.json``).

        >>> import tempfile, torch
        >>> from torchdict import TensorDict
        >>> td = TensorDict({"a": torch.arange(3), "b": {"c": torch.ones(3)}}, batch_size=[3])
        >>> saved = td.memmap(tempfile.mkdtemp())
        >>> type(saved["b", "c"]).__name__, saved.is_locked, saved.is_memmap()
        ('MemoryMappedTensor', True, True)
        """
        if prefix is None and not archive:
            prefix = getattr(self, "_saved_path", None)
        return save_collection(self, prefix, copy_existing=copy_existing, num_threads=num_threads,
                               return_early=return_early, existsok=existsok, allow_pickle=allow_pickle,
                               share_non_tensor=share_non_tensor, robust_key=robust_key, archive=archive,
                               compression=compression, atomic=atomic)

    def save(self, prefix: Any = None, copy_existing: bool = False, *, num_threads: int = 0,
             return_early: bool = False, share_non_tensor: bool = False, robust_key: bool | None = True,
             archive: bool | None = None, compression: str | int | None = None, atomic: bool = False,
             existsok: bool = True, allow_pickle: bool = False) -> Any:
        """Alias of :meth:`memmap` (a ``.tdz`` path writes an archive).

        >>> import tempfile
        >>> from torchdict import TensorDict
        >>> TensorDict(a=1).save(tempfile.mkdtemp())["a"].item()
        1
        """
        return self.memmap(prefix, copy_existing, num_threads=num_threads, return_early=return_early,
                           share_non_tensor=share_non_tensor, existsok=existsok, robust_key=robust_key,
                           archive=archive, compression=compression, atomic=atomic, allow_pickle=allow_pickle)

    dumps = save

    def memmap_(self, prefix: Any = None, copy_existing: bool = False, *, num_threads: int = 0,
                return_early: bool = False, share_non_tensor: bool = False, existsok: bool = True,
                robust_key: bool | None = True, atomic: bool = False, allow_pickle: bool = False) -> Any:
        """Memory-map in place: the leaves are replaced by MemoryMappedTensors; returns self (locked).

        The leaves are only swapped once every file is written, so a failed save leaves
        the TensorDict as it was. ``prefix=None`` writes to the folder this TensorDict was
        loaded from or saved to, if any.

        >>> import tempfile, torch
        >>> from torchdict import TensorDict
        >>> td = TensorDict(a=torch.zeros(2))
        >>> td.memmap_(tempfile.mkdtemp()) is td, type(td["a"]).__name__
        (True, 'MemoryMappedTensor')
        """
        if prefix is None:
            prefix = getattr(self, "_saved_path", None)
        return save_collection(self, prefix, copy_existing=copy_existing, num_threads=num_threads,
                               return_early=return_early, existsok=existsok, allow_pickle=allow_pickle,
                               inplace=True, share_non_tensor=share_non_tensor, robust_key=robust_key,
                               archive=False, atomic=atomic)

    def memmap_like(self, prefix: Any = None, copy_existing: bool = False, *, existsok: bool = True,
                    num_threads: int = 0, return_early: bool = False, share_non_tensor: bool = False,
                    robust_key: bool | None = True, archive: bool | None = None, allow_pickle: bool = False) -> Any:
        """Same keys, dtypes and shapes, as zero-filled memory-mapped files; no data is copied.

        Files are allocated at full size *sparsely* (``ftruncate``): allocating a 50 GB
        dataset takes microseconds and no disk blocks until written. Expanded leaves become
        full-size contiguous files. Files that already exist keep their bytes (resized).
        With ``archive=True`` (or a ``.tdz`` path) a zero-filled archive is written and
        returned loaded writable (``mode="r+"``), unlocked.

        >>> import tempfile, torch
        >>> from torchdict import TensorDict
        >>> image = torch.zeros(8, 8, 3, dtype=torch.uint8)
        >>> data = TensorDict({"images": image.expand(1000, 8, 8, 3)}, batch_size=[1000])
        >>> data = data.memmap_like(tempfile.mkdtemp())
        >>> data.shape, data["images"].shape
        (torch.Size([1000]), torch.Size([1000, 8, 8, 3]))
        """
        return save_collection(self, prefix, copy_existing=copy_existing, num_threads=num_threads,
                               return_early=return_early, existsok=existsok, allow_pickle=allow_pickle,
                               like=True, share_non_tensor=share_non_tensor, robust_key=robust_key,
                               archive=archive)

    @classmethod
    def load_memmap(cls, prefix: Any, device: Any = None, non_blocking: bool = False, *, out: Any = None,
                    robust_key: bool | None = True, subpath: Any = None, mode: str | None = None,
                    num_threads: int = 0, allow_pickle: bool | None = None) -> Any:
        """Load a saved folder or ``.tdz`` archive lazily: files are mapped, nothing is read until used.

        A sub-folder (``prefix/"0"``, or ``subpath="0"`` / ``subpath=("a", "b")``) loads on its own
        as that nested TensorDict. The result is unlocked, with MemoryMappedTensor leaves (plain
        tensor views of one mapping for an archive). ``mode="r"`` maps copy-on-write (writes stay
        in memory), ``"r+"`` writes through to the files, and ``None`` (the default) maps each file
        of a folder ``"r+"`` when it is writable and an archive ``"r"``. Pickled values load only
        with ``allow_pickle=True``. ``device`` moves the result there (``"meta"`` reads nothing).
        ``out`` loads into an existing TensorDict: its nested TensorDicts are kept, its leaves
        replaced, keys that were not saved removed. An archive's checksums are verified before it
        is returned. Folders and archives written by upstream tensordict 0.15.x load too.

        >>> import tempfile, torch
        >>> from torchdict import TensorDict
        >>> folder = tempfile.mkdtemp()
        >>> _ = TensorDict({"0": {"w": torch.ones(2)}}).memmap(folder)
        >>> TensorDict.load_memmap(folder + "/0")["w"].tolist()
        [1.0, 1.0]
        """
        return _load_memmap(prefix, device, non_blocking, out=out, robust_key=robust_key, subpath=subpath,
                            mode=mode, num_threads=num_threads, allow_pickle=allow_pickle, cls=_loaded_class(cls))

    @classmethod
    def load(cls, prefix: Any, device: Any = None, non_blocking: bool = False, *, out: Any = None,
             robust_key: bool | None = True, subpath: Any = None, mode: str | None = None, num_threads: int = 0,
             allow_pickle: bool | None = None) -> Any:
        """Alias of :meth:`load_memmap`.

        >>> import tempfile
        >>> from torchdict import TensorDict
        >>> folder = tempfile.mkdtemp()
        >>> _ = TensorDict(a=2).save(folder)
        >>> TensorDict.load(folder)["a"].item()
        2
        """
        return cls.load_memmap(prefix, device, non_blocking, out=out, robust_key=robust_key, subpath=subpath,
                               mode=mode, num_threads=num_threads, allow_pickle=allow_pickle)

    def load_memmap_(self, prefix: Any, robust_key: bool | None = True, *, allow_pickle: bool | None = None,
                     mode: str | None = None) -> Any:
        """Load a save into this TensorDict (``load_memmap(..., out=self)``) and return it.

        Nested TensorDicts are kept, leaves replaced by the loaded ones, keys that were not saved
        removed; everything is checked before anything changes. A memory-mapped TensorDict is
        unlocked for the load and memory-mapped again into the loaded folder (an archive, or
        ``mode="r"``, leaves it unlocked).

        >>> import tempfile, torch
        >>> from torchdict import TensorDict
        >>> folder = tempfile.mkdtemp()
        >>> _ = TensorDict(a=torch.ones(3)).save(folder)
        >>> td = TensorDict(a=torch.zeros(3), b=torch.zeros(3))
        >>> td.load_memmap_(folder) is td, list(td.keys()), td["a"].tolist()
        (True, ['a'], [1.0, 1.0, 1.0])
        """
        from ._memmap_members import load_into

        return load_into(self, prefix, robust_key=robust_key, allow_pickle=allow_pickle, mode=mode)

    def load_(self, prefix: Any, *args: Any, **kwargs: Any) -> Any:
        """Deprecated (upstream 0.15): :meth:`load_memmap_` with the same arguments."""
        import warnings

        warnings.warn("TensorDictBase.load_() is deprecated and will be removed in TensorDict 0.17. Use "
                      "load_memmap_() instead.", DeprecationWarning, stacklevel=2)
        return self.load_memmap_(prefix, *args, **kwargs)

    def memmap_refresh_(self, *, allow_pickle: bool | None = None) -> Any:
        """Reload this memory-mapped TensorDict from its :attr:`saved_path` (entries another process added,
        removed or rewrote) and return it.

        >>> import tempfile, torch
        >>> from torchdict import TensorDict
        >>> folder = tempfile.mkdtemp()
        >>> td = TensorDict(a=torch.zeros(3)).memmap(folder)
        >>> _ = TensorDict(a=torch.ones(3), b=torch.ones(3)).memmap(folder)
        >>> sorted(td.memmap_refresh_().keys()), td["a"].tolist()
        (['a', 'b'], [1.0, 1.0, 1.0])
        """
        if not self._is_memmap or self._saved_path is None:
            raise RuntimeError("Cannot refresh a TensorDict that is not memory mapped or has no path associated.")
        return self.load_memmap_(self._saved_path, allow_pickle=allow_pickle)

    def make_memmap(self, key: Any, shape: Any, *, dtype: torch.dtype | None = None,
                    robust_key: bool | None = True) -> MemoryMappedTensor:
        """Add an uninitialised (zero-filled) MemoryMappedTensor of ``shape`` at ``key`` and return it.

        This TensorDict must be memory-mapped; the new file goes to its folder and its ``meta.json``
        records it, although the TensorDict is locked. A nested key creates the missing nested
        TensorDicts. An existing key, or a shape that does not start with the batch size, is refused
        before anything is written.

        >>> import tempfile, torch
        >>> from torchdict import TensorDict
        >>> td = TensorDict(a=torch.zeros(3), batch_size=[3]).memmap(tempfile.mkdtemp())
        >>> x = td.make_memmap(("nested", "b"), (3, 4))
        >>> td["nested", "b"].shape, td["nested", "b"] is x
        (torch.Size([3, 4]), True)
        """
        from ._memmap_members import make_memmap

        return make_memmap(self, key, shape, dtype=dtype, robust_key=robust_key)

    def make_memmap_from_storage(self, key: Any, storage: Any, shape: Any, *, dtype: torch.dtype | None = None,
                                 robust_key: bool | None = True) -> MemoryMappedTensor:
        """Add at ``key`` a MemoryMappedTensor that views ``storage`` (no copy) and return it.

        A storage mapped from a file must be the new entry's file in this TensorDict's folder. A
        storage without a file can't be recorded in the folder, so it is refused when the TensorDict
        has one (upstream 0.15 warns and drops the entry on reload); use
        :meth:`make_memmap_from_tensor` to copy the data instead.
        """
        from ._memmap_members import make_memmap_from_storage

        return make_memmap_from_storage(self, key, storage, shape, dtype=dtype, robust_key=robust_key)

    def make_memmap_from_tensor(self, key: Any, tensor: torch.Tensor, *, copy_data: bool = True,
                                existsok: bool = True, robust_key: bool | None = True) -> MemoryMappedTensor:
        """Add at ``key`` a memory-mapped copy of ``tensor`` (``copy_data=False``: same shape and dtype,
        zero-filled) in this TensorDict's folder, and return it.

        >>> import tempfile, torch
        >>> from torchdict import TensorDict
        >>> td = TensorDict(a=torch.zeros(3), batch_size=[3]).memmap(tempfile.mkdtemp())
        >>> td.make_memmap_from_tensor("b", torch.ones(3, 2)).sum().item()
        6.0
        """
        from ._memmap_members import make_memmap_from_tensor

        return make_memmap_from_tensor(self, key, tensor, copy_data=copy_data, existsok=existsok,
                                       robust_key=robust_key)

    def pack(self, dim: int = -1, *, layout: Any = None) -> tuple:
        """All the leaves in one tensor of features, and the :class:`~torchdict.PackLayout` that unpacks it.

        Each leaf is flattened after the batch dims and the leaves are concatenated (sorted by key, or
        in ``layout``'s order); ``dim`` places the feature dim in the result.

        >>> import torch
        >>> from torchdict import TensorDict
        >>> flat, layout = TensorDict(p=torch.zeros(5), v=torch.ones(5, 3), batch_size=[5]).pack()
        >>> flat.shape, layout.keys
        (torch.Size([5, 4]), ('p', 'v'))
        """
        from .formats.pack import pack

        return pack(self, dim, layout=layout)

    def is_memmap(self) -> bool:
        """True for the results of ``memmap``/``memmap_``/``memmap_like`` while they stay locked.

        (As in upstream, a freshly loaded TensorDict is not "memmap": it is unlocked.)

        >>> from torchdict import TensorDict
        >>> TensorDict(a=1).is_memmap()
        False
        """
        return self._is_memmap

    @property
    def saved_path(self) -> str:
        """The folder this memory-mapped TensorDict was saved to.

        >>> import tempfile, os
        >>> from torchdict import TensorDict
        >>> folder = tempfile.mkdtemp()
        >>> TensorDict(a=1).memmap(folder).saved_path == os.path.abspath(folder)
        True
        """
        if not self._is_memmap or self._saved_path is None:
            raise AttributeError(
                f"The tensordict has no saved path (memmap={self._is_memmap}, path={self._saved_path})"
            )
        return self._saved_path


def _loaded_class(cls: type) -> type:
    """The class ``load_memmap`` builds for ``cls.load_memmap``: ``cls`` when it is a TensorDict, else TensorDict."""
    td_class = tensordict_class()
    return cls if isinstance(cls, type) and issubclass(cls, td_class) else td_class
