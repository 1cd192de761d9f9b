"""Modules typed by tensorclasses: ``TensorClassModuleBase[In, Out]`` (``forward(x: In) -> Out``) and
``TensorClassModuleWrapper``, which makes one a tensordict module (keys = the classes' fields, nested
tensorclass fields as nested keys) so it can sit in a ``TensorDictSequential``.
"""
from __future__ import annotations

import dataclasses
import typing
import warnings
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Generic, List, Optional, TypeVar, Union, cast, get_args, get_origin

from torch import Tensor, nn

from ..tensorclass import TensorClass
from ._dispatch import dispatch
from .common import TensorDictModuleBase

if TYPE_CHECKING:
    from types import FrameType

__all__ = ["TensorClassModuleBase", "TensorClassModuleWrapper"]


def _field_types(tensorclass_type: type) -> dict:
    # Annotations may be strings (``from __future__ import annotations``): resolve them when possible.
    try:
        return typing.get_type_hints(tensorclass_type)
    except Exception:
        return {}


def _tensor_class_keys(tensorclass_type: type) -> List[tuple]:
    """One key per leaf field, a tensorclass-typed field contributing its own fields under its name."""
    hints = _field_types(tensorclass_type)
    keys: List[tuple] = []
    for field in dataclasses.fields(tensorclass_type):
        field_type = hints.get(field.name, field.type)
        if isinstance(field_type, type) and issubclass(field_type, TensorClass):
            keys.extend((field.name,) + sub for sub in _tensor_class_keys(field_type))
        else:
            keys.append((field.name,))
    return keys


def _caller_stacklevel() -> int:
    """The stack level of the first frame outside torch and torchdict (where the user's call is)."""
    import sys

    frame: Optional[FrameType] = sys._getframe(1)
    level = 1
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if not (name.startswith("torchdict") or name.startswith("torch")):
            return level
        frame = frame.f_back
        level += 1
    return 1


InputClass = TypeVar("InputClass", bound=Union[TensorClass, Tensor])
OutputClass = TypeVar("OutputClass", bound=Union[TensorClass, Tensor])


class TensorClassModuleBase(Generic[InputClass, OutputClass], ABC, nn.Module):
    """Base of modules that take one tensorclass (or tensor) and return one.

    Subclass ``TensorClassModuleBase[InputTC, OutputTC]`` and write ``forward``; the subscript sets
    ``input_type`` / ``output_type``. ``as_td_module()`` wraps a module whose both types are tensorclasses
    as a tensordict module.

    >>> import torch
    >>> from torchdict import TensorClass, TensorDict
    >>> from torchdict.nn import TensorClassModuleBase
    >>> class Pair(TensorClass):
    ...     a: torch.Tensor
    ...     b: torch.Tensor
    >>> class Sum(TensorClass):
    ...     total: torch.Tensor
    >>> class Add(TensorClassModuleBase[Pair, Sum]):
    ...     def forward(self, x: Pair) -> Sum:
    ...         return Sum(total=x.a + x.b, batch_size=x.batch_size)
    >>> Add()(Pair(a=torch.ones(2), b=torch.ones(2), batch_size=[2])).total
    tensor([2., 2.])
    >>> Add().as_td_module()(TensorDict(a=torch.ones(2), b=torch.zeros(2), batch_size=[2]))["total"]
    tensor([1., 1.])
    """

    input_type: type
    output_type: type

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for base in cls.__dict__.get("__orig_bases__", ()):
            if get_origin(base) is TensorClassModuleBase:
                arguments = get_args(base)
                if not arguments:
                    raise ValueError("Generic input/output types not set in TensorClassModuleBase")
                cls.input_type, cls.output_type = arguments

    @abstractmethod
    def forward(self, x: InputClass) -> OutputClass:
        """The output for ``x`` (written by the subclass)."""

    def __call__(self, x: InputClass) -> OutputClass:
        return cast(OutputClass, super().__call__(x))

    def as_td_module(self) -> "TensorClassModuleWrapper":
        """This module as a tensordict module (both types must be tensorclasses)."""
        input_type = getattr(self, "input_type", None)
        output_type = getattr(self, "output_type", None)
        if not (isinstance(input_type, type) and isinstance(output_type, type)):
            raise ValueError(
                "Generic input/output types not set in TensorClassModuleBase. To convert "
                f"{type(self).__name__} to TensorDictModule, subclass TensorClassModuleBase[InputClass, "
                "OutputClass] directly, with a class for each type."
            )
        if not (issubclass(input_type, TensorClass) and issubclass(output_type, TensorClass)):
            raise ValueError("Only TensorClassModuleBase implementations with both input and output type as "
                             "TensorClass can be converted to TensorDictModule")
        return TensorClassModuleWrapper(self)


class TensorClassModuleWrapper(TensorDictModuleBase):
    """A ``TensorClassModuleBase`` seen as a tensordict module: reads the input class's fields from the
    tensordict and returns the output tensorclass as a new TensorDict."""

    def __init__(self, module: TensorClassModuleBase) -> None:
        super().__init__()
        # The module's mode, without ``train()`` (which would also reset every submodule's).
        self.training = module.training
        self.tc_module = module
        self.in_keys = _tensor_class_keys(module.input_type)
        self.out_keys = _tensor_class_keys(module.output_type)

    @dispatch(auto_batch_size=False)
    def forward(self, tensordict: Any, *args: Any, **kwargs: Any) -> Any:
        """The wrapped module's output on ``input_type.from_tensordict(tensordict)``, as a TensorDict
        (keys that are not fields of the input class are left out of the input)."""
        if args or kwargs:
            ignored = (["positional arguments"] if args else []) + [repr(name) for name in kwargs]
            warnings.warn(
                f"TensorClassModuleWrapper ignores {', '.join(ignored)}. Starting with TensorDict 0.17, the "
                "default will change to writing the outputs into tensordict_out and returning it, as "
                "TensorDictModule does, and to raising a TypeError for the other arguments.",
                FutureWarning, stacklevel=_caller_stacklevel())
        input_type = cast("type[TensorClass]", self.tc_module.input_type)  # as_td_module checked it
        fields = {field.name for field in dataclasses.fields(input_type)}
        extra = [key for key in tensordict.keys() if key not in fields]
        if extra:
            tensordict = tensordict.exclude(*extra)
        return self.tc_module(input_type.from_tensordict(tensordict)).to_tensordict()
