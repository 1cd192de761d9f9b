"""A TensorDict holding another kind of collection (a lazy stack) walks it through the collection's primitives."""
from __future__ import annotations

import pytest
import torch

import torchdict

tensordict = pytest.importorskip("tensordict")


def _holder(lib):
    members = [lib.TensorDict(a=torch.zeros(2), b={"c": torch.ones(2, 3)}, batch_size=[2]) for _ in range(2)]
    return lib.TensorDict(l=lib.lazy_stack(members), x=torch.zeros(2, 2), batch_size=[2])


@pytest.mark.parametrize("leaves_only", [False, True])
def test_nested_keys_through_a_lazy_stack_match_upstream(leaves_only):
    mine, theirs = _holder(torchdict), _holder(tensordict)
    assert list(mine.keys(True, leaves_only)) == list(theirs.keys(True, leaves_only))
    assert ("l", "b", "c") in mine.keys(True) and ("l", "b", "c") in theirs.keys(True)


def test_items_and_repr_through_a_lazy_stack():
    mine = _holder(torchdict)
    items = dict(mine.items(True, True))
    assert torch.equal(items["l", "a"], torch.zeros(2, 2)) and items["l", "b", "c"].shape == (2, 2, 3)
    assert "LazyStackedTensorDict" in repr(mine) or "l: " in repr(mine)


def test_get_through_a_lazy_stack_matches_upstream():
    mine, theirs = _holder(torchdict), _holder(tensordict)
    for key in [("l", "a"), ("l", "b", "c")]:
        assert torch.equal(mine.get(key), theirs.get(key))
        assert torch.equal(mine[key], theirs[key])
    assert mine.get(("l", "missing"), "default") == "default"


def test_get_of_a_deep_key_walks_every_kind_of_level():
    leaf = torch.arange(3.0)
    deep = torchdict.TensorDict(x=leaf, batch_size=[3])
    for depth in range(20):
        deep = torchdict.TensorDict({f"n{depth}": deep}, batch_size=[3])
    key = tuple(f"n{depth}" for depth in reversed(range(20))) + ("x",)
    assert deep.get(key) is leaf
    assert deep.get(key[:-1] + ("absent",), None) is None
    with pytest.raises(KeyError):
        deep[key[:-1] + ("absent",)]
    with pytest.raises(KeyError):
        deep[key[:5] + ("absent", "x")]
