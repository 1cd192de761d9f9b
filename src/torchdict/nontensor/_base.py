"""``NonTensorDataBase``: upstream's common base of the one-value non-tensor entries, here an abstract class
that ``NonTensorData`` is registered with (so ``isinstance(x, NonTensorDataBase)`` and ``issubclass`` answer as
upstream's do; ``NonTensorStack`` is not one, as upstream)."""
from __future__ import annotations

import abc

from ..nontensor import NonTensorData

__all__ = ["NonTensorDataBase"]


class NonTensorDataBase(abc.ABC):
    """The base of non-tensor entries holding one value for the whole batch.

    >>> from torchdict import NonTensorData, NonTensorStack
    >>> isinstance(NonTensorData("a"), NonTensorDataBase), issubclass(NonTensorStack, NonTensorDataBase)
    (True, False)
    """


NonTensorDataBase.register(NonTensorData)
