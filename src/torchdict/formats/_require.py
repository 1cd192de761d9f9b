"""Import an optional third-party library on demand, with an error that names the extra to install."""
from __future__ import annotations

import importlib
from types import ModuleType


def require(module_name: str, extra: str, what: str) -> ModuleType:
    """Return the imported ``module_name``; raise an ImportError naming ``torchdict[extra]`` if it is missing.

    ``what`` is the feature asking for it (e.g. ``"to_h5"``) so the message says why the library is needed.
    A module set to ``None`` in ``sys.modules`` (how tests simulate an absent library) counts as missing.
    """
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ImportError(f"{what} needs {module_name}: pip install torchdict[{extra}]") from err
    return module
