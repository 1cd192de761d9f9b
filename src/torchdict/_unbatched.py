"""``UnbatchedTensor``: a tensor entry with no batch dims, which the batch ops of a TensorDict leave alone.

A plain tensor entry's shape starts with its TensorDict's batch size; an
``UnbatchedTensor`` can have any shape (a lookup table, a mask shared by every
element). The batch recursions of torchdict (indexing, shape ops, stack / cat,
split / unbind, reductions over batch dims) hand it on unchanged, as an alias
of the same payload whose ``batch_size`` says the batch of the TensorDict that
holds it; the ops that act on values (arithmetic, ``clone``, ``to``, ``apply``)
treat it as any tensor and give an ``UnbatchedTensor`` back.

Its ``batch_size`` is metadata only: a TensorDict stamps its own on the alias it
stores (:func:`with_batch_size`), and every torch op on an ``UnbatchedTensor``
gives results that carry the ``batch_size`` of the first ``UnbatchedTensor``
argument. The recursions test for it (``isinstance``) only on a branch they
already take for a tensor that is not a plain ``torch.Tensor``, so a TensorDict
of plain tensors pays nothing for it; the C write checks of ``_speedups`` are
told the class (``_accel.set_unbatched_class``) and read it as "does not fit",
which sends it to the Python write path that stamps it.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch

__all__ = ["UnbatchedTensor", "with_batch_size", "stack_unbatched", "detach_unbatched_",
           "unbatched_memmap_error"]

_Tensor = torch.Tensor
_Size = torch.Size
_NO_TORCH_FUNCTION = torch._C.DisableTorchFunctionSubclass
_as_subclass = torch.Tensor.as_subclass
_EMPTY = torch.Size(())

# Results of these are handed back as torch gives them: ``_base`` must not be re-wrapped (each wrap is a
# new view, so ``_base`` of a view would never end), the others answer with plain Python values.
_RAW_RESULTS = frozenset({getattr(torch.Tensor, "_base").__get__, torch.Tensor.data_ptr})  # (a getset's reader)


def _first_batch_size(values: Any) -> Optional[torch.Size]:
    """The ``batch_size`` of the first ``UnbatchedTensor`` among ``values`` (nested lists, tuples, dicts)."""
    for value in values:
        if isinstance(value, UnbatchedTensor):
            found = getattr(value, "_batch_size", None)
            if found is not None:
                return found
        elif isinstance(value, (list, tuple)):
            found = _first_batch_size(value)
            if found is not None:
                return found
        elif isinstance(value, dict):
            found = _first_batch_size(value.values())
            if found is not None:
                return found
    return None


def _wrap(tensor: torch.Tensor, batch_size: Optional[torch.Size]) -> "UnbatchedTensor":
    with _NO_TORCH_FUNCTION():
        out = _as_subclass(tensor, UnbatchedTensor)
    if batch_size is not None:
        out._batch_size = batch_size
    return out


def _wrap_sequence(result: Any, args: tuple, batch_size: Optional[torch.Size]) -> Any:
    """A list / tuple of results. When an argument is a sequence of as many tensors (the ``torch._foreach_*``
    ops), result ``i`` is wrapped only where input ``i`` was unbatched: torchdict runs those ops on every
    leaf of a TensorDict at once, and the plain leaves must stay plain. Otherwise (``unbind``, ``split``
    of one unbatched tensor) every tensor of the result is wrapped."""
    for arg in args:
        if isinstance(arg, (list, tuple)) and len(arg) == len(result) and arg and isinstance(arg[0], _Tensor):
            return type(result)(
                _wrap(item, getattr(source, "_batch_size", None)) if isinstance(source, UnbatchedTensor)
                and isinstance(item, _Tensor) else item
                for item, source in zip(result, arg)
            )
    return type(result)(_wrap(item, batch_size) if isinstance(item, _Tensor) else item for item in result)


class UnbatchedTensor(torch.Tensor):
    """A tensor entry of a TensorDict that has no batch dims: the batch ops leave it unchanged.

    ``UnbatchedTensor(data, batch_size=None)``: ``data`` is a tensor (or anything ``torch.as_tensor``
    takes); the result shares its storage, detached from ``data``'s autograd graph (as upstream's).
    ``batch_size`` is the batch of the TensorDict that holds it (set by the TensorDict when it stores the
    entry; it doesn't change the payload's shape); ``[]`` by default.

    In a TensorDict, indexing, ``reshape`` / ``view`` / ``permute`` / ``unsqueeze`` / ``squeeze`` /
    ``flatten`` / ``expand`` ..., ``torch.stack`` / ``torch.cat``, ``unbind`` / ``split`` / ``chunk`` and
    the reductions over batch dims give the entry back with the same data and shape (with the result's
    ``batch_size``); ``apply``, arithmetic, ``clone`` and ``to`` act on it as on any tensor and return an
    ``UnbatchedTensor``. ``td["key"]`` returns it (a ``torch.Tensor``).

    >>> import torch
    >>> from torchdict import TensorDict
    >>> td = TensorDict(table=UnbatchedTensor(torch.zeros(3, 4)), obs=torch.zeros(2, 5), batch_size=[2])
    >>> td[0]["table"].shape, td.unsqueeze(0)["table"].batch_size
    (torch.Size([3, 4]), torch.Size([1, 2]))
    """

    _pass_through = True  # upstream's marker of a leaf the batch ops hand on unchanged

    @staticmethod
    def __new__(cls, data: Any, batch_size: Any = None) -> "UnbatchedTensor":
        if isinstance(data, cls):
            return data if batch_size is None else with_batch_size(data, _Size(batch_size))
        if not isinstance(data, _Tensor):
            data = torch.as_tensor(data)
        # A detached alias, as upstream's (the results of ops on it keep their graph: see _wrap).
        out = torch.Tensor._make_subclass(cls, data)
        if batch_size is not None:
            out._batch_size = _Size(batch_size)
        return out

    def __init__(self, data: Any, batch_size: Any = None) -> None:
        pass  # everything is done by __new__ (torch.Tensor.__init__ takes no arguments)

    @property
    def batch_size(self) -> torch.Size:
        """The batch size of the TensorDict holding this entry (``[]`` outside one)."""
        batch_size = getattr(self, "_batch_size", None)  # (Dynamo can trace getattr, not a read of the dict)
        return _EMPTY if batch_size is None else batch_size

    @batch_size.setter
    def batch_size(self, batch_size: Any) -> None:
        self._batch_size = _Size(batch_size)

    @classmethod
    def __torch_function__(cls, func: Callable, types: tuple, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        kwargs = kwargs or {}
        with _NO_TORCH_FUNCTION():
            result = func(*args, **kwargs)
        if func in _RAW_RESULTS:
            return result
        if isinstance(result, _Tensor):
            batch_size = _first_batch_size(args)
            if batch_size is None and kwargs:
                batch_size = _first_batch_size(kwargs.values())
            return _wrap(result, batch_size)
        if isinstance(result, (list, tuple)) and any(isinstance(item, _Tensor) for item in result):
            batch_size = _first_batch_size(args)
            return _wrap_sequence(result, args, batch_size)
        return result

    def _with_batch_size(self, batch_size: torch.Size) -> "UnbatchedTensor":
        """An alias with another ``batch_size`` (the protocol the batch recursions share with the
        non-tensor leaves)."""
        return with_batch_size(self, batch_size)

    def _payload(self) -> torch.Tensor:
        """The data as a plain ``torch.Tensor`` (same storage)."""
        with _NO_TORCH_FUNCTION():
            return _as_subclass(self, _Tensor)

    # torch.Tensor's takes ``tensor_contents=``, which mypy reads as a nameless keyword no signature matches.
    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        return f"UnbatchedTensor({self._payload()!r})"

    def __str__(self) -> str:
        return str(self._payload())

    def __format__(self, format_spec: str) -> str:
        return self._payload().__format__(format_spec)

    def __reduce_ex__(self, protocol: Any) -> tuple:
        return (UnbatchedTensor, (self._payload(), self.batch_size))

    def __deepcopy__(self, memo: dict) -> "UnbatchedTensor":
        out = _wrap(self._payload().__deepcopy__(memo), getattr(self, "_batch_size", None))
        memo[id(self)] = out
        return out


def with_batch_size(tensor: torch.Tensor, batch_size: torch.Size) -> UnbatchedTensor:
    """An alias of ``tensor`` (same storage, same autograd graph) whose ``batch_size`` is ``batch_size``;
    ``tensor`` itself when it already has it."""
    if isinstance(tensor, UnbatchedTensor) and getattr(tensor, "_batch_size", None) == batch_size:
        return tensor
    return _wrap(tensor, batch_size)


def stack_unbatched(leaves: Sequence[Any], batch_size: torch.Size) -> UnbatchedTensor:
    """The entry of a stack or cat of TensorDicts whose entries at one key are unbatched: the first one,
    with the result's ``batch_size``; a warning (upstream's) when they don't all share its storage."""
    first = leaves[0]
    others = [leaf for leaf in leaves[1:] if leaf is not first]
    if others:
        pointer = first.data_ptr()
        if any(not isinstance(leaf, _Tensor) or leaf.data_ptr() != pointer for leaf in others):
            from ._indexing import warn_user  # (a cycle at import time: _indexing imports this module)

            warn_user(
                "Stacking UnbatchedTensors with different data storage. Only the first element's data will be "
                "kept. UnbatchedTensor is shape-invariant; if you need different data per batch element, "
                "consider using a regular tensor.",
                UserWarning,
            )
    return with_batch_size(first, batch_size)


def detach_unbatched_(td: Any) -> None:
    """Replace every UnbatchedTensor of ``td`` (nested levels too) by its ``detach()``: ``detach_()`` can't
    detach it in place, it is an alias (a view) of the payload (upstream replaces it the same way)."""
    from ._apply import is_sub_collection, unwrap  # (a cycle at import time: _apply imports this module)

    storage = td._tensordict
    for key, value in list(storage.items()):
        if isinstance(value, UnbatchedTensor):
            storage[key] = value.detach()
        elif is_sub_collection(value):
            detach_unbatched_(unwrap(value))


def unbatched_memmap_error(key: Any) -> NotImplementedError:
    """Upstream's refusal to save an ``UnbatchedTensor`` entry (memmap, save)."""
    return NotImplementedError(
        f"UnbatchedTensor entries cannot be memory-mapped yet, but {key!r} is one. Exclude it first, e.g. "
        f"with td.exclude({key!r})."
    )


def _register() -> None:
    from ._accel import set_unbatched_class

    set_unbatched_class(UnbatchedTensor)


_register()
