"""torchdict.nn: modules that read their inputs from a TensorDict and write their outputs into it.

Imported on its own (``import torchdict.nn``), never by ``import torchdict``: the module layer is only paid
for by programs that use it.
"""
from .._params import TensorDictParams

__all__ = ["TensorDictParams"]
