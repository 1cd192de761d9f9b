"""The hottest paths of torchdict, in C when the optional extension is built.

The C module ``torchdict._speedups`` (sources in ``src/torchdict/_csrc/``) holds C versions
of the batch checks (a tensor's first size, "every value of this dict / list is a tensor of
first size n"), of ``td["key"]`` and ``td["a", "b"]``, of the walk of ``apply(fn)`` over a
plain tree, and of a tensorclass's ``data[i]`` and ``Cls(*tensors, batch_size=[n])``. This
module picks them, or their pure-Python twins (below, or the Python code they front), which
give the same answers and raise the same error types. C pays where Python's own call
overhead is the cost: reaching torch's C length slot from Python costs a call and an
argument tuple per tensor (building a TensorDict of 100 leaves takes half the time with the
C check), and a Python ``__getitem__`` costs as much as the dict lookup it wraps.

The extension is built by ``pip install`` when a C compiler is present (``setup.py``
marks it optional). Setting ``TORCHDICT_PURE_PYTHON=1`` before the import uses the twins
even when it is built: the test suite runs its fast tests that way too.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Optional

import torch

__all__ = ["USING_C", "tensor_len", "leaves_fit", "lengths_fit", "zip_dict", "collect_tree", "field_indexer",
           "FieldIndexer", "field_init", "install_tensordict_getitem"]

_TensorBase: Any = getattr(torch._C, "TensorBase", getattr(torch._C, "_TensorBase", None))
_Tensor = torch.Tensor


def _load_extension() -> Optional[Any]:
    if os.environ.get("TORCHDICT_PURE_PYTHON", "") not in ("", "0"):
        return None
    try:
        from . import _speedups  # type: ignore[attr-defined]

        _speedups.setup(_TensorBase, _Tensor)  # refuses a torch whose tensor class has no C length
    except (ImportError, TypeError):
        return None
    return _speedups


_C = _load_extension()
#: True when the C helpers are in use.
USING_C = _C is not None


# ------------------------------------------------------------------ pure-Python twins
# The first size of a tensor (0 for a 0-dim one), read by torch's C slot under
# torch.Tensor.__len__ (which is a slower Python wrapper that raises on 0-dim tensors);
# TypeError for anything that is not a tensor.
py_tensor_len: Callable[[Any], int] = _TensorBase.__len__

_TYPE_PASS_MAX = 16
_ONLY_TENSOR = {_Tensor}


def py_leaves_fit(source: dict, first: int) -> bool:
    """True when ``first > 0``, ``source`` is not empty, every key is a str (a subclass too)
    and every value a tensor (a subclass too) whose first size is ``first``: such a dict is
    a valid storage for the batch size ``[first]``.

    Two C-level passes (keys joined, first sizes) instead of a Python loop. Each pass is also
    a type test. A 0-dim tensor has C length 0, hence ``first > 0``.
    """
    if not isinstance(source, dict):
        raise TypeError("leaves_fit expects a dict")
    if first <= 0 or not source:
        return False
    values = source.values()
    # A small dict (typically one level of a nested source, holding a sub-dict) gets a type
    # pass first: cheaper than the TypeError the length pass would raise. A large one skips it.
    if len(source) <= _TYPE_PASS_MAX:
        types = set(map(type, values))
        if types != _ONLY_TENSOR and not all(issubclass(kind, _Tensor) for kind in types):
            return False
    try:
        # join raises TypeError unless every key is a str; the length pass unless every
        # value is a tensor.
        "".join(source)
        return set(map(py_tensor_len, values)) == {first}
    except TypeError:
        return False


def py_lengths_fit(values: Any, first: int) -> bool:
    """True when ``first > 0`` and the list or tuple ``values`` holds at least one item, each a
    tensor whose first size is ``first``."""
    if not isinstance(values, (list, tuple)):
        raise TypeError("lengths_fit expects a list or a tuple")
    if first <= 0:
        return False
    try:
        return set(map(py_tensor_len, values)) == {first}
    except TypeError:
        return False


def py_zip_dict(keys: Any, values: list, start: int, count: int) -> dict:
    """``{keys[i]: values[start + i]}`` for the first ``count`` keys of ``keys`` (a dict or a list)."""
    if (type(keys) is not dict and type(keys) is not list) or type(values) is not list:
        raise TypeError("zip_dict expects a dict or list of keys and a list of values")
    if start < 0 or count < 0 or start + count > len(values):
        raise ValueError("zip_dict: start and count out of range")
    return dict(zip(keys, values[start:start + count]))


# ------------------------------------------------------------------ the picks
tensor_len: Callable[[Any], int] = _C.tensor_len if _C is not None else py_tensor_len
leaves_fit: Callable[[dict, int], bool] = _C.leaves_fit if _C is not None else py_leaves_fit
lengths_fit: Callable[[Any, int], bool] = _C.lengths_fit if _C is not None else py_lengths_fit
zip_dict: Callable[[Any, list, int, int], dict] = _C.zip_dict if _C is not None else py_zip_dict
#: ``collect_tree(td, batch_size, batch_member)``: the first pass of apply on a plain tree, in C;
#: None without C (its twin is _apply_tree.py_collect_tree).
collect_tree: Optional[Callable] = _C.collect_tree if _C is not None else None
#: ``make_field_indexer(names, state, general, no_batch, Tensor)``: a tensorclass's ``data[i]``
#: in C (see _tensorclass_indexing, whose generated Python code is its twin); None without C.
field_indexer: Optional[Callable] = _C.make_field_indexer if _C is not None else None
FieldIndexer: Optional[type] = _C.FieldIndexer if _C is not None else None
#: ``make_field_init(names, state, general)``: a tensorclass's ``Cls(*tensors, batch_size=[n])``
#: in C, in front of its generated Python ``__init__`` (see _tensorclass_fields.make_init).
field_init: Optional[Callable] = _C.make_field_init if _C is not None else None


#: The Python ``TensorDict.__getitem__`` (set by install_tensordict_getitem): the general path the C
#: method hands over to, kept here so that tests can compare the two.
python_getitem: Optional[Callable] = None


def install_tensordict_getitem(cls: type, non_tensor_types: tuple) -> None:
    """Give ``cls`` (TensorDict) a C ``__getitem__`` when the extension is built.

    The C method answers an exact str key found in ``cls._tensordict`` and a tuple of exact
    str keys walking through plain TensorDicts (the entry; a non-tensor wrapper's ``.data``).
    Every other index, and every miss, goes to the Python ``__getitem__`` it replaces, which
    stays the general path and words the errors.
    """
    global python_getitem
    python_getitem = general = cls.__dict__["__getitem__"]
    if _C is None:
        return
    data_cls, stack_cls = non_tensor_types
    member = cls.__dict__["_tensordict"]
    setattr(cls, "__getitem__", _C.make_getitem(cls, member, data_cls, stack_cls, general))
