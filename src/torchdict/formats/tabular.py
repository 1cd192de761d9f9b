"""Tables in and out: pandas DataFrames, CSV, JSON records and Parquet files, with upstream's column rules.

Writing: one column per leaf of a TensorDict with one batch dim. A leaf must hold one value per row (a 1-D
tensor or non-tensor data); nested TensorDicts need ``separator``, which joins the keys into column names
(``("obs", "x")`` -> ``"obs.x"`` with ``separator="."``). A nested tensorclass without ``separator`` is one
column of objects, as upstream.

Reading: one entry per column, batch size ``[num_rows]``. Numeric and boolean columns become tensors
(cast to ``dtype`` when given), datetimes int64 nanoseconds, categoricals their codes. Columns of other values
follow upstream: through pandas (``from_pandas``, ``from_csv``, ``from_json``) a string column is one
``NonTensorData`` holding the column's array; through pyarrow (``from_parquet``) it is a ``NonTensorStack``
with one value per row. ``separator`` splits column names back into nested keys.

Each file is read and written by its own library (pandas, pyarrow); a file written here appears at its path
only once complete.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from ._batch_options import apply_batch_options, result_class
from ._require import require
from ._write_target import atomic_target, is_path

__all__ = ["from_csv", "from_json", "from_pandas", "from_parquet", "to_csv", "to_json", "to_pandas", "to_parquet"]


# ---------------------------------------------------------------------------- TensorDict -> columns
def table_columns(td: Any, separator: Optional[str]) -> dict:
    """The columns of ``td``: column name -> a 1-D numpy array (tensor leaves, sharing CPU memory) or a list
    of Python values (non-tensor leaves); a tensorclass kept whole is passed on as it is."""
    from ..nontensor import NonTensorData, NonTensorStack

    leaves = _flat_leaves(td, separator) if separator is not None else _top_leaves(td)
    columns = {}
    for name, value in leaves.items():
        if isinstance(value, torch.Tensor):
            if value.ndim > 1:
                raise ValueError(f"Cannot convert tensor with shape {value.shape} at key '{name}' to a single "
                                 "DataFrame column. Only 1D tensors (matching the batch size) are supported.")
            columns[name] = value.detach().cpu().numpy()
        elif isinstance(value, (NonTensorData, NonTensorStack)):
            columns[name] = value.tolist()
        else:
            columns[name] = value
    return columns


def _top_leaves(td: Any) -> dict:
    from .._base import is_tensor_collection
    from ..tensorclass import is_tensorclass

    leaves = {}
    for key, value in td.items():
        if is_tensor_collection(value) and not _is_non_tensor(value) and not is_tensorclass(value):
            raise ValueError(f"Nested TensorDict at key '{key}' requires a separator parameter to flatten to "
                             "DataFrame columns. Use to_pandas(separator='.').")
        leaves[key] = value
    return leaves


def _flat_leaves(td: Any, separator: str) -> dict:
    from .._base import is_tensor_collection
    from ..tensorclass import is_tensorclass

    leaves = {}
    for key, value in td.items():
        if is_tensor_collection(value) and not _is_non_tensor(value):
            inner = _flat_leaves(value, separator)
            if is_tensorclass(value) and (not inner or any(_needs_object_column(item) for item in inner.values())):
                # A tensorclass with no leaf, or a leaf that doesn't fit one column, stays one column of
                # objects (upstream keeps it so, for the calls that worked before it flattened them).
                leaves[key] = value
                continue
            for name, item in inner.items():
                leaves[f"{key}{separator}{name}"] = item
        else:
            leaves[key] = value
    return leaves


def _needs_object_column(value: Any) -> bool:
    from ..tensorclass import is_tensorclass

    if isinstance(value, torch.Tensor):
        return value.ndim > 1
    return is_tensorclass(value) and not _is_non_tensor(value)


def _is_non_tensor(value: Any) -> bool:
    from ..nontensor import NonTensorData, NonTensorStack

    return isinstance(value, (NonTensorData, NonTensorStack))


def _frame(td: Any, separator: Optional[str], *, for_writing: bool) -> Any:
    pd = require("pandas", "arrow", "to_pandas")
    # A frame made only to be written may share the tensors' memory: pandas then writes from it directly.
    return pd.DataFrame(table_columns(td, separator), copy=not for_writing)


# ---------------------------------------------------------------------------- writers
def to_pandas(td: Any, *, separator: Optional[str] = None) -> Any:
    """A ``pandas.DataFrame`` with one column per leaf of ``td`` (copies of the tensors' data).

    >>> import torch
    >>> from torchdict import TensorDict
    >>> list(to_pandas(TensorDict(a=torch.arange(2), n={"b": torch.zeros(2)}, batch_size=[2]), separator=".").columns)
    ['a', 'n.b']
    """
    return _frame(td, separator, for_writing=False)


def to_csv(td: Any, path: Any, *, separator: Optional[str] = None, **kwargs: Any) -> None:
    """Write ``td`` as a CSV file through ``pandas.DataFrame.to_csv`` (no index column; ``kwargs`` go to it)."""
    require("pandas", "arrow", "to_csv")
    frame = _frame(td, separator, for_writing=True)
    _write(path, kwargs, lambda target: frame.to_csv(target, index=False, **kwargs))


def to_json(td: Any, path: Any, *, separator: Optional[str] = None, lines: bool = False, **kwargs: Any) -> None:
    """Write ``td`` as JSON records (one per row; JSON Lines with ``lines=True``) through ``pandas.DataFrame.to_json``."""
    require("pandas", "arrow", "to_json")
    frame = _frame(td, separator, for_writing=True)
    _write(path, kwargs, lambda target: frame.to_json(target, orient="records", lines=lines, **kwargs))


def to_parquet(td: Any, path: Any, *, separator: Optional[str] = None, **kwargs: Any) -> None:
    """Write ``td`` as a Parquet file through ``pyarrow.parquet.write_table`` (``kwargs`` go to it).

    The Arrow table is built straight from the columns (numeric ones without a copy). Without pyarrow, falls
    back to ``pandas.DataFrame.to_parquet`` as upstream does.
    """
    try:
        pa = require("pyarrow", "arrow", "to_parquet")
    except ImportError:
        require("pandas", "arrow", "to_parquet")
        frame = _frame(td, separator, for_writing=True)
        _write(path, kwargs, lambda target: frame.to_parquet(target, **kwargs))
        return
    import pyarrow.parquet as pq

    table = pa.table(table_columns(td, separator))
    _write(path, kwargs, lambda target: pq.write_table(table, target, **kwargs))


def _write(path: Any, kwargs: dict, write: Any) -> None:
    """Run ``write(target)`` so that a failed write leaves nothing at ``path`` (when it names a file that is
    written whole: an appending ``mode`` writes in place)."""
    if is_path(path) and kwargs.get("mode", "w") in ("w", "wb", "wt"):
        with atomic_target(path) as temporary:
            write(temporary)
    else:
        write(path)


# ---------------------------------------------------------------------------- columns -> TensorDict
def build_from_columns(cls: Optional[type], columns: dict, num_rows: int, *, device: Any, batch_size: Any,
                       separator: Optional[str], dtype: Optional[torch.dtype]) -> Any:
    """The TensorDict of a table's columns (column name -> numpy array or list of values), as upstream."""
    import numpy as np

    entries: dict = {}
    for name, column in columns.items():
        if isinstance(column, torch.Tensor):
            entries[name] = column.to(dtype) if dtype is not None else column  # see arrow_columns
        elif isinstance(column, np.ndarray) and column.dtype.kind in "iufb":
            # Copied: the reader's buffers may be read-only or shared with the frame.
            entries[name] = torch.as_tensor(column.copy()).to(dtype) if dtype is not None else column.copy()
        elif isinstance(column, np.ndarray) and column.dtype.kind == "M":
            entries[name] = column.astype("datetime64[ns]").astype(np.int64)
        elif isinstance(column, list) and _is_ragged(column):
            from ..nontensor import NonTensorStack

            # One value per row (stacking refuses ragged rows): a row of numbers as a tensor, as upstream.
            entries[name] = NonTensorStack._from_flat([_row_value(row) for row in column], [len(column)])
        else:
            entries[name] = column
    if separator is not None:
        entries = _nest(entries, separator)
    return result_class(cls)(entries, batch_size=[num_rows] if batch_size is None else batch_size, device=device)


def _is_ragged(values: list) -> bool:
    """Whether a column of lists has rows of different lengths (stacking refuses them: one value per row)."""
    lengths = {len(value) if isinstance(value, list) else -1 for value in values}
    return len(lengths) > 1 and any(isinstance(value, list) for value in values)


def _row_value(row: Any) -> Any:
    if isinstance(row, list) and all(type(item) in (int, float, bool) for item in row):
        return torch.tensor(row)
    return row


def _nest(flat: dict, separator: str) -> dict:
    """Column names split on ``separator`` into nested dicts."""
    nested: dict = {}
    for name, value in flat.items():
        *parents, leaf = name.split(separator)
        level = nested
        for part in parents:
            child = level.setdefault(part, {})
            if not isinstance(child, dict):
                raise ValueError(f"Key conflict: '{part}' is both a leaf and a prefix in column names")
            level = child
        level[leaf] = value
    return nested


def frame_columns(frame: Any) -> dict:
    """A DataFrame's columns as numpy arrays (categoricals as their codes)."""
    import pandas as pd

    columns = {}
    for name in frame.columns:
        series = frame[name]
        if isinstance(series.dtype, pd.CategoricalDtype):
            columns[str(name)] = series.cat.codes.to_numpy().copy()
        else:
            columns[str(name)] = series.to_numpy()
    return columns


def arrow_columns(table: Any) -> dict:
    """An Arrow table's columns: integers and floats without nulls as tensors viewing the table's memory
    (copied when read-only), other numbers, booleans and timestamps as numpy arrays, numeric fixed-shape
    tensors without nulls as numpy arrays of their shape, the rest as lists of Python values.

    For a table a reader just made (Parquet, CSV): its memory is the result's alone, no copy is needed.
    """
    import pyarrow as pa

    from .arrow import _number_types, number_view

    number_types = _number_types(pa)
    types = pa.types
    columns = {}
    for index, name in enumerate(table.column_names):
        column = table.column(index)
        kind = column.type
        if kind.id in number_types and not column.null_count:
            # one chunk per row group: several are combined (one copy, into memory of its own) and viewed
            array = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
            view = number_view(array)
            columns[name] = view if view is not None else torch.from_numpy(array.to_numpy(zero_copy_only=False).copy())
        elif types.is_integer(kind) or types.is_floating(kind) or types.is_boolean(kind) or types.is_timestamp(kind):
            columns[name] = column.to_numpy()
        elif _is_plain_tensor_column(pa, column):
            columns[name] = column.combine_chunks().to_numpy_ndarray()
        else:
            columns[name] = column.to_pylist()
    return columns


def _is_plain_tensor_column(pa: Any, column: Any) -> bool:
    """A fixed-shape tensor column of numbers with no null row or value (``to_numpy_ndarray`` keeps its shape;
    it refuses bools and reads nulls as garbage)."""
    kind = column.type
    if getattr(kind, "extension_name", None) != "arrow.fixed_shape_tensor":
        return False
    value_type = kind.value_type
    if not (pa.types.is_integer(value_type) or pa.types.is_floating(value_type)) or column.null_count:
        return False
    return not any(chunk.storage.flatten().null_count for chunk in column.chunks)


# ---------------------------------------------------------------------------- readers
def read_pandas(cls: Optional[type], dataframe: Any, *, auto_batch_size: bool = False, batch_dims: Optional[int] = None,
                device: Any = None, batch_size: Any = None, separator: Optional[str] = None,
                dtype: Optional[torch.dtype] = None) -> Any:
    """``cls.from_pandas``: see :func:`from_pandas`."""
    require("pandas", "arrow", "from_pandas")
    result = build_from_columns(cls, frame_columns(dataframe), len(dataframe), device=device, batch_size=batch_size,
                                separator=separator, dtype=dtype)
    return apply_batch_options(result, "from_pandas", auto_batch_size, batch_dims, batch_size)


def read_csv(cls: Optional[type], path: Any, *, auto_batch_size: bool = False, batch_dims: Optional[int] = None,
             device: Any = None, batch_size: Any = None, separator: Optional[str] = None,
             dtype: Optional[torch.dtype] = None, **kwargs: Any) -> Any:
    """``cls.from_csv``: see :func:`from_csv`."""
    try:
        pd = require("pandas", "arrow", "from_csv")
    except ImportError:
        # As upstream: pyarrow's CSV reader when pandas is missing (string columns then one value per row).
        require("pyarrow", "arrow", "from_csv")
        import pyarrow.csv as pa_csv

        table = pa_csv.read_csv(str(path), **kwargs)
        columns, num_rows = arrow_columns(table), table.num_rows
    else:
        frame = pd.read_csv(path, **kwargs)
        columns, num_rows = frame_columns(frame), len(frame)
    result = build_from_columns(cls, columns, num_rows, device=device, batch_size=batch_size, separator=separator,
                                dtype=dtype)
    return apply_batch_options(result, "from_csv", auto_batch_size, batch_dims, batch_size)


def read_json(cls: Optional[type], path: Any, *, auto_batch_size: bool = False, batch_dims: Optional[int] = None,
              device: Any = None, batch_size: Any = None, separator: Optional[str] = None,
              dtype: Optional[torch.dtype] = None, lines: bool = False, **kwargs: Any) -> Any:
    """``cls.from_json``: see :func:`from_json`."""
    pd = require("pandas", "arrow", "from_json")
    frame = pd.read_json(path, lines=lines, **kwargs)
    columns = {str(name): frame[name].to_numpy() for name in frame.columns}
    result = build_from_columns(cls, columns, len(frame), device=device, batch_size=batch_size, separator=separator,
                                dtype=dtype)
    return apply_batch_options(result, "from_json", auto_batch_size, batch_dims, batch_size)


def read_parquet(cls: Optional[type], path: Any, *, auto_batch_size: bool = False, batch_dims: Optional[int] = None,
                 device: Any = None, batch_size: Any = None, separator: Optional[str] = None,
                 dtype: Optional[torch.dtype] = None, columns: Optional[list] = None, **kwargs: Any) -> Any:
    """``cls.from_parquet``: see :func:`from_parquet`."""
    try:
        require("pyarrow", "arrow", "from_parquet")
    except ImportError:
        pd = require("pandas", "arrow", "from_parquet")
        frame = pd.read_parquet(path, columns=columns, **kwargs)
        table_columns_, num_rows = {str(name): frame[name].to_numpy() for name in frame.columns}, len(frame)
    else:
        import pyarrow.parquet as pq

        table = pq.read_table(str(path), columns=columns, **kwargs)
        table_columns_, num_rows = arrow_columns(table), table.num_rows
    result = build_from_columns(cls, table_columns_, num_rows, device=device, batch_size=batch_size,
                                separator=separator, dtype=dtype)
    return apply_batch_options(result, "from_parquet", auto_batch_size, batch_dims, batch_size)


# ---------------------------------------------------------------------------- top-level functions
def from_pandas(dataframe: Any, *, auto_batch_size: bool = False, batch_dims: Optional[int] = None,
                device: Any = None, batch_size: Any = None, separator: Optional[str] = None,
                dtype: Optional[torch.dtype] = None) -> Any:
    """A TensorDict with one entry per column of a ``pandas.DataFrame`` (see the module docstring).

    >>> import pandas as pd
    >>> td = from_pandas(pd.DataFrame({"obs.x": [1.0, 2.0], "done": [False, True]}), separator=".")
    >>> td["obs", "x"], td.batch_size
    (tensor([1., 2.], dtype=torch.float64), torch.Size([2]))
    """
    return read_pandas(None, dataframe, auto_batch_size=auto_batch_size, batch_dims=batch_dims, device=device,
                       batch_size=batch_size, separator=separator, dtype=dtype)


def from_csv(path: Any, *, auto_batch_size: bool = False, batch_dims: Optional[int] = None, device: Any = None,
             batch_size: Any = None, separator: Optional[str] = None, dtype: Optional[torch.dtype] = None,
             **kwargs: Any) -> Any:
    """A TensorDict read from a CSV file with ``pandas.read_csv`` (``kwargs`` go to it), one entry per column."""
    return read_csv(None, path, auto_batch_size=auto_batch_size, batch_dims=batch_dims, device=device,
                    batch_size=batch_size, separator=separator, dtype=dtype, **kwargs)


def from_json(path: Any, *, auto_batch_size: bool = False, batch_dims: Optional[int] = None, device: Any = None,
              batch_size: Any = None, separator: Optional[str] = None, dtype: Optional[torch.dtype] = None,
              lines: bool = False, **kwargs: Any) -> Any:
    """A TensorDict read from a JSON array of records (JSON Lines with ``lines=True``) with ``pandas.read_json``."""
    return read_json(None, path, auto_batch_size=auto_batch_size, batch_dims=batch_dims, device=device,
                     batch_size=batch_size, separator=separator, dtype=dtype, lines=lines, **kwargs)


def from_parquet(path: Any, *, auto_batch_size: bool = False, batch_dims: Optional[int] = None, device: Any = None,
                 batch_size: Any = None, separator: Optional[str] = None, dtype: Optional[torch.dtype] = None,
                 columns: Optional[list] = None, **kwargs: Any) -> Any:
    """A TensorDict read from a Parquet file with ``pyarrow.parquet.read_table`` (only ``columns`` if given)."""
    return read_parquet(None, path, auto_batch_size=auto_batch_size, batch_dims=batch_dims, device=device,
                        batch_size=batch_size, separator=separator, dtype=dtype, columns=columns, **kwargs)
