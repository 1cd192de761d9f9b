"""``lazy_stack`` of a list of tensors (upstream accepts one): a dense ``torch.stack``, or, for tensors of
different shapes, a list, a padded tensor or a nested tensor, as the caller asks."""
from __future__ import annotations

from typing import Any, List, Optional

import torch
from torch.nn.utils.rnn import pad_sequence

_Tensor = torch.Tensor


def stack_tensor_list(tensors: List[_Tensor], dim: int, out: Optional[_Tensor], *, as_list: bool,
                      as_padded_tensor: bool, as_nested_tensor: bool, padding_side: str,
                      layout: Optional[torch.layout], padding_value: Any) -> Any:
    """``tensors`` stacked along ``dim`` (``out`` receives them), or in the one form asked for."""
    if as_list + as_padded_tensor + as_nested_tensor > 1:
        raise TypeError("as_list, as_padded_tensor and as_nested_tensor are exclusive.")
    if as_padded_tensor:
        return padded_stack(tensors, padding_value, padding_side)
    if as_nested_tensor:
        return nested_stack(tensors, layout)
    if as_list:
        return tensors
    try:
        return torch.stack(tensors, dim) if out is None else torch.stack(tensors, dim, out=out)
    except RuntimeError as error:
        raise RuntimeError(f"lazy_stack could not stack tensors of shapes {[tuple(t.shape) for t in tensors]}: "
                           f"{error} To stack tensors of different shapes, pass as_padded_tensor=True, "
                           "as_nested_tensor=True or as_list=True.") from error


def padded_stack(tensors: List[_Tensor], padding_value: Any, padding_side: str) -> _Tensor:
    """The tensors along a new dim 0, each padded with ``padding_value`` (on ``padding_side``) to the
    largest size.

    As upstream, torch's ``pad_sequence`` (which pads dim 0 and copies each tensor into the first
    one's trailing shape, broadcasting size-1 dims) is tried first, so inputs it accepts give its
    result; otherwise every trailing dim is padded to its largest size first.
    """
    try:
        return pad_sequence(tensors, batch_first=True, padding_value=padding_value, padding_side=padding_side)
    except RuntimeError:
        n_dims = tensors[0].dim()
        if n_dims < 2 or any(tensor.dim() != n_dims for tensor in tensors):
            raise
    widest = [max(sizes) for sizes in zip(*(tensor.shape[1:] for tensor in tensors))]
    padded = []
    for tensor in tensors:
        amounts: List[int] = []
        for size, target in zip(reversed(tensor.shape[1:]), reversed(widest)):  # F.pad: the last dim first
            amounts += [0, target - size] if padding_side == "right" else [target - size, 0]
        padded.append(torch.nn.functional.pad(tensor, amounts, value=padding_value))
    return pad_sequence(padded, batch_first=True, padding_value=padding_value, padding_side=padding_side)


def nested_stack(tensors: List[_Tensor], layout: Optional[torch.layout]) -> _Tensor:
    """A ``torch.nested`` tensor of the tensors (``layout``: jagged by default). Nested tensors can't be
    nested again (``ValueError``)."""
    try:
        return torch.nested.as_nested_tensor(tensors, layout=layout or torch.jagged)
    except (RuntimeError, NotImplementedError) as error:
        if not any(tensor.is_nested for tensor in tensors):
            raise
        raise ValueError("A nested tensor has one nested level: the tensors to stack are nested tensors "
                         "themselves (flatten the lazy stack of lazy stacks with view(-1) first, or use "
                         "as_padded_tensor=True).") from error
