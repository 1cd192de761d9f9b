"""Adding batch dims: ``broadcast_to`` and ``atleast_1d`` / ``atleast_2d`` / ``atleast_3d`` (``BatchDimsMixin``);
the ``atleast_*`` results write back when used as context managers, as the other shape ops do."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._context import undo_reshape, write_back

if TYPE_CHECKING:
    from ._host import TensorDictHost
else:
    TensorDictHost = object


def _at_least(td: Any, ndim: int) -> Any:
    """``td`` with leading batch dims of size 1 added until it has ``ndim`` of them (``td`` if it has)."""
    result = td
    for _ in range(ndim - len(td.batch_size)):
        result = result.unsqueeze(0)
    return result


class BatchDimsMixin(TensorDictHost):
    __slots__ = ()

    def broadcast_to(self, shape: Any) -> Any:
        """``expand(shape)``: the batch broadcast to ``shape`` (``-1`` keeps a dim).

        >>> TensorDict(a=torch.zeros(3, 4), batch_size=[3]).broadcast_to((2, 3))["a"].shape
        torch.Size([2, 3, 4])
        """
        return self.expand(tuple(shape))

    @write_back(undo_reshape)
    def atleast_1d(self) -> Any:
        """``self`` with a leading batch dim of size 1 added when it has none (else ``self``)."""
        return _at_least(self, 1)

    @write_back(undo_reshape)
    def atleast_2d(self) -> Any:
        """``self`` with leading batch dims of size 1 added up to 2 batch dims (else ``self``)."""
        return _at_least(self, 2)

    @write_back(undo_reshape)
    def atleast_3d(self) -> Any:
        """``self`` with leading batch dims of size 1 added up to 3 batch dims (unlike
        ``torch.atleast_3d``, always in front, as upstream)."""
        return _at_least(self, 3)
