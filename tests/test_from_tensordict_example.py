"""examples/from_tensordict.py, a pipeline written against upstream's API, gives the same outputs on both libraries."""
from __future__ import annotations

import importlib
import pathlib
import sys
import warnings

import pytest
import torch

tensordict = pytest.importorskip("tensordict")
import torchdict  # noqa: E402

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def _load_example():
    # imported by name (not from a file spec) so that map's worker processes can unpickle its function
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    return importlib.import_module("from_tensordict")


def _assert_same(ours, theirs, where="output"):
    if isinstance(theirs, torch.Tensor):
        assert isinstance(ours, torch.Tensor), where
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape, where
        assert torch.equal(ours, theirs), where
    elif isinstance(theirs, dict):
        assert isinstance(ours, dict) and list(ours) == list(theirs), where
        for key in theirs:
            _assert_same(ours[key], theirs[key], f"{where}[{key!r}]")
    elif isinstance(theirs, float):
        assert ours == pytest.approx(theirs), where
    else:
        assert ours == theirs, where


@pytest.fixture(scope="module")
def outputs():
    example = _load_example()
    # the toggles the example sets are process-wide: put both libraries back as they were afterwards
    before = {lib: (lib.list_to_stack(), lib.lazy_legacy()) for lib in (tensordict, torchdict)}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # upstream's FutureWarnings (map's seeding, ...)
            theirs = example.pipeline(tensordict)
            ours = example.pipeline(torchdict)
    finally:
        for lib, (to_stack, legacy) in before.items():
            lib.set_list_to_stack(to_stack).set()
            lib.set_lazy_legacy(legacy).set()
    return ours, theirs


def test_every_output_matches_upstream(outputs):
    ours, theirs = outputs
    assert list(ours) == list(theirs)
    for name in theirs:
        _assert_same(ours[name], theirs[name], name)


def test_the_pipeline_really_ran(outputs):
    ours, _ = outputs
    assert ours["storage_batch"] == [6, 3] and ours["lazy_batch"] == [3, -1]
    assert ours["memmap_same"] and ours["memmap_locked"] and ours["best_count"] > 0
    assert ours["padded_obs"].shape == (3, 7, 4) and ours["obs_norm"].shape == (18, 4)
