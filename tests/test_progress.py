"""The opt-in progress bar (tqdm) of long saves and loads: torchdict.set_progress_bar / TORCHDICT_PROGRESS=1."""
import inspect
import os
import sys
import types

import pytest
import tensordict
import torch

import torchdict
from torchdict import TensorDict
from torchdict import _progress


def build():
    return TensorDict(a=torch.zeros(100, 10), b={"c": torch.ones(100, dtype=torch.int64)},
                      s=torchdict.NonTensorData("label", batch_size=[100]), batch_size=[100])


DATA_BYTES = 100 * 10 * 4 + 100 * 8


class FakeBar:
    """Stands in for tqdm.tqdm: records what each bar was told."""

    made: list = []

    def __init__(self, total=None, desc=None, unit=None, **kwargs):
        self.total, self.desc, self.unit, self.count, self.closed = total, desc, unit, 0, False
        FakeBar.made.append(self)

    def update(self, n):
        self.count += n

    def close(self):
        self.closed = True


@pytest.fixture
def fake_tqdm(monkeypatch):
    FakeBar.made = []
    monkeypatch.setitem(sys.modules, "tqdm", types.SimpleNamespace(tqdm=FakeBar))
    monkeypatch.delenv(_progress.ENV_VAR, raising=False)
    return FakeBar.made


def test_off_by_default(tmp_path, fake_tqdm):
    build().memmap(tmp_path / "saved")
    TensorDict.load_memmap(tmp_path / "saved")
    build().memmap(tmp_path / "saved.tdz")
    assert fake_tqdm == [] and not _progress.progress_bar_enabled()


@pytest.mark.parametrize("num_threads", [0, 3])
def test_a_save_counts_the_bytes_of_every_leaf(tmp_path, fake_tqdm, num_threads):
    with torchdict.set_progress_bar(True):
        saved = build().memmap(tmp_path / "saved", num_threads=num_threads)
    (bar,) = fake_tqdm
    assert (bar.total, bar.count, bar.unit, bar.closed) == (DATA_BYTES, DATA_BYTES, "B", True)
    assert "saved" in bar.desc
    assert torch.equal(saved["a"], build()["a"])
    with torchdict.set_progress_bar(True):
        build().memmap_like(tmp_path / "like")  # no data is written: no bar
    assert len(fake_tqdm) == 1


def test_a_load_counts_the_bytes_mapped(tmp_path, fake_tqdm):
    build().memmap(tmp_path / "saved")
    with torchdict.set_progress_bar(True):
        loaded = TensorDict.load_memmap(tmp_path / "saved")
        torchdict.load(tmp_path / "saved", num_threads=2)
    assert [(bar.count, bar.closed) for bar in fake_tqdm] == [(DATA_BYTES, True)] * 2
    assert loaded["s"] == "label"


def test_archives_count_entries_written_and_checksums_read(tmp_path, fake_tqdm):
    with torchdict.set_progress_bar(True):
        build().memmap(tmp_path / "saved.tdz")
    written = [bar for bar in fake_tqdm if "archive" in bar.desc]
    assert len(written) == 1 and written[0].count == written[0].total >= DATA_BYTES and written[0].closed
    fake_tqdm.clear()
    from torchdict.formats.archive import forget_verified

    forget_verified(str(tmp_path / "saved.tdz"))  # checked again on this load
    with torchdict.set_progress_bar(True):
        TensorDict.load_memmap(tmp_path / "saved.tdz")
    checked = [bar for bar in fake_tqdm if bar.desc.startswith("checking")]
    assert len(checked) == 1 and checked[0].count == checked[0].total == DATA_BYTES
    build().memmap(tmp_path / "folder")
    fake_tqdm.clear()
    with torchdict.set_progress_bar(True):
        torchdict.pack_memmap(tmp_path / "folder", tmp_path / "packed.tdz")
    (packed,) = fake_tqdm
    assert packed.count == packed.total >= DATA_BYTES and "packed.tdz" in packed.desc


def test_the_environment_variable_turns_it_on_and_the_setter_wins(tmp_path, fake_tqdm, monkeypatch):
    monkeypatch.setenv(_progress.ENV_VAR, "1")
    build().memmap(tmp_path / "one")
    assert len(fake_tqdm) == 1
    with torchdict.set_progress_bar(False):
        build().memmap(tmp_path / "two")
    assert len(fake_tqdm) == 1
    monkeypatch.setenv(_progress.ENV_VAR, "0")
    build().memmap(tmp_path / "three")
    assert len(fake_tqdm) == 1


def test_set_and_decorator_forms(tmp_path, fake_tqdm):
    @torchdict.set_progress_bar(True)
    def save(path):
        return build().memmap(path)

    save(tmp_path / "one")
    assert len(fake_tqdm) == 1 and not _progress.progress_bar_enabled()
    toggle = torchdict.set_progress_bar(True)
    toggle.set()
    try:
        assert _progress.progress_bar_enabled()
    finally:
        toggle.__exit__(None, None, None)
    assert not _progress.progress_bar_enabled()


def test_without_tqdm_turning_it_on_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.delenv(_progress.ENV_VAR, raising=False)
    with pytest.raises(ImportError, match=r"pip install torchdict\[progress\]"):
        torchdict.set_progress_bar(True)
    build().memmap(tmp_path / "off")  # off: tqdm is never imported
    monkeypatch.setenv(_progress.ENV_VAR, "1")
    with pytest.raises(ImportError, match=r"torchdict\[progress\]"):
        build().memmap(tmp_path / "on")
    assert not os.path.exists(tmp_path / "on" / "meta.json")  # refused before the save wrote anything
    with pytest.raises(ImportError, match=r"torchdict\[progress\]"):
        TensorDict.load_memmap(tmp_path / "off")


def test_with_real_tqdm_the_bar_is_shown(tmp_path, capsys):
    pytest.importorskip("tqdm")
    with torchdict.set_progress_bar(True):
        build().memmap(tmp_path / "saved")
    err = capsys.readouterr().err
    assert "memmap saved" in err and "100%" in err


def test_no_upstream_signature_changes():
    # the opt-in adds no keyword to the calls upstream has
    for name in ("memmap", "memmap_", "memmap_like", "save", "load_memmap"):
        ours = set(inspect.signature(getattr(TensorDict, name)).parameters)
        theirs = set(inspect.signature(getattr(tensordict.TensorDict, name)).parameters)
        assert theirs <= ours and not any("progress" in parameter for parameter in ours)
    for name in ("save", "load", "memmap", "pack_memmap"):
        assert not any("progress" in parameter for parameter in inspect.signature(getattr(torchdict, name)).parameters)
