"""``backward``: the gradients of every leaf of a TensorDict that requires them, in one autograd call.

and the leaves' gradients: the ``grad`` property (read and assigned) and ``zero_grad``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Sequence

import torch

from ._apply import is_sub_collection as _is_sub_collection, tensor_leaves, unwrap
from ._base import TensorCollection
from ._locking import keep_lock
from .nontensor import NonTensorData, NonTensorStack

if TYPE_CHECKING:
    from ._host import TensorDictHost
else:
    TensorDictHost = object

_Tensor = torch.Tensor
_NON_TENSOR = (NonTensorData, NonTensorStack)


def _grads_storage(td: Any) -> dict:
    """``td``'s storage with each tensor replaced by its ``.grad``; tensors without one (and
    sub-TensorDicts left empty) are left out, non-tensor entries are kept as they are."""
    storage = {}
    for key, value in td._tensordict.items():
        if isinstance(value, _Tensor):
            if value.grad is not None:
                storage[key] = value.grad
        elif _is_sub_collection(value):
            inner = unwrap(value)
            nested = _grads_storage(inner)
            if nested:
                storage[key] = inner._new_unsafe(nested, inner._batch_size, inner._device, inner._names)
        else:
            storage[key] = value
    return storage


def _inputs(inputs: Any) -> Optional[Sequence[torch.Tensor]]:
    if inputs is None:
        return None
    if isinstance(inputs, TensorCollection):
        return [leaf for leaf in inputs.values(include_nested=True, leaves_only=True)
                if isinstance(leaf, torch.Tensor)]
    return list(inputs)


class AutogradMixin(TensorDictHost):
    __slots__ = ()

    def backward(self, gradient: Any = None, retain_graph: Optional[bool] = None, create_graph: bool = False,
                 inputs: Any = None) -> None:
        """``torch.autograd.backward`` of every leaf that requires gradients (nested ones too), at once.

        ``gradient``: a TensorDict with a gradient for each such leaf, at its key (needed unless every such
        leaf has one element); ``inputs``: a TensorDict or a sequence of tensors whose ``.grad`` receives the
        gradients. Raises ``RuntimeError`` when no leaf requires gradients.

        >>> from torchdict import TensorDict
        >>> x = torch.ones(3, requires_grad=True)
        >>> TensorDict(actor=x.sum(), critic=x.pow(2).sum()).backward()
        >>> x.grad
        tensor([3., 3., 3.])
        """
        keyed = [(key, leaf) for key, leaf in self.items(include_nested=True, leaves_only=True)
                 if isinstance(leaf, torch.Tensor) and leaf.requires_grad]
        if not keyed:
            raise RuntimeError("backward() cannot be called on a tensordict that has no leaf tensor requiring "
                               "gradients.")
        tensors = [leaf for _, leaf in keyed]
        if gradient is None:
            for key, leaf in keyed:
                if leaf.numel() != 1:
                    raise RuntimeError(
                        f"grad can be implicitly created only for scalar outputs: the leaf at key {key!r} has shape "
                        f"{tuple(leaf.shape)}. Pass a gradient tensordict matching the structure of this tensordict "
                        "to backward().")
            grad_tensors: Optional[list] = None
        else:
            grad_tensors = [gradient[key] for key, _ in keyed]  # KeyError for a missing gradient
        torch.autograd.backward(tensors, grad_tensors=grad_tensors, retain_graph=retain_graph,
                                create_graph=create_graph, inputs=_inputs(inputs))

    @property
    def grad(self) -> Any:
        """A TensorDict of the leaves' ``.grad`` (leaves without one left out), or None when it would be empty.

        Locked when ``self`` is; assigning ``td.grad = other`` sets (or copies into) each leaf's
        ``.grad`` from the leaf of ``other`` at the same key.

        >>> td = TensorDict(x=torch.ones(2, requires_grad=True), y=torch.ones(2, requires_grad=True))
        >>> (td["x"] * 2).sum().backward()
        >>> td.grad["x"], "y" in td.grad.keys()
        (tensor([2., 2.]), False)
        """
        storage = _grads_storage(self)
        if not storage:  # (non-tensor entries alone still give a TensorDict, as upstream)
            return None
        return keep_lock(self, self._new_unsafe(storage, self._batch_size, self._device, self._names))

    @grad.setter
    def grad(self, grads: Any) -> None:
        for key, leaf in self.items(include_nested=True, leaves_only=True):
            new = grads.get(key)
            if leaf.grad is None:
                leaf.grad = new
            else:
                leaf.grad.copy_(new)

    def zero_grad(self, set_to_none: bool = True) -> Any:
        """Reset the ``.grad`` of every leaf: to None, or zeroed in place with ``set_to_none=False``."""
        for leaf in tensor_leaves(self):
            if leaf.grad is None:
                continue
            if set_to_none:
                leaf.grad = None
            else:
                leaf.grad.zero_()
        return self
