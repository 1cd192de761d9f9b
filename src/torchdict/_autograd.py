"""``backward``: the gradients of every leaf of a TensorDict that requires them, in one autograd call.

(``grad`` / ``zero_grad`` / ``requires_grad_`` live with the moves and extras; this module is the backward pass.)
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

from ._base import TensorCollection


class AutogradMixin:
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


def _inputs(inputs: Any) -> Optional[Sequence[torch.Tensor]]:
    if inputs is None:
        return None
    if isinstance(inputs, TensorCollection):
        return [leaf for leaf in inputs.values(include_nested=True, leaves_only=True)
                if isinstance(leaf, torch.Tensor)]
    return list(inputs)
