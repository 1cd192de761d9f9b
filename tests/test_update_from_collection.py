"""``update`` from a TensorDict whose batch starts with the destination's takes its leaves without
checking their dims again; the results must be those of the checked path and of upstream."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

import torchdict
from torchdict import TensorDict

tensordict = pytest.importorskip("tensordict")

batches = st.lists(st.integers(1, 3), min_size=0, max_size=3)


def _pair(lib, dest_batch, extra, n_leaves, nested):
    source_batch = list(dest_batch) + list(extra)
    dest = lib.TensorDict({"k0": torch.zeros(*dest_batch, 2)}, batch_size=dest_batch)
    entries = {f"k{i}": torch.full((*source_batch, 2), float(i)) for i in range(n_leaves)}
    if nested:
        entries["sub"] = {"x": torch.ones(source_batch)}
    return dest, lib.TensorDict(entries, batch_size=source_batch)


@settings(max_examples=40, deadline=None)
@given(dest_batch=batches, extra=st.lists(st.integers(1, 2), max_size=1), n_leaves=st.sampled_from([1, 10]),
       nested=st.booleans())
def test_update_from_a_tensordict_matches_upstream(dest_batch, extra, n_leaves, nested):
    mine_dest, mine_source = _pair(torchdict, dest_batch, extra, n_leaves, nested)
    their_dest, their_source = _pair(tensordict, dest_batch, extra, n_leaves, nested)
    mine_dest.update(mine_source)
    their_dest.update(their_source)
    assert mine_dest.batch_size == their_dest.batch_size
    assert sorted(map(str, mine_dest.keys(True, True))) == sorted(map(str, their_dest.keys(True, True)))
    for key in their_dest.keys(True, True):
        assert torch.equal(mine_dest[key], their_dest[key])
    for key in mine_source.keys(True, True):  # the leaves are taken, not copied (as upstream)
        if key in mine_dest.keys(True, True) and not isinstance(key, tuple):
            assert mine_dest.get(key) is mine_source.get(key)


def test_a_source_with_another_batch_is_still_refused_and_changes_nothing():
    dest = TensorDict({"a": torch.zeros(3, 4)}, batch_size=[3, 4])
    source = TensorDict({"a": torch.ones(3, 5), "b": torch.ones(3, 5)}, batch_size=[3, 5])
    with pytest.raises(RuntimeError):
        dest.update(source)
    assert list(dest.keys()) == ["a"] and not dest["a"].any()


def test_leaves_are_cast_to_the_destination_device():
    dest = TensorDict({}, batch_size=[2, 3], device="meta")
    source = TensorDict({"a": torch.ones(2, 3, 1)}, batch_size=[2, 3])
    dest.update(source)
    assert dest["a"].device == torch.device("meta")
    same = TensorDict({"b": torch.ones(2, 3, device="meta")}, batch_size=[2, 3], device="meta")
    dest.update(same)
    assert dest.get("b") is same.get("b")
