"""Save and load collections as safetensors files, in upstream tensordict's layout.

Each tensor is stored under its nested key joined with ``"."`` (the names of a model's ``state_dict``). The
structure safetensors can't hold (batch size and dim names of each level, the stack dim of a lazy stack, the
class of a tensorclass, non-tensor values) is one JSON document in the file's ``__metadata__`` under the key
``"tensordict"``, format version 1: the same document upstream writes, so files go both ways.

Loading goes through ``safetensors.safe_open``, which maps the file: the loaded tensors are copy-on-write views
of the mapping (reading pages on first touch; writing into them never changes the file).
"""
from __future__ import annotations

import json
from typing import Any, Optional

import torch

from ..tensordict import TensorDict
from ._require import require
from ._write_target import atomic_target, is_path

__all__ = ["from_safetensors", "to_safetensors"]

METADATA_KEY = "tensordict"
FORMAT_VERSION = 1
_JSON_SCALARS = (str, int, float, bool, type(None))


# ---------------------------------------------------------------------------- writing
def to_safetensors(data: Any, path: Any) -> None:
    """Save a TensorDict, lazy stack or tensorclass to the safetensors file ``path``.

    Tensors are written straight from their memory (no copy, except for the views that overlap another
    saved tensor, which safetensors refuses); the structure goes to the file's metadata (see the module
    docstring). The file appears at ``path`` only once complete. Needs ``torchdict[safetensors]``.

    Raises ``TypeError`` for what safetensors can't hold (nested / sparse tensors, a non-tensor value that is
    not JSON, a ``NonTensorStack``, a lazy stack whose members have different keys), ``ValueError`` when two
    keys join to the same name (``"a.b"`` and ``("a", "b")``), ``KeyError`` for a dtype safetensors lacks.

    >>> import tempfile, os, torch
    >>> from torchdict import TensorDict
    >>> path = os.path.join(tempfile.mkdtemp(), "td.safetensors")
    >>> to_safetensors(TensorDict(w=torch.ones(2, 3), sub={"b": torch.zeros(2)}, batch_size=[2]), path)
    >>> from_safetensors(path)["sub", "b"]
    tensor([0., 0.])
    """
    require("safetensors", "safetensors", "to_safetensors")
    from safetensors.torch import save_file

    from ..nontensor import NonTensorData, NonTensorStack

    if isinstance(data, (NonTensorData, NonTensorStack)):
        raise TypeError("Cannot save a non-tensor value as safetensors: put it in a tensordict first.")
    tensors: dict = {}
    root = _describe(data, (), tensors)
    _copy_overlapping(tensors)
    metadata = {METADATA_KEY: json.dumps({"version": FORMAT_VERSION, "root": root})}
    try:
        if is_path(path):
            with atomic_target(path) as temporary:
                save_file(tensors, temporary, metadata=metadata)
        else:
            save_file(tensors, path, metadata=metadata)
    except KeyError as err:
        # safetensors looks dtypes up in a table: a dtype it lacks surfaces as a bare KeyError.
        names = [name for name, tensor in tensors.items() if str(tensor.dtype) == str(err.args[0] if err.args
                                                                                       else "")]
        raise KeyError(f"Cannot save {names or 'a tensor'} as safetensors: the format has no dtype "
                       f"{err.args[0] if err.args else '?'}.") from err


def _describe(collection: Any, prefix: tuple, tensors: dict) -> dict:
    """The JSON description of one level; its tensors are added to ``tensors`` under their joined names."""
    from .._base import is_tensor_collection
    from ..nontensor import NonTensorData, NonTensorStack
    from ..tensorclass import is_tensorclass

    inner = collection._tensordict if is_tensorclass(collection) else collection
    where = prefix or "the root"
    if _has_exclusive_keys(inner):
        raise TypeError(f"Cannot save the lazy stack at {where} as safetensors: its entries have different keys. "
                        "Give every entry the same keys first.")
    names = list(inner.names)
    level: dict = {"batch_size": list(collection.batch_size),
                   "names": names if any(name is not None for name in names) else None}
    stack_dim = getattr(inner, "stack_dim", None)
    if stack_dim is not None and hasattr(inner, "tensordicts"):
        level["stack_dim"] = stack_dim
    if is_tensorclass(collection):
        level["class"] = str(type(collection))
    entries = level["keys"] = {}
    for key, value in inner.items():
        nested_key = prefix + (key,)
        if isinstance(value, NonTensorStack):
            raise TypeError(f"Cannot save the non-tensor stack at {nested_key} as safetensors: only single JSON "
                            "values are supported.")
        if isinstance(value, NonTensorData):
            if not _is_json(value.data):
                raise TypeError(f"Cannot save the non-tensor value at {nested_key} as safetensors: "
                                f"{type(value.data).__name__} is not a JSON value (str, int, float, bool, None, "
                                "list or dict).")
            entries[key] = {"non_tensor": value.data}
        elif is_tensor_collection(value):
            entries[key] = {"td": _describe(value, nested_key, tensors)}
        else:
            entries[key] = {"tensor": _add_tensor(value, nested_key, tensors)}
    return level


def _add_tensor(tensor: torch.Tensor, nested_key: tuple, tensors: dict) -> str:
    if tensor.is_nested or tensor.layout != torch.strided:
        nested = " (nested)" if tensor.is_nested else ""
        raise TypeError(f"Cannot save the tensor at {nested_key} as safetensors: only dense tensors are supported, "
                        f"got layout {tensor.layout}{nested}.")
    name = ".".join(nested_key)
    if name in tensors:
        raise ValueError(f"Two keys of the tensordict have the safetensors name {name!r}.")
    tensors[name] = tensor.detach().contiguous()  # no copy for a tensor already contiguous
    return name


def _has_exclusive_keys(collection: Any) -> bool:
    """Whether a lazy stack (at any depth of lazy stacks) has members whose keys differ."""
    exclusive = getattr(collection, "_exclusive_keys", None)
    if exclusive is None:
        return False
    return any(exclusive()) or any(_has_exclusive_keys(member) for member in collection.tensordicts)


def _is_json(value: Any) -> bool:
    """Whether JSON gives ``value`` back with the same types."""
    kind = type(value)
    if kind in _JSON_SCALARS:
        return True
    if kind is list:
        return all(_is_json(item) for item in value)
    if kind is dict:
        return all(type(key) is str and _is_json(item) for key, item in value.items())
    return False


def _copy_overlapping(tensors: dict) -> None:
    """Copy the tensors whose bytes overlap another saved tensor (safetensors refuses shared memory)."""
    by_storage: dict = {}
    for name, tensor in tensors.items():
        if tensor.numel() and tensor.device.type != "meta":
            storage_key = (tensor.device, tensor.untyped_storage().data_ptr())
            by_storage.setdefault(storage_key, []).append(name)
    for names in by_storage.values():
        if len(names) < 2:
            continue
        names.sort(key=lambda name: tensors[name].data_ptr())
        end = 0
        for name in names:
            tensor = tensors[name]
            if tensor.data_ptr() < end:
                tensors[name] = tensor.clone()
            else:
                end = tensor.data_ptr() + tensor.numel() * tensor.element_size()


# ---------------------------------------------------------------------------- reading
def from_safetensors(path: Any, *, device: Any = None) -> Any:
    """Load a safetensors file as a TensorDict (or the lazy stack / tensorclass that was saved).

    A file with upstream's / torchdict's metadata loads with its structure. Any other safetensors file (a
    model checkpoint) loads as a nested TensorDict with an empty batch size, each name split on ``"."`` (the
    layout ``TensorDict.from_module`` gives, so ``to_module`` writes it into the model). Tensors are
    memory-mapped views of the file, or loaded on ``device`` when given (which is then the result's device).
    A tensorclass loads only once the class is defined (nothing is imported by a name in the file).
    Needs ``torchdict[safetensors]``.

    >>> import tempfile, os, torch
    >>> from safetensors.torch import save_file
    >>> path = os.path.join(tempfile.mkdtemp(), "model.safetensors")
    >>> save_file({"0.weight": torch.ones(4, 3), "0.bias": torch.zeros(4)}, path)
    >>> from_safetensors(path)["0", "weight"].shape
    torch.Size([4, 3])
    """
    safetensors = require("safetensors", "safetensors", "from_safetensors")
    if device is not None:
        device = torch.device(device)
    try:
        handle = safetensors.safe_open(str(path), framework="pt", device="cpu" if device is None else str(device))
    except safetensors.SafetensorError as err:
        raise type(err)(f"Cannot read {path} as a safetensors file: {err}") from err
    with handle as file:
        document = (file.metadata() or {}).get(METADATA_KEY)
        if document is None:
            td = TensorDict(device=device)
            for name in file.keys():
                td.set(tuple(name.split(".")), file.get_tensor(name))
            return td
        try:
            metadata = json.loads(document)
        except json.JSONDecodeError as err:
            raise ValueError(f"Cannot load {path}: its tensordict metadata is not valid JSON ({err}).") from None
        version = metadata.get("version") if isinstance(metadata, dict) else None
        if version != FORMAT_VERSION:
            raise ValueError(f"Cannot load {path}: its tensordict metadata has version {version!r}, and this "
                             f"version of torchdict reads version {FORMAT_VERSION}.")
        bulk = getattr(file, "get_tensors", None)  # newer safetensors: every tensor in one call, a little faster
        tensors = bulk() if bulk is not None else {name: file.get_tensor(name) for name in file.keys()}
        used: set = set()
        try:
            result = _rebuild(metadata["root"], tensors, device, path, used)
        except (KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"Cannot load {path}: its tensordict metadata is malformed "
                             f"({type(err).__name__}: {err}).") from err
        unused = tensors.keys() - used
        if unused:
            raise ValueError(f"The tensors {sorted(unused)} of {path} are not in its tensordict metadata.")
        return result


def _rebuild(level: dict, tensors: dict, device: Optional[torch.device], path: Any, used: set) -> Any:
    """The collection one level of the metadata describes, its tensors taken from ``tensors`` (the file's,
    by name).

    ``used`` collects the names of the tensors taken.
    """
    entries: dict = {}
    non_tensors = []
    for key, entry in level["keys"].items():
        if "tensor" in entry:
            if entry.get("unbatched"):
                raise ValueError(f"Cannot load {path}: the entry {key!r} is an UnbatchedTensor, which torchdict "
                                 "does not provide.")
            name = entry["tensor"]
            tensor = tensors.get(name)
            if tensor is None:
                raise ValueError(f"Cannot load {path}: its metadata names the tensor {name!r}, which the file "
                                 "does not hold.")
            used.add(name)
            entries[key] = tensor
        elif "non_tensor" in entry:
            entries[key] = None  # set below, in its place
            non_tensors.append(key)
        else:
            entries[key] = _rebuild(entry["td"], tensors, device, path, used)
    if non_tensors:
        # entry by entry, in the file's order (a non-tensor value is made by set_non_tensor)
        td: Any = TensorDict(batch_size=level["batch_size"], names=level["names"], device=device)
        for key, entry in level["keys"].items():
            if key in non_tensors:
                td.set_non_tensor(key, entry["non_tensor"])
            else:
                td.set(key, entries[key])
    elif device is None and level["names"] is None and _fit_as_they_are(entries, level["batch_size"]):
        td = TensorDict._new_unsafe(entries, torch.Size(level["batch_size"]))
    else:
        # one constructor call: its checks of a dict of tensors run in bulk
        td = TensorDict(entries, batch_size=level["batch_size"], names=level["names"], device=device)
    stack_dim = level.get("stack_dim")
    if stack_dim is not None and td.batch_size[stack_dim]:
        # A lazy stack: its members are the slices of the level along the stack dim.
        from ..lazy import LazyStackedTensorDict

        stacked = LazyStackedTensorDict(*td.unbind(stack_dim), stack_dim=stack_dim)
        if level["names"] is not None:
            stacked.names = level["names"]
        td = stacked
    class_name = level.get("class")
    if class_name is not None:
        return _saved_tensorclass(class_name, path).from_tensordict(td)
    return td


def _fit_as_they_are(entries: dict, batch_size: Any) -> bool:
    """Whether the constructor would store ``entries`` unchanged under ``batch_size`` (a list of sizes): plain
    tensors and TensorDicts without a device whose leading dims are the batch size. Then the level skips the
    constructor's per-entry conversions (a level holding levels would take them all); else the constructor
    decides (and raises what it raises)."""
    if type(batch_size) is not list:
        return False
    for size in batch_size:
        if type(size) is not int or size < 0:
            return False
    n_batch = len(batch_size)
    size = torch.Size(batch_size)
    tensor_class = torch.Tensor
    for value in entries.values():
        kind = value.__class__
        if kind is tensor_class:
            shape = value.shape
        elif kind is TensorDict and value._device is None:
            shape = value._batch_size
        else:
            return False
        if shape[:n_batch] != size:
            return False
    return True


def _saved_tensorclass(class_name: str, path: Any) -> Any:
    """The defined tensorclass whose ``str`` is ``class_name`` (upstream records classes so)."""
    from .._saved_classes import _SAVED_CLASSES
    from ..tensorclass import is_tensorclass

    for cls in list(_SAVED_CLASSES.values()):
        if str(cls) == class_name and is_tensorclass(cls):
            return cls
    raise RuntimeError(f"Could not find the tensorclass {class_name} saved in {path}. Import the module that "
                       "defines it before you load the file.")
