"""Non-tensor stacks over large batches keep their values as a palette plus a grid of codes.

Every op must answer as the flat form does (one value per element); the flat form is forced by raising
``nontensor._FLAT_RESULT_LIMIT`` above the batch's element count, and a few results are checked against
upstream tensordict too.
"""
from __future__ import annotations

import pytest
import torch

import torchdict
from torchdict import TensorDict, nontensor

tensordict = pytest.importorskip("tensordict")

BATCH = (4, 5, 30)  # 600 elements: above the flat-result limit


def _labels(lib, count: int = 3, batch=BATCH):
    return [lib.TensorDict({"x": torch.full(batch, float(i)), "s": f"v{i}"}, batch_size=batch) for i in range(count)]


OPS = {
    "stack0": lambda tds: torch.stack(tds, 0),
    "stack2": lambda tds: torch.stack(tds, 2),
    "cat1": lambda tds: torch.cat(tds, 1),
    "stack_view": lambda tds: torch.stack(tds, 0).view(3, -1),
    "stack_index": lambda tds: torch.stack(tds, 1)[1:3, ::2],
    "stack_row": lambda tds: torch.stack(tds, 0)[1],
    "stack_permute": lambda tds: torch.stack(tds, 0).permute(3, 0, 2, 1),
    "stack_unbind": lambda tds: torch.stack(tds, 0).unbind(1)[2],
    "stack_split": lambda tds: torch.stack(tds, 0).split(2, 0)[1],
    "stack_mask": lambda tds: torch.stack(tds, 0)[torch.stack(tds, 0)["x"] > 0],
    "stack_reshape_back": lambda tds: torch.stack(tds, 0).reshape(-1).reshape(3, *BATCH),
    "stack_unsqueeze_expand": lambda tds: torch.stack(tds, 0)[:, :1].expand(3, 4, 5, 30),
}


def _read(td):
    value = td.get("s")
    kind = type(value).__name__
    return kind, value.tolist(), tuple(td.batch_size)


@pytest.mark.parametrize("name", sorted(OPS))
def test_palette_form_answers_as_the_flat_form(name, monkeypatch):
    op = OPS[name]
    palette = _read(op(_labels(torchdict)))
    monkeypatch.setattr(nontensor, "_FLAT_RESULT_LIMIT", 10 ** 9)
    flat = _read(op(_labels(torchdict)))
    assert palette == flat


@pytest.mark.parametrize("name", ["stack0", "cat1", "stack_view", "stack_index", "stack_row", "stack_unbind"])
def test_palette_form_against_upstream(name):
    op = OPS[name]
    mine, theirs = op(_labels(torchdict)), op(_labels(tensordict))
    assert mine.batch_size == theirs.batch_size
    assert mine.get("s").tolist() == theirs.get("s").tolist()
    assert mine["s"] == theirs["s"]


def test_a_row_of_a_big_stack_reads_back_as_the_value_stacked():
    stacked = torch.stack(_labels(torchdict), 0)
    row = stacked[2]
    assert type(row.get("s")) is torchdict.NonTensorData and row["s"] == "v2"
    assert stacked[1, 2:4]["s"] == "v1"


def test_writing_into_a_view_does_not_reach_the_stack_it_came_from():
    stacked = torch.stack(_labels(torchdict), 0)
    view = stacked.view(3, -1)
    flat_before = stacked.get("s").tolist()
    view[0, 0] = TensorDict({"x": torch.tensor(9.0), "s": "changed"}, [])
    assert view.get("s").tolist()[0][0] == "changed"
    assert stacked.get("s").tolist() == flat_before  # the palette is shared, never mutated


def test_writes_into_a_palette_stack_then_ops():
    stacked = torch.stack(_labels(torchdict), 0)
    stacked[1, 0] = TensorDict({"x": torch.zeros(5, 30), "s": "w"}, [5, 30])
    got = stacked.get("s").tolist()
    assert got[1][0][0][0] == "w" and got[1][1][0][0] == "v1" and got[0][0][0][0] == "v0"
    again = stacked.view(-1)[:601]
    values = again.get("s").tolist()
    assert values[:600] == ["v0"] * 600 and values[-1] == "w"  # element 600 is stacked[1, 0, 0, 0]


def test_stacking_costs_no_python_object_per_element():
    big = [TensorDict({"s": f"v{i}"}, batch_size=[300, 400]) for i in range(3)]
    stacked = torch.stack(big, 0)
    leaf = stacked.get("s")
    assert leaf._codes is not None and len(leaf._palette) == 3  # a code per element, three values
    assert stacked.view(3, -1)[1, 7]["s"] == "v1"
