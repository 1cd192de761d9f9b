"""``TensorDictBase``: the public API of every tensor collection, written once over a few primitives.

A concrete collection (``TensorDict``, ``LazyStackedTensorDict``, ``TensorDictParams``, a collection kept
in a file or a server) subclasses :class:`TensorDictBase` and provides the *primitives*:

========================  ===================================================================
``batch_size``            property: the shared leading dims
``device``                property: the device of every leaf, or None
``_keys_str()``           this level's keys (``str``), in order
``_get_str(key, default)`` this level's value at ``key`` (a tensor, a nested collection, non-tensor
                          data), or ``default``
``_set_str(key, value, inplace)``  write one entry at this level; ``value`` is already a valid leaf
                          (its shape starts with ``batch_size``); ``inplace=True`` copies into the
                          existing tensor
``_del_str(key)``         remove one entry at this level
========================  ===================================================================

and may override, for speed or to stay lazy, the *optional* primitives, whose generic versions go
through the others: ``names``, ``is_locked``, ``_index(index)`` (``td[index]`` on the batch dims),
``_set_at(index, value)`` (``td[index] = value``) and ``_dense()`` (the collection as a ``TensorDict`` over
the same leaves where it can, else a copy).

The rest of the API is generic:
- the dict API (keys / values / items with nested keys, get / set / del / pop / update / select /
  exclude / to_dict, ...) is written here on the primitives;
- every other member of ``TensorDict``'s API runs on ``self._dense()``: ops that make a new result
  return the dense op's result, ops that change the collection (``add_``, ``apply_``, ``rename_key_``,
  ...) run on the dense form and then write the difference back through the primitives (so a failing
  op changes nothing), and return ``self``.

``TensorDict`` overrides all of it with its own fast code; the generic paths serve the other kinds.
A method that can't apply to a kind of collection raises :class:`NotImplementedError` naming the method
and the type.
"""
from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Sequence, Union

import torch

from ._base import BoundCall, TensorCollection, is_tensor_collection
from ._context import then_on_exit
from ._errors import locked_error, missing_key_error, through_leaf_error
from ._keys import key_to_tuple
from .formats._methods import FormatsMixin
from .nontensor import NON_TENSOR_TYPES

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["TensorDictBase", "TensorCollection", "is_tensor_collection"]

_MISSING: Any = object()


def unsupported(collection: Any, method: str, why: str = "") -> NotImplementedError:
    """The error of a method that this kind of collection does not provide."""
    reason = f": {why}" if why else ""
    return NotImplementedError(f"{type(collection).__name__}.{method}() is not supported{reason}.")


class TensorDictBase(TensorCollection, FormatsMixin):
    """The base of every TensorDict-like collection; see the module docstring for the primitives.

    >>> import torch
    >>> from torchdict import TensorDict, TensorDictBase, lazy_stack
    >>> isinstance(TensorDict(), TensorDictBase), isinstance(lazy_stack([TensorDict()]), TensorDictBase)
    (True, True)
    """

    __slots__ = ()
    __hash__ = None  # type: ignore[assignment]  # ``==`` compares entry by entry, as on a tensor

    # ------------------------------------------------------------------ required primitives
    @property
    def batch_size(self) -> torch.Size:
        raise unsupported(self, "batch_size", "the collection does not define its batch size")

    @property
    def device(self) -> Optional[torch.device]:
        raise unsupported(self, "device", "the collection does not define its device")

    def _keys_str(self) -> Iterator[str]:
        raise unsupported(self, "_keys_str", "the collection does not list its keys")

    def _get_str(self, key: str, default: Any) -> Any:
        raise unsupported(self, "_get_str", "the collection does not read entries")

    def _set_str(self, key: str, value: Any, inplace: bool) -> None:
        raise unsupported(self, "_set_str", "the collection is read-only")

    def _del_str(self, key: str) -> None:
        raise unsupported(self, "_del_str", "the collection can't remove entries")

    @classmethod
    def __torch_function__(cls, func: Callable, types: tuple, args: tuple = (), kwargs: Any = None) -> Any:
        """``torch.stack`` / ``torch.cat`` / ... with this collection among the inputs: on its dense form."""
        def dense(value: Any) -> Any:
            if isinstance(value, TensorDictBase):
                return value._dense()
            if isinstance(value, (list, tuple)):
                return type(value)(dense(item) for item in value)
            return value

        return func(*dense(tuple(args)), **{name: dense(value) for name, value in (kwargs or {}).items()})

    # ------------------------------------------------------------------ optional primitives
    @property
    def names(self) -> list:
        return [None] * len(self.batch_size)

    @names.setter
    def names(self, value: Any) -> None:
        # Every collection takes names as upstream's base does; a kind that keeps none refuses them.
        raise unsupported(self, "names", "the collection does not name its batch dims")

    @property
    def is_locked(self) -> bool:
        return False

    def _dense(self) -> Any:
        """A ``TensorDict`` holding this collection's entries (nested collections made dense too)."""
        from .tensordict import TensorDict

        source = {}
        for key in self._keys_str():
            value = self._get_str(key, None)
            source[key] = value._dense() if isinstance(value, TensorDictBase) else value
        return TensorDict(source, batch_size=self.batch_size, device=self.device)

    def _index(self, index: Any) -> Any:
        return self._dense()[index]

    def _set_at(self, index: Any, value: Any) -> None:
        scratch = self._scratch(values_change=True)
        scratch[index] = value
        self._assign_from(scratch, True)

    # ------------------------------------------------------------------ shape
    @property
    def batch_dims(self) -> int:
        return len(self.batch_size)

    ndim = batch_dims

    @property
    def shape(self) -> torch.Size:
        return self.batch_size

    def dim(self) -> int:
        return len(self.batch_size)

    def ndimension(self) -> int:
        return len(self.batch_size)

    def size(self, dim: Optional[int] = None) -> Any:
        return self.batch_size if dim is None else self.batch_size[dim]

    def numel(self) -> int:
        return self.batch_size.numel()

    def __len__(self) -> int:
        batch = self.batch_size
        return batch[0] if batch else 0

    if TYPE_CHECKING:
        # Generic members (installed below) whose result is a new collection: a TensorDictBase here (the dense
        # TensorDict, or the kind's own), where a tensorclass rewraps its own (see _collection_api.py).
        def copy(self) -> TensorDictBase: ...
        def select(self, *keys: Any, inplace: bool = ..., strict: bool = ...,
                   as_tensordict: bool = ...) -> TensorDictBase: ...
        def exclude(self, *keys: Any, inplace: bool = ...) -> TensorDictBase: ...

    # ------------------------------------------------------------------ keys and reading
    def keys(self, include_nested: bool = False, leaves_only: bool = False, is_leaf: Optional[Callable] = None,
             *, sort: bool = False) -> Collection[Any]:
        """This collection's keys; nested ones as tuples with ``include_nested``."""
        keys = list(self._walk_keys((), include_nested, leaves_only, is_leaf))
        return sorted(keys, key=lambda key: key if isinstance(key, str) else ".".join(key)) if sort else keys

    def _walk_keys(self, prefix: tuple, include_nested: bool, leaves_only: bool,
                   is_leaf: Optional[Callable]) -> Iterator[Any]:
        for key in self._keys_str():
            value = self._get_str(key, None)
            full = prefix + (key,) if prefix else key
            nested = isinstance(value, TensorDictBase) and not (is_leaf is not None and is_leaf(type(value)))
            if not nested or not leaves_only:
                yield full
            if nested and include_nested:
                yield from value._walk_keys(key_to_tuple(full), include_nested, leaves_only, is_leaf)

    def values(self, include_nested: bool = False, leaves_only: bool = False,
               is_leaf: Optional[Callable] = None, *, sort: bool = False) -> Iterable[Any]:
        return [self.get(key) for key in self.keys(include_nested, leaves_only, is_leaf, sort=sort)]

    def items(self, include_nested: bool = False, leaves_only: bool = False,
              is_leaf: Optional[Callable] = None, *, sort: bool = False) -> Iterable[tuple]:
        return [(key, self.get(key)) for key in self.keys(include_nested, leaves_only, is_leaf, sort=sort)]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.unbind(0)) if self.batch_size else iter(())

    def __contains__(self, key: Any) -> bool:
        if isinstance(key, list):
            raise TypeError("a list is not a key: use a tuple for a nested key")
        return self._walk(key_to_tuple(key), _MISSING) is not _MISSING

    def _walk(self, keys: tuple, default: Any) -> Any:
        """The value at the nested key ``keys``, or ``default`` when a level lacks it."""
        node: Any = self
        for position, key in enumerate(keys):
            if not isinstance(node, TensorDictBase):
                raise through_leaf_error(keys[position - 1], node, key)
            node = node._get_str(key, _MISSING)
            if node is _MISSING:
                return default
        return node

    def get(self, key: Any, default: Any = _MISSING) -> Any:
        """The value at ``key`` (a str or a tuple of str); ``default`` (else a KeyError) when missing."""
        value = self._walk(key_to_tuple(key), _MISSING)
        if value is _MISSING:
            if default is _MISSING:
                raise missing_key_error(key, self.keys())
            return default
        return value  # non-tensor entries as their wrappers, as TensorDict.get

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, str) or (isinstance(index, tuple) and index and all(isinstance(i, str) for i in index)):
            value = self.get(index)
            return value._read() if type(value) in NON_TENSOR_TYPES else value  # the Python value, as td[key]
        return self._index(index)

    # ------------------------------------------------------------------ writing
    def _parent_of(self, keys: tuple, create: bool) -> Any:
        """The collection holding the last part of ``keys`` (missing levels made when ``create``)."""
        node: Any = self
        for position, key in enumerate(keys[:-1]):
            child = node._get_str(key, _MISSING)
            if child is _MISSING:
                if not create:
                    raise missing_key_error(keys, self.keys(include_nested=True))
                if node.is_locked:
                    raise locked_error()
                from .tensordict import TensorDict

                child = TensorDict({}, batch_size=node.batch_size, device=node.device)
                node._set_str(key, child, False)
                child = node._get_str(key, _MISSING)
            elif not isinstance(child, TensorDictBase):
                raise through_leaf_error(keys[position], child, keys[position + 1])
            node = child
        return node

    def set(self, key: Any, item: Any, inplace: bool = False, **kwargs: Any) -> Self:
        """Write ``item`` at ``key`` (missing levels are created); returns self."""
        from ._convert import to_leaf

        keys = key_to_tuple(key)
        parent = self._parent_of(keys, create=True)
        existing = parent._get_str(keys[-1], _MISSING)
        if existing is _MISSING and parent.is_locked:
            raise locked_error()
        leaf = to_leaf(item, keys[-1], parent.batch_size, parent.device)
        write_in_place = inplace and isinstance(existing, torch.Tensor) and isinstance(leaf, torch.Tensor)
        parent._set_str(keys[-1], leaf, write_in_place)
        return self

    def set_(self, key: Any, item: Any, *, non_blocking: bool = False) -> Self:
        """Copy ``item`` into the existing tensor at ``key``; returns self (``non_blocking``: nothing to wait
        for here, the copy is a host write)."""
        keys = key_to_tuple(key)
        parent = self._parent_of(keys, create=False)
        existing = parent._get_str(keys[-1], _MISSING)
        if existing is _MISSING:
            raise missing_key_error(key, self.keys(include_nested=True))
        if isinstance(existing, torch.Tensor) and isinstance(item, torch.Tensor) and item.shape != existing.shape:
            item = item.expand(existing.shape)  # torch's broadcast rule, and its error
        parent._set_str(keys[-1], item, True)
        return self

    def __setitem__(self, index: Any, value: Any) -> None:
        if isinstance(index, str) or (isinstance(index, tuple) and index and all(isinstance(i, str) for i in index)):
            self.set(index, value)
        else:
            self._set_at(index, value)

    def del_(self, key: Any) -> Self:
        keys = key_to_tuple(key)
        parent = self._parent_of(keys, create=False)
        if parent._get_str(keys[-1], _MISSING) is _MISSING:
            raise missing_key_error(key, self.keys(include_nested=True))
        if parent.is_locked:
            raise locked_error()
        parent._del_str(keys[-1])
        return self

    def __delitem__(self, key: Any) -> None:
        self.del_(key)

    def pop(self, key: Any, default: Any = _MISSING) -> Any:
        value = self.get(key, _MISSING)
        if value is _MISSING:
            if default is _MISSING:
                raise missing_key_error(key, self.keys())
            return default
        self.del_(key)
        return value

    def setdefault(self, key: Any, default: Any, inplace: bool = False) -> Any:
        if key not in self:
            self.set(key, default, inplace=inplace)
        return self.get(key)

    def update(self, input_dict_or_td: Any = None, clone: bool = False, inplace: bool = False, *,
               non_blocking: bool = False, keys_to_update: Optional[Sequence[Any]] = None,
               is_leaf: Optional[Callable] = None, update_batch_size: bool = False, ignore_lock: bool = False,
               **kwargs: Any) -> Self:
        """Write every entry of ``input_dict_or_td`` (and the entries given as keywords), with
        ``TensorDict.update``'s options; checked on a scratch copy first, so a failure changes nothing."""
        scratch = self._scratch(values_change=inplace)
        scratch.update(input_dict_or_td, clone=clone, inplace=inplace, non_blocking=non_blocking,
                       keys_to_update=keys_to_update, is_leaf=is_leaf, update_batch_size=update_batch_size,
                       ignore_lock=ignore_lock, **kwargs)
        if scratch.batch_size != self.batch_size:  # update_batch_size: a generic collection keeps its batch
            raise RuntimeError(f"update(update_batch_size=True) can't change the batch size of a "
                               f"{type(self).__name__} ({self.batch_size} -> {scratch.batch_size}).")
        self._assign_from(scratch, inplace)
        return self

    def update_(self, input_dict_or_td: Any = None, clone: bool = False, *, non_blocking: bool = False,
                keys_to_update: Optional[Sequence[Any]] = None, **kwargs: Any) -> Self:
        scratch = self._scratch(values_change=True)
        scratch.update_(input_dict_or_td, clone=clone, non_blocking=non_blocking, keys_to_update=keys_to_update,
                        **kwargs)
        self._assign_from(scratch, True)
        return self

    # ------------------------------------------------------------------ whole-collection conversions
    def to_tensordict(self, *, retain_none: Optional[bool] = None) -> Any:
        """A TensorDict holding a copy of every leaf."""
        return self._dense().clone()

    def to_dict(self, *, retain_none: bool = True, convert_tensors: Union[bool, str] = False,
                tolist_first: bool = False) -> dict:
        return self._dense().to_dict(retain_none=retain_none, convert_tensors=convert_tensors,
                                     tolist_first=tolist_first)

    def is_empty(self) -> bool:
        return not any(True for _ in self.keys(include_nested=True, leaves_only=True))

    # ------------------------------------------------------------------ the write-back of the generic in-place ops
    def _dense_is_copy(self) -> bool:
        """Whether :meth:`_dense` copies the leaves (a lazy stack's dense form does; the generic one, a
        TensorDict over the same tensors, does not)."""
        return False

    def _scratch(self, values_change: bool) -> Any:
        """A TensorDict with this collection's entries that an op may change without reaching this collection.

        Only the structure is new unless the op writes into tensors (``values_change``): then the leaves
        are copies as well (when :meth:`_dense` does not copy already).
        """
        dense = self._dense()
        if self._dense_is_copy():
            return dense
        return dense.clone() if values_change else dense.copy()

    def _assign_from(self, source: Any, inplace: bool) -> None:
        """Make this collection hold what the TensorDict ``source`` holds: the same keys and values.

        With ``inplace``, tensors already held are written in place where shape and dtype agree;
        otherwise an entry is replaced only when ``source`` holds another object. A locked collection
        refuses a change of keys before anything is written.
        """
        own = list(self._keys_str())
        theirs = list(source.keys())
        if self.is_locked and set(own) != set(theirs):
            raise locked_error()
        for key in own:
            if key not in theirs:
                self._del_str(key)
        for key in theirs:
            value = source._get_str(key, None) if isinstance(source, TensorDictBase) else source.get(key)
            current = self._get_str(key, _MISSING)
            if current is value:
                continue
            if isinstance(current, TensorDictBase) and isinstance(value, TensorDictBase):
                current._assign_from(value, inplace)
            elif (inplace and isinstance(current, torch.Tensor) and isinstance(value, torch.Tensor)
                  and current.shape == value.shape and current.dtype == value.dtype):
                self._set_str(key, value, True)
            else:
                self._set_str(key, value, False)

    def __repr__(self) -> str:
        fields = ", ".join(f"{key}: {type(self._get_str(key, None)).__name__}" for key in self._keys_str())
        return f"{type(self).__name__}({fields}; batch_size={self.batch_size}, device={self.device})"


# ---------------------------------------------------------------------- the dense-backed part of the API
def _call_on_dense(collection: TensorDictBase, name: str, *args: Any, **kwargs: Any) -> Any:
    """``TensorDict.<name>`` computed on the dense form (a result of the same value).

    Used as a context manager (``with td.flatten_keys() as flat: ...``), the result writes back into the
    dense form on exit, as for any TensorDict; the collection then takes the dense form's entries.
    """
    dense = collection._dense()
    result = getattr(dense, name)(*args, **kwargs)
    if result is dense:
        return collection
    if dense is not collection and getattr(result, "_cm", None) is not None:
        then_on_exit(result, lambda: collection._assign_from(dense, True))
    return result


def _call_and_write_back(collection: TensorDictBase, name: str, values_change: bool, *args: Any,
                         **kwargs: Any) -> Any:
    """``TensorDict.<name>`` (which changes its TensorDict) on a scratch copy, then written back: a failure
    of the op leaves the collection unchanged."""
    scratch = collection._scratch(values_change)
    result = getattr(scratch, name)(*args, **kwargs)
    collection._assign_from(scratch, values_change)
    return collection if result is scratch else result


class _DenseProperty:
    """A generic read-only property, read from the dense form."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, collection: Any, owner: type) -> Any:
        if collection is None:
            return self
        return getattr(collection._dense(), self.name)


# Members computed on the dense form whose result is new (self is left alone).
DENSE_RESULT_METHODS: tuple = (
    "abs", "absolute", "acos", "acosh", "add", "addcdiv", "addcmul", "all", "amax", "amin", "any", "apply",
    "asin", "asinh", "atan", "atan2", "atanh", "atleast_1d", "atleast_2d", "atleast_3d", "bfloat16",
    "bitwise_and", "bitwise_not", "bitwise_or", "bitwise_xor", "bool", "broadcast_to", "bytes", "ceil", "chunk",
    "clamp", "clamp_max", "clamp_min", "clip", "clone", "complex128", "complex64", "consolidate", "contiguous", "copy",
    "copysign", "cos", "cosh", "cpu", "cuda", "cummax", "cummin", "data_ptr", "deg2rad", "detach", "digamma",
    "div", "divide", "double", "empty", "eq", "erf", "erfc", "erfinv", "exclude", "exp", "exp2", "expand",
    "expand_as", "expm1", "filter_non_tensor_data", "flatten", "flatten_keys", "flip", "float", "float16",
    "float32", "float64", "floor", "floor_divide", "fmod", "frac", "gather", "ge", "get_at", "get_item_shape",
    "get_non_tensor", "greater", "greater_equal", "gt", "half", "hypot", "int", "int16", "int32", "int64",
    "int8", "is_consolidated", "is_contiguous", "is_floating_point", "is_memmap", "is_non_tensor", "is_shared",
    "isfinite",
    "isinf", "isnan", "isneginf", "isposinf", "isreal", "le", "lerp", "less", "less_equal", "lgamma", "log",
    "log10", "log1p", "log2", "logical_and", "logical_not", "logical_or", "logical_xor", "logit", "logsumexp",
    "long", "lt", "masked_fill", "masked_select", "max", "maximum", "mean", "memmap", "memmap_like", "min",
    "minimum", "mod", "moveaxis", "movedim", "mul", "multiply", "named_apply", "nan_to_num", "nanmean",
    "nansum", "narrow", "ne", "neg", "negative", "new_empty", "new_full", "new_ones", "new_zeros",
    "non_tensor_items", "norm", "not_equal", "numpy", "param_count", "permute", "pin_memory", "pow", "prod",
    "quantile", "rad2deg", "reciprocal", "relu", "remainder", "repeat", "repeat_interleave", "reshape", "roll",
    "round", "rsqrt", "rsub", "select", "separates", "sgn", "short", "sigmoid", "sign", "signbit", "sin", "sinh",
    "softmax", "split", "split_keys", "sqrt", "square", "squeeze", "state_dict", "std", "sub", "subtract", "sum",
    "swapaxes", "swapdims", "tan", "tanh", "tensor_split", "tile", "to", "to_lazystack", "to_namedtuple",
    "tolist", "transpose", "true_divide", "trunc", "type", "uint16", "uint32", "uint64", "uint8", "unbind",
    "unflatten", "unflatten_keys", "unsqueeze", "var", "view", "where",
    # drop-in members (issue 18)
    "as_tensor", "attrs", "backward", "cat_from_tensordict", "densify", "entry_class", "fliplr", "flipud",
    "from_dict_instance", "new_tensor", "pad", "rename_keys", "rot90", "stack_from_tensordict", "to_padded_tensor",
    "to_pytree",
)

# Members that write into the collection's tensors: run on a copy, then written back in place.
WRITE_BACK_METHODS: tuple = (
    "abs_", "absolute_", "acos_", "acosh_", "add_", "addcdiv_", "addcmul_", "apply_", "asin_", "asinh_",
    "atan2_", "atan_", "atanh_", "bitwise_and_", "bitwise_not_", "bitwise_or_", "bitwise_xor_", "ceil_",
    "clamp_", "clamp_max_", "clamp_min_", "clip_", "copy_", "copy_at_", "copysign_", "cos_", "cosh_", "deg2rad_", "digamma_", "div_", "divide_", "eq_", "erf_", "erfc_", "erfinv_", "exp2_",
    "exp_", "expm1_", "fill_", "floor_", "floor_divide_", "fmod_", "frac_", "ge_", "greater_",
    "greater_equal_", "gt_", "hypot_", "le_", "lerp_", "less_", "less_equal_", "lgamma_", "log10_", "log1p_",
    "log2_", "log_", "logical_and_", "logical_not_", "logical_or_", "logical_xor_", "logit_", "lt_",
    "masked_fill_", "maximum_", "minimum_", "mul_", "multiply_", "nan_to_num_", "ne_", "neg_", "negative_",
    "not_equal_", "pow_", "rad2deg_", "reciprocal_", "relu_", "remainder_",
    "round_", "rsqrt_", "set_at_", "sgn_", "sigmoid_", "sign_", "sin_", "sinh_", "sqrt_",
    "square_", "sub_", "subtract_", "tan_", "tanh_", "true_divide_", "trunc_", "update_at_", "zero_",
)

# Members that change which entries the collection holds, never a tensor's values: run on a new
# structure over the same leaves, then the changed entries are replaced.
RESTRUCTURE_METHODS: tuple = ("clear", "create_nested", "filter_empty_", "popitem", "rename_key_", "set_non_tensor",
                              "cat_tensors", "stack_tensors")

DENSE_PROPERTIES: tuple = ("data", "depth", "dtype", "grad", "is_cpu", "is_cuda", "is_meta", "requires_grad",
                           "sorted_keys")

# Python operators: ``a + b``, ``a == b``, ``-a`` on the dense form; ``a += b`` written back.
DENSE_OPERATORS: tuple = (
    "__abs__", "__add__", "__and__", "__bool__", "__eq__", "__floordiv__", "__ge__", "__gt__", "__invert__",
    "__le__", "__lt__", "__mod__", "__mul__", "__ne__", "__neg__", "__or__", "__pow__", "__radd__", "__rand__",
    "__rfloordiv__", "__rmod__", "__rmul__", "__ror__", "__rpow__", "__rsub__", "__rtruediv__", "__rxor__",
    "__sub__", "__truediv__", "__xor__",
)
IN_PLACE_OPERATORS: tuple = ("__iadd__", "__iand__", "__ifloordiv__", "__imod__", "__imul__", "__ior__",
                             "__ipow__", "__isub__", "__itruediv__", "__ixor__")

#: name -> None (a new result, :func:`_call_on_dense`) or ``values_change`` (:func:`_call_and_write_back`).
GENERIC_METHODS: dict = {
    **dict.fromkeys(DENSE_RESULT_METHODS + DENSE_OPERATORS), **dict.fromkeys(WRITE_BACK_METHODS, True),
    **dict.fromkeys(IN_PLACE_OPERATORS, True), **dict.fromkeys(RESTRUCTURE_METHODS, False),
}

# Class attributes, not a ``__getattr__`` fallback: a class whose MRO has ``__getattr__`` loses CPython's
# specialised attribute reads, and TensorDict's hot paths rely on them.
for _name, _values_change in GENERIC_METHODS.items():
    # A new result from the dense form, or the op run on a scratch copy and written back.
    if _values_change is None:
        setattr(TensorDictBase, _name, BoundCall(_call_on_dense, _name))
    else:
        setattr(TensorDictBase, _name, BoundCall(_call_and_write_back, _name, _values_change))
for _name in DENSE_PROPERTIES:
    setattr(TensorDictBase, _name, _DenseProperty(_name))
del _name, _values_change
