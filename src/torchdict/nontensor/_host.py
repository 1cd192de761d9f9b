"""``NonTensorHost``: what the non-tensor mixins use of the two leaf classes, for type checkers.

``NonTensorData`` and ``NonTensorStack`` share their API through the mixins of ``_shape.py``, ``_members.py``,
``_ops.py`` and ``_io.py``. The mixins take ``NonTensorHost`` as their base under ``TYPE_CHECKING`` only
(``object`` at run time), so mypy checks their bodies against these declarations, and checks the two classes'
definitions against them too.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any, List, Optional

    import torch
    from typing_extensions import Self

    from ._shared import SharedValue

    class NonTensorHost:
        """A non-tensor leaf: one value for the whole batch, or one value per element."""

        # ------------------------------------------------------------------ state of both classes
        _batch_size: torch.Size
        _device: Optional[torch.device]
        _names: Optional[list]
        _locked: bool
        _lock_undo: Optional[bool]  # the lock state to restore when a ``with td.lock_():`` block ends
        _saved_path: Optional[str]
        _shared: SharedValue  # set on a shared leaf only (share_non_tensor=True): read it after _is_shared()

        # The value: ``_data`` on a NonTensorData, ``_values`` / ``_origins`` (one per element) on a
        # NonTensorStack. The mixins test the class (``type(self) is NonTensorData``) before reading them.
        _data: Any
        _values: List[Any]
        _origins: Optional[List[Any]]

        # ------------------------------------------------------------------ defined by both classes
        def _shallow(self) -> Self: ...
        def _to_device(self, device: Any) -> Self: ...
        def _flat_values(self) -> List[Any]: ...
        def _flat_origins(self) -> List[Any]: ...

        # ------------------------------------------------------------------ defined by NonTensorStack
        def _index_grid(self) -> torch.Tensor: ...

        # ------------------------------------------------------------------ defined by the mixins
        def unbind(self, dim: int = 0) -> Any: ...
        def _refuse_if_locked(self) -> None: ...
        def _is_shared(self) -> bool: ...
        def _write_shared(self, value: Any) -> bool: ...
        def _write_shared_leaf(self, value: Any) -> bool: ...
        def _rewrite_saved(self) -> None: ...
