"""Loading folders written by upstream tensordict 0.15.x, and its older (legacy) layout.

Upstream's ``meta.json`` is flat: ``shape``, ``device``, ``_type`` / ``_class``, ``_names``,
``_format_version``, plus one dict per key (``dtype``/``shape`` for a tensor, ``type`` for a
sub-folder). File names are ``%XX``-escaped like torchdict's (:func:`escape_key`); the
legacy layout used the raw key as the name. Nested TensorDicts, ``NonTensorData`` /
``NonTensorStack``, nested tensors, ``LazyStackedTensorDict`` (a lazy stack; dense when nested)
and registered tensorclasses are read. This is a migration path: torchdict only writes
its own format. Sub-folders are loaded through the :class:`~torchdict._loading.FolderLoader`
of the call, so either format may sit below either.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ._filenames import escape_key, is_safe_name
from ._meta_json import check_fits, corrupt_meta, parse_dtype, parse_shape
from ._saved_classes import find_saved_class
from .nontensor import NonTensorData, NonTensorStack
from .nontensor._metadata import one_value_class

if TYPE_CHECKING:
    from ._loading import FolderLoader

__all__ = ["load_upstream_folder", "upstream_child"]

_CPU = torch.device("cpu")
# Top-level meta.json fields that describe the folder rather than name an entry.
_UPSTREAM_RESERVED = frozenset(
    ("shape", "device", "_type", "_format_version", "_class", "_names", "_metadata", "_is_non_tensor",
     "data", "stack_dim", "stack_dim_name")
)


def _upstream_kind(meta: dict) -> str:
    """Which upstream class wrote a folder, from ``_class`` (0.15) or ``_type`` (older).

    >>> _upstream_kind({"_type": "<class 'tensordict._td.TensorDict'>"}), _upstream_kind({"_class": "mod:Point"})
    ('TensorDict', 'external:mod.Point')
    """
    class_name = meta.get("_class")
    if type(class_name) is str and class_name.startswith("tensordict:"):
        return class_name.split(":", 1)[1]
    type_name = meta.get("_type")
    if type(type_name) is str and type_name.startswith("<class '") and type_name.endswith("'>"):
        qualified = type_name[len("<class '"):-2]
        if qualified.startswith("tensordict."):
            return qualified.rsplit(".", 1)[1]
        return "external:" + qualified
    if type(class_name) is str:
        return "external:" + class_name.replace(":", ".")
    return "TensorDict"


def upstream_child(loader: FolderLoader, folder: str, key: str, suffix: str) -> str:
    """The file (or sub-folder) of ``key`` in an upstream folder: the %XX name, or the legacy raw key name."""
    tree = loader.tree
    encoded = tree.join(folder, escape_key(key) + suffix)
    # lexists: a symlink is found, then refused by the loader, rather than skipped
    if tree.lexists(encoded) or not is_safe_name(key + suffix):
        return encoded
    legacy = tree.join(folder, key + suffix)
    return legacy if tree.lexists(legacy) else encoded


def _pickled_data(loader: FolderLoader, folder: str) -> Any:
    """The ``data`` of a folder's ``other.pickle`` (non-tensor values upstream could not JSON), or None."""
    pickle_path = loader.tree.join(folder, "other.pickle")
    if not loader.tree.lexists(pickle_path):
        return None
    return loader.unpickle(pickle_path)["data"]


def load_upstream_folder(loader: FolderLoader, folder: str, meta: dict, parent_batch: torch.Size | None) -> Any:
    """What upstream tensordict saved in ``folder`` (whose parsed ``meta.json`` is ``meta``)."""
    kind = _upstream_kind(meta)
    if kind == "NonTensorData" or kind.startswith("MetaData"):
        value = meta["data"] if "data" in meta else _pickled_data(loader, folder)
        return one_value_class(kind)(value, parent_batch or torch.Size(()), _CPU)  # MetaData[...] too
    if kind == "NonTensorStack":
        return _non_tensor_stack(loader, folder, meta, parent_batch)
    if kind == "LazyStackedTensorDict":
        return _lazy_stack(loader, folder, meta, as_lazy=parent_batch is None)
    if kind.startswith("external:"):
        return _tensorclass(loader, folder, meta, kind[len("external:"):], parent_batch)
    if kind != "TensorDict":
        raise RuntimeError(f"Could not find the class tensordict.{kind} saved in {folder}.")
    batch_size = parse_shape(folder, meta.get("shape", []))
    storage: dict = {}
    for key, entry in meta.items():
        if key in _UPSTREAM_RESERVED or type(entry) is not dict:
            continue
        if "dtype" in entry:
            storage[key] = _tensor(loader, folder, key, entry, batch_size)
        elif "type" in entry:
            storage[key] = loader.load(upstream_child(loader, folder, key, ""), batch_size)
    names = meta.get("_names")
    device = meta.get("device", "cpu")
    return loader.build(storage, batch_size, device, names if type(names) is list else None, None, folder)


def _tensor(loader: FolderLoader, folder: str, key: str, entry: dict, batch_size: torch.Size) -> Any:
    dtype = parse_dtype(folder, entry.get("dtype"))
    shape = parse_shape(folder, entry.get("shape"))
    path = upstream_child(loader, folder, key, ".memmap")
    if not entry.get("is_nested", False):
        check_fits(folder, key, shape, batch_size)
        return loader.map(path, dtype, shape)
    # A nested tensor: <key>.shape.memmap holds one row of sizes per element.
    sizes = loader.tree.map(upstream_child(loader, folder, key, ".shape.memmap"), torch.int64, shape, "r")
    element_shapes = [torch.Size(row) for row in sizes.tolist()]
    total = sum(element.numel() for element in element_shapes)
    flat = loader.tree.map(path, dtype, torch.Size([total]), loader.mode)
    pieces = []
    offset = 0
    for element in element_shapes:
        pieces.append(flat[offset: offset + element.numel()].view(element))
        offset += element.numel()
    return torch.nested.as_nested_tensor(pieces, layout=torch.strided)


def _non_tensor_stack(loader: FolderLoader, folder: str, meta: dict, parent_batch: torch.Size | None) -> Any:
    data = meta.get("data")
    if data is None:
        data = _pickled_data(loader, folder)
    elif data == "pickle.pkl":  # a lone stack's values JSON can't hold: the pickled nested list
        data = loader.unpickle(loader.tree.join(folder, "pickle.pkl"))
    if type(data) is not list:
        raise corrupt_meta(folder, "a NonTensorStack without a list of values")
    stack = NonTensorStack.from_nested_list(data, parent_batch)
    stack_dim = meta.get("stack_dim", 0)
    if stack_dim not in (0, None):
        raise RuntimeError(f"Loading a NonTensorStack stacked along dim {stack_dim} ({folder}) is not supported.")
    if parent_batch is None:  # a lone stack keeps the device it was saved with (None too), as upstream
        saved = meta.get("device")
        return stack._to_device(None if saved is None else torch.device(saved))
    return stack._to_device(_CPU)


def _lazy_stack(loader: FolderLoader, folder: str, meta: dict, as_lazy: bool) -> Any:
    """The members stacked: a ``LazyStackedTensorDict`` for the folder loaded itself (as upstream), one dense
    TensorDict for a lazy stack held inside a TensorDict (torchdict's nested collections are dense)."""
    members = []
    index = 0
    # a symlinked member is found (is_folder), then refused by the loader rather than ending the stack there
    while loader.tree.is_folder(loader.tree.join(folder, str(index))):
        members.append(loader.load(loader.tree.join(folder, str(index))))
        index += 1
    stack_dim = meta.get("stack_dim", 0)
    if not members:
        raise corrupt_meta(folder, "a stacked TensorDict without members")
    if type(stack_dim) is not int:
        raise corrupt_meta(folder, f"invalid stack_dim {stack_dim!r}")
    if not as_lazy:
        try:
            return torch.stack(members, stack_dim)
        except Exception as error:
            raise RuntimeError(
                f"The upstream LazyStackedTensorDict in {folder} could not be loaded as one dense TensorDict "
                f"(a lazy stack inside a TensorDict is loaded densely): {error}"
            ) from error
    from .lazy import LazyStackedTensorDict  # imported on first use (see torchdict._LAZY_EXPORTS)

    try:
        stack = LazyStackedTensorDict(*members, stack_dim=stack_dim)
    except Exception as error:
        raise corrupt_meta(folder, f"its members can't be stacked along dim {stack_dim} ({error})") from error
    name = meta.get("stack_dim_name")
    stack._stack_name = name if type(name) is str else None
    return stack


def _tensorclass(loader: FolderLoader, folder: str, meta: dict, qualified: str,
                 parent_batch: torch.Size | None) -> Any:
    module, _, qualname = qualified.rpartition(".")
    cls = find_saved_class(f"{module}:{qualname}", qualified, folder)  # before reading anything more
    td = loader.load(loader.tree.join(folder, "_tensordict"), parent_batch)
    for key, value in meta.items():
        if key not in _UPSTREAM_RESERVED and key != "_tensordict":
            td._tensordict[key] = NonTensorData(value, td._batch_size, _CPU)
    return cls.from_tensordict(td)
