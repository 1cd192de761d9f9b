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
from . import _pytree  # noqa: F401  (registers TensorDict as a torch.utils._pytree node)
# persistence: the function ``memmap`` replaces the submodule of that name as the attribute (as upstream's)
from .saving import memmap  # noqa: E402,F811

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
    # formats: HDF5 and zarr; safetensors, Arrow / Parquet, pandas / CSV / JSON, numpy structured arrays
    "PersistentTensorDict", "from_h5", "from_zarr",
    "from_safetensors", "to_safetensors", "from_arrow", "to_arrow", "from_parquet", "from_pandas", "from_csv",
    "from_json", "from_struct_array",
    # module layer (torchdict.nn)
    "nn", "as_tensordict_module", "TensorClassModuleBase", "TensorClassModuleWrapper",
    # persistence: save / load, archives, pack
    "save", "load", "load_memmap", "memmap", "pack_memmap", "unpack_memmap", "append_memmap", "is_memmap_archive",
    "refresh_archive_checksums", "PackLayout",
    # store: TensorDicts on a Redis-protocol server (torchdict.store)
    "store", "TensorDictStore", "LazyStackedTensorDictStore",
]

__version__ = "0.1.0"

# Families imported on first use (PEP 562): the lazy-stack family (``lazy.py`` and its ``_lazy_*`` modules) is
# a few thousand objects, and creating them in ``import torchdict`` sets off a full garbage collection of
# torch's large heap (~100-200 ms); the formats, the store and the module layer are paid for only by the
# programs that use them. Public name -> the submodule that defines it.
_LAZY_EXPORTS: dict = {
    "LazyStackedTensorDict": "lazy",
    "lazy_stack": "lazy",
    "maybe_dense_stack": "lazy",
    # formats: HDF5 and zarr (PersistentTensorDict)
    "PersistentTensorDict": "formats.h5", "from_h5": "formats.h5", "from_zarr": "formats.zarr",
    # formats: safetensors, Arrow / Parquet, pandas / CSV / JSON, numpy structured arrays
    "from_safetensors": "formats.safetensors", "to_safetensors": "formats.safetensors",
    "from_arrow": "formats.arrow", "to_arrow": "formats.arrow", "from_parquet": "formats.tabular",
    "from_pandas": "formats.tabular", "from_csv": "formats.tabular", "from_json": "formats.tabular",
    "from_struct_array": "formats.struct",
    # module layer (torchdict.nn): the package, and the names upstream also exports at the top level
    "nn": "nn", "as_tensordict_module": "nn.common", "TensorClassModuleBase": "nn.tensorclass_module",
    "TensorClassModuleWrapper": "nn.tensorclass_module",
    # persistence: save / load, .tdz archives, appending rows, pack
    "save": "saving", "load": "saving", "load_memmap": "saving", "pack_memmap": "formats.archive",
    "unpack_memmap": "formats.archive", "is_memmap_archive": "formats.archive",
    "refresh_archive_checksums": "formats.archive", "append_memmap": "_append_memmap", "PackLayout": "formats.pack",
    # store: TensorDicts on a Redis-protocol server (torchdict.store)
    "store": "store", "TensorDictStore": "store", "LazyStackedTensorDictStore": "store",
}


def __getattr__(name: str) -> object:
    module_name = _LAZY_EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'torchdict' has no attribute {name!r}")
    import importlib

    module = importlib.import_module(f".{module_name}", __name__)
    return module if module_name == name else getattr(module, name)  # a name equal to its module: the module


def __dir__() -> list:
    return sorted(set(globals()) | set(_LAZY_EXPORTS))
