"""``LazyHost``: what the lazy-stack mixins use of the class they are mixed into, for type checkers.

Each mixin of :class:`~torchdict.LazyStackedTensorDict` (``_apply.py``, ``_keyops.py``, ``_shape.py``, ...)
is written against the stack's members and state, and against helpers that a sibling mixin or the class
itself defines. The mixins take ``LazyHost`` as their base under ``TYPE_CHECKING`` only (``object`` at run
time), so mypy checks their bodies against these declarations; ``LazyStackedTensorDict`` and the mixins
define every one of them, and mypy checks those definitions against the declarations too.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any, Callable, List, Optional, Sequence

    import torch

    from ..base import TensorDictBase
    from ..tensordict import TensorDict
    from . import LazyStackedTensorDict, _Index

    class LazyHost(TensorDictBase):
        """A TensorDictBase stacking its members (dense TensorDicts or lazy stacks) along ``stack_dim``."""

        # ------------------------------------------------------------------ state (LazyStackedTensorDict)
        _tds: List[TensorDictBase]
        _stack_dim: int
        _member_batch: torch.Size
        _is_locked: bool
        _stack_name: Optional[str]

        @property
        def tensordicts(self) -> List[TensorDictBase]: ...
        @property
        def stack_dim(self) -> int: ...

        # ------------------------------------------------------------------ defined by LazyStackedTensorDict
        def __init__(self, *tensordicts: TensorDictBase, stack_dim: int = 0) -> None: ...
        def keys(self, include_nested: bool = False, leaves_only: bool = False, is_leaf: Optional[Callable] = None,
                 *, sort: bool = False) -> list: ...
        @staticmethod
        def _restack(members: Sequence[Any], stack_dim: int) -> LazyStackedTensorDict: ...
        def _member_values(self, key: Any) -> Any: ...
        def _split_index(self, index: Any) -> _Index: ...
        def contiguous(self, *, canonical: bool = False, inplace: bool = False) -> TensorDict: ...
        def lock_(self) -> LazyStackedTensorDict: ...
        def unlock_(self) -> LazyStackedTensorDict: ...

        # ------------------------------------------------------------------ made by LazyOpsMixin (member by member)
        def copy(self) -> LazyStackedTensorDict: ...

        # ------------------------------------------------------------------ defined by LazyKeyOpsMixin
        def _has_exclusive_keys(self) -> bool: ...
        def _member_writes(self, write: Callable[[Any, Any], Any], parts: Sequence[Any],
                           values_change: bool = True) -> None: ...
