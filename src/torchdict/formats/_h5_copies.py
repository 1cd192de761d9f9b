"""Copies, moves and pickling of a ``PersistentTensorDict``: ``clone`` (a new file, or an in-memory copy),
``copy`` (a second handle on the same file), ``to`` (a device for the entries read from now on, or an in-memory
result), and a pickle that names the file instead of holding its data.
"""
from __future__ import annotations

import os
import tempfile
import warnings
from typing import TYPE_CHECKING, Any, Optional

import torch

from .._convert import parse_device
from ._storage import GROUP, make_backend

if TYPE_CHECKING:
    from ._h5_host import PersistentHost
    from .h5 import PersistentTensorDict
else:
    PersistentHost = object

__all__ = ["PersistentCopiesMixin"]

_MISSING: Any = object()


class PersistentCopiesMixin(PersistentHost):
    """The copy, move and pickling members of ``PersistentTensorDict`` (which provides ``_over``, ``_storage``...)."""

    __slots__ = ()

    # ------------------------------------------------------------------ copies and moves
    def clone(self, recurse: bool = True, **kwargs: Any) -> "PersistentTensorDict":
        """``recurse=False``: a new tensordict over the same file. Otherwise a copy of the file, at
        ``newfile=`` (a temporary file, with a warning, when not given), as upstream."""
        if not recurse:
            return self._shallow_copy(self._group)
        newfile = kwargs.get("newfile")
        if newfile is None:
            warnings.warn(
                "PersistentTensorDict.clone() copies the file: pass newfile=<path> to choose where (a temporary "
                "file is used now), or clone(recurse=False) for another tensordict over the same file, or "
                "to_tensordict() for an in-memory copy.", UserWarning, stacklevel=2)
            handle, newfile = tempfile.mkstemp(suffix=".h5" if self.backend == "h5" else ".zarr")
            os.close(handle)
            if self.backend == "zarr":
                os.unlink(newfile)
        storage = make_backend(self.backend, "clone", type(self).LOCKING)  # one backend per open file
        storage.allow_pickle = self._storage.allow_pickle
        group = storage.copy_file(self._group, os.fspath(newfile))
        clone = self._shallow_copy(group, storage)
        clone.filename = newfile
        clone.mode = "r+"
        return clone

    def _shallow_copy(self, group: Any, storage: Any = None) -> "PersistentTensorDict":
        storage = self._storage if storage is None else storage
        clone = type(self)._over(storage, group, self._batch_size, self._device,
                                           self._non_tensor_as_stack, self._options, self.filename, self.mode)
        clone._names = None if self._names is None else list(self._names)
        for key, child in self._children.items():
            node = storage.child(group, key)
            if node is not None and storage.kind(node) == GROUP:
                clone._children[key] = child._shallow_copy(node, storage)
        return clone

    def copy(self) -> "PersistentTensorDict":
        """A new tensordict over the same file (upstream's shallow copy)."""
        return self.clone(recurse=False)

    def to(self, *args: Any, **kwargs: Any) -> Any:
        """A device alone gives a tensordict over the same file that reads onto that device (nothing is read
        now); any other conversion reads the entries into an in-memory ``TensorDict``."""
        device = _only_device(args, kwargs)
        if device is not _MISSING:
            device = parse_device(device)
            if device == self._device:
                return self
            clone = self.clone(recurse=False)
            clone._set_device(device)
            return clone
        return self._dense().to(*args, **kwargs)

    def _set_device(self, device: Optional[torch.device]) -> None:
        self._device = device
        for child in self._children.values():
            child._set_device(device)

    # ------------------------------------------------------------------ pickling
    def __getstate__(self) -> dict:
        filename, path = self._storage.location(self._group)
        if filename is None:
            raise TypeError("This PersistentTensorDict's store is not a file or folder: it can't be pickled.")
        state = {
            "backend": self.backend, "filename": filename, "path": path,
            # reopened read-only when opened so, else for reading and writing: never truncated again
            "mode": "r" if self._storage.is_read_only(self._group) else "r+",
            "allow_pickle": self._storage.allow_pickle, "tree": self._tree_state(),
            "device": self._device, "non_tensor_as_stack": self._non_tensor_as_stack, "options": self._options,
            "user_filename": self.filename, "user_mode": self.mode,
        }
        return state

    def _tree_state(self) -> dict:
        return {"batch_size": list(self._batch_size), "names": self._names, "locked": self._locked,
                "children": {key: child._tree_state() for key, child in self._children.items()}}

    def __setstate__(self, state: dict) -> None:
        storage = make_backend(state["backend"], "PersistentTensorDict", type(self).LOCKING)
        storage.allow_pickle = state["allow_pickle"]
        group = storage.reopen(state["filename"], state["path"], state["mode"])
        fresh = type(self)._over(storage, group, torch.Size(state["tree"]["batch_size"]),
                                           state["device"], state["non_tensor_as_stack"], state["options"],
                                           state["user_filename"], state["user_mode"])
        self.__dict__.update(fresh.__dict__)
        self._restore_tree(state["tree"])

    def _restore_tree(self, tree: dict) -> None:
        self._batch_size = torch.Size(tree["batch_size"])
        self._names = tree["names"]
        self._locked = tree["locked"]
        for key, sub in tree["children"].items():
            node = self._storage.child(self._group, key)
            if node is not None and self._storage.kind(node) == GROUP:
                child = type(self)._over(self._storage, node, torch.Size(sub["batch_size"]),
                                                   self._device, self._non_tensor_as_stack, self._options)
                self._children[key] = child
                child._restore_tree(sub)


def _only_device(args: tuple, kwargs: dict) -> Any:
    """The device when ``to(...)`` is given a device and nothing else, else _MISSING."""
    if kwargs and set(kwargs) - {"device", "non_blocking"}:
        return _MISSING
    if len(args) == 1 and not kwargs.get("device") and isinstance(args[0], (str, torch.device, int)):
        if isinstance(args[0], str):
            try:
                return torch.device(args[0])
            except RuntimeError:
                return _MISSING
        return args[0]
    if not args and "device" in kwargs:
        return kwargs["device"]
    return _MISSING
