"""``PersistentHost``: what the mixins of ``PersistentTensorDict`` use of the class, for type checkers.

``_h5_rows.py`` (row reads and writes) and ``_h5_copies.py`` (copies, moves, pickling) are written against the
state and helpers that ``h5.py`` defines. They take ``PersistentHost`` as their base under ``TYPE_CHECKING`` only
(``object`` at run time), so mypy checks their bodies against these declarations, and checks
``PersistentTensorDict``'s own definitions against them too.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any, Iterator, Optional, Union

    import torch

    from ..base import TensorDictBase
    from .h5 import PersistentTensorDict

    class PersistentHost(TensorDictBase):
        """A collection over an HDF5 file or a zarr store (h5py / zarr objects are untyped: Any)."""

        LOCKING: Union[bool, str, None]  # h5py's file locking for the files the class opens

        # ------------------------------------------------------------------ state (PersistentTensorDict)
        _storage: Any  # the backend: _h5_backend.H5Backend or _zarr_backend.ZarrBackend
        _group: Any  # the open h5py group / zarr group
        backend: str
        filename: Any
        mode: str
        _batch_size: torch.Size
        _device: Optional[torch.device]
        _names: Optional[list]
        _locked: bool
        _children: dict
        _nodes: dict
        _non_tensor_as_stack: bool
        _options: dict

        # ------------------------------------------------------------------ defined by PersistentTensorDict
        @classmethod
        def _over(cls, storage: Any, group: Any, batch_size: torch.Size, device: Optional[torch.device],
                  non_tensor_as_stack: bool, options: dict, filename: Any = None,
                  mode: str = "r") -> PersistentTensorDict: ...
        def _check_writable(self) -> None: ...
        def _node(self, key: str) -> Any: ...
        def _kind(self, node: Any) -> str: ...
        def _child(self, key: str, node: Any, check: bool = True) -> PersistentTensorDict: ...
        def _tensor_nodes(self, prefix: tuple = ()) -> Iterator[tuple]: ...
        def _read_node(self, key: str, node: Any) -> Any: ...
        def _to_device(self, tensor: torch.Tensor) -> torch.Tensor: ...
        def _locate(self, keys: tuple) -> tuple: ...

        # ------------------------------------------------------------------ defined by PersistentCopiesMixin
        def _shallow_copy(self, group: Any, storage: Any = None) -> PersistentTensorDict: ...
