"""torchdict: a dict of tensors that behaves like one tensor along shared batch dimensions."""
from ._base import TensorCollection, is_tensor_collection
from .base import TensorDictBase
from ._errors import InplaceWriteError, KeyThroughLeafError
from ._keys import NestedKey, unravel_key, unravel_key_list
from .memmap import MemoryMappedTensor
from .nontensor import NonTensorData, NonTensorStack
from .nontensor._metadata import MetaData
from ._unbatched import UnbatchedTensor
from .tensordict import TensorDict
from .tensorclass import TensorClass, is_tensorclass, tensorclass
from ._torch_function import cat, stack
from ._padding import pad, pad_sequence
from ._options import (capture_non_tensor_stack, get_defaults_to_none, get_printoptions, lazy_legacy,  # drop-in toggles
                       list_to_stack, set_capture_non_tensor_stack, set_get_defaults_to_none, set_lazy_legacy,
                       set_list_to_stack, set_printoptions)
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
    "UnbatchedTensor",
    "MetaData",
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
    # store: TensorDicts on a Redis-protocol server (torchdict.store)
    "store", "TensorDictStore", "LazyStackedTensorDictStore",
    # module layer (torchdict.nn)
    "nn", "as_tensordict_module", "TensorClassModuleBase", "TensorClassModuleWrapper",
    # drop-in: toggles, helpers and the rest of upstream's top level (issue 18)
    "capture_non_tensor_stack", "get_defaults_to_none", "get_printoptions", "lazy_legacy", "list_to_stack",
    "set_capture_non_tensor_stack", "set_get_defaults_to_none", "set_lazy_legacy", "set_list_to_stack",
    "set_printoptions", "KEY_SEPARATOR", "assert_allclose_td", "assert_close", "collate", "default_is_leaf",
    "dense_stack_tds", "from_any", "from_dataclass", "from_dict", "from_module", "from_modules", "from_namedtuple",
    "from_pytree", "from_tuple", "fromkeys", "group_by", "is_bool", "is_floating", "is_inexact", "is_integer",
    "is_leaf_nontensor", "is_non_tensor", "make_tensordict", "merge_tensordicts", "parse_tensor_dict_string",
    "unpad_sequence", "unravel_key_to_tuple", "functional", "utils", "TypedTensorDict", "typedtensordict",
    "TensorAttrs", "NonTensorDataBase",
    "PersistentTensorDict",
    "from_h5",
    "from_zarr",
    # formats: safetensors, Arrow / Parquet, pandas / CSV / JSON, numpy structured arrays
    "from_safetensors", "to_safetensors", "from_arrow", "to_arrow", "from_parquet", "from_pandas", "from_csv",
    "from_json", "from_struct_array",
    # persistence: save / load, archives, pack
    "save", "load", "load_memmap", "memmap", "pack_memmap", "unpack_memmap", "append_memmap", "is_memmap_archive",
    "refresh_archive_checksums", "PackLayout", "set_progress_bar",
    # devices: consolidated storage (one buffer for all leaves)
    "from_consolidated",
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
    "TensorDictParams": "_params",
    # devices: consolidated storage (one buffer for all leaves)
    "from_consolidated": "_consolidate",
    # store: TensorDicts on a Redis-protocol server (torchdict.store)
    "store": "store", "TensorDictStore": "store", "LazyStackedTensorDictStore": "store",
    # formats: HDF5 and zarr (PersistentTensorDict)
    "PersistentTensorDict": "formats.h5", "from_h5": "formats.h5", "from_zarr": "formats.zarr",
    # formats: safetensors, Arrow / Parquet, pandas / CSV / JSON, numpy structured arrays
    "from_safetensors": "formats.safetensors", "to_safetensors": "formats.safetensors",
    "from_arrow": "formats.arrow", "to_arrow": "formats.arrow", "from_parquet": "formats.tabular",
    "from_pandas": "formats.tabular", "from_csv": "formats.tabular", "from_json": "formats.tabular",
    "from_struct_array": "formats.struct",
    # module layer (torchdict.nn): the names upstream also exports at the top level
    "nn": "nn", "as_tensordict_module": "nn.common", "TensorClassModuleBase": "nn.tensorclass_module",
    "TensorClassModuleWrapper": "nn.tensorclass_module",
    # persistence: save / load, .tdz archives, appending rows, pack
    "save": "saving", "load": "saving", "load_memmap": "saving", "pack_memmap": "formats.archive",
    "unpack_memmap": "formats.archive", "is_memmap_archive": "formats.archive",
    "refresh_archive_checksums": "formats.archive", "append_memmap": "_append_memmap", "PackLayout": "formats.pack",
    # persistence: the opt-in progress bar of long saves and loads (tqdm)
    "set_progress_bar": "_progress",
    # drop-in (issue 18): upstream's other top-level names; a name equal to its module is the module itself
    "utils": "utils", "functional": "functional", "KEY_SEPARATOR": "utils", "assert_allclose_td": "utils",
    "assert_close": "utils", "is_bool": "utils", "is_floating": "utils", "is_inexact": "utils", "is_integer": "utils",
    "is_non_tensor": "utils", "unravel_key_to_tuple": "utils", "parse_tensor_dict_string": "_parse_repr",
    "collate": "functional", "dense_stack_tds": "functional", "group_by": "functional",
    "make_tensordict": "functional", "merge_tensordicts": "functional", "unpad_sequence": "functional",
    "default_is_leaf": "_factories", "is_leaf_nontensor": "_factories", "from_any": "_factories",
    "from_dataclass": "_factories", "from_dict": "_factories", "from_module": "_factories",
    "from_modules": "_factories", "from_namedtuple": "_factories", "from_pytree": "_factories",
    "from_tuple": "_factories", "fromkeys": "_factories", "TypedTensorDict": "typedtensordict",
    "typedtensordict": "typedtensordict", "TensorAttrs": "_tensor_attrs", "NonTensorDataBase": "nontensor._base",
}


def __getattr__(name: str) -> object:
    module_name = _LAZY_EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'torchdict' has no attribute {name!r}")
    import importlib

    module = importlib.import_module(f".{module_name}", __name__)
    value = module if module_name == name else getattr(module, name)  # a name equal to its module: the module
    globals()[name] = value  # later reads are plain attribute reads, not a call of this function
    return value


def __dir__() -> list:
    return sorted(set(globals()) | set(_LAZY_EXPORTS))
