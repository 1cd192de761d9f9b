"""The smaller members of upstream's ``LazyStackedTensorDict`` API, each a few lines over the rest of
the lazy stack: more dtype casts, flips and rotations, padding, nested-tensor reads, entries built
from several keys, device bookkeeping, and the class-level constructors.

Where upstream computes on the dense stack (``fliplr``, ``rot90``, ``pad``, ``new_tensor``, ...),
these do too (ragged leaves raise the ragged-read error, exclusive keys are left out); where it
keeps the members (``as_tensor``, ``replace``, ``to_padded_tensor``, the casts), so do these.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, List, Optional, Sequence

import torch

if TYPE_CHECKING:
    from ._host import LazyHost
else:
    LazyHost = object

_Tensor = torch.Tensor
_NO: Any = object()


def _cast(dtype: torch.dtype) -> Callable:
    def method(self: Any, *, cast_filter: Optional[Callable] = None) -> Any:
        return self.type(dtype, cast_filter=cast_filter)

    method.__doc__ = f"A lazy stack of the members with every tensor leaf cast to ``{dtype}``."
    return method


class LazyExtrasMixin(LazyHost):
    """The class using it provides the rest of the lazy stack's API."""

    __slots__ = ()

    complex32 = _cast(torch.complex32)
    qint8 = _cast(torch.qint8)
    qint32 = _cast(torch.qint32)
    quint8 = _cast(torch.quint8)
    quint4x2 = _cast(torch.quint4x2)

    # ------------------------------------------------------------------ bookkeeping without a change
    @property
    def hook_in(self) -> Any:
        """None: torchdict runs no hooks on lazy stacks (upstream's default)."""
        return None

    @property
    def hook_out(self) -> Any:
        return None

    def clear_refs_for_compile_(self) -> Any:
        """Returns self: a lazy stack keeps no references for ``torch.compile`` to clear (a ragged entry
        raises the ragged-read error, as upstream's walk over the stacked entries does)."""
        self._check_not_ragged()
        return self

    def consolidate(self, filename: Any = None, *, num_threads: Any = 0, device: Any = None,
                    non_blocking: bool = False, inplace: bool = False, return_early: bool = False,
                    use_buffer: bool = False, share_memory: bool = False, pin_memory: bool = False,
                    metadata: bool = False) -> Any:
        """A new lazy stack whose members' leaves are views of one storage (one copy to move it to a device),
        as upstream; ``inplace`` changes nothing more (upstream returns a new stack too). With ``filename``
        or ``return_early``, or members that are lazy stacks themselves, the dense stack is consolidated."""
        from ._moves import lazy_consolidate

        return lazy_consolidate(self, filename, dict(
            num_threads=num_threads, device=device, non_blocking=non_blocking, inplace=inplace,
            return_early=return_early, use_buffer=use_buffer, share_memory=share_memory, pin_memory=pin_memory,
            metadata=metadata))

    def is_consolidated(self) -> bool:
        """True for a stack made by :meth:`consolidate` whose members still are the storage's views."""
        from ._moves import lazy_is_consolidated

        return lazy_is_consolidated(self)

    # ------------------------------------------------------------------ pinned memory, streams (lazy/_moves.py)
    def pin_memory(self, num_threads: Optional[int] = None, inplace: bool = False) -> Any:
        """A lazy stack of the members with their leaves pinned (``inplace=True``: the members' leaves are
        replaced and self returned; a locked stack keeps its leaves). Needs an accelerator."""
        from ._moves import lazy_pin_memory

        return lazy_pin_memory(self, num_threads, inplace)

    def pin_memory_(self, num_threads: int = 0) -> Any:
        """``pin_memory(num_threads, inplace=True)`` (deprecated, as upstream)."""
        import warnings

        from ._moves import lazy_pin_memory

        warnings.warn(f"{type(self).__name__}.pin_memory_() is deprecated: use pin_memory(inplace=True) instead.",
                      DeprecationWarning, stacklevel=2)
        return lazy_pin_memory(self, num_threads, True)

    def record_stream(self, stream: Any) -> Any:
        """Mark every member's tensor leaves as used by the CUDA ``stream``; returns self."""
        from ._moves import lazy_record_stream

        return lazy_record_stream(self, stream)

    def auto_batch_size_(self, batch_dims: Optional[int] = None, keep_compliant_size: bool = False) -> Any:
        """Returns self when the batch size it would get is the current one; a lazy stack's batch size can't
        change otherwise (RuntimeError, as upstream; a ragged entry raises the ragged-read error)."""
        new = self.contiguous().auto_batch_size_(batch_dims).batch_size
        if new != self.batch_size:
            raise RuntimeError(
                f"Received a new batch size {list(new)} with an existing batch_size {self.batch_size} in a lazy TD. "
                "Modifying the batch size of a lazy representation of a tensordict is not permitted. Consider "
                "instantiating the tensordict first by calling `td = td.to_tensordict()` before resetting the "
                "batch size.")
        return self

    def _check_not_ragged(self) -> None:
        from ._ops import is_ragged
        from ..lazy import _ragged_error

        for key in self.keys(True, True):
            values = self._member_values(key)
            if is_ragged(values):
                raise _ragged_error(key, [value.shape for value in values])

    def auto_device_(self) -> Any:
        """Each member's ``auto_device_()``; returns self."""
        for td in self.tensordicts:
            # TensorDicts and lazy stacks have it; another kind of member raises its own AttributeError.
            td.auto_device_()  # type: ignore[attr-defined]
        return self

    def clear_device_(self) -> Any:
        """Each member's ``clear_device_()``; returns self."""
        for td in self.tensordicts:
            td.clear_device_()  # type: ignore[attr-defined]  # as auto_device_
        return self

    # ------------------------------------------------------------------ member-wise conversions
    def as_tensor(self) -> Any:
        """A lazy stack of the members whose leaves with an ``as_tensor()`` method are converted."""
        return self.apply(lambda leaf: leaf.as_tensor() if hasattr(leaf, "as_tensor") else leaf)

    def to_padded_tensor(self, padding: float = 0.0, mask_key: Any = None) -> Any:
        """A lazy stack of the members whose nested-tensor leaves are padded with ``padding``."""
        if mask_key is not None:
            raise NotImplementedError("to_padded_tensor(mask_key=...) is not supported on a LazyStackedTensorDict.")
        return self.apply(lambda leaf: torch.nested.to_padded_tensor(leaf, padding) if leaf.is_nested else leaf)

    def replace(self, *args: Any, **kwargs: Any) -> Any:
        """A copy (same leaves) of the stack with the given entries set (a mapping and/or keywords)."""
        result = self.copy()
        entries = dict(*args, **kwargs)
        if entries:
            result.update(entries)
        return result

    # ------------------------------------------------------------------ on the dense stack
    def fliplr(self) -> Any:
        """``flip(1)`` of the dense stack (two batch dims at least)."""
        if len(self.batch_size) < 2:
            raise RuntimeError("fliplr requires at least 2 batch dimensions")
        return self.contiguous().flip(1)

    def flipud(self) -> Any:
        """``flip(0)`` of the dense stack (one batch dim at least)."""
        if len(self.batch_size) < 1:
            raise RuntimeError("flipud requires at least 1 batch dimension")
        return self.contiguous().flip(0)

    def rot90(self, k: int = 1, dims: Sequence[int] = (0, 1)) -> Any:
        """The dense stack rotated by ``k`` quarter turns in the plane of batch dims ``dims``."""
        batch = torch.rot90(torch.empty(self.batch_size), k, list(dims)).shape  # torch's checks and errors
        return self.contiguous().apply(lambda leaf: torch.rot90(leaf, k, list(dims)), batch_size=batch)

    def pad(self, pad_size: Sequence[int], value: float = 0.0, inplace: bool = False, safe: bool = True) -> Any:
        """:func:`torchdict.pad` of the dense stack (a new TensorDict; ``inplace`` is refused)."""
        from .._padding import pad

        if inplace:
            raise NotImplementedError("pad(inplace=True) is not supported on a LazyStackedTensorDict.")
        return pad(self.contiguous(), pad_size, value, safe=safe)

    def new_tensor(self, data: Any, *, dtype: Optional[torch.dtype] = None, device: Any = _NO,
                   requires_grad: bool = False, pin_memory: Optional[bool] = None) -> Any:
        """A TensorDict of the dense stack's structure whose leaves are copies of ``data`` (each with its
        leaf's dtype unless ``dtype``); its batch size is ``data``'s shape."""
        data = torch.as_tensor(data)
        options: dict = {"requires_grad": requires_grad}
        if dtype is not None:
            options["dtype"] = dtype
        if device is not _NO:
            options["device"] = device
        return self.contiguous().apply(lambda leaf: leaf.new_tensor(data, **options), batch_size=data.shape)

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False,
                        from_flatten: Optional[bool] = None) -> Any:
        """Load ``state_dict`` into the dense stack, then write its entries back into the members."""
        scratch = self.contiguous()
        scratch.load_state_dict(state_dict, strict=strict, assign=assign, from_flatten=from_flatten)
        if assign:
            self.update(scratch)
        else:
            self.update_(scratch)
        return self

    def to_module(self, module: torch.nn.Module, *, inplace: Optional[bool] = None, return_swap: bool = True,
                  swap_dest: Any = None, use_state_dict: bool = False, non_blocking: bool = False,
                  preserve_module_state: bool = True, memo: Any = None) -> Any:
        """The dense stack's ``to_module`` (its leaves go into ``module``); the keywords are TensorDict's."""
        return self.contiguous().to_module(
            module, inplace=inplace, return_swap=return_swap, swap_dest=swap_dest, use_state_dict=use_state_dict,
            non_blocking=non_blocking, preserve_module_state=preserve_module_state, memo=memo)

    def backward(self, gradient: Any = None, retain_graph: Optional[bool] = None, create_graph: bool = False,
                 inputs: Any = None) -> None:
        """``torch.autograd.backward`` of the stacked leaves that require gradients (the keys every member
        has, as upstream; a ragged one raises the ragged-read error); ``gradient`` gives each its
        gradient under the same key. The gradients flow back into the members' leaves."""
        dense = self.contiguous()  # torch.stack keeps the autograd graph to the members' leaves
        keys = [key for key in dense.keys(True, True)
                if isinstance(dense.get(key), _Tensor) and dense.get(key).requires_grad]
        if not keys:
            raise RuntimeError("element 0 of tensors does not require grad and does not have a grad_fn")
        tensors = [dense.get(key) for key in keys]
        if gradient is None:
            if any(tensor.numel() != 1 for tensor in tensors):
                raise RuntimeError("grad can be implicitly created only for scalar outputs")
            grads = None
        else:
            grads = [gradient.get(key) if key in gradient.keys(True, True) else gradient[key] for key in keys]
        if hasattr(inputs, "values"):
            inputs = [leaf for leaf in inputs.values(True, True) if isinstance(leaf, _Tensor)]
        torch.autograd.backward(tensors, grads, retain_graph=retain_graph, create_graph=create_graph,
                                inputs=inputs)

    # ------------------------------------------------------------------ entries made of several keys
    def cat_tensors(self, *keys: Any, out_key: Any, dim: int = 0, keep_entries: bool = False) -> Any:
        """``torch.cat`` of the stacked entries ``keys`` along ``dim``, written at ``out_key``; the
        entries are removed unless ``keep_entries``. Returns self."""
        return self._combine_keys(torch.cat, keys, out_key, dim, keep_entries)

    def stack_tensors(self, *keys: Any, out_key: Any, dim: int = 0, keep_entries: bool = False) -> Any:
        """As :meth:`cat_tensors`, with ``torch.stack``."""
        return self._combine_keys(torch.stack, keys, out_key, dim, keep_entries)

    def _combine_keys(self, combine: Callable, keys: tuple, out_key: Any, dim: int, keep_entries: bool) -> Any:
        from .._keys import key_to_tuple
        from ..lazy import _missing_key_error

        paths = [key_to_tuple(key) for key in keys]
        if not keep_entries and len(set(paths)) != len(paths):
            # The second removal of a repeated key would fail after the first changes: refuse first.
            raise KeyError(f"Key {keys[0]} not found in any of the stacked tensordicts.")
        values = []
        for key in keys:
            value = self.get(key, _NO)
            if value is _NO:
                raise _missing_key_error(key, self.keys())
            values.append(value)
        self.set(out_key, combine(values, dim))
        if not keep_entries:
            for key in keys:
                if key_to_tuple(key) != key_to_tuple(out_key):
                    del self[key]
        return self

    def cat_from_tensordict(self, dim: int = 0, *, sorted: Any = None, out: Optional[_Tensor] = None) -> _Tensor:
        """``torch.cat`` of every stacked leaf (in key order, or sorted) along ``dim``."""
        return self._all_leaves(torch.cat, dim, sorted, out)

    def stack_from_tensordict(self, dim: int = 0, *, sorted: Any = None, out: Optional[_Tensor] = None) -> _Tensor:
        """``torch.stack`` of every stacked leaf (in key order, or sorted) along ``dim``."""
        return self._all_leaves(torch.stack, dim, sorted, out)

    def _all_leaves(self, combine: Callable, dim: int, sort: Any, out: Optional[_Tensor]) -> _Tensor:
        if isinstance(sort, (list, tuple)):
            keys: List[Any] = list(sort)
        else:
            keys = self.keys(True, True, sort=bool(sort))
        values = [self.get(key) for key in keys]
        return combine(values, dim) if out is None else combine(values, dim, out=out)

    # ------------------------------------------------------------------ nested tensors
    def get_nestedtensor(self, key: Any, default: Any = _NO, *, layout: Optional[torch.layout] = None) -> _Tensor:
        """A nested tensor of the members' values at ``key`` (the stack dim must be 0)."""
        if self.stack_dim != 0:
            raise RuntimeError("Because nested tensors can only be stacked along their first dimension, "
                               "LazyStackedTensorDict.get_nestedtensor can only be called when the stack_dim is 0.")
        values = self._member_values(key)
        from ._ops import _MISSING

        if values is _MISSING:
            if default is not _NO:
                return default
            from ..lazy import _missing_key_error

            raise _missing_key_error(key, self.keys())
        return torch.nested.nested_tensor(values, layout=layout or torch.strided)

    def densify(self, layout: torch.layout = torch.strided) -> Any:
        """The dense stack; ragged leaves (stack dim 0 only) become nested tensors of ``layout``."""
        from ._ops import is_ragged

        ragged = [key for key in self.keys(True, True) if is_ragged(self._member_values(key))]
        exclusive = self._has_exclusive_keys()
        if exclusive and not len(self._member_batch):
            raise RuntimeError("Cannot densify a tensordict with values with empty shape and exclusive keys: got "
                               f"shape {self._member_batch}.")
        if (ragged or exclusive) and self.stack_dim != 0:
            raise NotImplementedError(f"stack_dim is {self.stack_dim} but not 0. Densify canot be done.")
        if not ragged:
            return self.contiguous()  # exclusive keys are left out
        # A TensorDict checks every leaf's shape, which a strided nested tensor does not have.
        raise NotImplementedError("densify() of ragged entries into nested tensors is not supported: read them "
                                  "with get(key, as_nested_tensor=True).")


class LazyConstructorsMixin(LazyHost):
    """The class-level constructors of upstream's ``LazyStackedTensorDict``: ``from_dict`` / ``from_list``
    (one member per dict) and ``lazy_stack``; the others build a plain TensorDict, as upstream's do."""

    __slots__ = ()

    @classmethod
    def from_dict(cls, input_dict: Any, *other: Any, auto_batch_size: bool = False, batch_size: Any = None,
                  device: Any = None, batch_dims: Optional[int] = None, stack_dim_name: Optional[str] = None,
                  stack_dim: int = 0, names: Optional[Sequence[str]] = None) -> Any:
        """A lazy stack with one member per dict (a list of dicts, or a dict keyed ``"0"``, ``"1"``, ...),
        each made by ``TensorDict.from_dict``; the dicts may hold different keys and shapes."""
        from ..tensordict import TensorDict

        if isinstance(input_dict, dict):
            input_dict = [input_dict[str(position)] for position in range(len(input_dict))]  # KeyError '0'
        if names is not None:
            if stack_dim_name is not None:
                raise ValueError("names and stack_dim_name are exclusive.")
            stack_dim_name = list(names)[stack_dim]
        members = [TensorDict.from_dict(item, *other, auto_batch_size=auto_batch_size, batch_size=batch_size,
                                        device=device, batch_dims=batch_dims) for item in input_dict]
        result = cls(*members, stack_dim=stack_dim)
        if stack_dim_name is not None:
            result._stack_name = stack_dim_name
        return result

    @classmethod
    def from_list(cls, input: Sequence[Any], *, auto_batch_size: Optional[bool] = None, batch_size: Any = None,
                  device: Any = None, batch_dims: Optional[int] = None, names: Optional[Sequence[str]] = None,
                  lazy: Optional[bool] = None) -> Any:
        """``from_dict`` of a list of dicts: one member each."""
        return cls.from_dict(list(input), auto_batch_size=bool(auto_batch_size), batch_size=batch_size,
                             device=device, batch_dims=batch_dims, names=names)

    @classmethod
    def from_any(cls, obj: Any, *, auto_batch_size: bool = False, batch_dims: Optional[int] = None,
                 device: Any = None, batch_size: Any = None) -> Any:
        """``from_dict`` for a mapping or a list; ``TensorDict.from_any`` otherwise."""
        from ..tensordict import TensorDict

        kwargs = dict(auto_batch_size=auto_batch_size, batch_dims=batch_dims, device=device, batch_size=batch_size)
        if isinstance(obj, (dict, list)):
            return cls.from_dict(obj, **kwargs)
        return TensorDict.from_any(obj, **kwargs)

    @classmethod
    def stack(cls, input: Sequence[Any], dim: int = 0, *, out: Any = None) -> Any:
        """``torch.stack(input, dim)``: lazy stacks of lazy stacks stay lazy (see ``torch.stack``)."""
        return torch.stack(list(input), dim, out=out) if out is not None else torch.stack(list(input), dim)

    @classmethod
    def cat(cls, input: Sequence[Any], dim: int = 0, *, out: Any = None) -> Any:
        """``torch.cat(input, dim)``: with lazy stacks among the inputs, a lazy stack."""
        return torch.cat(list(input), dim, out=out) if out is not None else torch.cat(list(input), dim)

    @classmethod
    def from_tuple(cls, obj: tuple, *, auto_batch_size: bool = False, batch_dims: Optional[int] = None,
                   device: Any = None, batch_size: Any = None) -> Any:
        """A TensorDict with the keys ``"0"``, ``"1"``, ... holding the tuple's items."""
        from ..tensordict import TensorDict

        return TensorDict.from_dict({str(position): value for position, value in enumerate(obj)},
                                    auto_batch_size=auto_batch_size, batch_dims=batch_dims, device=device,
                                    batch_size=batch_size)

    @classmethod
    def from_schema(cls, schema: dict, *, batch_size: Any = None, storage: Optional[str] = None,
                    device: Any = None, **kwargs: Any) -> Any:
        """``TensorDict.from_schema`` (upstream builds the same dense or stored collection here)."""
        from .._from_schema import from_schema

        return from_schema(schema, batch_size, storage, device, kwargs)

    def from_dict_instance(self, input_dict: Any, *, auto_batch_size: Optional[bool] = None, batch_size: Any = None,
                           device: Any = None, batch_dims: Optional[int] = None, names: Any = None) -> Any:
        """``TensorDict.from_dict(input_dict, ...)`` (upstream builds a TensorDict here too)."""
        from ..tensordict import TensorDict

        return TensorDict.from_dict(input_dict, auto_batch_size=bool(auto_batch_size), batch_size=batch_size,
                                    device=device, batch_dims=batch_dims, names=names)


def _delegate_to_tensordict(name: str) -> classmethod:
    def method(cls: Any, *args: Any, **kwargs: Any) -> Any:
        from ..tensordict import TensorDict

        return getattr(TensorDict, name)(*args, **kwargs)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"``TensorDict.{name}`` (upstream's lazy stack builds a TensorDict here too)."
    setattr(method, "__wrapped__", _tensordict_function(name))  # inspect.signature shows TensorDict's parameters
    return classmethod(method)


def _tensordict_function(name: str) -> Callable:
    from ..tensordict import TensorDict  # loaded before the lazy package (lazy/_ops imports it too)

    return getattr(TensorDict, name).__func__


for _name in ("fromkeys", "from_namedtuple", "from_dataclass", "from_module", "from_modules"):
    setattr(LazyConstructorsMixin, _name, _delegate_to_tensordict(_name))
del _name
