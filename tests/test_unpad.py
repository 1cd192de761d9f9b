"""``unpad_sequence`` of ``pad_sequence(..., return_mask=...)``, against upstream: round trips whose padded
dim is any batch dim of the samples (batch ranks 1-3) or a feature dim (counted from either end), left or
right padding, masks under ``"masks"`` or another key, nested and non-tensor entries."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import torchdict
from _dropin_diff import outcome, plain, same_outcome, snapshot

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")


@st.composite
def cases(draw):
    rank = draw(st.integers(1, 3))
    features = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    n_dims = rank + len(features)
    pad_dim = draw(st.integers(-n_dims, n_dims - 1))  # negative: counted from the end of each sample's leaves
    # At least one sample with data: a stack of zero elements has no value to give back (torchdict's flat
    # non-tensor stacks hold one value per element; upstream keeps the sample's NonTensorData in its member).
    lengths = draw(st.lists(st.integers(0, 3), min_size=1, max_size=3).filter(lambda sizes: max(sizes) > 0))
    return dict(rank=rank, features=features, pad_dim=pad_dim, lengths=lengths,
                side=draw(st.sampled_from(["left", "right"])), mask_key=draw(st.sampled_from([True, "valid"])),
                nested=draw(st.booleans()), non_tensor=draw(st.booleans()), seed=draw(st.integers(0, 999)))


def _samples(lib, case):
    generator = torch.Generator().manual_seed(case["seed"])
    rank, features, pad_dim = case["rank"], case["features"], case["pad_dim"]
    position = pad_dim if pad_dim >= 0 else rank + len(features) + pad_dim
    samples = []
    for index, length in enumerate(case["lengths"]):
        shape = [2] * rank + list(features)
        shape[position] = length
        batch = shape[:rank]
        td = lib.TensorDict(a=torch.randint(0, 9, shape, generator=generator), batch_size=batch)
        if case["nested"]:
            td["n", "b"] = torch.randn(shape, generator=generator)
        if case["non_tensor"]:
            td["s"] = f"sample-{index}"
        samples.append(td)
    return samples


def _round_trip(lib, case):
    padded = lib.pad_sequence(_samples(lib, case), pad_dim=case["pad_dim"], return_mask=case["mask_key"],
                              padding_side=case["side"])
    if case["mask_key"] is True:
        result = lib.unpad_sequence(padded, pad_dim=case["pad_dim"])
    else:
        mask = padded.get(case["mask_key"])
        result = lib.unpad_sequence(padded.exclude(case["mask_key"]), mask, pad_dim=case["pad_dim"])
    return type(result).__name__, tuple(result.batch_size), [plain(sample) for sample in result.tensordicts]


@given(case=cases())
@settings(max_examples=150, deadline=None)
def test_round_trips_match_upstream(case):
    same_outcome(lambda lib: _round_trip(lib, case))


@given(case=cases())
@settings(max_examples=40, deadline=None)
def test_round_trips_give_the_samples_back(case):
    samples = _samples(torchdict, case)
    padded = torchdict.pad_sequence(samples, pad_dim=case["pad_dim"], return_mask=True, padding_side=case["side"])
    result = torchdict.unpad_sequence(padded, pad_dim=case["pad_dim"])
    for sample, back in zip(samples, result.tensordicts):
        assert back.batch_size == sample.batch_size
        for key in sample.keys(True, True):
            if isinstance(sample.get(key), torch.Tensor):
                assert torch.equal(back.get(key), sample.get(key))
            else:
                assert back.get(key).tolist() == sample.get(key).tolist() or back.get(key).data == sample.get(key).data


@pytest.mark.parametrize("rank", [1, 2, 3])
@pytest.mark.parametrize("pad_dim", [0, 1, 2, -1])
@pytest.mark.parametrize("side", ["left", "right"])
def test_non_tensor_entries_of_padded_rows(rank, pad_dim, side):
    # A padded row's non-tensor entry is a stack; upstream keeps it one after unpadding, as torchdict does.
    case = dict(rank=rank, features=(2,), pad_dim=pad_dim, lengths=[1, 3, 2], side=side, mask_key=True,
                nested=False, non_tensor=True, seed=0)

    def run(lib):
        result = lib.unpad_sequence(lib.pad_sequence(_samples(lib, case), pad_dim=pad_dim, return_mask=True,
                                                     padding_side=side), pad_dim=pad_dim)
        return [(type(sample.get("s")).__name__, plain(sample.get("s"))) for sample in result.tensordicts]

    same_outcome(run)


@pytest.mark.parametrize("bad", ["holes", "shape", "missing_key", "no_mask", "no_batch"])
def test_refused_masks_change_nothing(bad):
    def run(lib):
        samples = [lib.TensorDict(a=torch.arange(n * 2).view(n, 2), batch_size=[n]) for n in (1, 3)]
        padded = lib.pad_sequence(samples, return_mask=True)
        mask = padded.get("masks")
        if bad == "holes":
            mask = mask.clone()
            mask["a"][1, 1] = False
            call = lambda: lib.unpad_sequence(padded, mask)  # noqa: E731
        elif bad == "shape":
            call = lambda: lib.unpad_sequence(padded, torch.ones(2, 5, dtype=torch.bool))  # noqa: E731
        elif bad == "missing_key":
            call = lambda: lib.unpad_sequence(padded, mask.exclude("a"))  # noqa: E731
        elif bad == "no_mask":
            call = lambda: lib.unpad_sequence(padded.exclude("masks"))  # noqa: E731
        else:
            call = lambda: lib.unpad_sequence(lib.TensorDict(a=torch.zeros(2)))  # noqa: E731
        before = snapshot(padded)
        result = outcome(call)
        assert snapshot(padded) == before
        return result

    same_outcome(run)
