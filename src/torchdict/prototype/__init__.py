"""The seed's import path: ``from torchdict.prototype import tensorclass``.

``tensorclass`` is stable here; this module only keeps the older path working.
"""
from ..tensorclass import TensorClass, is_tensorclass, tensorclass

__all__ = ["tensorclass", "TensorClass", "is_tensorclass"]
