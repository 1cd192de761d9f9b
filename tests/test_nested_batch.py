"""Batch ops on trees whose middle levels add batch dims (issue: the innermost level got the wrong batch).

Every batch op must give each nested level ``new top batch + that level's extra dims``, however deep the
level is. The hypothesis properties in ``test_properties_nested.py`` cover the ops at random; these are the
reported cases, spelled out.
"""
from __future__ import annotations

import pytest
import torch

from _deep_trees import assert_levels_consistent
from torchdict import TensorDict


def _deep() -> TensorDict:
    inner = TensorDict({"k": torch.arange(6.0).view(3, 2)}, batch_size=[3, 2])
    return TensorDict({"n": TensorDict({"m": inner}, batch_size=[3, 2])}, batch_size=[3])


@pytest.mark.parametrize("op, inner_batch", [
    (lambda td: td[0], [2]),
    (lambda td: td[1:], [2, 2]),
    (lambda td: td[torch.tensor([0, 2])], [2, 2]),
    (lambda td: td[torch.tensor([True, False, True])], [2, 2]),
    (lambda td: torch.stack([td, td], 0), [2, 3, 2]),
    (lambda td: torch.cat([td, td], 0), [6, 2]),
    (lambda td: td.reshape(3, 1), [3, 1, 2]),
    (lambda td: td.unsqueeze(0), [1, 3, 2]),
    (lambda td: td.expand(4, 3), [4, 3, 2]),
    (lambda td: td.split(2)[1], [1, 2]),
    (lambda td: td.unbind(0)[2], [2]),
    (lambda td: td.empty(recurse=True)[0], [2]),
])
def test_innermost_level_follows_the_top_batch(op, inner_batch):
    out = op(_deep())
    assert out["n", "m"].batch_size == torch.Size(inner_batch)
    assert_levels_consistent(out)
    out.apply(lambda x: x + 1)  # raised "batch dimension mismatch" before the fix


def test_indexing_after_auto_batch_size_of_a_middle_level():
    td = TensorDict({"n": {"m": {"k": torch.zeros(3, 2, 4)}}}, batch_size=[3])
    td["n"].auto_batch_size_()
    out = td[0]
    assert out["n", "m"].batch_size == torch.Size([2, 4])
    assert_levels_consistent(out)


def test_memmap_round_trip_of_a_deep_tree_indexes_right(tmp_path):
    loaded = _deep().memmap(tmp_path)
    assert loaded[0]["n", "m"].batch_size == torch.Size([2])
    assert torch.equal(loaded[0]["n", "m", "k"], torch.tensor([0.0, 1.0]))


@pytest.mark.parametrize("op", [
    lambda td, torch_: td[0], lambda td, torch_: td[1:], lambda td, torch_: torch_.stack([td, td], 1),
    lambda td, torch_: torch_.cat([td, td], 0), lambda td, torch_: td.unsqueeze(-1),
    lambda td, torch_: td.unbind(0)[1], lambda td, torch_: td.expand(2, 3),
])
def test_nested_batch_sizes_match_upstream(op):
    upstream = pytest.importorskip("tensordict")

    def build(cls):
        inner = cls({"k": torch.arange(24.0).view(3, 2, 4)}, batch_size=[3, 2, 4])
        return cls({"n": cls({"m": inner, "x": torch.zeros(3, 2)}, batch_size=[3, 2])}, batch_size=[3])

    ours, theirs = op(build(TensorDict), torch), op(build(upstream.TensorDict), torch)
    for key in (("n",), ("n", "m")):
        assert ours[key].batch_size == theirs[key].batch_size, key
    assert torch.equal(ours["n", "m", "k"], theirs["n", "m", "k"])
