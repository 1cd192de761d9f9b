"""Write a collection as a MosaicML Streaming (MDS) dataset, through ``streaming.MDSWriter``.

Each element along the first batch dim is one sample (a collection without batch dims is one sample). Tensors
are written as numpy arrays, 0-dim ones as Python numbers; the column encodings are inferred from the first
sample unless ``columns`` gives them. MDS columns are flat: call ``flatten_keys()`` first for nested entries.
"""
from __future__ import annotations

import contextlib
import warnings
from typing import Any, Optional, Union

import torch

from ._require import require

__all__ = ["to_mds"]

DEFAULT_SIZE_LIMIT = 1 << 26  # 64 MiB per shard, as upstream


def to_mds(td: Any, *, columns: Optional[dict] = None, out: Union[str, tuple], keep_local: bool = False,
           compression: Optional[str] = None, hashes: Optional[list] = None,
           size_limit: Union[int, str, None] = DEFAULT_SIZE_LIMIT, writer: Any = None,
           finish_writer: Optional[bool] = None, **kwargs: Any) -> None:
    """Write ``td`` to an MDS dataset at ``out`` (a folder, a remote URL, or ``(local, remote)``).

    ``columns`` maps each key to its MDS encoding (``{"obs": "ndarray", "name": "str"}``); ``keep_local``,
    ``compression``, ``hashes``, ``size_limit`` and ``kwargs`` go to ``streaming.MDSWriter``. A ``writer`` of
    the caller's is used instead; ``finish_writer`` says whether to finish it afterwards (default: left open
    for a collection without batch dims, finished with a ``FutureWarning`` otherwise, as upstream 0.15). Needs
    ``mosaicml-streaming`` (``pip install torchdict[mds]``). Raises ``ValueError`` for an empty collection.
    """
    streaming = require("streaming", "mds", "to_mds")
    if not td.numel():
        raise ValueError("Cannot write an empty TensorDict to a streaming dataset.")

    def new_writer(sample: Any) -> Any:
        return streaming.MDSWriter(out=out, columns=columns if columns is not None else infer_columns(sample),
                                   keep_local=keep_local, compression=compression, hashes=hashes,
                                   size_limit=size_limit, **kwargs)

    if td.batch_dims:
        if writer is None:
            writer, finish_writer = new_writer(td[0]), True
        elif finish_writer is None:
            warnings.warn("to_mds finished the writer passed by the caller after a tensordict with batch dims. "
                          "Starting with TensorDict 0.17, the default will change to leaving it open, as for a "
                          "tensordict without batch dims. Pass finish_writer=True or False to choose.",
                          FutureWarning, stacklevel=3)
            finish_writer = True
        samples = td.tolist(convert_tensors="numpy")
        with writer if finish_writer else contextlib.nullcontext(writer) as sink:
            for sample in samples:
                sink.write(_unwrap_scalars(sample))
        return

    created = writer is None
    if created:
        writer = new_writer(td)
    sample = _one_sample(td, writer, created)
    if created or finish_writer:
        with writer as sink:
            sink.write(sample)
    else:
        writer.write(sample)


def _one_sample(td: Any, writer: Any, created: bool) -> Any:
    """The sample a collection without batch dims writes: the writer's columns, numpy-converted.

    A caller's writer keeps its ``"pkl"`` columns as the entries themselves (pickled by the writer); a writer
    without column lists gets the collection as it is, as upstream.
    """
    names = getattr(writer, "column_names", None)
    encodings = getattr(writer, "column_encodings", None)
    if names is None or encodings is None:
        return td
    pickled = set() if created else {name for name, encoding in zip(names, encodings) if encoding == "pkl"}
    sample = td.select(*(name for name in names if name not in pickled), strict=False)
    sample = _unwrap_scalars(sample.tolist(convert_tensors="numpy"))
    for name in pickled:
        if name in td.keys():
            sample[name] = td[name]
    return sample


def _unwrap_scalars(sample: dict) -> dict:
    """0-dim arrays as Python numbers (the MDS scalar encodings take numbers, not arrays)."""
    import numpy as np

    for key, value in sample.items():
        if isinstance(value, np.ndarray) and value.shape == ():
            sample[key] = value.item()
    return sample


def infer_columns(sample: Any) -> dict:
    """The MDS encoding of each top-level entry of one sample."""
    return {key: mds_encoding(value) for key, value in sample.items()}


def mds_encoding(value: Any) -> str:
    """The MDS encoding of one value: ``"ndarray"`` for arrays with dims, a numeric one for 0-dim tensors
    (``"int"``, or the float dtype's name), ``"str"`` / ``"bytes"`` / ``"json"`` (lists) for Python values.

    >>> mds_encoding(torch.zeros(3)), mds_encoding(torch.tensor(1.5)), mds_encoding(torch.tensor(2)), mds_encoding("a")
    ('ndarray', 'float32', 'int', 'str')
    """
    import numpy as np

    from ..nontensor import NonTensorData, NonTensorStack

    if isinstance(value, NonTensorStack):
        return mds_encoding(value.tolist())
    if isinstance(value, NonTensorData):
        return mds_encoding(value.data)
    if isinstance(value, list):
        return "json"
    if isinstance(value, bytes):
        return "bytes"
    if isinstance(value, (torch.Tensor, np.ndarray)):
        if value.shape:
            return "ndarray"
        if isinstance(value, torch.Tensor):
            # MDS has one float encoding per width, and a single "int" for the integers.
            return str(value.dtype).removeprefix("torch.") if value.dtype.is_floating_point else "int"
        kind = value.dtype.kind
        return value.dtype.name if kind == "f" else "int" if kind in "ib" else "str"
    if isinstance(value, float):
        return "float64"
    if isinstance(value, (int, bool)):
        return "int"
    if isinstance(value, str):
        return "str"
    raise ValueError(f"Unknown type {type(value)}")
