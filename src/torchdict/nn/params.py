"""``torchdict.nn.params``: where upstream's ``tensordict.nn.params`` imports find ``TensorDictParams``
(defined in ``torchdict._params``, which ``import torchdict`` loads)."""
from .._params import TensorDictParams

__all__ = ["TensorDictParams"]
