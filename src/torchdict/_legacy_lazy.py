"""The legacy lazy mode (``set_lazy_legacy(True)``, deprecated upstream): lazy shape views.

In that mode ``td.unsqueeze(d)``, ``td.permute(...)``, ``td.transpose(a, b)`` and ``td.view(...)`` return a
view over ``td`` instead of a TensorDict: reading an entry applies the op to the source's entry, writing one
applies the inverse op and writes into the source, and the inverse op on the view gives the source back
(``td.unsqueeze(0).squeeze(0) is td``). Each view is a ``TensorDictBase`` over the six primitives, so the rest
of the API works on it generically; ``to_tensordict()`` makes it dense. ``torch.stack`` makes a lazy stack.

The class names are upstream's (``_UnsqueezedTensorDict``, ``_PermutedTensorDict``, ``_TransposedTensorDict``,
``_ViewedTensorDict``), so code that tests them keeps working.
"""
from __future__ import annotations

from typing import Any, Iterator, Optional

import torch

from .base import TensorDictBase


_MISSING: Any = object()


def _generic(view: Any, name: str) -> Any:
    """``TensorDictBase``'s generic ``name`` bound to ``view`` (computed on its dense form)."""
    return TensorDictBase.__dict__[name].__get__(view, type(view))


def _dense_op(td: Any, name: str, args: tuple) -> Any:
    """The TensorDict op itself (not the lazy view the public method makes in this mode)."""
    from . import _shape

    if name == "unsqueeze":
        return _shape.unsqueeze(td, args[0])
    if name == "squeeze":
        return _shape.squeeze(td, args[0])
    if name == "permute":
        return _shape.permute(td, args)
    if name == "transpose":
        return _shape.transpose(td, *args)
    return _shape.view(td, args, None, None)


def _normalize_dim(dim: int, ndim: int) -> int:
    return dim + ndim if dim < 0 else dim


class _CustomOpTensorDict(TensorDictBase):
    """A lazy view: ``source``'s entries seen through one shape op on the batch dims."""

    # _cm: what the shape op's ``write_back`` decorator records on any result (unused: writes go through).
    __slots__ = ("_source", "_args", "_batch_size", "_cm", "__weakref__")

    def __init__(self, source: Any, args: tuple, batch_size: torch.Size) -> None:
        self._source = source
        self._args = args
        self._batch_size = batch_size
        self._cm = None

    # ------------------------------------------------------------------ what each op does, both ways
    def _forward(self, dense: Any) -> Any:
        raise NotImplementedError

    def _backward(self, dense: Any) -> Any:
        raise NotImplementedError

    # ------------------------------------------------------------------ primitives
    @property
    def batch_size(self) -> torch.Size:
        return self._batch_size

    @property
    def device(self) -> Optional[torch.device]:
        return self._source.device

    @property
    def is_locked(self) -> bool:
        return self._source.is_locked

    def _keys_str(self) -> Iterator[str]:
        return iter(list(self._source._keys_str()))

    def _get_str(self, key: str, default: Any) -> Any:
        value = self._source._get_str(key, _MISSING)
        if value is _MISSING:
            return default
        if isinstance(value, TensorDictBase):
            return type(self)(value, self._args, self._batch_size + value.batch_size[self._source.batch_dims:])
        if getattr(type(value), "_is_non_tensor", False):
            # A non-tensor leaf goes through its own op, as upstream's view reads it (a lone NonTensorData
            # unsqueezed is a stack).
            return self._leaf_op(value)
        return self._through(self._forward, key, value, self._source.batch_size)

    def _leaf_op(self, leaf: Any) -> Any:
        from . import _options

        previous, _options.LAZY_LEGACY = _options.LAZY_LEGACY, False  # the leaf's own (dense) op
        try:
            if self._op_name == "view":
                return leaf.view(self._batch_size)
            return getattr(leaf, self._op_name)(*self._args)
        finally:
            _options.LAZY_LEGACY = previous

    def _set_str(self, key: str, value: Any, inplace: bool) -> None:
        if isinstance(value, _CustomOpTensorDict) and type(value) is type(self) and value._args == self._args:
            self._source._set_str(key, value._source, inplace)
            return
        self._source._set_str(key, self._through(self._backward, key, value, self._batch_size), inplace)

    def _del_str(self, key: str) -> None:
        self._source._del_str(key)

    @staticmethod
    def _through(op: Any, key: str, value: Any, batch_size: torch.Size) -> Any:
        """One entry through ``op``, computed on a one-entry TensorDict (the dense op's own rules)."""
        from .tensordict import TensorDict

        return op(TensorDict._new_unsafe({key: value}, batch_size))._tensordict[key]

    def to_tensordict(self, *, retain_none: Optional[bool] = None) -> Any:
        return self._dense().clone()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(\n\tsource={self._source!r}, \n\top={self._op_text()})"

    def _op_text(self) -> str:
        return f"{self._op_name}({', '.join(map(str, self._args))})"

    _op_name = ""


class _UnsqueezedTensorDict(_CustomOpTensorDict):
    __slots__ = ()
    _op_name = "unsqueeze"

    def _forward(self, dense: Any) -> Any:
        return _dense_op(dense, "unsqueeze", self._args)

    def _backward(self, dense: Any) -> Any:
        return _dense_op(dense, "squeeze", self._args)

    def squeeze(self, dim: Optional[int] = None) -> Any:
        if dim is not None and _normalize_dim(dim, self.batch_dims) == self._args[0]:
            return self._source
        return _generic(self, "squeeze")(dim)


class _PermutedTensorDict(_CustomOpTensorDict):
    __slots__ = ()
    _op_name = "permute"

    def _forward(self, dense: Any) -> Any:
        return _dense_op(dense, "permute", self._args)

    def _backward(self, dense: Any) -> Any:
        inverse = [0] * len(self._args)
        for position, dim in enumerate(self._args):
            inverse[dim] = position
        return _dense_op(dense, "permute", tuple(inverse))

    def permute(self, *dims: Any) -> Any:
        if len(dims) == 1 and isinstance(dims[0], (list, tuple, torch.Size)):
            dims = tuple(dims[0])
        ndim = self.batch_dims
        composed = tuple(self._args[_normalize_dim(dim, ndim)] for dim in dims) if len(dims) == ndim else None
        if composed == tuple(range(ndim)):
            return self._source
        return _generic(self, "permute")(*dims)


class _TransposedTensorDict(_CustomOpTensorDict):
    __slots__ = ()
    _op_name = "transpose"

    def _forward(self, dense: Any) -> Any:
        return _dense_op(dense, "transpose", self._args)

    _backward = _forward

    def transpose(self, dim0: int, dim1: int) -> Any:
        ndim = self.batch_dims
        if {_normalize_dim(dim0, ndim), _normalize_dim(dim1, ndim)} == set(self._args):
            return self._source
        return _generic(self, "transpose")(dim0, dim1)


class _ViewedTensorDict(_CustomOpTensorDict):
    __slots__ = ()
    _op_name = "view"

    def _forward(self, dense: Any) -> Any:
        return _dense_op(dense, "view", (self._batch_size,))

    def _backward(self, dense: Any) -> Any:
        return _dense_op(dense, "view", (self._source.batch_size,))

    def _op_text(self) -> str:
        return f"view(size={list(self._batch_size)})"

    def view(self, *shape: Any, **kwargs: Any) -> Any:
        if len(shape) == 1 and isinstance(shape[0], (list, tuple, torch.Size)):
            shape = tuple(shape[0])
        if shape and not kwargs and all(isinstance(size, int) for size in shape):
            from ._shape import infer_shape

            try:
                if infer_shape(tuple(shape), self._batch_size.numel()) == self._source.batch_size:
                    return self._source
            except (RuntimeError, ValueError):
                pass
        return _generic(self, "view")(*shape, **kwargs)


def lazy_view(td: Any, name: str, *args: Any) -> Any:
    """The legacy lazy view of ``td.<name>(*args)``, or ``td`` itself when the op changes nothing.

    The dense op run on an empty TensorDict of ``td``'s batch size checks the arguments (with its errors)
    and gives the view's batch size.
    """
    from .tensordict import TensorDict

    probe = TensorDict._new_unsafe({}, td.batch_size)
    result_batch = _dense_op(probe, name, args).batch_size
    ndim = len(result_batch)
    if name == "unsqueeze":
        return _UnsqueezedTensorDict(td, (_normalize_dim(args[0], ndim),), result_batch)
    if result_batch == td.batch_size and name == "view":
        return td
    if name == "permute":
        dims = tuple(args[0]) if len(args) == 1 and isinstance(args[0], (list, tuple, torch.Size)) else args
        dims = tuple(_normalize_dim(dim, ndim) for dim in dims)
        return td if dims == tuple(range(ndim)) else _PermutedTensorDict(td, dims, result_batch)
    if name == "transpose":
        dims = tuple(_normalize_dim(dim, ndim) for dim in args)
        return td if dims[0] == dims[1] else _TransposedTensorDict(td, dims, result_batch)
    return _ViewedTensorDict(td, (), result_batch)
