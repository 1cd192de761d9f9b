"""Arrow tables <-> TensorDicts (``from_arrow`` / ``to_arrow``), with upstream tensordict's column mapping.

Column types, both ways:

==========================================  ==========================================================
Arrow                                       TensorDict entry
==========================================  ==========================================================
integer / floating point                    tensor viewing the Arrow buffer (frombuffer, or DLPack)
boolean                                     bool tensor (a copy: Arrow packs booleans as bits)
``fixed_size_list`` / fixed_shape_tensor    tensor with trailing dims
``list`` / ``large_list`` of numbers        jagged nested tensor (``layout=torch.jagged``)
``struct``                                  nested TensorDict
anything else (strings, dates, ...)         ``NonTensorStack`` of ``to_pylist()`` values
==========================================  ==========================================================

Views keep the Arrow buffers alive. ``copy=None`` copies only buffers Arrow marks immutable (a memory-mapped
file): torch has no read-only tensors, and writing into such a view would crash the process.
"""
from __future__ import annotations

import sys
import warnings
from typing import Any, Optional

import torch

from ..tensordict import TensorDict
from ._require import require

__all__ = ["from_arrow", "to_arrow"]

NULL_MODES = ("raise", "fill", "mask")
DEFAULT_MASK_KEY = "_mask"
# masked_fill has no kernels for these: fill a signed view of the same width (0 has the same bits).
_SIGNED_TWIN = {torch.uint16: torch.int16, torch.uint32: torch.int32, torch.uint64: torch.int64}
_CHECKED_PYARROW: list = []  # the pyarrow module whose version import_pyarrow checked
_NUMBER_TYPES: dict = {}  # Arrow type id -> torch dtype, see _number_types
# The dtypes ``Tensor.numpy()`` converts (to_arrow goes through numpy).
_NUMPY_DTYPES = frozenset({torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16,
                           torch.uint32, torch.uint64, torch.float16, torch.float32, torch.float64, torch.complex64,
                           torch.complex128})


def import_pyarrow(what: str) -> Any:
    """pyarrow (15 or later: older releases lack types used here and give tensors DLPack refuses)."""
    if _CHECKED_PYARROW and sys.modules.get("pyarrow") is _CHECKED_PYARROW[0]:
        return _CHECKED_PYARROW[0]  # checked before (a module set to None in sys.modules is not it)
    pa = require("pyarrow", "arrow", what)
    major = int(pa.__version__.split(".")[0])
    if major < 15:
        raise ImportError(f"{what} needs pyarrow 15 or later, got pyarrow=={pa.__version__}: "
                          "pip install 'pyarrow>=15'")
    _number_types(pa)
    _CHECKED_PYARROW[:] = [pa]
    return pa


def _number_types(pa: Any) -> dict:
    """Arrow type id -> torch dtype for the types whose values are a tensor's as they are: integers and floats
    (booleans are bits in Arrow). Filled on first use."""
    if not _NUMBER_TYPES:
        _NUMBER_TYPES.update({
            pa.int8().id: torch.int8, pa.int16().id: torch.int16, pa.int32().id: torch.int32,
            pa.int64().id: torch.int64, pa.uint8().id: torch.uint8, pa.uint16().id: torch.uint16,
            pa.uint32().id: torch.uint32, pa.uint64().id: torch.uint64, pa.float16().id: torch.float16,
            pa.float32().id: torch.float32, pa.float64().id: torch.float64})
    return _NUMBER_TYPES


# ---------------------------------------------------------------------------- Arrow -> TensorDict
def from_arrow(table: Any, *, copy: Optional[bool] = None, nulls: str = "raise", mask_key: Any = None,
               device: Any = None) -> Any:
    """A TensorDict of batch size ``[num_rows]`` with one entry per column of an Arrow table.

    ``table`` is a ``pyarrow.Table`` / ``RecordBatch`` or anything ``pyarrow.table`` accepts (a Polars frame,
    an object with ``__arrow_c_stream__``). A column of several chunks is combined first (a copy).

    ``copy``: ``None`` views mutable buffers and copies immutable ones, ``True`` copies every column, ``False``
    views whatever it can. ``nulls``: ``"raise"`` (a ``ValueError`` for a null row, or a null inside a list or
    struct), ``"fill"`` (NaN in float tensors, 0 / False in others, ``[]`` in jagged ones, ``None`` in
    non-tensor columns), ``"mask"`` (fill, and add a bool entry ``(*mask_key, *key)``, True where the row is
    valid, for each entry with nulls; ``mask_key`` defaults to ``"_mask"``). ``device``: the result's device.
    Needs ``torchdict[arrow]``.

    >>> import pyarrow as pa
    >>> td = from_arrow(pa.table({"x": [1.0, None], "s": ["a", "b"]}), nulls="mask")
    >>> td["x"], td["_mask", "x"], td["s"]
    (tensor([1., nan], dtype=torch.float64), tensor([ True, False]), LinkedList(['a', 'b']))
    """
    pa = import_pyarrow("from_arrow")
    if nulls not in NULL_MODES:
        raise ValueError(f"nulls must be one of {NULL_MODES}, got {nulls!r}.")
    mask_path = _mask_path(mask_key, nulls)
    if not isinstance(table, (pa.Table, pa.RecordBatch)):
        table = pa.table(table)
    if nulls == "mask" and mask_path[0] in table.column_names:
        raise ValueError(f"nulls='mask' writes the masks under the key {mask_path[0]!r}, which is a column of the "
                         "table.")
    source = table
    if isinstance(table, pa.Table):
        batches = table.to_batches()
        if len(batches) == 1:
            source = batches[0]  # its columns are arrays: no ChunkedArray to unwrap each time
    if copy is not True and isinstance(source, pa.RecordBatch):
        views = _number_views(source, table.num_rows)
        if views is not None:
            result = TensorDict._new_unsafe(views, torch.Size([table.num_rows]))
            return result if device is None else result.to(device)
    reader = _ColumnReader(pa, copy, nulls)
    entries = {}
    all_views = True  # every entry a 1-D tensor of num_rows made below: the result needs no checks
    chunked_array = pa.ChunkedArray
    # schema.names and column(i): the column_names and columns properties cost twice as much
    for index, name in enumerate(source.schema.names):
        column = source.column(index)
        if isinstance(column, chunked_array):
            column = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
        if copy is not True:
            view = number_view(column)  # what entry() gives such a column, the cheap way
            if view is not None:
                entries[name] = view
                continue
        all_views = False
        entries[name] = reader.entry(column, (name,))
        if nulls == "raise" and not reader.nulls_left_as_none and _may_hide_nulls(pa.types, column.type):
            reader.nulls_left_as_none = reader.has_unchecked_nulls(column, inside=False)
    if reader.nulls_left_as_none:
        # Once every column converted: a call that raises does not warn too.
        warnings.warn("from_arrow got a null inside a map, a list view or the values of a dictionary-encoded "
                      "column, and returns it as None. Starting with TensorDict 0.18, the default will change to "
                      "raising a ValueError for these nulls, as for nulls inside lists. Pass nulls='fill' to keep "
                      "this result without the warning. nulls='mask' gives the same result: its masks only mark "
                      "null rows.", FutureWarning, stacklevel=2)
    if all_views:
        result = TensorDict._new_unsafe(entries, torch.Size([table.num_rows]))
    else:
        result = TensorDict(entries, batch_size=[table.num_rows])
    for key, mask in reader.masks.items():
        result.set(mask_path + key, mask)
    if device is not None:
        result = result.to(device)
    return result


def number_view(array: Any) -> Optional[torch.Tensor]:
    """A 1-D tensor viewing a non-empty integer or float Arrow array without nulls whose buffer is mutable,
    else None (``import_pyarrow`` or ``_number_types`` called first).

    What ``from_arrow`` gives such a column (a mutable buffer is viewed unless ``copy=True``), made with
    ``torch.frombuffer``, which costs less than DLPack: the tensor holds the buffer, which holds the memory.
    frombuffer needs a writable buffer (it warns for another): immutable ones are left to the general path.
    """
    dtype = _NUMBER_TYPES.get(array.type.id)
    if dtype is None or array.null_count:
        return None
    buffer = array.buffers()[1]
    rows = len(array)
    if not rows or buffer is None or not buffer.is_mutable:
        return None
    offset = array.offset
    if offset or buffer.size != rows * dtype.itemsize:
        return torch.frombuffer(buffer, dtype=dtype, count=rows, offset=offset * dtype.itemsize)
    return torch.frombuffer(buffer, dtype=dtype)  # the whole buffer: fewer arguments to parse


def _number_views(batch: Any, rows: int) -> Optional[dict]:
    """Every column of ``batch`` as ``number_view`` gives it, when each column is one: integers or floats
    with no validity bitmap, over a mutable buffer holding exactly its ``rows`` values; else None.

    One ``to_struct_array().buffers()`` call gives every column's buffers without making an Array object
    per column (``batch.column(i)`` costs more than the view itself). A buffer of exactly ``rows`` values
    can only be read from its start, so the columns' offsets, which that list does not give, are all 0.
    """
    if not rows:
        return None
    schema = batch.schema
    number_types = _NUMBER_TYPES
    dtypes: list = [number_types.get(kind.id) for kind in schema.types]  # torch dtypes once None is ruled out
    if None in dtypes:
        return None
    to_struct_array = getattr(batch, "to_struct_array", None)  # RecordBatch.to_struct_array: pyarrow 15
    if to_struct_array is None:
        return None
    buffers = to_struct_array().buffers()  # [struct validity, then validity and values of each column]
    if len(buffers) != 1 + 2 * len(dtypes) or buffers[0] is not None:
        return None
    views = {}
    frombuffer = torch.frombuffer
    for name, dtype, validity, values in zip(schema.names, dtypes, buffers[1::2], buffers[2::2]):
        if validity is not None or values is None or not values.is_mutable or values.size != rows * dtype.itemsize:
            return None
        views[name] = frombuffer(values, dtype=dtype)
    return views


def _mask_path(mask_key: Any, nulls: str) -> tuple:
    if mask_key is not None and nulls != "mask":
        raise ValueError(f"from_arrow got a mask_key but nulls={nulls!r}, not 'mask'.")
    if mask_key is None:
        return (DEFAULT_MASK_KEY,)
    if not _is_string_key(mask_key):
        raise TypeError(f"mask_key must be a string or a tuple of strings, got {mask_key!r}.")
    path = _flatten_key(mask_key)
    if not path:
        raise ValueError(f"mask_key must be a string or a non-empty tuple of strings, got {mask_key!r}.")
    return path


def _is_string_key(key: Any) -> bool:
    return isinstance(key, str) or (isinstance(key, tuple) and all(_is_string_key(part) for part in key))


def _flatten_key(key: Any) -> tuple:
    return (key,) if isinstance(key, str) else tuple(part for sub in key for part in _flatten_key(sub))


class _ColumnReader:
    """Converts the columns of one table, collecting the masks and whether some nulls came back as None."""

    def __init__(self, pa: Any, copy: Optional[bool], nulls: str) -> None:
        self.pa = pa
        self.types = pa.types
        self.copy = copy
        self.nulls = nulls
        self.masks: dict = {}
        self.nulls_left_as_none = False

    # ------------------------------------------------------------------ dispatch
    def entry(self, array: Any, key: tuple) -> Any:
        """One column (or one field of a struct column) as a TensorDict entry."""
        kind = array.type
        if self.types.is_struct(kind):
            # flatten() applies the struct's offset and hands its null rows down to the fields.
            fields = {field.name: self.entry(child, key + (field.name,)) for field, child in zip(kind, array.flatten())}
            return TensorDict(fields, batch_size=[len(array)])
        self._refuse_nulls(array, key)
        if array.null_count and self.nulls == "mask":
            self.masks[key] = torch.from_numpy(array.is_valid().to_numpy(zero_copy_only=False))
        if self._is_dense(kind):
            return self.dense(array, key)
        if (self.types.is_list(kind) or self.types.is_large_list(kind)) and self._is_dense(kind.value_type):
            return self.jagged(array, key)
        return self.objects(array, key)

    def _is_dense(self, kind: Any) -> bool:
        """Whether an Arrow type converts to a dense tensor (numbers, bools, fixed-size lists / tensors of them)."""
        if isinstance(kind, self.pa.FixedShapeTensorType):
            return self._is_dense(kind.storage_type)
        if self.types.is_fixed_size_list(kind):
            return self._is_dense(kind.value_type)
        return self.types.is_integer(kind) or self.types.is_floating(kind) or self.types.is_boolean(kind)

    def _refuse_nulls(self, array: Any, key: tuple, mode: Optional[str] = None) -> None:
        if array.null_count and (mode or self.nulls) == "raise":
            raise ValueError(f"The Arrow column {key} has {array.null_count} null value(s). Pass nulls='fill' to "
                             "fill them, or nulls='mask' to also get a mask entry.")

    # ------------------------------------------------------------------ tensors
    def dense(self, array: Any, key: tuple) -> torch.Tensor:
        """A column of a dense type (see ``_is_dense``) as a tensor of shape ``[rows, *item shape]``."""
        kind = array.type
        self._refuse_nulls(array, key)
        rows = len(array)
        if isinstance(kind, self.pa.FixedShapeTensorType):
            # ``kind.shape`` is the stored (physical) shape, ``permutation`` the logical order of its dims.
            tensor = self.dense(array.storage, key).view(rows, *kind.shape)
            if kind.permutation is not None:
                tensor = tensor.permute(0, *[1 + dim for dim in kind.permutation])
            return tensor
        if self.types.is_fixed_size_list(kind):
            # ``values`` ignores the array's offset and null rows (``flatten`` would drop them): slice by hand.
            width = kind.list_size
            inner = self.dense(array.values.slice(array.offset * width, rows * width), key)
            tensor = inner.view(rows, width, *inner.shape[1:])
        elif array.null_count:
            # The values without their validity bitmap; the null rows are filled below.
            bare = self.pa.Array.from_buffers(kind, rows, [None, array.buffers()[1]], null_count=0,
                                              offset=array.offset)
            tensor = self.primitive(bare)
        else:
            return self.primitive(array)
        if not array.null_count:
            return tensor
        invalid = ~torch.from_numpy(array.is_valid().to_numpy(zero_copy_only=False))
        dtype = tensor.dtype
        fill = float("nan") if tensor.is_floating_point() else 0
        filled = tensor.view(_SIGNED_TWIN.get(dtype, dtype)).masked_fill(
            invalid.view(rows, *[1] * (tensor.ndim - 1)), fill)
        return filled.view(dtype)

    def primitive(self, array: Any) -> torch.Tensor:
        """A 1-D tensor over a primitive array without nulls (a view where allowed, see ``copy``)."""
        if self.types.is_boolean(array.type):
            return torch.from_numpy(array.to_numpy(zero_copy_only=False))  # bits -> bytes: a copy anyway
        tensor = torch.from_dlpack(array)  # honours the array's offset; needs no writable buffer
        if self.copy:
            return tensor.clone()
        if self.copy is None:
            buffer = array.buffers()[1]
            if buffer is not None and not buffer.is_mutable:
                return tensor.clone()
        return tensor

    def jagged(self, array: Any, key: tuple) -> torch.Tensor:
        """A list column of a dense type as a jagged nested tensor over its values."""
        if array.null_count:
            array = array.fill_null(self.pa.scalar([], type=array.type))
        offsets = self.primitive(array.offsets)
        start, stop = int(offsets[0]), int(offsets[-1])
        if start:
            offsets = offsets - start  # a sliced array's offsets start past 0
        values = self.dense(array.values.slice(start, stop - start), key)
        return torch.nested.nested_tensor_from_jagged(values, offsets.to(torch.int64))

    # ------------------------------------------------------------------ Python objects
    def objects(self, array: Any, key: tuple) -> Any:
        """Any other column: one Python value per row, in a NonTensorStack."""
        from ..nontensor import NonTensorStack

        if self.nulls == "raise":
            self._refuse_inner_nulls(array, key)
        return NonTensorStack._from_flat(array.to_pylist(), [len(array)])

    def _refuse_inner_nulls(self, array: Any, key: tuple) -> None:
        """Raise for a null inside the rows of a list or a struct, at any depth."""
        kind = array.type
        if self.types.is_struct(kind):
            children = array.flatten()
        elif self._is_list_like(kind):
            children = [array.flatten()]
        else:
            return
        for child in children:
            self._refuse_nulls(child, key, "raise")
            self._refuse_inner_nulls(child, key)

    def _is_list_like(self, kind: Any) -> bool:
        return self.types.is_list(kind) or self.types.is_large_list(kind) or self.types.is_fixed_size_list(kind)

    def _is_unchecked(self, kind: Any) -> bool:
        """Types ``_refuse_inner_nulls`` does not look into: maps, dictionaries, list views."""
        list_view = getattr(self.types, "is_list_view", None)
        return (self.types.is_map(kind) or self.types.is_dictionary(kind)
                or (list_view is not None and (list_view(kind) or self.types.is_large_list_view(kind))))

    def _holds_unchecked(self, kind: Any) -> bool:
        if self._is_unchecked(kind):
            return True
        if self.types.is_struct(kind):
            return any(self._holds_unchecked(field.type) for field in kind)
        if self._is_list_like(kind):
            return self._holds_unchecked(kind.value_type)
        return False

    def has_unchecked_nulls(self, array: Any, inside: bool) -> bool:
        """Whether ``array`` has a null that ``_refuse_inner_nulls`` lets through (in a map, a list view or
        the dictionary values its indices select; unions are not looked into)."""
        if inside and array.null_count:
            return True
        kind = array.type
        if not inside and not self._holds_unchecked(kind):
            return False
        if self.types.is_dictionary(kind):
            if not self.has_unchecked_nulls(array.dictionary, True):
                return False
            children = [array.dictionary_decode()]  # only the values the indices select count
        elif self.types.is_struct(kind):
            children = array.flatten()
        elif self.types.is_map(kind):
            # The rows' key-value structs (MapArray.flatten raises; keys / items ignore the offset).
            children = [self.pa.ListArray.from_arrays(array.offsets, array.values).flatten()]
        elif self._is_list_like(kind) or self._is_unchecked(kind):
            children = [array.flatten()]
        else:
            return False
        inside = inside or self._is_unchecked(kind)
        return any(self.has_unchecked_nulls(child, inside) for child in children)


def _may_hide_nulls(types: Any, kind: Any) -> bool:
    """A cheap gate before the walk of ``_has_unchecked_nulls``: only nested or dictionary types can."""
    return types.is_nested(kind) or types.is_dictionary(kind) or types.is_fixed_size_list(kind)


# ---------------------------------------------------------------------------- TensorDict -> Arrow
def to_arrow(td: Any) -> Any:
    """A ``pyarrow.Table`` with one column per entry of a TensorDict with one batch dim (one row per element).

    1-D tensors give primitive columns (viewing CPU data where Arrow can), tensors with more dims
    ``arrow.fixed_shape_tensor`` columns, jagged nested tensors (ragged dim 1) ``large_list`` columns, nested
    TensorDicts ``struct`` columns, non-tensor entries the type ``pyarrow.array`` infers from their values.
    ``from_arrow`` converts back. Needs ``torchdict[arrow]``.

    >>> import torch
    >>> from torchdict import TensorDict
    >>> to_arrow(TensorDict(x=torch.tensor([1.0, 2.0]), image=torch.zeros(2, 3, 4), batch_size=[2])).schema.types[0]
    DataType(float)
    """
    pa = import_pyarrow("to_arrow")
    if td.batch_dims != 1:
        raise ValueError(f"to_arrow needs a tensordict with one batch dimension, got the batch size {td.batch_size}. "
                         "Call td.reshape(-1) first to flatten it.")
    names, arrays = [], []
    for key, value in td.items():
        names.append(key)
        array = None
        if type(value) is torch.Tensor and value.ndim == 1 and value.is_contiguous():
            # The common column, a view of a CPU tensor, as _arrow_array would make it: ``numpy()`` itself
            # refuses every tensor _arrow_array treats otherwise (grad, device, dtype, nested, conj / neg bit).
            try:
                array = value.numpy()
            except (RuntimeError, TypeError):
                pass
        arrays.append(pa.array(array) if array is not None else _arrow_array(pa, value, key))
    return pa.Table.from_arrays(arrays, names=names)  # pa.table(dict) costs more, for the same table


def _arrow_array(pa: Any, value: Any, key: Any) -> Any:
    if isinstance(value, torch.Tensor):
        tensor = value
        if tensor.requires_grad:  # each call costs as much as the conversion: only when needed
            tensor = tensor.detach()
        if not tensor.is_cpu:
            tensor = tensor.cpu()
        tensor = tensor.contiguous()
        if tensor.is_nested:
            return _jagged_array(pa, tensor, key)
        if tensor.dtype not in _NUMPY_DTYPES:
            # Arrow columns go through numpy: name the entry in upstream's TypeError.
            raise TypeError(f"Cannot convert the entry {key!r} to Arrow: numpy has no dtype {tensor.dtype} (cast "
                            "it first, e.g. to torch.float32).")
        if tensor.ndim == 1:
            return pa.array(tensor.numpy())
        if not len(tensor):
            # from_numpy_ndarray refuses an empty array: build the empty column from its type.
            kind = pa.fixed_shape_tensor(pa.from_numpy_dtype(tensor.numpy().dtype), tensor.shape[1:])
            return pa.ExtensionArray.from_storage(kind, pa.array([], kind.storage_type))
        return pa.FixedShapeTensorArray.from_numpy_ndarray(tensor.numpy())
    from ..nontensor import NonTensorData, NonTensorStack

    if isinstance(value, (NonTensorData, NonTensorStack)):
        return pa.array(value.tolist())
    fields = list(value.items())  # a nested collection: a struct column
    if not fields:
        return pa.array([{}] * value.batch_size[0], type=pa.struct([]))
    return pa.StructArray.from_arrays([_arrow_array(pa, item, (key, name)) for name, item in fields],
                                      names=[name for name, _ in fields])


def _jagged_array(pa: Any, tensor: torch.Tensor, key: Any) -> Any:
    if tensor.layout is not torch.jagged:
        raise ValueError(f"to_arrow converts the nested tensors of layout torch.jagged only, got {tensor.layout}.")
    ragged_dim = getattr(tensor, "_ragged_idx")  # a jagged tensor's private attribute: no public accessor yet
    if ragged_dim != 1:
        raise ValueError(f"to_arrow needs the ragged dim of the jagged tensor {key!r} at position 1, got "
                         f"{ragged_dim}. Move it there first, for example with .transpose(1, {ragged_dim}).")
    offsets = getattr(tensor, "offsets")()
    return pa.LargeListArray.from_arrays(pa.array(offsets.numpy()), _arrow_array(pa, tensor.values(), key))
