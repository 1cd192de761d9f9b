"""``TensorDictHost``: what the concern mixins of ``TensorDict`` use of the class, for type checkers.

``TensorDict`` gets its tensor-like behaviour from one mixin per concern module (``ApplyMixin``,
``LockingMixin``, ``MovesMixin``, ...; see docs/architecture.md). Their methods read the container's state
(the slots below) and call helpers that ``tensordict.py`` or a sibling mixin defines. The mixins take
``TensorDictHost`` as their base under ``TYPE_CHECKING`` only (``object`` at run time), so mypy checks their
bodies against these declarations, and checks ``TensorDict``'s own definitions against them too.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any, Callable, Optional, Sequence

    import torch
    from typing_extensions import Self

    from ._views import ItemsView, KeysView, ValuesView
    from .base import TensorDictBase
    from .tensordict import TensorDict

    class TensorDictHost(TensorDictBase):
        """A TensorDict: a dict of leaves (``_tensordict``) sharing the leading dims ``_batch_size``."""

        # ------------------------------------------------------------------ state (TensorDict.__slots__)
        _tensordict: dict[str, Any]
        _batch_size: torch.Size
        _batch_len: int  # quick_batch_len(_batch_size), or -1 until a write computes it
        _device: Optional[torch.device]
        _names: Optional[list]
        _is_locked: bool
        _lock_parents: int  # how many locked parents hold this TensorDict
        _cm: Any  # the write-back record of an op used as a context manager (_context.py)
        _is_memmap: bool
        _saved_path: Optional[str]

        # ------------------------------------------------------------------ defined by TensorDict
        def __init__(self, source: Any = None, batch_size: Any = None, device: Any = None,
                     names: Optional[Sequence[Optional[str]]] = None, non_blocking: Optional[bool] = None,
                     lock: bool = False, **kwargs: Any) -> None: ...
        @classmethod
        def _new_unsafe(cls, source: dict, batch_size: torch.Size, device: Optional[torch.device] = None,
                        names: Optional[list] = None) -> TensorDict: ...
        def _new_like(self, source: dict, batch_size: Optional[torch.Size] = None) -> TensorDict: ...
        def _get_path(self, keys: tuple, default: Any = ...) -> Any: ...
        def _set_path(self, keys: tuple, value: Any, inplace: bool = False, non_blocking: bool = False) -> None: ...
        def keys(self, include_nested: bool = False, leaves_only: bool = False,
                 is_leaf: Optional[Callable[[type], bool]] = None, *,
                 sort: bool = False) -> KeysView: ...
        def values(self, include_nested: bool = False, leaves_only: bool = False,
                   is_leaf: Optional[Callable[[type], bool]] = None, *,
                   sort: bool = False) -> ValuesView: ...
        def items(self, include_nested: bool = False, leaves_only: bool = False,
                  is_leaf: Optional[Callable[[type], bool]] = None, *,
                  sort: bool = False) -> ItemsView: ...
        def copy(self) -> TensorDict: ...
        def clear_device_(self) -> Self: ...

        # ------------------------------------------------------------------ defined by LockingMixin
        def _check_unlocked(self) -> None: ...
        def _lock_tree(self) -> None: ...
        def _unlock_tree(self) -> None: ...
