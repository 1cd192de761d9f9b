"""Edge cases found by the differential runs against upstream 0.15.3: same results or the same exception type."""
from __future__ import annotations

import pytest
import torch

import torchdict

upstream = pytest.importorskip("tensordict")
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")  # upstream announces its 0.17 changes


def _outcome(make):
    try:
        result = make()
    except Exception as error:  # noqa: BLE001 - the type is what is compared
        return ("raises", type(error))
    if isinstance(result, torch.Size):
        return ("size", tuple(result))
    return ("value", result)


def _scalar_td(lib):
    return lib.TensorDict({"a": torch.zeros(())}, [])


CASES = {
    **{f"0-dim flatten{args}": (lambda lib, args=args: _scalar_td(lib).flatten(*args).batch_size)
       for args in [(), (0, 0), (0, -1), (-1, -1), (1, -1), (0, 1), (-1, 0)]},
    "0-dim movedim": lambda lib: lib.TensorDict().movedim(0, 0),
    "0-dim movedim negative": lambda lib: lib.TensorDict().movedim(-1, 0),
    "new_zeros keeps no device": lambda lib: lib.TensorDict({"a": torch.zeros(3)}, [3]).new_zeros(2).device,
    "new_ones keeps the device": lambda lib: lib.TensorDict({"a": torch.zeros(3)}, [3], device="cpu").new_ones(2).device,
    "get_at of a missing key": lambda lib: lib.TensorDict({"a": torch.zeros(3)}, [3]).get_at("b", 0),
    "get_at with a default": lambda lib: lib.TensorDict({"a": torch.zeros(3)}, [3]).get_at("b", 0, 5),
    "get_at of a key": lambda lib: lib.TensorDict({"a": torch.arange(3)}, [3]).get_at("a", 1).item(),
}


@pytest.mark.parametrize("name", CASES)
def test_same_outcome_as_upstream(name):
    assert _outcome(lambda: CASES[name](torchdict)) == _outcome(lambda: CASES[name](upstream))
