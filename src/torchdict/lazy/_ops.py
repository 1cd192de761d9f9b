"""Member-wise operations of :class:`~torchdict.lazy.LazyStackedTensorDict`.

A lazy stack keeps its members (dense TensorDicts) and does not copy them, so
most operations on it are "do it to every member": ``select``/``exclude``,
``del``/``pop``, ``update``, pointwise arithmetic and comparisons. This module
holds them in :class:`LazyOpsMixin`, which the lazy stack inherits, so that
``lazy.py`` keeps to the stack itself (shape, reading, indexing, writing).

The pointwise methods are not written again here: each one calls the member
method of the same name (defined in :mod:`torchdict._ops`) with the operand
split along the stack dim (:meth:`LazyOpsMixin._split_operand`), and stacks the
results lazily. In-place forms first try the op on an empty slice of every
member, so that a member that would fail is found before any member is written.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Callable, List

import torch

from .._base import TensorCollection
from .._errors import locked_error
from .._keys import key_to_tuple
from .._ops import _OPERATORS, BINARY_OPS, UNARY_OPS
from .._torch_function import tensor_operator_handler

if TYPE_CHECKING:
    from ._host import LazyHost
else:
    LazyHost = object

_Tensor = torch.Tensor
#: What ``_member_values`` returns when a member lacks the key (shared with lazy.py).
_MISSING: Any = object()


def is_ragged(values: list) -> bool:
    """True for the members' values of a key that are all tensors but not all of one shape."""
    return all(isinstance(value, _Tensor) for value in values) and any(
        value.shape != values[0].shape for value in values)


class LazyOpsMixin(LazyHost):
    """Member-wise operations; the class using it provides ``_tds``, ``_stack_dim``, ``_is_locked``,
    ``batch_size``, ``keys``, ``get``, ``set``, ``set_`` and ``_member_values``."""

    __slots__ = ()

    # ``==`` is member-wise (a lazy stack of bool entries), so a lazy stack is neither hashable
    # nor usable as a bool (``assert a == b`` would otherwise always pass).
    __hash__ = None  # type: ignore[assignment]

    def __bool__(self) -> bool:
        raise RuntimeError(
            "Converting a tensordict to boolean value is not permitted. Use len(td.keys()) to test for "
            "keys, or (a == b).all() / .any() to reduce a comparison."
        )

    # ------------------------------------------------------------------ building results
    def _stack_of(self, members: List[Any]) -> Any:
        from ..lazy import LazyStackedTensorDict

        return LazyStackedTensorDict(*members, stack_dim=self._stack_dim)

    def _check_writable(self) -> None:
        if self._is_locked or any(td.is_locked for td in self._tds):
            raise locked_error()

    # ------------------------------------------------------------------ select / exclude
    def select(self, *keys: Any, inplace: bool = False, strict: bool = True, as_tensordict: bool = False) -> Any:
        """A lazy stack of each member's ``select(*keys)``; with ``inplace``, the members keep only those keys.

        With ``strict`` (the default), every member must hold every key (the member's ``KeyError``).
        ``as_tensordict`` changes nothing here (it matters to tensorclasses): the result is a lazy stack.

        >>> from torchdict import TensorDict, lazy_stack
        >>> td = lazy_stack([TensorDict(a=0, b=1), TensorDict(a=2, b=3)])
        >>> td.select("a").keys()
        ['a']
        """
        selected = [td.select(*keys, strict=strict) for td in self._tds]  # raises before anything changes
        if not inplace:
            return self._stack_of(selected)
        self._check_writable()
        for td in self._tds:
            td.select(*keys, inplace=True, strict=False)
        return self

    def exclude(self, *keys: Any, inplace: bool = False) -> Any:
        """A lazy stack of each member's ``exclude(*keys)`` (missing keys are ignored); with ``inplace``,
        the keys are removed from the members.

        >>> from torchdict import TensorDict, lazy_stack
        >>> lazy_stack([TensorDict(a=0, b=1), TensorDict(a=2, b=3)]).exclude("a").keys()
        ['b']
        """
        if not inplace:
            return self._stack_of([td.exclude(*keys) for td in self._tds])
        self._check_writable()
        for td in self._tds:
            td.exclude(*keys, inplace=True)
        return self

    # ------------------------------------------------------------------ update
    def update(self, input_dict_or_td: Any = None, clone: bool = False, inplace: bool = False, *,
               non_blocking: bool = False, keys_to_update: Any = None, is_leaf: Any = None,
               update_batch_size: bool = False, ignore_lock: bool = False, **kwargs: Any) -> Any:
        """Write every entry of ``input_dict_or_td`` (full batch) with ``set``; returns self.

        Sub-dicts and sub-TensorDicts are merged into existing sub-TensorDicts, as the
        dense ``update``. With ``inplace``, tensors are copied into the tensors every member
        already has (``set_``, allowed when locked); other entries are set. If one entry
        fails, the entries written before it are undone.

        >>> import torch
        >>> from torchdict import TensorDict, lazy_stack
        >>> td = lazy_stack([TensorDict(), TensorDict()])
        >>> td.update({"a": torch.tensor([1, 2])}).tensordicts[1]["a"]
        tensor(2)
        """
        source = input_dict_or_td
        if keys_to_update is not None and hasattr(source, "select"):
            source = source.select(*keys_to_update, strict=False)
        if clone and hasattr(source, "clone"):
            source = source.clone()
        if isinstance(source, LazyOpsMixin) and source._stack_dim == self._stack_dim and len(
                source._tds) == len(self._tds):
            # Stacked the same way: member by member, so exclusive keys and ragged entries go across.
            self._member_writes(lambda td, part: td.update(part, inplace=inplace), source._tds, inplace)
            return self
        undo: List[Callable[[], None]] = []
        try:
            self._update_from(source, (), inplace, undo)
        except BaseException:
            for step in reversed(undo):
                step()
            raise
        return self

    def _update_from(self, source: Any, prefix: tuple, inplace: bool, undo: list) -> None:
        for key in source.keys():  # a source without keys() raises AttributeError, as upstream
            value = self._source_entry(source, key)
            keys = prefix + key_to_tuple(key)
            if isinstance(value, (Mapping, TensorCollection)) and self._members_hold(keys, TensorCollection):
                self._update_from(value, keys, inplace, undo)  # merge into the members' sub-TensorDicts
            else:
                self._update_entry(keys, value, inplace, undo)

    def _source_entry(self, source: Any, key: Any) -> Any:
        """``source[key]``; a ragged entry of a lazy source stacked along the same dim comes as
        one value per member (a list), which ``set`` writes member by member."""
        if isinstance(source, Mapping):
            return source[key]
        if isinstance(source, LazyOpsMixin) and source._stack_dim == self._stack_dim:
            values = source._member_values(key)
            if is_ragged(values):
                return values
        return source.get(key)

    def _members_hold(self, keys: tuple, kind: type) -> bool:
        """Every member has an entry of type ``kind`` at ``keys``."""
        values = self._member_values(keys)
        return values is not _MISSING and all(isinstance(value, kind) for value in values)

    def _update_entry(self, keys: tuple, value: Any, inplace: bool, undo: list) -> None:
        if inplace and isinstance(value, _Tensor) and self._members_hold(keys, _Tensor):
            backups = [old.clone() for old in self._member_values(keys)]
            self.set_(keys, value)  # checks every member before writing any
            undo.append(lambda: [td.set_(keys, backup) for td, backup in zip(self._tds, backups)])
            return
        from ._writes import undo_record

        records = [undo_record(td, keys) for td in self._tds]
        self.set(keys, value)  # undoes its own partial write if a member refuses
        undo.append(lambda: _restore(self._tds, records))

    # ------------------------------------------------------------------ removing
    def __delitem__(self, key: Any) -> None:
        """Delete ``key`` from every member that has it (an exclusive key too, as upstream)."""
        holders = [td for td in self._tds if key in td]
        if not holders:
            raise KeyError(f"Key {key} not found in any of the stacked tensordicts.")
        if self._is_locked or any(td.is_locked for td in holders):
            raise locked_error()
        for td in holders:
            del td[key]

    def del_(self, key: Any) -> Any:
        """``del self[key]``; returns self."""
        del self[key]
        return self

    def pop(self, key: Any, default: Any = _MISSING) -> Any:
        """``self[key]`` (or ``default`` when some member lacks it), then the key is deleted from the members.

        >>> import torch
        >>> from torchdict import TensorDict, lazy_stack
        >>> td = lazy_stack([TensorDict(a=0), TensorDict(a=1)])
        >>> td.pop("a"), td.keys()
        (tensor([0, 1]), [])
        """
        value = self.get(key, _MISSING)  # a ragged entry raises here, before anything is deleted
        if value is _MISSING:
            if default is not _MISSING:
                return default
            from ..lazy import _missing_key_error

            raise _missing_key_error(key, self.keys())
        del self[key]
        return value

    # ------------------------------------------------------------------ pickling
    def __reduce__(self) -> tuple:
        return _unpickle_lazy_stack, (list(self._tds), self._stack_dim, self._is_locked)

    # ------------------------------------------------------------------ pointwise ops
    def _split_operand(self, operand: Any) -> list:
        """``operand`` as one value per member: TensorDicts (full batch) and tensors (broadcast against
        the batch shape, as the dense ops do) are split along the stack dim; anything else is given to
        every member."""
        count, dim = len(self._tds), self._stack_dim
        if isinstance(operand, Mapping) and not isinstance(operand, TensorCollection):
            operand = _as_tensordict(operand, self.batch_size)
        if isinstance(operand, TensorCollection):
            if operand.batch_size != self.batch_size:
                raise RuntimeError(f"A LazyStackedTensorDict of batch size {self.batch_size} takes TensorDict "
                                   f"operands of the same batch size, got {operand.batch_size}.")
            # A lazy operand split along another dim gives lazy slices: the members' ops need dense ones.
            return [_dense(part) for part in operand.unbind(dim)]
        if isinstance(operand, _Tensor):
            # The operand broadcasts against the batch shape as torch broadcasts (its last dim meets
            # the last batch dim), so the stack dim is this dim of it (none if negative).
            position = dim + operand.dim() - len(self.batch_size)
            if position >= 0:
                size = operand.shape[position]
                if size == 1:
                    return [operand.select(position, 0)] * count
                if size != count:
                    raise RuntimeError(f"The size of the operand ({size}) must match the size of the stack dim "
                                       f"({count}) at dim {position} of the operand.")
                return list(operand.unbind(position))
        return [operand] * count

    def _member_arguments(self, args: tuple, kwargs: dict) -> list:
        """One ``(args, kwargs)`` per member, each operand split by :meth:`_split_operand`."""
        split_args = [self._split_operand(arg) for arg in args]
        split_kwargs = {name: self._split_operand(value) for name, value in kwargs.items()}
        return [(tuple(parts[i] for parts in split_args), {name: parts[i] for name, parts in split_kwargs.items()})
                for i in range(len(self._tds))]

    def _memberwise(self, method: str, args: tuple, kwargs: dict) -> Any:
        """A lazy stack of ``member.<method>(...)``; NotImplemented if a member's dunder gives it."""
        from ..lazy import LazyStackedTensorDict

        results = []
        for td, (member_args, member_kwargs) in zip(self._tds, self._member_arguments(args, kwargs)):
            result = getattr(td, method)(*member_args, **member_kwargs)
            if result is NotImplemented:
                return NotImplemented
            results.append(result)
        # A tensor operand with more dims than the batch grows the members' batch in front (as the
        # dense ops do), which moves the stack dim right.
        grown = results[0].batch_dims - len(self._member_batch)
        stacked = LazyStackedTensorDict(*results, stack_dim=self._stack_dim + grown)
        # As the dense ops: a result of a locked stack is locked when the members' results are
        # (arithmetic), not otherwise (comparisons).
        stacked._is_locked = self._is_locked and all(result.is_locked for result in results)
        return stacked

    def _memberwise_(self, method: str, args: tuple, kwargs: dict, dry_run: bool = True) -> Any:
        """``member.<method>(...)`` in place on every member; returns self (NotImplemented, unchanged, if
        the operand type is not supported). ``dry_run=False`` for ops that can't fail on one member only
        (``detach_``, ``zero_``, ...)."""
        per_member = self._member_arguments(args, kwargs)
        if dry_run:
            self._dry_run(method, per_member, skip_first=True)
        for td, (member_args, member_kwargs) in zip(self._tds, per_member):
            if getattr(td, method)(*member_args, **member_kwargs) is NotImplemented:
                return NotImplemented  # the first member: the operand type is refused before any write
        return self

    def _dry_run(self, method: str, per_member: list, skip_first: bool) -> None:
        """Raise, before any member is written, what a member's in-place op would raise.

        Each member's own in-place op changes nothing when it fails, but the earlier
        members would already be written. So the op first runs on an empty slice of
        every later member (``member[:0]``, the operands sliced alike): torch checks
        dtypes and the members check keys and shapes, and no element is written. A
        member that is a lazy stack itself is probed member by member.
        """
        pairs = list(zip(self._tds, per_member))
        for td, (member_args, member_kwargs) in pairs[1:] if skip_first else pairs:
            if isinstance(td, LazyOpsMixin):
                td._dry_run(method, td._member_arguments(member_args, member_kwargs), skip_first=False)
                continue
            if td.batch_dims == 0:  # no batch dim to take an empty slice of: try a copy
                getattr(td.clone(), method)(*member_args, **member_kwargs)
                continue
            n_batch = td.batch_dims
            probe_args = [_empty_slice(arg, n_batch) for arg in member_args]
            probe_kwargs = {name: _empty_slice(value, n_batch) for name, value in member_kwargs.items()}
            getattr(td[:0], method)(*probe_args, **probe_kwargs)

    def __pos__(self) -> Any:
        return self

    # ------------------------------------------------------------------ torch.<fn>(lazy_td, ...)
    @classmethod
    def __torch_function__(cls, func: Callable, types: tuple, args: tuple = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.stack:
            tensors = args[0] if args else kwargs.get("tensors", ())
            if all(isinstance(td, LazyOpsMixin) for td in tensors):
                return _stack_lazy_stacks(*args, **kwargs)
            return NotImplemented  # lazy and dense mixed: TensorDict's stack, of the lazy ones' dense forms
        if func is torch.cat:
            return _cat_lazy_stacks(*args, **kwargs)
        method = _TORCH_POINTWISE.get(func)
        if method is not None and args and isinstance(args[0], LazyOpsMixin):
            return getattr(args[0], method)(*args[1:], **kwargs)
        # ``t + lazy`` / ``lazy ** t`` under torch.compile: the tensor's operator, answered with the stack's own
        operator = tensor_operator_handler(func)
        if operator is not None:
            return operator(*args, **kwargs)
        return NotImplemented  # torch raises its TypeError


def _take_entries(out: Any, result: Any, update_batch_size: bool) -> Any:
    """``out`` takes the top-level entries of ``result`` (set, not copied into); if one is refused, the
    entries set before it are put back. Returns ``out``."""
    if isinstance(out, LazyOpsMixin):
        return out.update(result, update_batch_size=update_batch_size)
    if update_batch_size and out.batch_size != result.batch_size:
        if out.is_locked:
            raise locked_error()
        out.batch_size = result.batch_size
    written: list = []
    try:
        for key, value in result.items():
            written.append((key, out.get(key, _MISSING)))
            out.set(key, value)
    except BaseException:
        for key, old in reversed(written):
            if old is _MISSING:
                if key in out.keys():
                    del out[key]
            else:
                out.set(key, old)
        raise
    return out


def _restore(members: list, records: list) -> None:
    """Undo ``set``: put each member's old entry back, or delete what the write created."""
    for td, (path, old) in zip(members, records):
        if old is _MISSING:
            if path in td.keys(True):
                del td[path]
        else:
            td.set(path, old)


def _as_tensordict(mapping: Mapping, batch_size: torch.Size) -> Any:
    """A dict operand as a TensorDict of the stack's batch size, or with no batch when its values lack it
    (then every member compares with all of it, as the dense ``td == {...}``)."""
    from ..tensordict import TensorDict

    try:
        return TensorDict(mapping, batch_size=batch_size)
    except RuntimeError:
        return mapping


def _dense(part: Any) -> Any:
    return part.contiguous() if hasattr(part, "tensordicts") else part


def _empty_slice(operand: Any, n_batch: int) -> Any:
    """``operand`` sliced as ``member[:0]`` is (a member has ``n_batch`` batch dims): a TensorDict along
    its first dim; a tensor along the dim that meets the member's first batch dim, if it has one of size > 1."""
    if isinstance(operand, TensorCollection):
        return operand[:0]
    if isinstance(operand, _Tensor):
        position = operand.dim() - n_batch
        if position >= 0 and operand.shape[position] != 1:
            return operand.narrow(position, 0, 0)
    return operand


def _unpickle_lazy_stack(members: list, stack_dim: int, locked: bool) -> Any:
    from ..lazy import LazyStackedTensorDict

    td = LazyStackedTensorDict(*members, stack_dim=stack_dim)
    td._is_locked = locked
    return td


def _stack_lazy_stacks(tensors: Any, dim: int = 0, *, out: Any = None) -> Any:
    """``torch.stack`` of lazy stacks with one batch size and stack dim: a lazy stack (the same
    stack dim, shifted if the new dim comes before it) of the dense stacks of their i-th members."""
    from ..lazy import LazyStackedTensorDict

    tensors = list(tensors)
    if out is not None:
        raise TypeError("torch.stack(..., out=...) is not supported for LazyStackedTensorDicts.")
    first = tensors[0]
    if not all(isinstance(td, LazyStackedTensorDict) and td.batch_size == first.batch_size
               and td.stack_dim == first.stack_dim for td in tensors):
        raise RuntimeError("torch.stack of LazyStackedTensorDicts needs LazyStackedTensorDicts with the same batch "
                           "size and stack_dim (stack their contiguous() forms, or lazy_stack TensorDicts).")
    n_dims = first.batch_dims + 1
    if not -n_dims <= dim < n_dims:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-n_dims}, {n_dims - 1}], "
                         f"but got {dim})")
    dim %= n_dims
    stack_dim = first.stack_dim
    # The new dim comes before the stack dim (which moves right) or after it (one dim less inside a member).
    member_dim, new_stack_dim = (dim, stack_dim + 1) if dim <= stack_dim else (dim - 1, stack_dim)
    # torch.stack / torch.cat of TensorDicts give TensorDicts (__torch_function__); torch's stubs say tensors.
    members: list = [torch.stack([td._tds[i] for td in tensors], member_dim) for i in range(len(first._tds))]
    return LazyStackedTensorDict(*members, stack_dim=new_stack_dim)


def _cat_lazy_stacks(tensors: Any, dim: int = 0, *, out: Any = None) -> Any:
    """``torch.cat`` with lazy stacks among the inputs, as upstream: a lazy stack. Dense inputs are first
    split along the lazy ones' stack dim (which they must share); along the stack dim the members are
    concatenated, along another dim the i-th members are (densely) catted."""
    from ..lazy import LazyStackedTensorDict

    tensors = list(tensors)
    if out is not None:
        raise TypeError("torch.cat(..., out=...) is not supported for LazyStackedTensorDicts.")
    lazies = [td for td in tensors if isinstance(td, LazyStackedTensorDict)]
    stack_dim = lazies[0].stack_dim
    if any(td.stack_dim != stack_dim for td in lazies):
        raise RuntimeError("cat lazy stacked tds must have same stack dim")
    n_batch = lazies[0].batch_dims
    if not -n_batch <= dim < n_batch:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-n_batch}, {n_batch - 1}], "
                         f"but got {dim})")
    dim %= n_batch
    stacks = [td if isinstance(td, LazyStackedTensorDict) else td.to_lazystack(stack_dim) for td in tensors]
    if dim == stack_dim:
        members = [member for td in stacks for member in td.tensordicts]
        return LazyStackedTensorDict(*members, stack_dim=stack_dim)
    counts = {len(td.tensordicts) for td in stacks}
    if len(counts) != 1:
        raise RuntimeError("torch.cat of lazy stacks along a dim other than the stack dim needs the same number "
                           f"of members in each, got {sorted(counts)}.")
    member_dim = dim - (dim > stack_dim)
    members = [torch.cat([td.tensordicts[position] for td in stacks], member_dim)  # type: ignore[misc]
               for position in range(counts.pop())]
    return LazyStackedTensorDict(*members, stack_dim=stack_dim)


#: torch functions that call the lazy stack's method of the same name (``torch.abs(td)``, ``torch.add(td, 1)``,
#: and the reductions of ``_reductions``: ``torch.sum(td)``, ``torch.mean(td, 0)``).
_TORCH_POINTWISE = {getattr(torch, name): name
                    for name in (*BINARY_OPS, *UNARY_OPS, "clamp", "clip", "lerp", "sum", "nansum", "mean", "nanmean",
                                 "prod", "std", "var", "amax", "amin", "max", "min", "all", "any")
                    if callable(getattr(torch, name, None))}


# --------------------------------------------------------------------------- generated methods

#: Member methods that are not in the op tables of ``_ops`` (aliases, clamp, lerp).
_EXTRA_METHODS = ("clamp", "clip", "lerp", "multiply", "subtract", "divide", "true_divide", "absolute", "negative",
                  "mod", "addcmul", "addcdiv", "masked_fill", "where",
                  "greater", "greater_equal", "less", "less_equal", "not_equal")


def _out_of_place(name: str) -> Callable:
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = kwargs.pop("out", None)  # not split among the members: it receives the whole result
        result = self._memberwise(name, args, kwargs)
        if result is NotImplemented:  # a named method, not a dunder: say so (the members' dunders don't)
            raise TypeError(f"{name}(): unsupported operand type for a LazyStackedTensorDict.")
        if out is None:
            return result
        if name == "where":  # as upstream: out takes the result's entries (sub-stacks stay lazy)
            return _take_entries(out, result, kwargs.get("update_batch_size", False))
        from .._ops import _into_out

        # The result's values copied into out's tensors (a dense out takes the dense result, which
        # must not leave out keys only some members hold).
        if isinstance(out, LazyOpsMixin):
            return _into_out(out, result)
        if result._has_exclusive_keys():
            raise KeyError(f"{name}(out=...): the result has keys that only some members hold "
                           f"({result._exclusive_keys()}); a dense out can't take them.")
        return _into_out(out, result.contiguous())

    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"A lazy stack of each member's ``{name}(...)`` (operands split along the stack dim)."
    return method


def _in_place(name: str, dry_run: bool = True) -> Callable:
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = self._memberwise_(name, args, kwargs, dry_run)
        if result is NotImplemented:
            raise TypeError(f"{name}(): unsupported operand type for a LazyStackedTensorDict.")
        return result

    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"Each member's ``{name}(...)`` in place (nothing is written if one member fails); returns self."
    return method


def _dunder(name: str, inplace: bool) -> Callable:
    if inplace:
        def method(self: Any, other: Any) -> Any:
            return self._memberwise_(name, (other,), {})
    else:
        def method(self: Any, other: Any) -> Any:
            return self._memberwise(name, (other,), {})
    method.__name__ = method.__qualname__ = name
    return method


#: Other members that upstream's lazy stack runs member by member (its result stays lazy; ragged members
#: are fine): dtype casts, moves and key-structure ops, whose arguments are the same for every member.
MEMBERWISE_METHODS = (
    "bfloat16", "bool", "complex128", "complex64", "double", "float", "float16", "float32", "float64", "half",
    "int", "int16", "int32", "int64", "int8", "long", "short", "uint16", "uint32", "uint64", "uint8", "type",
    "cpu", "detach", "copy", "filter_non_tensor_data",
)
#: Their in-place relatives: run on every member, then ``self`` is returned.
MEMBERWISE_IN_PLACE = ("detach_", "zero_", "requires_grad_", "share_memory_", "zero_grad")


def _install() -> None:
    """Add one member-wise method per member method of the op tables (and the Python operators)."""
    from ..tensordict import TensorDict

    def put(name: str, method: Callable) -> None:
        if name not in vars(LazyOpsMixin) and hasattr(TensorDict, name):
            # The member method takes the same arguments: inspect.signature (and help()) show its keywords.
            setattr(method, "__wrapped__", getattr(TensorDict, name))
            setattr(LazyOpsMixin, name, method)

    for name in [*BINARY_OPS, *UNARY_OPS, *_EXTRA_METHODS]:
        put(name, _out_of_place(name))
        put(f"{name}_", _in_place(f"{name}_"))
    for stem, _, _ in _OPERATORS:
        put(f"__{stem}__", _dunder(f"__{stem}__", inplace=False))
        put(f"__r{stem}__", _dunder(f"__r{stem}__", inplace=False))
        put(f"__i{stem}__", _dunder(f"__i{stem}__", inplace=True))
    for name in MEMBERWISE_METHODS:
        put(name, _out_of_place(name))
    for name in MEMBERWISE_IN_PLACE:
        put(name, _in_place(name, dry_run=False))
    for unary in ("__neg__", "__abs__", "__invert__"):
        put(unary, lambda self, _name=unary: self._memberwise(_name, (), {}))


_install()
