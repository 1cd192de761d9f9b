"""The generated ``__getitem__`` of a tensorclass: ``data[i]`` and ``data[a:b]`` unrolled over its fields.

Indexing an instance along its one batch dim is the hot path of a dataset of
tensorclasses (iterating it, slicing minibatches). A generic loop over the fields costs
about as much as indexing one small tensor, so each class gets its own ``__getitem__``,
generated from its field names the way dataclasses generate ``__init__``: it reads each
field from the instance dict, indexes it, and fills the new instance's (fresh) dict.

It only takes the case it can finish without a check failing: an int or a slice, a
one-dim batch, every field present and a plain ``torch.Tensor``. Everything else goes to
the general ``__getitem__`` the class inherits, and so does an index torch refuses (an
int out of range, a slice step <= 0: refused on the first field, before anything is
built), so that the general path words the error.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional

import torch

from .._accel import C_HELPER, descriptor_setter, field_indexer, FieldIndexer, front_tensorclass_slots, slot_getitem
from .._convert import tensor_len
from ._generated import exec_generated
from .._indexing import NO_BATCH

if TYPE_CHECKING:
    from ._delegation import TensorDictMethods

_MARK = "_tc_generated"


def _generated_source(names: tuple) -> str:
    fields = list(enumerate(names))
    plain = " and ".join(f"type(_tc_{position}) is _tc_Tensor" for position, _ in fields)
    return "\n".join([
        "def __getitem__(self, index):",
        "    _tc_kind = type(index)",
        "    if _tc_kind is int or _tc_kind is slice:",
        "        _tc_td = self._td",  # (batch_size, device) until a TensorDict is needed
        "        if type(_tc_td) is tuple and len(_tc_td[0]) == 1:",
        "            _tc_source = self.__dict__",
        f"            if len(_tc_source) == {len(names)}:",
        "                try:",
        *[f"                    _tc_{position} = _tc_source[{name!r}]" for position, name in fields],
        "                except KeyError:",
        "                    return _tc_general(self, index)",
        f"                if {plain}:",
        "                    try:",
        "                        _tc_0 = _tc_0[index]",
        "                    except (IndexError, ValueError):",
        "                        return _tc_general(self, index)",
        # The new batch: none for an int; for a slice, the rows it kept (the C length of a
        # field, cheaper than computing it from the slice's bounds).
        "                    _tc_batch = _tc_NO_BATCH if _tc_kind is int else (_tc_len(_tc_0),)",
        *[f"                    _tc_{position} = _tc_{position}[index]" for position, _ in fields[1:]],
        "                    _tc_new = _tc_object_new(type(self))",
        "                    _tc_out = _tc_new.__dict__",
        *[f"                    _tc_out[{name!r}] = _tc_{position}" for position, name in fields],
        "                    _tc_set_td(_tc_new, (_tc_batch, _tc_td[1]))",
        "                    return _tc_new",
        "    return _tc_general(self, index)",
    ])


def make_getitem(cls: type, names: tuple, general: Callable, state: Any) -> Callable:
    """The ``__getitem__`` of ``cls`` (fields ``names``), falling back on ``general``.

    ``state`` is the descriptor of the instances' ``_td`` slot. With the C helpers built, the
    method is their ``FieldIndexer`` (the same steps without a Python frame); otherwise it is
    generated here.
    """
    if field_indexer is not None:
        # The C FieldIndexer runs from the type slot; the class keeps a Python __getitem__ (Dynamo's).
        front = slot_getitem(general)
        setattr(front, C_HELPER, field_indexer(tuple(names), state, general, NO_BATCH, torch.Tensor))
        setattr(front, _MARK, True)
        front.__qualname__ = f"{cls.__qualname__}.__getitem__"
        return front
    namespace: dict = {"_tc_Tensor": torch.Tensor, "_tc_NO_BATCH": NO_BATCH, "_tc_len": tensor_len,
                       "_tc_object_new": object.__new__, "_tc_set_td": descriptor_setter(state), "_tc_general": general}
    exec_generated(_generated_source(names), f"{cls.__qualname__}.__getitem__", namespace)
    getitem = namespace["__getitem__"]
    getitem.__qualname__ = f"{cls.__qualname__}.__getitem__"
    getitem.__module__ = cls.__module__
    setattr(getitem, _MARK, True)
    return getitem


def _is_generated(method: Any) -> bool:
    return getattr(method, _MARK, False) or (field_indexer is not None and type(method) is FieldIndexer)


def _inherited_getitem(cls: type) -> Optional[Callable]:
    """The ``__getitem__`` ``cls`` gets from its bases, generated ones skipped."""
    for base in cls.__mro__[1:]:
        method = base.__dict__.get("__getitem__")
        if method is not None and not _is_generated(method):
            return method
    return None


def install_getitem(cls: type[TensorDictMethods], state: Any) -> None:
    """Give ``cls`` its generated ``__getitem__`` (or take it away when it no longer applies).

    A ``__getitem__`` written by the user, on the class or on a base, is kept. A frozen class
    uses the general path, which locks the result.
    """
    own: Any = cls.__dict__.get("__getitem__")
    if own is not None and not _is_generated(own):
        return
    general = _inherited_getitem(cls)
    names = cls._tc_field_names
    if general is not None and getattr(general, "_tc_general", False) and names and \
            not cls._tc_options["frozen"] and \
            not getattr(cls, "_tc_rebuild_post_init", False):  # __post_init__ on rebuilds: the general path
        setattr(cls, "__getitem__", make_getitem(cls, names, general, state))
    elif own is not None:
        delattr(cls, "__getitem__")
    front_tensorclass_slots(cls)  # an assignment above gave the slots back to CPython
