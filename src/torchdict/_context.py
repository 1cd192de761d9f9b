"""One mechanism for every "operation as a context manager".

Two kinds of operation can be used in a ``with`` block:

* **write-back ops** (``flatten_keys``, ``permute``, ``to``, ...) return a new
  TensorDict, the *child*. Each declares its *inverse* with :func:`write_back`:
  a function mapping a TensorDict laid out like the child back to the layout
  of the parent. When the block ends without an exception, what changed in the
  child since ``__enter__`` (values edited in place, keys set or replaced, keys
  deleted) is gathered into small TensorDicts in the child's layout, mapped
  back with the inverse, and applied to the parent.
* **state changes** (``lock_``, ``unlock_``, ``to_module``) record a plain exit
  action with :func:`set_exit_action` / :func:`remember_state_change`; it runs
  on exit whether or not the block raised.

Cost off the ``with`` path: a write-back op stores one tuple (with a weak
reference to the parent, so an unused child never keeps its parent alive) in
the result's ``_cm`` slot. Everything else (the snapshot taken by
``__enter__``, the diff and the write-back) only happens inside ``with``.

The ``_cm`` slot holds ``None``, a pending record (a tuple whose first item is
the function that runs it), or a :class:`_ContextState` once the object has
been entered (pending record plus the stack of entered ones, so nested blocks
on the same object unwind in order).
"""
from __future__ import annotations

import functools
import weakref
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch

from ._base import TensorCollection, tensordict_class
from ._errors import MessageKeyError, locked_error
from .nontensor import NonTensorData

if TYPE_CHECKING:
    from typing import Literal

    from ._host import TensorDictHost
else:
    TensorDictHost = object

ExitAction = Callable[[bool], None]  # called with raised=True when the block raised
Inverse = Callable[..., Any]  # inverse(td_like_child, parent, *op_args, **op_kwargs) -> td_like_parent

_Tensor = torch.Tensor
_MISSING: Any = object()
_ref = weakref.ref


# --------------------------------------------------------------------------- pending records


class _ContextState:
    __slots__ = ("pending", "stack")

    def __init__(self, pending: Optional[tuple]) -> None:
        self.pending = pending
        self.stack: list = []  # (record or None, snapshot or None) per entered block


def _set_pending(td: Any, record: Optional[tuple]) -> None:
    state = td._cm
    if state is None or type(state) is tuple:
        td._cm = record
    else:
        state.pending = record


def _run_action(child: Any, raised: bool, record: tuple, snapshot: Any) -> None:
    record[1](raised)


def _run_restore(child: Any, raised: bool, record: tuple, snapshot: Any) -> None:
    record[1]()


def set_exit_action(td: Any, action: Optional[ExitAction]) -> None:
    """Record what leaving a ``with`` block around ``td`` must do: ``action(raised)``.

    It runs on exit also when the block raised (``raised=True``). ``None``
    clears a pending action.
    """
    if action is None:
        if td._cm is not None:
            _set_pending(td, None)
        return
    _set_pending(td, (_run_action, action))


def remember_state_change(td: Any, restore: Optional[Callable[[], None]]) -> None:
    """For ``lock_``/``unlock_``: undo the change on exit, also when the block raises.

    ``restore`` is None when the call changed nothing (then exit does nothing).
    """
    if restore is None:
        if td._cm is not None:
            _set_pending(td, None)
        return
    _set_pending(td, (_run_restore, restore))


def then_on_exit(td: Any, after: Callable[[], None]) -> None:
    """Once the write-back pending on ``td`` has run at the end of a ``with`` block that did not raise,
    call ``after()`` (a collection whose op ran on a dense copy writes that copy back to itself)."""
    record = td._cm
    if type(record) is tuple:
        td._cm = (_run_then, record, after)


def _run_then(child: Any, raised: bool, record: tuple, snapshot: Any) -> None:
    inner = record[1]
    inner[0](child, raised, inner, snapshot)
    if not raised:
        record[2]()


_INVERSES: list = []  # every inverse given to write_back


def write_back(inverse: Inverse, *, shares_leaves: bool = False) -> Callable[[Callable], Callable]:
    """Declare a method as an op whose result writes back to ``self`` when used in ``with``.

    ``inverse(td, parent, *args, **kwargs)`` gets a TensorDict laid out like
    the op's result and returns it laid out like ``parent`` (``args`` and
    ``kwargs`` are those of the op call). ``shares_leaves=True`` says the
    result holds the parent's own leaf objects (key-structure ops), so values
    edited in place need no write-back at all.

    A result that *is* ``self`` (e.g. a view to the same shape) has nothing to
    write back.
    """

    # The inverse is read from a module-level table when an op runs, not from the closure: torch.compile
    # can rebuild (return from compiled code) a function it reached through a module global only.
    position = len(_INVERSES)
    _INVERSES.append(inverse)

    def decorate(method: Callable) -> Callable:
        @functools.wraps(method)
        def op(self: Any, *args: Any, **kwargs: Any) -> Any:
            result = method(self, *args, **kwargs)
            if result is self:
                if self._cm is not None:
                    _set_pending(self, None)
            elif result._cm is None:
                result._cm = (_write_back, _INVERSES[position], shares_leaves, _ref(self), args, kwargs)
            else:
                _set_pending(result, (_write_back, _INVERSES[position], shares_leaves, _ref(self), args, kwargs))
            return result

        setattr(op, "write_back_inverse", inverse)
        return op

    return decorate


# --------------------------------------------------------------------------- the mixin


class ContextMixin(TensorDictHost):
    __slots__ = ()

    def clear_refs_for_compile_(self) -> Any:
        """Forget the pending ``with`` records of this TensorDict and its nested ones, as upstream; returns self.

        Each record holds a weak reference to the TensorDict the op came from, which torch.compile can't
        return from a compiled function. A block already entered keeps its state.
        """
        pending = [self]
        while pending:
            td = pending.pop()
            if not isinstance(td._cm, _ContextState):
                td._cm = None
            pending.extend(_unwrap(value) for value in td._tensordict.values()
                           if isinstance(value, TensorCollection) and isinstance(_unwrap(value), tensordict_class()))
        return self

    def __enter__(self) -> Any:
        """Start a block; the op that produced this TensorDict is undone (or written back) on exit.

        >>> from torchdict import TensorDict
        >>> td = TensorDict({"a": {"b": 0}})
        >>> with td.flatten_keys() as flat:
        ...     flat["a.b"] += 1
        ...     flat["a.c"] = 0
        >>> int(td["a", "b"]), int(td["a", "c"])
        (1, 0)
        """
        state = self._cm
        if type(state) is not _ContextState:
            state = self._cm = _ContextState(state)
        record = state.pending
        state.pending = None
        snapshot = None
        own = record[1] if record is not None and record[0] is _run_then else record
        if own is not None and own[0] is _write_back:
            snapshot = _snapshot(self, not own[2])  # versions only where leaves may be copies
        state.stack.append((record, snapshot))
        return self

    def __exit__(self, exc_type: Any, exc: Any, traceback: Any) -> Literal[False]:
        record, snapshot = self._cm.stack.pop()
        if record is not None:
            record[0](self, exc_type is not None, record, snapshot)
        return False


# --------------------------------------------------------------------------- what changed in the child


def _unwrap(value: Any) -> Any:
    """The TensorDict behind a collection (a tensorclass keeps one in ``_tensordict``)."""
    inner = value._tensordict
    return value if type(inner) is dict else inner


def _version(tensor: torch.Tensor) -> Optional[int]:
    """The tensor's version counter (bumped by every in-place op); None where torch keeps none."""
    try:
        return tensor._version
    except RuntimeError:  # inference-mode tensors have no version counter
        return None


def _snapshot(td: Any, with_versions: bool) -> tuple:
    """The entries of ``td`` (by identity) and of its sub-collections, to diff against on exit.

    With ``with_versions``, also each tensor leaf's version counter, so that on exit only
    leaves edited in place need copying back.
    """
    nested = None
    versions: Optional[dict] = {} if with_versions else None
    storage = td._tensordict
    for key, value in storage.items():
        if isinstance(value, _Tensor):
            if versions is not None:
                versions[key] = _version(value)
        elif isinstance(value, TensorCollection):
            if nested is None:
                nested = {}
            nested[key] = _snapshot(_unwrap(value), with_versions)
    return dict(storage), nested, versions


_REMOVED: Any = object()  # data of the placeholder standing for a deleted entry
_WHOLE = "\x00torchdict:whole-entry-removed"  # key of the placeholder marking a deleted sub-collection


def _empty(template: Any) -> Any:
    return tensordict_class()._new_unsafe({}, template._batch_size, template._device)


class _Changes:
    """What changed in a child, as three TensorDicts in the child's layout (built on demand).

    ``kept``: tensor leaves still the same objects but edited in place;
    ``changed``: entries set or replaced; ``removed``: placeholders where
    entries were deleted (a deleted sub-collection holds a ``_WHOLE`` marker).
    """

    __slots__ = ("kept", "changed", "removed")

    def __init__(self) -> None:
        self.kept: Any = None
        self.changed: Any = None
        self.removed: Any = None

    @staticmethod
    def _add(root: Any, chain: list, keys: list, key: str, value: Any) -> Any:
        if root is None:
            root = _empty(chain[0])
        td = root
        for position, part in enumerate(keys):
            storage = td._tensordict
            inner = storage.get(part)
            if inner is None:
                inner = storage[part] = _empty(chain[position + 1])
            td = inner
        td._tensordict[key] = value
        return root


def _placeholder(td: Any) -> NonTensorData:
    return NonTensorData(_REMOVED, td._batch_size)


def _removed_copy(container: Any) -> Any:
    """Placeholders for every entry of a deleted sub-collection, plus the ``_WHOLE`` marker."""
    inner = _unwrap(container)
    copy = _empty(inner)
    storage = copy._tensordict
    for key, value in inner._tensordict.items():
        storage[key] = _removed_copy(value) if isinstance(value, TensorCollection) else _placeholder(inner)
    storage[_WHOLE] = _placeholder(inner)
    return copy


def _diff(td: Any, snapshot: tuple, changes: _Changes, want_kept: bool, chain: list, keys: list) -> None:
    old_storage, old_nested, versions = snapshot
    storage = td._tensordict
    chain.append(td)
    found = 0
    for key, value in storage.items():
        old = old_storage.get(key, _MISSING)
        if old is _MISSING:
            changes.changed = changes._add(changes.changed, chain, keys, key, value)
            continue
        found += 1
        was_nested = old_nested is not None and key in old_nested
        if old is value:
            if was_nested:
                keys.append(key)
                _diff(_unwrap(value), old_nested[key], changes, want_kept, chain, keys)
                keys.pop()
            elif want_kept and isinstance(value, _Tensor):
                version = versions.get(key)
                if version is None or version != _version(value):  # edited in place (or can't tell)
                    changes.kept = changes._add(changes.kept, chain, keys, key, value)
            continue
        if was_nested:
            # A replaced sub-collection: its old entries go, the new value comes in whole.
            changes.removed = changes._add(changes.removed, chain, keys, key, _removed_copy(old))
        changes.changed = changes._add(changes.changed, chain, keys, key, value)
    if found != len(old_storage):
        for key, old in old_storage.items():
            if key not in storage:
                value = _removed_copy(old) if isinstance(old, TensorCollection) else _placeholder(td)
                changes.removed = changes._add(changes.removed, chain, keys, key, value)
    chain.pop()


# --------------------------------------------------------------------------- applying the changes to the parent


class _Plan:
    """Every change to the parent, checked first and applied only when all of them are valid."""

    __slots__ = ("deletions", "deleted", "sets", "copies")

    def __init__(self) -> None:
        self.deletions: list = []
        self.deleted: set = set()
        self.sets: list = []
        self.copies: list = []

    def delete(self, td: Any, key: str) -> None:
        if td._is_locked:
            raise locked_error()
        self.deletions.append((td, key))
        self.deleted.add((id(td), key))

    def set(self, td: Any, key: str, value: Any, full_key: tuple) -> None:
        if td._is_locked:
            raise locked_error()
        from ._convert import to_leaf

        shown = full_key if len(full_key) > 1 else full_key[0]
        self.sets.append((td, key, to_leaf(value, shown, td._batch_size, td._device)))

    def apply(self) -> None:
        for td, key in self.deletions:
            td._tensordict.pop(key, None)
        for td, key, value in self.sets:
            td._tensordict[key] = value
        for target, value in self.copies:
            if target.requires_grad and target.is_leaf:
                # A parameter: update its data, as an optimizer step would.
                with torch.no_grad():
                    target.copy_(value)
            else:
                target.copy_(value)


def _plan_removals(parent: Any, restored: Any, plan: _Plan) -> None:
    storage = parent._tensordict
    for key, value in restored._tensordict.items():
        if key == _WHOLE or key not in storage:
            continue
        if isinstance(value, TensorCollection):
            inner = _unwrap(value)
            if _WHOLE in inner._tensordict:
                plan.delete(parent, key)
            elif isinstance(storage[key], TensorCollection):
                _plan_removals(_unwrap(storage[key]), inner, plan)
        elif type(value) is NonTensorData and value.data is _REMOVED:
            plan.delete(parent, key)


def _plan_sets(parent: Any, restored: Any, plan: _Plan, prefix: tuple) -> None:
    storage = parent._tensordict
    for key, value in restored._tensordict.items():
        existing = storage.get(key, _MISSING)
        if existing is not _MISSING and (id(parent), key) in plan.deleted:
            existing = _MISSING
        if isinstance(value, TensorCollection) and isinstance(existing, TensorCollection):
            _plan_sets(_unwrap(existing), _unwrap(value), plan, prefix + (key,))
        else:
            plan.set(parent, key, value, prefix + (key,))


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.data_ptr() == b.data_ptr() and a.dtype == b.dtype and a.shape == b.shape
            and a.stride() == b.stride() and a.device == b.device)


def _plan_copies(parent: Any, restored: Any, plan: _Plan, prefix: tuple) -> None:
    storage = parent._tensordict
    for key, value in restored._tensordict.items():
        existing = storage.get(key, _MISSING)
        if isinstance(value, TensorCollection):
            if isinstance(existing, TensorCollection):
                _plan_copies(_unwrap(existing), _unwrap(value), plan, prefix + (key,))
            else:
                plan.set(parent, key, value, prefix + (key,))
            continue
        if isinstance(existing, _Tensor):
            if value is existing or _same_memory(value, existing):
                continue  # a view of the parent's leaf: in-place edits are already there
            if value.shape == existing.shape:
                plan.copies.append((existing, value))
                continue
        plan.set(parent, key, value, prefix + (key,))


def _write_back(child: Any, raised: bool, record: tuple, snapshot: tuple) -> None:
    if raised:
        return
    _, inverse, shares_leaves, parent_ref, args, kwargs = record
    parent = parent_ref()
    if parent is None:
        return  # nothing left to write into
    changes = _Changes()
    _diff(child, snapshot, changes, not shares_leaves, [], [])
    if changes.kept is None and changes.changed is None and changes.removed is None:
        return
    plan = _Plan()
    if changes.removed is not None:
        _plan_removals(parent, inverse(changes.removed, parent, *args, **kwargs), plan)
    if changes.changed is not None:
        _plan_sets(parent, inverse(changes.changed, parent, *args, **kwargs), plan, ())
    if changes.kept is not None:
        _plan_copies(parent, inverse(changes.kept, parent, *args, **kwargs), plan, ())
    plan.apply()


# --------------------------------------------------------------------------- the inverses
# Each maps a TensorDict laid out like an op's result back to the layout of the
# op's input (``parent``), given the op's own arguments.


def _is_not_collection(cls: type) -> bool:
    return not issubclass(cls, TensorCollection)


def _place(result: Any, parent: Any, path: tuple, value: Any) -> None:
    """Put ``value`` at ``path`` in ``result``, whose sub-TensorDicts mirror the parent's."""
    td = result
    source: Any = parent
    for position, key in enumerate(path[:-1]):
        held = source._tensordict.get(key, _MISSING) if source is not None else _MISSING
        if held is not _MISSING and not isinstance(held, TensorCollection):
            raise MessageKeyError(
                f"The entry {key} is already present in tensordict and is a {type(held).__name__}, "
                f"so the nested key {path} cannot be set through it."
            )
        source = _unwrap(held) if held is not _MISSING else None
        inner = td._tensordict.get(key)
        if inner is None:
            inner = td._tensordict[key] = _empty(source if source is not None else td)
        td = inner
    td._tensordict[path[-1]] = value


def _split_path(storage: dict, flat_key: str, separator: str, is_leaf: Callable[[type], bool],
                existing_only: bool) -> Optional[tuple]:
    """The parent's path that ``flatten_keys`` names ``flat_key``.

    The key is split only where the parent really has a sub-TensorDict, so parent keys that
    contain the separator are found. With ``existing_only`` the path must end on an existing
    leaf (else None); otherwise, once no sub-TensorDict matches, the rest is split on every
    separator (a new key, as ``td[tuple(flat_key.split(separator))] = value`` would make it).
    """
    value = storage.get(flat_key, _MISSING)
    if value is not _MISSING and is_leaf(type(value)):
        return (flat_key,)
    start = flat_key.find(separator) if separator else -1
    while start >= 0:
        head = flat_key[:start]
        inner = storage.get(head)
        if isinstance(inner, TensorCollection) and not is_leaf(type(inner)):
            rest = _split_path(_unwrap(inner)._tensordict, flat_key[start + len(separator):], separator, is_leaf,
                               existing_only)
            if rest is not None:
                return (head,) + rest
        start = flat_key.find(separator, start + 1)
    if existing_only:
        return None
    return tuple(flat_key.split(separator)) if separator else (flat_key,)


def undo_flatten_keys(td: Any, parent: Any, separator: str = ".", inplace: bool = False,
                      is_leaf: Optional[Callable[[type], bool]] = None) -> Any:
    """Nest the flat keys again, following the parent's own keys (which may contain ``separator``)."""
    is_leaf = is_leaf or _is_not_collection
    storage = parent._tensordict
    result = _empty(parent)
    for flat_key, value in td._tensordict.items():
        path = _split_path(storage, flat_key, separator, is_leaf, True)
        if path is None:
            path = _split_path(storage, flat_key, separator, is_leaf, False)
            assert path is not None  # existing_only=False always finds a path
        _place(result, parent, path, value)
    return result


def _joined_path(storage: dict, parts: tuple, separator: str, existing_only: bool) -> Optional[tuple]:
    """The parent's path that ``unflatten_keys`` splits into ``parts``.

    Runs of ``parts`` are joined with the separator into the parent's keys, descending only
    into sub-TensorDicts the parent really has. With ``existing_only`` the path must end on an
    existing leaf (else None); otherwise the parts left once no sub-TensorDict matches are
    joined into one new key.
    """
    last = len(parts)
    for cut in range(1, last + 1):
        key = separator.join(parts[:cut]) if cut > 1 else parts[0]
        value = storage.get(key, _MISSING)
        if value is _MISSING:
            continue
        if cut == last:
            if not isinstance(value, TensorCollection):
                return (key,)
        elif isinstance(value, TensorCollection):
            rest = _joined_path(_unwrap(value)._tensordict, parts[cut:], separator, existing_only)
            if rest is not None:
                return (key,) + rest
    if existing_only:
        return None
    return (separator.join(parts),)


def undo_unflatten_keys(td: Any, parent: Any, separator: str = ".", inplace: bool = False) -> Any:
    """Join nested keys with ``separator`` again, keeping the sub-TensorDicts the parent really has."""
    storage = parent._tensordict
    result = _empty(parent)

    def walk(node: Any, child_prefix: tuple) -> None:
        for key, value in node._tensordict.items():
            child_path = child_prefix + (key,)
            if isinstance(value, TensorCollection):
                walk(_unwrap(value), child_path)
                continue
            path = _joined_path(storage, child_path, separator, True)
            if path is None:
                path = _joined_path(storage, child_path, separator, False)
                assert path is not None  # existing_only=False always finds a path
            _place(result, parent, path, value)

    walk(td, ())
    return result


def _like_parent(td: Any, parent: Any, leaf_fn: Callable[[torch.Tensor, Any], torch.Tensor]) -> Any:
    """``leaf_fn(leaf, parent_leaf_or_None)`` on every tensor leaf, walking ``parent`` alongside."""
    from ._apply import rewrap

    held = parent._tensordict if parent is not None else {}
    storage = {}
    for key, value in td._tensordict.items():
        counterpart = held.get(key)
        if isinstance(value, _Tensor):
            storage[key] = leaf_fn(value, counterpart if isinstance(counterpart, _Tensor) else None)
        elif isinstance(value, TensorCollection):
            inner_parent = _unwrap(counterpart) if isinstance(counterpart, TensorCollection) else None
            storage[key] = rewrap(value, _like_parent(_unwrap(value), inner_parent, leaf_fn))
        else:
            storage[key] = value
    result = _empty(td)
    result._tensordict = storage
    result._device = parent._device if parent is not None else td._device
    return result


def _home_device(parent: Any) -> Any:
    """Where the parent's data lives: its device, else the device of its first tensor leaf."""
    if parent._device is not None:
        return parent._device
    for value in parent._tensordict.values():
        if isinstance(value, _Tensor):
            return value.device
        if isinstance(value, TensorCollection):
            found = _home_device(_unwrap(value))
            if found is not None:
                return found
    return None


def undo_to(td: Any, parent: Any, *args: Any, **kwargs: Any) -> Any:
    """Each leaf back to the dtype and device of the parent's leaf; new leaves to the parent's device."""
    home = _home_device(parent)

    def back(leaf: torch.Tensor, original: Optional[torch.Tensor]) -> torch.Tensor:
        if original is not None:
            return leaf.to(device=original.device, dtype=original.dtype)
        return leaf if home is None else leaf.to(home)

    return _like_parent(td, parent, back)


def undo_view(td: Any, parent: Any, *shape: Any, **kwargs: Any) -> Any:
    """``view(dtype)`` is undone leaf by leaf; a view to a new batch shape by a reshape back."""
    if len(shape) == 1 and isinstance(shape[0], torch.dtype):
        return _like_parent(td, parent, lambda leaf, original: leaf if original is None else leaf.view(original.dtype))
    return undo_reshape(td, parent)


def undo_reshape(td: Any, parent: Any, *args: Any, **kwargs: Any) -> Any:
    """For ops that only regroup the batch dims (flatten, unflatten, squeeze, unsqueeze, view)."""
    return td.reshape(parent._batch_size)


def undo_permute(td: Any, parent: Any, *dims: Any) -> Any:
    from ._shape import parse_shape

    n_batch = len(parent._batch_size)
    order = [dim % n_batch for dim in parse_shape(dims)]
    inverse = [0] * n_batch
    for position, dim in enumerate(order):
        inverse[dim] = position
    return td.permute(*inverse)


def undo_transpose(td: Any, parent: Any, dim0: int, dim1: int) -> Any:
    return td.transpose(dim0, dim1)


def undo_movedim(td: Any, parent: Any, source: Any, destination: Any) -> Any:
    return td.movedim(destination, source)


def undo_flip(td: Any, parent: Any, *dims: Any) -> Any:
    return td.flip(*dims)


def undo_roll(td: Any, parent: Any, shifts: Any, dims: Any = None) -> Any:
    back = -shifts if isinstance(shifts, int) else tuple(-shift for shift in shifts)
    return td.roll(back, dims)
