"""``torch.<fn>(td, ...)``: the ``__torch_function__`` table, and dense stack / cat.

torch calls ``TensorDict.__torch_function__`` whenever a TensorDict appears
among the arguments of a torch function (also inside a list, as in
``torch.stack([td0, td1])``). The hook looks the function up in one table,
:data:`TORCH_FUNCTIONS`, and calls the handler with the original arguments;
an unknown function gives ``NotImplemented`` (torch then raises its
TypeError). Other modules add their own functions with :func:`implements`
or :func:`dispatch_to_method`, so this file never needs to know them.
"""
from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Sequence

import torch

from . import _options
from ._apply import rebuild, rewrap, tensor_leaves, unwrap
from ._base import TensorCollection
from ._indexing import same_value, batch_probe
from ._locking import keep_lock
from ._shape import batch_dim
from .nontensor import NON_TENSOR_TYPES, NonTensorData, combine_non_tensor
from ._unbatched import UnbatchedTensor as _Unbatched, stack_unbatched
from .nontensor._metadata import concatenated_metadata, stacked_metadata
from .nontensor._stack_values import stack_single_values

if TYPE_CHECKING:
    from ._host import TensorDictHost
else:
    TensorDictHost = object

_Tensor = torch.Tensor
_Size = torch.Size

#: torch function -> handler with the same signature as the torch function.
TORCH_FUNCTIONS: Dict[Callable, Callable] = {}


def implements(*torch_functions: Callable) -> Callable[[Callable], Callable]:
    """Register the decorated function as the handler of ``torch_functions`` for TensorDicts.

    >>> import torch
    >>> @implements(torch.numel)
    ... def _numel(td):
    ...     return td.numel()
    """

    def register(handler: Callable) -> Callable:
        for torch_function in torch_functions:
            TORCH_FUNCTIONS[torch_function] = handler
        return handler

    return register


def dispatch_to_method(torch_function: Callable, method_name: str,
                       rename: Optional[Dict[str, str]] = None) -> None:
    """``torch_function(td, *args, **kwargs)`` calls ``td.<method_name>(*args, **kwargs)``.

    ``rename`` maps torch's keyword names to the method's (e.g. ``{"input": ...}``).
    The method is looked up by name at call time, so it may live in any mixin.
    """

    # A partial, not a closure: one object per handler (there are ~140, made at import).
    TORCH_FUNCTIONS[torch_function] = partial(_call_method, method_name, rename)


def _call_method(method_name: str, rename: Optional[Dict[str, str]], first: Any, *args: Any, **kwargs: Any) -> Any:
    if rename:
        kwargs = {rename.get(name, name): value for name, value in kwargs.items()}
    return getattr(first, method_name)(*args, **kwargs)


# --------------------------------------------------------------------------- stack


def _exclusive_keys_error() -> RuntimeError:
    return RuntimeError(
        "The sets of keys in the tensordicts to stack are exclusive. Consider using "
        "`LazyStackedTensorDict.maybe_dense_stack` instead."
    )


def _merged_device(tds: Sequence[Any]) -> Optional[torch.device]:
    """The first device set among ``tds`` (cpu with None gives cpu)."""
    for td in tds:
        if td._device is not None:
            return td._device
    return None


def _leaf_kind(leaf: Any) -> str:
    if isinstance(leaf, _Tensor):
        return "Tensor"
    return type(leaf).__name__


def _combine_error(key: str, leaves: list, verb: str, error: Exception) -> Exception:
    """A clear error for leaves that torch could not stack / cat (wrong kinds or shapes)."""
    kinds = {_leaf_kind(leaf) for leaf in leaves}
    if len(kinds) > 1 or not isinstance(leaves[0], _Tensor):
        found = ", ".join(f"tensordict {position}: {_leaf_kind(leaf)}" for position, leaf in enumerate(leaves))
        return TypeError(f"Cannot {verb} the entries at key {key!r}: they are of different kinds ({found}).")
    if verb == "stack":
        first = leaves[0].shape
        for leaf in leaves[1:]:
            if leaf.shape != first:
                return RuntimeError(
                    f"The shapes of the tensors to stack is incompatible: {leaf.shape} vs {first} for key {key}."
                )
    return error


class _Combine:
    """What differs between stack and cat: the torch function and the checks of nested entries."""

    __slots__ = ("verb", "torch_fn", "keys_error", "nested_extra", "non_tensor")

    def __init__(self, verb: str, torch_fn: Callable, keys_error: Callable, nested_extra: Callable,
                 non_tensor: Callable) -> None:
        self.verb = verb
        self.torch_fn = torch_fn
        self.keys_error = keys_error  # (storages) -> Exception
        self.nested_extra = nested_extra  # (inners, key, n_batch) -> their extra batch dims, or raise
        self.non_tensor = non_tensor  # (leaves, dim) -> the combined non-tensor leaf


def _combine_storage(storages: Sequence[dict], dim: int, n_batch: int, new_batch: torch.Size, out: Optional[dict],
                     kind: _Combine) -> dict:
    """Combine key by key; the caller has checked that every storage has as many keys as the first."""
    torch_fn = kind.torch_fn
    result: dict = {} if out is None else out
    for key, leaf in storages[0].items():
        try:
            leaves = [storage[key] for storage in storages]
        except KeyError:
            raise kind.keys_error(storages) from None
        if type(leaf) is _Tensor and out is None:  # the common case, kept lean
            try:
                result[key] = torch_fn(leaves, dim)
            except (RuntimeError, TypeError) as error:
                raise _combine_error(key, leaves, kind.verb, error) from error
        else:
            _combine_entry(result, key, leaf, leaves, dim, n_batch, new_batch, out, kind)
    return result


def _combine_entry(result: dict, key: str, leaf: Any, leaves: list, dim: int, n_batch: int,
                   new_batch: torch.Size, out: Optional[dict], kind: _Combine) -> None:
    """One entry that is not a plain tensor combined into a new result: a tensor subclass, a tensor
    written into ``out``, a nested collection or a non-tensor leaf."""
    if isinstance(leaf, _Unbatched):  # no batch dims to combine: the first one, with the new batch size
        result[key] = stack_unbatched(leaves, new_batch + leaf.batch_size[n_batch:])
    elif isinstance(leaf, _Tensor):
        try:
            target = out.get(key) if out is not None else None
            if isinstance(target, _Tensor):
                kind.torch_fn(leaves, dim, out=target)
            else:
                result[key] = kind.torch_fn(leaves, dim)
        except (RuntimeError, TypeError) as error:
            raise _combine_error(key, leaves, kind.verb, error) from error
    elif isinstance(leaf, TensorCollection) and type(getattr(unwrap(leaf), "_tensordict", None)) is not dict:
        # A nested lazy stack: stacked lazily (as upstream), concatenated by its own torch.cat.
        if out is not None and isinstance(out.get(key), TensorCollection):
            out[key].update_(_combine_foreign(key, leaves, dim, kind))
        else:
            result[key] = _combine_foreign(key, leaves, dim, kind)
    elif isinstance(leaf, TensorCollection):
        collected = _collect(leaves)
        if collected is None:
            raise _combine_error(key, leaves, kind.verb, TypeError())
        inners, storages, same_sizes = collected
        inner_batch = new_batch + kind.nested_extra(inners, key, n_batch)
        if not same_sizes:
            raise kind.keys_error(storages)
        collection = out.get(key) if out is not None else None
        if isinstance(collection, TensorCollection):
            _combine_storage(storages, dim, n_batch, new_batch, unwrap(collection)._tensordict, kind)
        else:
            storage = _combine_storage(storages, dim, n_batch, new_batch, None, kind)
            result[key] = rewrap(leaf, inners[0]._new_unsafe(storage, inner_batch, _merged_device(inners)))
    else:
        if not all(type(item) in NON_TENSOR_TYPES for item in leaves):
            raise _combine_error(key, leaves, kind.verb, TypeError())
        result[key] = kind.non_tensor(leaves, dim)


def _combine_foreign(key: str, leaves: list, dim: int, kind: _Combine) -> Any:
    if not all(isinstance(item, TensorCollection) for item in leaves):
        raise _combine_error(key, leaves, kind.verb, TypeError())
    if kind.verb == "stack":
        from ._nested_foreign import stack_foreign

        return stack_foreign(leaves, dim)
    return kind.torch_fn(leaves, dim)


def _stacked_extra(inners: list, key: str, n_batch: int) -> torch.Size:
    """Sub-TensorDicts to stack must have the same batch size."""
    batches = [inner._batch_size for inner in inners]
    batch = batches[0]
    if batches.count(batch) != len(batches):
        raise _incongruent_error(inners, next(position for position, size in enumerate(batches) if size != batch))
    return batch[n_batch:]


def _concatenated_extra(inners: list, key: str, n_batch: int) -> torch.Size:
    """Sub-TensorDicts to concatenate must agree on their dims beyond the parent's batch."""
    batches = [inner._batch_size for inner in inners]
    extra = batches[0][n_batch:]
    if batches.count(batches[0]) == len(batches):  # the common case, checked at C level
        return extra
    for batch in batches:
        if batch[n_batch:] != extra:
            raise RuntimeError(
                f"cannot cat the sub-tensordicts at key {key!r}: their batch sizes "
                f"{[item._batch_size for item in inners]} differ beyond the parent's batch dims"
            )
    return extra


def _incongruent_error(tds: Sequence[Any], position: int) -> RuntimeError:
    return RuntimeError(
        "stacking tensordicts requires them to have congruent batch sizes, got "
        f"td[{position}].batch_size={tds[position].batch_size} and td[0].batch_size={tds[0].batch_size}"
    )


def _stacked_names(first: Any, dim: int) -> Optional[list]:
    names = first._names
    if names is None:
        return None
    return names[:dim] + [None] + names[dim:]


def _collect(tds: Sequence[Any]) -> Optional[tuple]:
    """``(inners, storages, same_sizes)``: the TensorDicts (a tensorclass's inner one) and their storages.

    ``same_sizes`` tells whether every storage has as many keys as the first;
    None when an element is not a TensorDict or tensorclass. The common case
    (plain TensorDicts) is checked with C-level list operations.
    """
    try:
        storages: Any = [td._tensordict for td in tds]
    except AttributeError:
        storages = None
    if storages is not None and list(map(type, storages)).count(dict) == len(storages):
        inners = tds  # only read, never changed
    else:
        inners, storages = [], []
        storage: Any
        for td in tds:
            storage = getattr(td, "_tensordict", None)
            if type(storage) is not dict:
                if not isinstance(td, TensorCollection):
                    return None
                # A tensorclass: the TensorDict of its fields. A lazy stack has no storage of its
                # own: its dense stack stands in for it (as upstream, the result is dense).
                td = td.contiguous() if storage is None else storage
                storage = td._tensordict
            inners.append(td)
            storages.append(storage)
    sizes = list(map(len, storages))
    return inners, storages, sizes.count(sizes[0]) == len(sizes)


def _collect_or_raise(tds: Sequence[Any], verb: str) -> tuple:
    collected = _collect(tds)
    if collected is None:
        raise TypeError(
            f"torch.{verb} of TensorDicts got an element that is not a TensorDict: "
            f"{[type(item).__name__ for item in tds]}."
        )
    return collected


def stack(input: Sequence[Any], dim: int = 0, *, out: Any = None) -> Any:
    """Stack TensorDicts (or tensorclasses) along a new batch dim ``dim``; the leaves are copied.

    >>> import torch
    >>> from torchdict import TensorDict
    >>> tensors = [TensorDict({"a": torch.zeros(3, 5)}, batch_size=[3]) for _ in range(2)]
    >>> stack(tensors, 1)["a"].shape
    torch.Size([3, 2, 5])
    """
    tensors = input  # upstream's parameter name
    if not len(tensors):
        raise RuntimeError("stack expects a non-empty TensorList")
    if _options.LAZY_LEGACY and out is None:
        from .base import TensorDictBase
        from .lazy import lazy_stack  # set_lazy_legacy(True): torch.stack keeps the members

        if all(isinstance(td, TensorDictBase) for td in tensors):
            return lazy_stack(list(tensors), dim)
    inners, storages, same_sizes = _collect_or_raise(tensors, "stack")
    first_inner = inners[0]
    batch = first_inner._batch_size
    batches = [inner._batch_size for inner in inners]
    if batches.count(batch) != len(batches):
        raise _incongruent_error(inners, next(position for position, size in enumerate(batches) if size != batch))
    if not same_sizes:
        raise _exclusive_keys_error()
    n_batch = len(batch)
    if not -n_batch - 1 <= dim <= n_batch:
        raise IndexError(
            f"Dimension out of range (expected to be in range of [{-n_batch - 1}, {n_batch}], but got {dim})"
        )
    if dim < 0:
        dim += n_batch + 1
    new_batch = _Size((*batch[:dim], len(inners), *batch[dim:])) if dim else _Size((len(inners), *batch))
    names = None if first_inner._names is None else _stacked_names(first_inner, dim)
    return _combined(tensors, inners, storages, dim, n_batch, new_batch, names, out, _STACK)


# --------------------------------------------------------------------------- cat


def _cat_keys_error(storages: list) -> KeyError:
    first = sorted(storages[0])
    for position, storage in enumerate(storages):
        if storage.keys() != storages[0].keys():
            return KeyError(
                f"tensordict {position} has keys {sorted(storage)} but tensordict 0 has keys {first}; "
                "all tensordicts must have the same keys"
            )
    return KeyError("all tensordicts must have the same keys")


def _cat_non_tensor(leaves: list, dim: int) -> Any:
    """One shared value stays a NonTensorData (as upstream); otherwise a NonTensorStack."""
    first = leaves[0]
    sizes = list(first.batch_size)
    sizes[dim] = sum(leaf.batch_size[dim] for leaf in leaves)
    metadata = concatenated_metadata(leaves, _Size(sizes))  # MetaData keeps the first one's value (upstream's)
    if metadata is not None:
        return metadata
    if all(isinstance(leaf, NonTensorData) for leaf in leaves) and all(
            same_value(leaf.data, first.data) for leaf in leaves):
        sizes = list(first.batch_size)
        sizes[dim] = sum(leaf.batch_size[dim] for leaf in leaves)
        return NonTensorData(first.data, sizes, first.device)
    return combine_non_tensor(leaves, lambda grids: torch.cat(grids, dim))


def _stack_non_tensor(leaves: list, dim: int) -> Any:
    from .nontensor._shape import captured_stack

    sizes = list(leaves[0].batch_size)
    sizes.insert(dim, len(leaves))
    metadata = stacked_metadata(leaves, _Size(sizes))  # MetaData holding one object stays one
    if metadata is not None:
        return metadata
    captured = captured_stack(leaves, dim)  # set_capture_non_tensor_stack(True): equal values stay one
    if captured is not None:
        return captured
    single = stack_single_values(leaves, dim)  # one value per leaf: no grid of codes per leaf
    if single is not None:
        return single
    return combine_non_tensor(leaves, lambda grids: torch.stack(grids, dim))


_STACK = _Combine("stack", torch.stack, lambda storages: _exclusive_keys_error(), _stacked_extra,
                  _stack_non_tensor)
_CAT = _Combine("cat", torch.cat, _cat_keys_error, _concatenated_extra, _cat_non_tensor)


def cat(input: Sequence[Any], dim: int = 0, *, out: Any = None) -> Any:
    """Concatenate TensorDicts (or tensorclasses) along batch dim ``dim``.

    >>> import torch
    >>> from torchdict import TensorDict
    >>> tensors = [TensorDict({"a": torch.zeros(3, 5)}, batch_size=[3]) for _ in range(2)]
    >>> cat(tensors, 0)["a"].shape
    torch.Size([6, 5])
    """
    tensors = input  # upstream's parameter name
    if not len(tensors):
        raise ValueError("torch.cat(): expected a non-empty list of Tensors")
    inners, storages, same_sizes = _collect_or_raise(tensors, "cat")
    first_inner = inners[0]
    batch = first_inner._batch_size
    n_batch = len(batch)
    if not -n_batch <= dim < n_batch:
        raise RuntimeError(
            f"dim must be in the range 0 <= dim < len(batch_size), got dim={dim} and batch_size={list(batch)}"
        )
    if dim < 0:
        dim += n_batch
    batches = [inner._batch_size for inner in inners]
    if batches.count(batch) == len(batches):  # the common case, checked at C level
        total = batch[dim] * len(batches)
    else:
        total = 0
        for other in batches:
            if other != batch and (len(other) != n_batch or other[:dim] != batch[:dim]
                                   or other[dim + 1:] != batch[dim + 1:]):
                # torch's own message, worded for the batch shapes.
                torch.cat([batch_probe(size) for size in batches], dim)
                raise RuntimeError(f"cannot cat tensordicts of batch sizes {batches}")
            total += other[dim]
    if not same_sizes:
        raise _cat_keys_error(storages)
    new_batch = _Size((*batch[:dim], total, *batch[dim + 1:]))
    return _combined(tensors, inners, storages, dim, n_batch, new_batch, first_inner._names, out, _CAT)


def _combined(tensors: Sequence[Any], inners: Sequence[Any], storages: Sequence[dict], dim: int, n_batch: int,
              new_batch: torch.Size, names: Optional[list], out: Any, kind: Any) -> Any:
    """The result of a stack or cat: written into ``out``, or a new collection of the first input's kind."""
    if out is not None:
        out_inner = unwrap(out)
        if out_inner._batch_size != new_batch:
            operation = "stack" if kind is _STACK else "cat"
            raise RuntimeError(
                f"the out tensordict has batch size {out_inner._batch_size}, expected {new_batch} for the {operation}"
            )
        _combine_storage(storages, dim, n_batch, new_batch, out_inner._tensordict, kind)
        return out
    storage = _combine_storage(storages, dim, n_batch, new_batch, None, kind)
    first_inner = inners[0]
    device = first_inner._device
    if device is None:
        device = _merged_device(inners)
    result = first_inner._new_unsafe(storage, new_batch, device, names)
    first = tensors[0]
    if first is first_inner or getattr(first, "_tensordict", None) is None:
        return result  # first a TensorDict, or a lazy stack (stacked in its dense form)
    return rewrap(first, result)


TORCH_FUNCTIONS[torch.stack] = stack
TORCH_FUNCTIONS[torch.cat] = cat
TORCH_FUNCTIONS[torch.concat] = cat
TORCH_FUNCTIONS[torch.concatenate] = cat


# --------------------------------------------------------------------------- *_like


def _like(make: Callable[..., torch.Tensor]) -> Callable:
    def handler(td: Any, *args: Any, **kwargs: Any) -> Any:
        device = kwargs.get("device")
        # Leaf by leaf (the batch size is kept): rebuild, not map_batch, whose batch-op path for a nested lazy
        # stack reads the op as a rearrangement of batch positions, which a value-making function is not.
        leaves = tensor_leaves(td)
        result = rebuild(td, iter([make(leaf, *args, **kwargs) for leaf in leaves]), td._batch_size)
        if device is not None:
            from ._convert import parse_device

            result._device = parse_device(device)
        result._names = td._names
        return keep_lock(td, result)  # as upstream: locked like its source

    return handler


_LIKE_FUNCTIONS: tuple = (torch.zeros_like, torch.ones_like, torch.empty_like, torch.full_like, torch.rand_like,
                          torch.randn_like)
for _like_function in _LIKE_FUNCTIONS:
    TORCH_FUNCTIONS[_like_function] = _like(_like_function)


# --------------------------------------------------------------------------- methods by name

_METHOD_FUNCTIONS: tuple = (
    (torch.unbind, "unbind"),
    (torch.split, "split"),
    (torch.chunk, "chunk"),
    (torch.tensor_split, "tensor_split"),
    (torch.squeeze, "squeeze"),
    (torch.unsqueeze, "unsqueeze"),
    (torch.permute, "permute"),
    (torch.flatten, "flatten"),
    (torch.unflatten, "unflatten"),
    (torch.reshape, "reshape"),
    (torch.transpose, "transpose"),
    (torch.swapaxes, "transpose"),
    (torch.swapdims, "transpose"),
    (torch.movedim, "movedim"),
    (torch.moveaxis, "movedim"),
    (torch.flip, "flip"),
    (torch.roll, "roll"),
    (torch.narrow, "narrow"),
    (torch.gather, "gather"),
    (torch.clone, "clone"),
    (torch.tile, "tile"),
    (torch.repeat_interleave, "repeat_interleave"),
    (torch.masked_select, "masked_select"),
)
for _torch_function, _method_name in _METHOD_FUNCTIONS:
    dispatch_to_method(_torch_function, _method_name, rename={"split_size_or_sections": "split_size"})


@implements(torch.where)
def _where(condition: Any, input: Any = None, other: Any = None, *, out: Any = None) -> Any:
    """``torch.where(condition, td, other)`` -> ``td.where(condition, other)``."""
    kwargs = {} if out is None else {"out": out}
    collection: Any
    if isinstance(input, TensorCollection):
        collection = input
        return collection.where(condition, other, **kwargs)
    if isinstance(other, TensorCollection):
        collection = other
        return collection.where(condition.logical_not(), input, **kwargs)
    raise TypeError("torch.where with a TensorDict condition needs a TensorDict input or other.")


# --------------------------------------------------------------------------- a tensor's operators with a collection

# ``tensor <op> td`` runs torch's method first, which returns NotImplemented and lets Python call the
# collection's reflected operator; torch.compile's Dynamo has no such fallback (``td + t`` and ``t * td``
# reach ``__torch_function__`` as the tensor method with the collection among the arguments). Answering
# here with the collection's own operator gives both the same result.
_TENSOR_OPERATORS: tuple = (  # (tensor method names, the collection's operator, its reflected one)
    (("add", "__add__"), "__add__", "__radd__"),
    (("sub", "subtract", "__sub__"), "__sub__", "__rsub__"),
    (("mul", "multiply", "__mul__"), "__mul__", "__rmul__"),
    (("div", "divide", "true_divide", "__truediv__"), "__truediv__", "__rtruediv__"),
    (("floor_divide", "__floordiv__"), "__floordiv__", "__rfloordiv__"),
    (("remainder", "__mod__"), "__mod__", "__rmod__"),
    (("pow", "__pow__"), "__pow__", "__rpow__"),
    (("eq", "__eq__"), "__eq__", "__eq__"),
    (("ne", "__ne__"), "__ne__", "__ne__"),
    (("lt", "__lt__"), "__lt__", "__gt__"),
    (("le", "__le__"), "__le__", "__ge__"),
    (("gt", "__gt__"), "__gt__", "__lt__"),
    (("ge", "__ge__"), "__ge__", "__le__"),
    (("__and__", "bitwise_and"), "__and__", "__rand__"),
    (("__or__", "bitwise_or"), "__or__", "__ror__"),
    (("__xor__", "bitwise_xor"), "__xor__", "__rxor__"),
)


def _tensor_operator(operator: str, reflected: str) -> Callable:
    def handler(left: Any, right: Any, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs:  # alpha=, rounding_mode=, out=: not an operator; torch's own error
            return NotImplemented
        if isinstance(left, TensorCollection):
            return getattr(left, operator)(right)
        return getattr(right, reflected)(left)

    return handler


#: torch._C.TensorBase's operator methods -> the handler answering them with the collection's operator
TENSOR_OPERATOR_HANDLERS: Dict[Callable, Callable] = {}
for _names, _operator, _reflected in _TENSOR_OPERATORS:
    for _name in _names:
        _method = getattr(torch._C.TensorBase, _name, None)
        if _method is not None:
            TENSOR_OPERATOR_HANDLERS[_method] = _tensor_operator(_operator, _reflected)
TORCH_FUNCTIONS.update(TENSOR_OPERATOR_HANDLERS)

# torch writes some operators of ``torch.Tensor`` in Python (torch/_tensor.py), not on the C base class:
# ``t ** td``, ``t // td`` and the reflected forms Dynamo picks for ``td - t``, ``td ** t``, ``td // t``,
# ``td % t``, ``td / t`` (``Tensor.__rsub__(t, td)``, ...) reach ``__torch_function__`` as these functions.
# ``Tensor.__rsub__(t, td)`` is ``td - t``: the collection's forward operator. They are kept out of
# TORCH_FUNCTIONS and found by identity: Dynamo can't look a Python function up in a dict (its guard on
# the lookup fails on the frame that made it).
_TENSOR_PYTHON_OPERATORS: tuple = (  # (torch.Tensor attribute, the collection's operator, its reflected one)
    ("__pow__", "__pow__", "__rpow__"),
    ("__rpow__", "__rpow__", "__pow__"),
    ("__floordiv__", "__floordiv__", "__rfloordiv__"),
    ("__rfloordiv__", "__rfloordiv__", "__floordiv__"),
    ("__rsub__", "__rsub__", "__sub__"),
    ("__rtruediv__", "__rtruediv__", "__truediv__"),
    ("__rmod__", "__rmod__", "__mod__"),
)
_PYTHON_OPERATOR_HANDLERS: tuple = tuple(
    (torch.Tensor.__dict__[name], _tensor_operator(operator, reflected))
    for name, operator, reflected in _TENSOR_PYTHON_OPERATORS
    if isinstance(torch.Tensor.__dict__.get(name), type(_tensor_operator))  # a Python function in this torch
)


def python_operator_handler(func: Any) -> Optional[Callable]:
    """The handler of one of torch.Tensor's Python-written operators, or None."""
    for method, handler in _PYTHON_OPERATOR_HANDLERS:
        if func is method:
            return handler
    return None


def tensor_operator_handler(func: Any) -> Optional[Callable]:
    """The handler of a tensor operator (C or Python-written) with a collection operand, or None
    (for the collections with their own ``__torch_function__``, such as the lazy stacks)."""
    handler = TENSOR_OPERATOR_HANDLERS.get(func)
    return handler if handler is not None else python_operator_handler(func)


# --------------------------------------------------------------------------- the mixin


class TorchFunctionMixin(TensorDictHost):
    __slots__ = ()

    @classmethod
    def __torch_function__(cls, func: Callable, types: tuple, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        handler = TORCH_FUNCTIONS.get(func)
        if handler is None:
            handler = python_operator_handler(func)
            if handler is None:
                return NotImplemented
        if kwargs:
            return handler(*args, **kwargs)
        return handler(*args)

    @classmethod
    def stack(cls, input: Sequence[Any], dim: int = 0, *, out: Any = None) -> Any:
        """Stack TensorDicts along a new batch dim (dense: the leaves are copied).

        >>> import torch
        >>> from torchdict import TensorDict
        >>> TensorDict.stack([TensorDict(a=0), TensorDict(a=1)])["a"]
        tensor([0, 1])
        """
        return stack(input, dim, out=out)

    @classmethod
    def cat(cls, input: Sequence[Any], dim: int = 0, *, out: Any = None) -> Any:
        """Concatenate TensorDicts along batch dim ``dim``.

        >>> import torch
        >>> from torchdict import TensorDict
        >>> TensorDict.cat([TensorDict(a=torch.zeros(2), batch_size=[2])] * 2).batch_size
        torch.Size([4])
        """
        return cat(input, dim, out=out)

    concat = cat

    # ------------------------------------------------------------------ lazy stacking

    def to_lazystack(self, dim: int = 0) -> Any:
        """A :class:`~torchdict.LazyStackedTensorDict` of the slices of ``self`` along batch ``dim``.

        >>> TensorDict(a=torch.zeros(3, 2), batch_size=[3, 2]).to_lazystack(1).stack_dim
        1
        """
        from .lazy import lazy_stack

        position = batch_dim(dim, self.batch_size)
        return lazy_stack(list(self.unbind(position)), position)

    @classmethod
    def lazy_stack(cls, input: Any, dim: int = 0, *, out: Any = None, **kwargs: Any) -> Any:
        """:func:`torchdict.lazy_stack`: stack ``input`` without copying (``out`` receives the values)."""
        from .lazy import lazy_stack

        return lazy_stack(input, dim, out=out, **kwargs)

    @classmethod
    def maybe_dense_stack(cls, input: Any, dim: int = 0, *, out: Any = None, **kwargs: Any) -> Any:
        """:func:`torchdict.maybe_dense_stack`: a dense stack when the items share their keys, else a lazy one."""
        from .lazy import maybe_dense_stack

        return maybe_dense_stack(input, dim, out=out, **kwargs)
