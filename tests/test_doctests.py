"""Every docstring example in the package runs (one test per module)."""
import doctest
import importlib
import pkgutil

import pytest
import torch

import torchdict
from torchdict import TensorDict

# Mixin docstrings use the public names without importing them in every example.
GLOBALS = {"torch": torch, "TensorDict": TensorDict}


def _modules():
    names = ["torchdict"]
    for info in pkgutil.walk_packages(torchdict.__path__, prefix="torchdict."):
        names.append(info.name)
    return sorted(names)


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, extraglobs=GLOBALS, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"
