"""The module-level memos: one bounded kind, never holding an exception (issue 17, item 8)."""
from __future__ import annotations

import copy
import importlib
import pickle

import pytest
import torch

from torchdict import TensorDict
from torchdict._bounded_cache import BoundedCache

# Every module-level memo of the package: (module, name).
MEMOS = [
    ("torchdict._indexing", "_PROBES"),
    ("torchdict._indexing", "_ROW_BATCH"),
    ("torchdict._meta_json", "_KNOWN_METAS"),
    ("torchdict._operands", "_PREFLIGHT"),
    ("torchdict._filenames", "_filename_cache"),
    ("torchdict._moves", "_DEVICES"),
    ("torchdict.formats._archive_reading", "_VERIFIED"),
]


@pytest.mark.parametrize("module, name", MEMOS)
def test_each_memo_is_a_bounded_cache(module, name):
    memo = getattr(importlib.import_module(module), name)
    assert isinstance(memo, BoundedCache) and memo.limit >= 16


def test_a_full_cache_empties_before_storing():
    cache = BoundedCache(3)
    for n in range(3):
        assert cache.put(n, str(n)) == str(n)
    assert len(cache) == 3
    cache.put(1, "again")  # replacing a present key keeps the others
    assert dict(cache) == {0: "0", 1: "again", 2: "2"}
    cache.put(3, "3")
    assert dict(cache) == {3: "3"}


def test_a_cache_refuses_exceptions_and_bad_limits():
    cache = BoundedCache(4)
    with pytest.raises(TypeError, match="does not hold exceptions"):
        cache.put("k", RuntimeError("boom"))
    assert "k" not in cache
    with pytest.raises(ValueError, match="at least one entry"):
        BoundedCache(0)


def test_a_copied_or_pickled_cache_starts_empty_with_its_limit():
    cache = BoundedCache(5)
    cache.put("a", 1)
    for other in (copy.copy(cache), copy.deepcopy(cache), pickle.loads(pickle.dumps(cache))):
        assert isinstance(other, BoundedCache) and other.limit == 5 and len(other) == 0


def test_index_memos_stay_under_their_limit():
    from torchdict import _indexing

    td = TensorDict({"a": torch.zeros(2, 3)}, batch_size=[2, 3])
    for n in range(_indexing._ROW_BATCH.limit + 5):
        _indexing._row_batch(torch.Size([n + 1, 2]))
    assert len(_indexing._ROW_BATCH) <= _indexing._ROW_BATCH.limit
    assert td[1].batch_size == torch.Size([3])


def test_a_failed_inplace_op_raises_the_same_error_again_and_changes_nothing():
    from torchdict import _operands

    td = TensorDict({"i": torch.arange(4), "f": torch.zeros(4)}, batch_size=[4])
    messages = []
    for _ in range(3):  # the first run fills the preflight memo, the others raise from it
        with pytest.raises(RuntimeError) as caught:
            td += 0.5
        messages.append(str(caught.value))
    with pytest.raises(RuntimeError) as plain:
        torch.arange(4).add_(0.5)
    assert messages == [str(plain.value)] * 3
    assert torch.equal(td["i"], torch.arange(4)) and torch.equal(td["f"], torch.zeros(4))
    held = list(_operands._PREFLIGHT.values())
    assert held and not any(isinstance(value, BaseException) for value in held)
    assert not any(isinstance(part, BaseException) for value in held if value for part in value)
