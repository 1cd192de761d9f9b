"""The registry of collection classes a saved folder may name: loading never imports modules.

A folder saved from a tensor collection other than TensorDict (a ``@tensorclass``) records
its class as ``"module:QualName"``. Loading looks that name up here and nowhere else, so a
tampered ``meta.json`` cannot make torchdict import or call arbitrary code.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing import Protocol

    from .tensordict import TensorDict

    class SavedClass(Protocol):
        """A registered class (the class object itself): it makes its instances from a TensorDict."""

        def from_tensordict(self, tensordict: TensorDict, /) -> Any: ...

__all__ = ["find_saved_class", "names_a_tensordict", "register_saved_class", "saved_class_name"]

# "module:QualName" -> class; filled by register_saved_class only.
_SAVED_CLASSES: dict = {}


def saved_class_name(cls: type) -> str:
    """How ``meta.json`` names ``cls``: ``"module:QualName"``.

    >>> saved_class_name(dict)
    'builtins:dict'
    """
    return f"{cls.__module__}:{cls.__qualname__}"


def register_saved_class(cls: type) -> type:
    """Make a tensor collection class (e.g. a ``@tensorclass``) loadable by name.

    Loading never imports modules: a folder saved from class ``mod:Name`` loads only once
    that class has been registered (the tensorclass decorator does it; saving an instance
    does it too). The class must provide ``from_tensordict(td)``. Returns ``cls``.

    >>> class Pair:
    ...     @classmethod
    ...     def from_tensordict(cls, td):
    ...         return cls()
    >>> register_saved_class(Pair) is Pair
    True
    """
    _SAVED_CLASSES[saved_class_name(cls)] = cls
    return cls


def names_a_tensordict(class_name: Any) -> bool:
    """True when a folder's recorded class is (a subclass of) torchdict's own TensorDict.

    >>> names_a_tensordict("torchdict:TensorDict"), names_a_tensordict("mod:Pair")
    (True, False)
    """
    return type(class_name) is str and class_name.startswith("torchdict:") and class_name.endswith("TensorDict")


def find_saved_class(class_name: str, shown_name: str, folder: str) -> SavedClass:
    """The registered class named ``class_name``; ``shown_name`` is how the error names it."""
    cls = _SAVED_CLASSES.get(class_name)
    if cls is None:
        raise RuntimeError(
            f"Could not find the class {shown_name} saved in {folder}. Loading never imports modules: "
            "import the module that defines it (a @tensorclass registers itself; other classes need "
            "torchdict.saving.register_saved_class) and load again."
        )
    return cls
