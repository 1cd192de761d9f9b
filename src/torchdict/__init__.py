"""torchdict: a dict of tensors that behaves like one tensor along shared batch dimensions."""
from ._base import TensorCollection, is_tensor_collection
from .base import TensorDictBase
from ._errors import InplaceWriteError, KeyThroughLeafError
from ._keys import NestedKey, unravel_key, unravel_key_list
from .memmap import MemoryMappedTensor
from .nontensor import NonTensorData, NonTensorStack
from .tensordict import TensorDict
from ._params import TensorDictParams
from .tensorclass import TensorClass, is_tensorclass, tensorclass
from ._torch_function import cat, stack
from ._padding import pad, pad_sequence
from .lazy import LazyStackedTensorDict, lazy_stack, maybe_dense_stack
from . import _pytree  # noqa: F401  (registers TensorDict as a torch.utils._pytree node)

__all__ = [
    "TensorDict",
    "TensorDictBase",
    "TensorCollection",
    "TensorDictParams",
    "TensorClass",
    "tensorclass",
    "is_tensorclass",
    "MemoryMappedTensor",
    "NonTensorData",
    "NonTensorStack",
    "NestedKey",
    "is_tensor_collection",
    "unravel_key",
    "unravel_key_list",
    "InplaceWriteError",
    "KeyThroughLeafError",
    "stack",
    "cat",
    "pad",
    "pad_sequence",
    "LazyStackedTensorDict",
    "lazy_stack",
    "maybe_dense_stack",
]

__version__ = "0.1.0"
