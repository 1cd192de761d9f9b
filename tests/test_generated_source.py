"""Generated tensorclass methods show their source in tracebacks and to inspect."""
from __future__ import annotations

import inspect
import traceback

import pytest
import torch

from torchdict import tensorclass


@tensorclass
class Pair:
    obs: torch.Tensor
    reward: torch.Tensor


def _generated(method):
    """The Python function behind a method the C helpers may front (they keep it as ``__wrapped__``)."""
    return getattr(method, "__wrapped__", method)


def test_the_generated_init_has_readable_source():
    init = _generated(Pair.__init__)
    assert init.__code__.co_filename.startswith("<torchdict-generated Pair.__init__")
    source = inspect.getsource(init)
    assert "def __init__" in source and "obs" in source and "reward" in source


def test_a_traceback_through_the_generated_init_shows_its_lines():
    with pytest.raises(Exception) as info:
        Pair(obs=torch.zeros(3), reward=torch.zeros(4), batch_size=[3])
    frames = traceback.extract_tb(info.value.__traceback__)
    generated = [frame for frame in frames if frame.filename.startswith("<torchdict-generated")]
    assert generated and all(frame.line for frame in generated)


def test_the_generated_getitem_has_readable_source(monkeypatch):
    from torchdict.tensorclass import _indexing as _tensorclass_indexing

    monkeypatch.setattr(_tensorclass_indexing, "field_indexer", None)  # the Python twin, not the C method
    getitem = _tensorclass_indexing.make_getitem(Pair, ("obs", "reward"), lambda self, index: None, _Slot())
    assert getitem.__code__.co_filename.startswith("<torchdict-generated Pair.__getitem__")
    assert "def __getitem__" in inspect.getsource(getitem)


class _Slot:
    """Stands in for the instances' ``_td`` slot descriptor (only its ``__set__`` is taken)."""

    def __set__(self, instance, value):
        pass
