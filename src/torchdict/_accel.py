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

``torch.compile``: Dynamo cannot look into C, so it must meet Python wherever a C helper
runs. The C methods run from the type slots (``mp_subscript``, ``tp_init``), while the
class ``__dict__`` keeps Python functions, which Dynamo reads and traces; and the C
functions (and the twins built on torch's C length) are paired with traceable twins in
``_compile.py``, registered with Dynamo only once ``torch._dynamo`` is imported (a
``sys.meta_path`` watcher below), so that ``import torchdict`` never imports it.
"""
from __future__ import annotations

import functools
import os
import sys
from typing import Any, Callable, Optional

import torch

__all__ = ["USING_C", "set_unbatched_class", "tensor_len", "leaves_fit", "lengths_fit", "shape_fits", "leaves_fit_batch", "zip_dict", "collect_tree", "field_indexer",
           "FieldIndexer", "field_init", "install_tensordict_getitem", "slot_getitem", "front_tensorclass_slots",
           "fronted_slots", "descriptor_setter", "descriptor_setters"]

_TensorBase: Any = getattr(torch._C, "TensorBase", getattr(torch._C, "_TensorBase", None))
_Tensor = torch.Tensor


def _load_extension() -> Optional[Any]:
    if os.environ.get("TORCHDICT_PURE_PYTHON", "") not in ("", "0"):
        return None
    try:
        from . import _speedups

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

#: UnbatchedTensor, once ``_unbatched`` has called :func:`set_unbatched_class`: a tensor with no batch
#: dims, which no batch check below fits (its write then takes the Python path, which places it).
unbatched_class: Optional[type] = None


def set_unbatched_class(cls: type) -> None:
    """Tell the batch checks (C and twins) the class of the tensors they never fit."""
    global unbatched_class
    unbatched_class = cls
    if _C is not None:
        _C.set_unbatched(cls)


def _any_unbatched(types: Any) -> bool:
    """Whether one of the value ``types`` is an UnbatchedTensor class (a C-level pass of the few types)."""
    cls = unbatched_class
    return cls is not None and any(issubclass(kind, cls) for kind in types if kind is not _Tensor)


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
        if types != _ONLY_TENSOR and (not all(issubclass(kind, _Tensor) for kind in types) or _any_unbatched(types)):
            return False
    try:
        # join raises TypeError unless every key is a str; the length pass unless every
        # value is a tensor.
        "".join(source)
        if set(map(py_tensor_len, values)) != {first}:
            return False
    except TypeError:
        return False
    return len(source) <= _TYPE_PASS_MAX or unbatched_class is None or not _any_unbatched(set(map(type, values)))


def py_lengths_fit(values: Any, first: int) -> bool:
    """True when ``first > 0`` and the list or tuple ``values`` holds at least one item, each a
    tensor whose first size is ``first``."""
    if not isinstance(values, (list, tuple)):
        raise TypeError("lengths_fit expects a list or a tuple")
    if first <= 0:
        return False
    try:
        if set(map(py_tensor_len, values)) != {first}:
            return False
    except TypeError:
        return False
    return unbatched_class is None or not _any_unbatched(set(map(type, values)))


def py_shape_fits(value: Any, batch_size: tuple) -> bool:
    """True when ``value`` is a tensor whose shape starts with ``batch_size`` (a torch.Size or tuple)."""
    if not isinstance(batch_size, tuple):
        raise TypeError("shape_fits expects the batch size as a torch.Size or a tuple")
    if not isinstance(value, _Tensor) or (unbatched_class is not None and isinstance(value, unbatched_class)):
        return False
    return value.shape[:len(batch_size)] == batch_size


def py_leaves_fit_batch(source: dict, batch_size: tuple) -> bool:
    """:func:`py_leaves_fit` for a batch of any number of dims: ``source`` is not empty, every key a str
    and every value a tensor whose shape starts with ``batch_size``."""
    if not isinstance(source, dict):
        raise TypeError("leaves_fit_batch expects a dict")
    if not isinstance(batch_size, tuple):
        raise TypeError("leaves_fit_batch expects the batch size as a torch.Size or a tuple")
    if not source:
        return False
    try:
        "".join(source)  # a TypeError unless every key is a str
    except TypeError:
        return False
    n_batch = len(batch_size)
    for value in source.values():
        if not isinstance(value, _Tensor) or value.shape[:n_batch] != batch_size:
            return False
    return unbatched_class is None or not _any_unbatched(set(map(type, source.values())))


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
shape_fits: Callable[[Any, tuple], bool] = _C.shape_fits if _C is not None else py_shape_fits
leaves_fit_batch: Callable[[dict, tuple], bool] = _C.leaves_fit_batch if _C is not None else py_leaves_fit_batch
zip_dict: Callable[[Any, list, int, int], dict] = _C.zip_dict if _C is not None else py_zip_dict
#: ``collect_tree(td, batch_size, batch_member)``: the first pass of apply on a plain tree, in C;
#: None without C (its twin is _apply_tree.py_collect_tree).
collect_tree: Optional[Callable] = _C.collect_tree if _C is not None else None
#: ``make_field_indexer(names, state, general, no_batch, Tensor)``: a tensorclass's ``data[i]``
#: in C (see tensorclass._indexing, whose generated Python code is its twin); None without C.
field_indexer: Optional[Callable] = _C.make_field_indexer if _C is not None else None
FieldIndexer: Optional[type] = _C.FieldIndexer if _C is not None else None
#: ``make_field_init(names, state, general)``: a tensorclass's ``Cls(*tensors, batch_size=[n])``
#: in C, in front of its generated Python ``__init__`` (see tensorclass._fields.make_init).
field_init: Optional[Callable] = _C.make_field_init if _C is not None else None


#: The Python ``TensorDict.__getitem__`` (set by install_tensordict_getitem): the general path the C
#: slot hands over to, kept here so that tests can compare the two.
python_getitem: Optional[Callable] = None

#: The attribute of a Python function in a class ``__dict__`` that names the C helper running from
#: the class's type slot in its place (see front_tensorclass_slots).
C_HELPER = "_torchdict_c"


def slot_getitem(general: Callable) -> Callable:
    """The Python ``__getitem__`` a class keeps in its ``__dict__`` while C runs from its slot.

    It calls ``general(self, index)``. Its extra ``*_`` parameter matters: CPython's
    specialising interpreter calls a plain two-argument Python ``__getitem__`` directly,
    skipping the type slot (and the C in it); a function taking ``*args`` is left to the slot.
    """

    def __getitem__(self: Any, index: Any, *_: Any) -> Any:
        return general(self, index)

    return functools.update_wrapper(__getitem__, general)


def install_tensordict_getitem(cls: type, non_tensor_types: tuple) -> None:
    """Give ``cls`` (TensorDict) a C ``td[index]`` when the extension is built.

    The C code answers an exact str key found in ``cls._tensordict`` and a tuple of exact
    str keys walking through plain TensorDicts (the entry; a non-tensor wrapper's ``.data``),
    from the type's ``mp_subscript`` slot. Every other index, and every miss, goes to the
    Python ``__getitem__``, which stays the general path, words the errors, and is what
    ``TensorDict.__getitem__`` (the class ``__dict__``) holds, for Dynamo and ``inspect``.
    A subclass of ``cls`` gets CPython's own slot: the Python path.
    """
    global python_getitem
    python_getitem = general = cls.__dict__["__getitem__"]
    if _C is None:
        return
    data_cls, stack_cls = non_tensor_types
    member = cls.__dict__["_tensordict"]
    setattr(cls, "__getitem__", slot_getitem(general))  # resets the slot: set it afterwards
    _C.install_getitem(cls, member, data_cls, stack_cls, general)


def front_tensorclass_slots(cls: type) -> None:
    """Run the C helpers that ``cls``'s ``__getitem__`` / ``__init__`` carry from its type slots.

    A tensorclass's generated ``__init__`` and its ``__getitem__`` carry their C twin (a
    ``FieldInit``, a ``FieldIndexer``) as ``C_HELPER``; assigning either on the class gives
    its slot back to CPython, so this runs after every such assignment (idempotent).
    """
    if _C is None:
        return
    own = cls.__dict__
    indexer = getattr(own.get("__getitem__"), C_HELPER, None)
    if indexer is not None:
        _C.front_getitem(cls, indexer)
    init = getattr(own.get("__init__"), C_HELPER, None)
    if init is not None:
        _C.front_init(cls, init)


#: descriptor -> its setter (one each, so that Dynamo gets one traceable twin per descriptor).
_SETTERS: dict = {}
#: Called with (setter, attribute name) for a setter made after the Dynamo registration (_compile sets it).
on_new_setter: Optional[Callable[[Callable, str], None]] = None


def descriptor_setter(descriptor: Any) -> Callable[[Any, Any], None]:
    """``descriptor.__set__`` (e.g. of a ``__slots__`` member) as a plain function ``(instance, value)``.

    A method-wrapper like ``descriptor.__set__`` is as fast but opaque to torch.compile, and
    only a function can be given a traceable twin (``_compile.py``). In C the setter is a
    builtin function bound to the descriptor; the pure-Python twin calls ``__set__``.
    """
    setter = _SETTERS.get(descriptor)
    if setter is None:
        if _C is not None:
            setter = _C.descriptor_setter(descriptor)
        else:
            store = descriptor.__set__

            def setter(instance: Any, value: Any) -> None:
                store(instance, value)

        _SETTERS[descriptor] = setter
        name = getattr(descriptor, "__name__", None)
        if on_new_setter is not None and type(name) is str:
            on_new_setter(setter, name)
    return setter


def descriptor_setters() -> list:
    """``[(setter, attribute name)]`` of every setter made so far (for the Dynamo registration)."""
    return [(setter, descriptor.__name__) for descriptor, setter in list(_SETTERS.items())
            if type(getattr(descriptor, "__name__", None)) is str]


def fronted_slots(cls: type) -> tuple:
    """The slots of ``cls`` that run C helpers: ``"__getitem__"`` and/or ``"__init__"`` (none without C)."""
    return () if _C is None else _C.fronted(cls)


# ------------------------------------------------------------------ torch.compile
# Dynamo gets the traceable twins of the C helpers (``_compile.register``) when torch._dynamo is
# imported, never before: importing it costs ~1 s, and most programs never compile.
_DYNAMO = "torch._dynamo"


def _register_with_dynamo() -> None:
    try:
        from . import _compile

        _compile.register()
    except Exception as error:  # never break the import of torch._dynamo
        import warnings

        warnings.warn(f"torchdict could not register its torch.compile support: {error!r}", RuntimeWarning,
                      stacklevel=2)


class _DynamoWatcher:
    """A ``sys.meta_path`` entry that runs :func:`_register_with_dynamo` right after torch._dynamo's import.

    It finds the module's spec with the other finders, and wraps that spec's loader's
    ``exec_module`` (an attribute of that one loader instance) so that the registration
    follows the module's execution; then it leaves ``sys.meta_path``.
    """

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != _DYNAMO:
            return None
        self.remove()
        import importlib.util

        spec = importlib.util.find_spec(fullname)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        execute = loader.exec_module

        def exec_module(module: Any) -> None:
            try:
                execute(module)
            finally:
                try:
                    del loader.exec_module
                except AttributeError:
                    pass
            _register_with_dynamo()

        loader.exec_module = exec_module
        return spec

    def remove(self) -> None:
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass


def watch_for_dynamo() -> None:
    """Register with Dynamo now if torch._dynamo is imported, else as soon as it is."""
    if _DYNAMO in sys.modules:
        _register_with_dynamo()
    elif not any(type(finder) is _DynamoWatcher for finder in sys.meta_path):
        sys.meta_path.insert(0, _DynamoWatcher())


watch_for_dynamo()
