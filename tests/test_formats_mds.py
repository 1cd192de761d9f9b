"""``to_mds`` (issue 21, item 4) without mosaicml-streaming installed.

The real ``streaming`` package is not in the test environment: these tests check the ImportError naming the
extra, and run upstream's ``to_mds`` and torchdict's against the same recording stand-in for
``streaming.MDSWriter`` (the samples written, the columns inferred, when the writer is finished). Writing a
real MDS dataset is NOT tested here.
"""
from __future__ import annotations

import sys
import types
import warnings

import numpy as np
import pytest
import torch

import torchdict
from torchdict import TensorDict
from torchdict.formats.mds import infer_columns, mds_encoding

upstream = pytest.importorskip("tensordict")


class RecordingWriter:
    """Stands in for ``streaming.MDSWriter``: keeps its arguments, the samples and whether it was finished."""

    def __init__(self, *, out, columns, keep_local=False, compression=None, hashes=None, size_limit=None, **kwargs):
        self.options = dict(out=out, columns=columns, keep_local=keep_local, compression=compression,
                            hashes=hashes, size_limit=size_limit, **kwargs)
        self.column_names = list(columns)
        self.column_encodings = list(columns.values())
        self.samples = []
        self.finished = 0
        CREATED.append(self)

    def write(self, sample):
        self.samples.append(sample)

    def finish(self):
        self.finished += 1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.finish()


CREATED: list = []


@pytest.fixture
def fake_streaming(monkeypatch):
    module = types.ModuleType("streaming")
    module.MDSWriter = RecordingWriter
    monkeypatch.setitem(sys.modules, "streaming", module)
    CREATED.clear()
    yield CREATED
    CREATED.clear()


def normal(sample):
    """A written sample with arrays as lists, comparable across the libraries."""
    if isinstance(sample, dict):
        return {key: normal(value) for key, value in sample.items()}
    if isinstance(sample, np.ndarray):
        return ("array", sample.dtype.str, sample.tolist())
    return sample


def run(lib, build, **options):
    CREATED.clear()
    td = build(lib)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        td.to_mds(**options)
    writers = list(CREATED)
    return ([(w.options, [normal(s) for s in w.samples], w.finished) for w in writers],
            [w.category for w in caught if w.category is FutureWarning])


def batched(lib):
    return lib.TensorDict(obs=torch.arange(6.0).reshape(3, 2), reward=torch.tensor([1.0, 2.0, 3.0]),
                          step=torch.tensor([0, 1, 2]), name=lib.NonTensorStack("a", "b", "c"), batch_size=[3])


def single(lib):
    return lib.TensorDict(obs=torch.zeros(2), reward=torch.tensor(0.5), step=torch.tensor(3), name="x")


@pytest.mark.parametrize("build", [batched, single], ids=["batched", "single"])
@pytest.mark.parametrize("options", [{}, {"columns": {"obs": "ndarray", "reward": "float32", "step": "int",
                                                      "name": "str"}},
                                     {"compression": "zstd", "hashes": ["sha1"], "size_limit": None,
                                      "keep_local": True, "progress_bar": False}], ids=str)
def test_samples_and_writer_options_match_upstream(fake_streaming, build, options):
    assert run(upstream, build, out="/tmp/x", **options) == run(torchdict, build, out="/tmp/x", **options)


@pytest.mark.parametrize("build", [batched, single], ids=["batched", "single"])
@pytest.mark.parametrize("finish_writer", [None, True, False])
def test_a_callers_writer_is_finished_as_upstream(fake_streaming, build, finish_writer):
    def with_writer(lib):
        writer = RecordingWriter(out="/tmp/y", columns={"obs": "ndarray", "name": "pkl"})
        before = len(CREATED)
        build(lib).to_mds(out="/tmp/y", writer=writer, finish_writer=finish_writer)
        return [normal(sample) for sample in writer.samples], writer.finished, len(CREATED) - before

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        assert with_writer(upstream) == with_writer(torchdict)


def test_empty_collection_is_refused(fake_streaming):
    """Upstream documents this ValueError, but its ``numel()`` is never below 1, so it fails later with an
    IndexError (on ``td[0]``); torchdict raises the documented error, before creating a writer."""
    with pytest.raises(IndexError):
        upstream.TensorDict(x=torch.zeros(0, 2), batch_size=[0]).to_mds(out="/tmp/z")
    CREATED.clear()
    with pytest.raises(ValueError, match="empty TensorDict"):
        TensorDict(x=torch.zeros(0, 2), batch_size=[0]).to_mds(out="/tmp/z")
    assert CREATED == []


@pytest.mark.parametrize("value", [torch.zeros(3), torch.tensor(1.5), torch.tensor(1.5, dtype=torch.float16),
                                   torch.tensor(2), torch.tensor(True), np.zeros(2), np.float32(1.0),
                                   np.array(3), np.array("s"), 1.0, 3, True, "s", b"b", [1, 2]], ids=repr)
def test_encodings_match_upstream(value):
    from tensordict._datasets import _get_elt_type

    from _format_helpers import outcome

    ours, up = outcome(lambda: mds_encoding(value)), outcome(lambda: _get_elt_type(value))
    assert ours[0] == up[0] and (ours[1] == up[1] if ours[0] == "ok" else type(ours[1]) is type(up[1]))


def test_unknown_types_raise_value_error():
    with pytest.raises(ValueError, match="Unknown type"):
        mds_encoding(object())


def test_columns_of_non_tensor_entries_match_upstream():
    from tensordict._datasets import _columns

    assert infer_columns(single(torchdict)) == _columns(single(upstream))


def test_missing_streaming_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "streaming", None)
    with pytest.raises(ImportError, match=r"torchdict\[mds\]"):
        TensorDict(x=torch.zeros(2), batch_size=[2]).to_mds(out=str(tmp_path))
