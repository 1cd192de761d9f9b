"""``td += t`` under torch.compile: in-place operators between a collection and a tensor.

Dynamo traces ``a op= b`` with a tensor among the operands as a call of a tensor method, dispatched
through ``__torch_function__``. When ``a`` is not a tensor it swaps the operands and calls the
tensor's *reflected, out-of-place* method: ``td -= t`` becomes ``Tensor.__rsub__(t, td)`` and
``td += t`` becomes ``Tensor.add(t, td)``, exactly what ``td - t`` and ``td + t`` become. A
``__torch_function__`` can't tell the two apart, so ``td`` would be rebound to a new collection and
every other name for it (the caller's argument, an alias) would keep the old values: a silent
difference from eager Python, where ``td -= t`` writes into ``td``.

:func:`install` puts one check in front of Dynamo's handler of those builtins: when a torchdict
collection is an operand of an in-place operator, Dynamo traces Python's own protocol instead, as it
already does when no tensor is involved: ``td.__isub__(t)``, and for ``t -= td`` the collection's
reflected operator ``td.__rsub__(t)`` (eager Python falls back to it once the tensor's own operators
answer ``NotImplemented``). Every other call goes to Dynamo's handler unchanged.

Like :mod:`torchdict._compile`, this module is imported only once ``torch._dynamo`` is.
"""
from __future__ import annotations

import operator
from typing import Any, Callable, Optional

from ._base import is_tensor_collection

__all__ = ["install", "installed", "INPLACE_OPERATORS"]

#: in-place builtin -> (the collection's in-place operator, its reflected operator)
INPLACE_OPERATORS: dict = {
    operator.iadd: ("__iadd__", "__radd__"),
    operator.isub: ("__isub__", "__rsub__"),
    operator.imul: ("__imul__", "__rmul__"),
    operator.itruediv: ("__itruediv__", "__rtruediv__"),
    operator.ifloordiv: ("__ifloordiv__", "__rfloordiv__"),
    operator.imod: ("__imod__", "__rmod__"),
    operator.ipow: ("__ipow__", "__rpow__"),
    operator.iand: ("__iand__", "__rand__"),
    operator.ior: ("__ior__", "__ror__"),
    operator.ixor: ("__ixor__", "__rxor__"),
    operator.ilshift: ("__ilshift__", "__rlshift__"),
    operator.irshift: ("__irshift__", "__rrshift__"),
    operator.imatmul: ("__imatmul__", "__rmatmul__"),
}

_INSTALLED: list = []


def _collection(variable: Any) -> Optional[Any]:
    """The torchdict collection (TensorDict, lazy stack, tensorclass instance) a Dynamo variable
    stands for, or None."""
    value = getattr(variable, "value", None)
    return value if value is not None and is_tensor_collection(value) else None


def _route(builtin: Callable, tx: Any, args: list) -> Optional[Any]:
    """Python's protocol for ``args[0] op= args[1]`` when a collection is an operand, traced; else None."""
    names = INPLACE_OPERATORS.get(builtin)
    if names is None or len(args) != 2:
        return None
    left, right = (arg.realize() for arg in args)
    inplace, reflected = names
    collection = _collection(left)
    if collection is not None:
        if not hasattr(type(collection), inplace):
            return None  # Dynamo's own handling (and eager Python's TypeError)
        return left.call_method(tx, inplace, [right], {})
    collection = _collection(right)
    if collection is not None and left.is_tensor() and hasattr(type(collection), reflected):
        return right.call_method(tx, reflected, [left], {})
    return None


def install() -> bool:
    """Route the in-place operators on collections (once). False when this Dynamo has no such handler."""
    if _INSTALLED:
        return True
    try:
        from torch._dynamo.variables.builtin import BuiltinVariable
    except ImportError:
        return False
    original = BuiltinVariable.__dict__.get("_handle_insert_op_in_graph")
    if not callable(original):
        return False

    def handle_insert_op_in_graph(self: Any, tx: Any, args: list, kwargs: dict) -> Any:
        if not kwargs and self.fn in INPLACE_OPERATORS:
            routed = _route(self.fn, tx, args)
            if routed is not None:
                return routed
        return original(self, tx, args, kwargs)

    setattr(handle_insert_op_in_graph, "__wrapped__", original)
    setattr(BuiltinVariable, "_handle_insert_op_in_graph", handle_insert_op_in_graph)  # Dynamo's method, patched
    # Handlers made before (a compile that ran before torchdict was imported) hold the old method.
    cache = getattr(BuiltinVariable, "call_function_handler_cache", None)
    if isinstance(cache, dict):
        for key in [key for key in cache if key and key[0] in INPLACE_OPERATORS]:
            del cache[key]
    _INSTALLED.append(original)
    return True


def installed() -> bool:
    """Whether :func:`install` has put the route in place."""
    return bool(_INSTALLED)
