"""Copies and moves: clone, detach, data, requires_grad, contiguous, to(), share_memory_, pin_memory.

Device moves are tested on CPU with the ``meta`` device standing in for an accelerator:
it has its own device type, so every "is it already there" and "move it" branch runs.
"""
from __future__ import annotations

import doctest
import warnings
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import torchdict._moves
from torchdict import NonTensorData, TensorDict

from _helpers import assert_same_snapshot, snapshot
from _tensor_strategies import leaves, tensordicts

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
META = torch.device("meta")


def tensor_leaves(td: TensorDict) -> dict:
    return {key: value for key, value in leaves(td).items() if isinstance(value, torch.Tensor)}


def make_td(**kwargs) -> TensorDict:
    return TensorDict({"a": torch.arange(6.0).view(3, 2), "i": torch.arange(3),
                       "sub": {"b": torch.ones(3, 4, dtype=torch.bool)}, "text": "hello"},
                      batch_size=[3], **kwargs)


# --------------------------------------------------------------------------- clone


@SETTINGS
@given(td=tensordicts())
def test_clone_copies_every_leaf(td):
    copy = td.clone()
    assert copy.batch_size == td.batch_size and copy.device == td.device
    originals, copies = tensor_leaves(td), tensor_leaves(copy)
    assert list(originals) == list(copies)
    for key, leaf in originals.items():
        assert torch.equal(copies[key], leaf) and copies[key].dtype == leaf.dtype
        assert copies[key] is not leaf
        if leaf.numel():
            assert copies[key].data_ptr() != leaf.data_ptr()
    assert {k: v.tolist() for k, v in leaves(td).items() if not isinstance(v, torch.Tensor)} == {
        k: v.tolist() for k, v in leaves(copy).items() if not isinstance(v, torch.Tensor)}


def test_clone_is_independent_unlocked_and_keeps_device_and_names():
    td = make_td(device="cpu", names=["rows"]).lock_()
    copy = td.clone()
    assert not copy.is_locked and not copy["sub"].is_locked
    assert copy.device == torch.device("cpu") and copy["sub"].device == torch.device("cpu")
    assert copy.names == ["rows"]
    copy["a"] += 1
    copy["new"] = torch.zeros(3)
    assert torch.equal(td["a"], torch.arange(6.0).view(3, 2)) and "new" not in td
    assert copy["text"] == "hello"


def test_clone_without_recursion_is_a_shallow_copy():
    td = make_td()
    shallow = td.clone(recurse=False)
    assert shallow["a"] is td["a"] and shallow["sub", "b"] is td["sub", "b"]
    assert shallow["sub"] is not td["sub"]
    shallow["x"] = torch.zeros(3)
    assert "x" not in td


def test_clone_keeps_the_autograd_graph_like_torch():
    weight = torch.ones(2, requires_grad=True)
    copy = TensorDict(w=weight).clone()
    assert copy["w"].requires_grad and copy["w"].grad_fn is not None
    copy["w"].sum().backward()
    assert torch.equal(weight.grad, torch.ones(2))


def test_torch_clone_dispatches():
    td = make_td()
    assert torch.equal(torch.clone(td)["a"], td["a"]) and torch.clone(td)["a"] is not td["a"]


# --------------------------------------------------------------------------- detach / data / requires_grad


def test_detach_and_data_share_storage_and_drop_the_graph():
    weight = torch.nn.Parameter(torch.ones(3))
    td = TensorDict(w=weight, sub={"v": weight * 2})
    for result in (td.detach(), td.data):
        assert not result.requires_grad
        assert result["w"].data_ptr() == weight.data_ptr()
        assert type(result["w"]) is torch.Tensor
    assert td.requires_grad


def test_data_zero_zeroes_module_parameters():
    module = torch.nn.Linear(3, 4)
    params = TensorDict(weight=module.weight, bias=module.bias)
    params.data.zero_()
    assert (module.weight == 0).all() and (module.bias == 0).all()


def test_detach_clone_zero_leaves_the_source_alone():
    module = torch.nn.Linear(3, 4)
    params = TensorDict(weight=module.weight, bias=module.bias)
    zeros = params.detach().clone().zero_()
    assert not zeros.any() and module.weight.abs().sum() > 0


def test_detach_in_place():
    leaf = torch.ones(2, requires_grad=True) * 2
    td = TensorDict(a=leaf)
    assert td.detach_() is td and not td.requires_grad and td["a"] is leaf


def test_requires_grad_sets_float_leaves_and_skips_others():
    td = make_td()
    assert not td.requires_grad
    assert td.requires_grad_() is td
    assert td["a"].requires_grad and not td["i"].requires_grad and not td["sub", "b"].requires_grad
    assert td.requires_grad
    td.requires_grad_(False)
    assert not td.requires_grad


def test_detach_and_to_keep_the_lock_clone_and_contiguous_do_not():
    td = make_td().lock_()
    assert td.detach().is_locked and td.data.is_locked
    assert td.to(torch.float64).is_locked and td.to(META).is_locked
    assert not td.clone().is_locked and not td.contiguous().is_locked


# --------------------------------------------------------------------------- contiguous


def test_contiguous():
    base = torch.arange(12.0).view(4, 3)
    td = TensorDict(t=base.t(), c=torch.zeros(3), batch_size=[3])
    assert not td.is_contiguous()
    result = td.contiguous()
    assert result.is_contiguous() and torch.equal(result["t"], base.t())
    assert result["c"] is td["c"]  # already contiguous: shared
    assert result is not td


# --------------------------------------------------------------------------- to()


def test_to_the_current_device_returns_self():
    td = make_td(device="cpu")
    assert td.to("cpu") is td
    assert td.to(torch.device("cpu")) is td
    assert td.to(device="cpu") is td
    assert td.cpu() is td


def test_to_a_device_on_a_td_without_device_sets_it_and_keeps_leaves():
    td = make_td()
    result = td.to("cpu")
    assert result is not td and result.device == torch.device("cpu") and td.device is None
    assert result["a"] is td["a"]
    assert result["sub"].device == torch.device("cpu")


@SETTINGS
@given(td=tensordicts())
def test_to_meta_moves_every_leaf(td):
    moved = td.to("meta")
    assert moved.device == META and td.device is None
    for key, leaf in tensor_leaves(td).items():
        result = moved.get(key)
        assert result.device == META and result.shape == leaf.shape and result.dtype == leaf.dtype
        assert leaf.device.type == "cpu"
    for key in moved.keys(include_nested=True):
        value = moved.get(key)
        if isinstance(value, TensorDict) or not isinstance(value, torch.Tensor):
            assert value.device == META, key


def test_to_meta_then_back_is_on_meta_dtype_casts_work_there():
    td = make_td(device="cpu")
    moved = td.to(META)
    assert moved.device == META and moved["sub"].device == META and moved.get("text").device == META
    assert moved.to("meta") is moved
    both = td.to(META, torch.float64)
    assert both["i"].dtype == torch.float64 and both["i"].device == META
    by_kwargs = td.to(device="meta", dtype=torch.float16, non_blocking=True)
    assert by_kwargs["a"].dtype == torch.float16 and by_kwargs.device == META


@SETTINGS
@given(td=tensordicts(), dtype=st.sampled_from([torch.float64, torch.float16, torch.int32, torch.bool]))
def test_to_dtype_casts_every_tensor_leaf(td, dtype):
    result = td.to(dtype)
    for key, leaf in tensor_leaves(td).items():
        expected = leaf.to(dtype)
        assert result.get(key).dtype == dtype and torch.equal(result.get(key), expected), key
    assert result.device == td.device and result.batch_size == td.batch_size


def test_to_a_dtype_every_leaf_already_has_returns_self():
    td = TensorDict(a=torch.zeros(2), sub={"b": torch.ones(2)}, batch_size=[2])
    assert td.to(torch.float32) is td and td.float() is td
    assert td.to(torch.float64) is not td


def test_casting_shortcuts():
    td = make_td()
    for name, dtype in torchdict._moves.CASTS.items():
        result = getattr(td, name)()
        assert result["a"].dtype == dtype and result["sub", "b"].dtype == dtype, name
    assert td.type(torch.float64)["i"].dtype == torch.float64


def test_to_a_tensor_or_other_takes_its_device_and_dtype():
    td = make_td()
    template = torch.zeros((), dtype=torch.float64, device="meta")
    result = td.to(template)
    assert result.device == META and result["i"].dtype == torch.float64
    # other=: its device, and its dtype when all its leaves share one (as upstream)
    assert td.to(other=TensorDict(device="meta")).device == META
    assert td.to(other=TensorDict()) is td
    half = td.to(other=TensorDict(x=torch.zeros(1, dtype=torch.float16), device="meta"))
    assert half.device == META and half["i"].dtype == torch.float16
    # a positional TensorDict is a per-leaf spec (what attrs() returns): a plain one names no leaf
    assert td.to(TensorDict(device="meta"))["a"] is td["a"]


def test_to_batch_size_sets_it_in_place():
    td = TensorDict(a=torch.zeros(3, 4), batch_size=[3])
    assert td.to(batch_size=[3, 4]) is td and td.batch_size == torch.Size([3, 4])
    moved = td.to("meta", batch_size=[3])  # with a move, the result gets the batch size: td keeps its own
    assert td.batch_size == torch.Size([3, 4]) and moved.batch_size == torch.Size([3]) and moved.device == META
    before = snapshot(td)
    with pytest.raises(RuntimeError, match="incompatible with the batch-size"):
        td.to(batch_size=[4])
    assert_same_snapshot(before, snapshot(td))


def test_bad_devices_raise_torch_errors_and_change_nothing():
    td = make_td()
    before = snapshot(td)
    with pytest.raises(RuntimeError, match="Expected one of cpu, cuda"):
        td.to("xyz")
    with pytest.raises(TypeError):
        td.to([1])
    assert_same_snapshot(before, snapshot(td))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
def test_cuda_without_cuda_raises_torch_error():
    with pytest.raises((RuntimeError, AssertionError)):
        TensorDict(a=torch.zeros(2)).cuda()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_round_trip():
    td = make_td()
    moved = td.cuda()
    assert moved.device.type == "cuda" and moved["a"].is_cuda and moved["sub", "b"].is_cuda
    assert moved.cuda() is moved
    back = moved.cpu()
    assert torch.equal(back["a"], td["a"]) and back.device == torch.device("cpu")
    assert torch.equal(moved.to("cuda", non_blocking=True)["i"].cpu(), td["i"])


def test_a_sub_tensordict_set_under_a_device_is_moved():
    parent = TensorDict(device="meta")
    parent["sub"] = TensorDict(a=torch.zeros(2))
    assert parent["sub"].device == META and parent["sub", "a"].device == META


def test_update_with_clone_clones_nested_values():
    source = TensorDict(sub={"a": torch.zeros(2)})
    target = TensorDict()
    target.update(source, clone=True)
    assert torch.equal(target["sub", "a"], source["sub", "a"]) and target["sub", "a"] is not source["sub", "a"]


# --------------------------------------------------------------------------- shared and pinned memory


def test_share_memory_locks_and_shares():
    td = make_td()
    assert not td.is_shared()
    assert td.share_memory_() is td
    assert td.is_locked and td.is_shared()
    assert all(leaf.is_shared() for leaf in tensor_leaves(td).values())
    assert not td.clone().is_shared()
    assert not TensorDict().is_shared()
    assert td["text"] == "hello" and isinstance(td.get("text"), NonTensorData)


def _has_accelerator() -> bool:
    accelerator = getattr(torch, "accelerator", None)
    return bool(accelerator is not None and accelerator.is_available())


@pytest.mark.skipif(_has_accelerator(), reason="checks the behaviour without an accelerator")
def test_pin_memory_without_accelerator_raises_torch_error():
    with pytest.raises(RuntimeError):
        make_td().pin_memory()


@pytest.mark.skipif(not _has_accelerator(), reason="needs an accelerator")
def test_pin_memory_pins_every_leaf():
    td = make_td()
    pinned = td.pin_memory()
    assert all(leaf.is_pinned() for leaf in tensor_leaves(pinned).values())
    assert td.pin_memory(inplace=True) is td and td["a"].is_pinned()


def test_docstring_examples_run():
    failures, _ = doctest.testmod(torchdict._moves, extraglobs={"torch": torch, "TensorDict": TensorDict})
    assert failures == 0


# --------------------------------------------------------------------------- to(): upstream's keywords, differentially

upstream = pytest.importorskip("tensordict")
from _dropin_diff import build, exception_kind, specs  # noqa: E402


def _described(value, source) -> Any:
    """A library-independent description of a to() result (meta leaves by dtype, shape and strides only)."""
    if isinstance(value, BaseException):
        return ("raises", exception_kind(value))
    entries = []
    for key, leaf in value.items(include_nested=True, leaves_only=True):
        if not isinstance(leaf, torch.Tensor):
            entries.append((key, "non-tensor", str(leaf.device)))
            continue
        data = None if leaf.device.type == "meta" else leaf.detach().cpu().tolist()
        entries.append((key, str(leaf.dtype), str(leaf.device), tuple(leaf.shape), leaf.stride(), data))
    nested = sorted((key, str(item.device), tuple(item.batch_size))
                    for key, item in value.items(include_nested=True) if hasattr(item, "batch_size")
                    and not isinstance(item, torch.Tensor) and not hasattr(item, "data"))
    return (type(value).__name__, tuple(value.batch_size), str(value.device), value.is_locked,
            sorted(entries, key=str), nested)


def _with_image(lib, spec, device, locked):
    """``spec``'s TensorDict with a 4-D ``image`` leaf (what ``memory_format`` applies to)."""
    td = build(lib, spec)
    generator = torch.Generator().manual_seed(spec.seed)
    td.set("image", torch.randn(*spec.batch, *(2,) * (4 - len(spec.batch)), generator=generator)
           if len(spec.batch) <= 4 else torch.zeros(spec.batch))
    if device is not None:
        td = td.to(device)
    if locked:
        td.lock_()
    return td


TO_CALLS = {
    "to(meta)": lambda td, lib: td.to("meta"),
    "to(float64)": lambda td, lib: td.to(torch.float64),
    "to(meta, float16)": lambda td, lib: td.to("meta", torch.float16),
    "to(device=, dtype=)": lambda td, lib: td.to(device="meta", dtype=torch.int32),
    "to(tensor)": lambda td, lib: td.to(torch.zeros(1, dtype=torch.float16, device="meta")),
    "memory_format": lambda td, lib: td.to(memory_format=torch.channels_last),
    "meta + memory_format": lambda td, lib: td.to("meta", memory_format=torch.channels_last),
    "float64 + memory_format": lambda td, lib: td.to(torch.float64, memory_format=torch.channels_last),
    "memory_format 3d": lambda td, lib: td.to(memory_format=torch.channels_last_3d),
    "cpu(memory_format)": lambda td, lib: td.cpu(memory_format=torch.channels_last),
    "other (one dtype)": lambda td, lib: td.to(other=lib.TensorDict(x=torch.zeros(1, dtype=torch.float16),
                                                                    device="meta")),
    "other (two dtypes)": lambda td, lib: td.to(other=lib.TensorDict(x=torch.zeros(1), y=torch.zeros(1).long(),
                                                                     device="meta")),
    "other without device": lambda td, lib: td.to(other=lib.TensorDict(x=torch.zeros(1, dtype=torch.float64))),
    "other and device": lambda td, lib: td.to("cpu", other=lib.TensorDict(device="meta")),
    "other, a tensor": lambda td, lib: td.to(other=torch.zeros(1)),
    "cast_filter": lambda td, lib: td.to(torch.float64, cast_filter=lambda key, leaf: leaf.is_floating_point()),
    "cast_filter without dtype": lambda td, lib: td.to("meta", cast_filter=lambda key, leaf: False),
    "attrs": lambda td, lib: td.to(td.to("meta", torch.float16).attrs()),
    "attrs + extra": lambda td, lib: td.to(td.attrs(), torch.float16),
    "copy=True": lambda td, lib: td.to("meta", copy=True),
    "memory_format, not one": lambda td, lib: td.to(memory_format="channels_last"),
    "cuda(cpu)": lambda td, lib: td.cuda("cpu"),
    "num_threads": lambda td, lib: td.to("meta", num_threads=2),
    "positional non_blocking": lambda td, lib: td.to("meta", torch.float64, False),
}
INPLACE_CALLS = {
    "to(meta, inplace)": lambda td, lib: td.to("meta", inplace=True),
    "to(float64, inplace)": lambda td, lib: td.to(torch.float64, inplace=True),
    "cpu(inplace)": lambda td, lib: td.cpu(inplace=True),
    "memory_format, inplace": lambda td, lib: td.to(memory_format=torch.channels_last, inplace=True),
}  # to(attrs, inplace=True) raises TypeError upstream (its device=None reaches torch.device): tested below
DIFF_SETTINGS = settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _compare(name: str, call, spec, device, locked) -> None:
    outcomes = []
    for lib in (upstream, torchdict):
        td = _with_image(lib, spec, device, locked)
        before = _described(td, td)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                result = call(td, lib)
        except Exception as error:  # noqa: BLE001 - the kind is compared
            result = error
        outcomes.append((_described(result, td), _described(td, td), before, result is td))
    theirs, ours = outcomes
    assert ours[0] == theirs[0], f"{name}\nupstream:  {theirs[0]}\ntorchdict: {ours[0]}"
    if theirs[0][0] == "raises":
        assert ours[1] == ours[2], f"{name}: a failed call changed the TensorDict"
    else:
        assert ours[1] == theirs[1], f"{name}: the source differs after the call"
    return ours


@pytest.mark.parametrize("name", sorted(TO_CALLS))
@pytest.mark.parametrize("device,locked", [(None, False), ("cpu", False), ("cpu", True)],
                         ids=["no-device", "cpu", "cpu-locked"])
@DIFF_SETTINGS
@given(spec=specs(max_rank=3))
def test_to_forms_match_upstream(name, device, locked, spec):
    _compare(name, TO_CALLS[name], spec, device, locked)


@pytest.mark.parametrize("name", sorted(INPLACE_CALLS))
@pytest.mark.parametrize("locked", [False, True], ids=["unlocked", "locked"])
@DIFF_SETTINGS
@given(spec=specs(max_rank=3))
def test_to_inplace_matches_upstream_and_keeps_identity(name, locked, spec):
    ours = _compare(name, INPLACE_CALLS[name], spec, "cpu", locked)
    if ours[0][0] != "raises":
        assert ours[3], f"{name}: inplace=True returns the TensorDict itself"


def test_to_inplace_keeps_the_nested_tensordicts_and_sets_their_device():
    td = make_td(device="cpu")
    sub = td["sub"]
    assert td.to("meta", inplace=True) is td
    assert td["sub"] is sub and sub.device == META and td.device == META and td["sub", "b"].device == META
    assert td.get("text").device == META


def test_to_channels_last_applies_to_4d_and_5d_leaves_only():
    td = TensorDict(volume=torch.randn(2, 3, 4, 5, 6), flat=torch.randn(2, 3), batch_size=[2])
    result = td.to(memory_format=torch.channels_last_3d)
    assert result["volume"].is_contiguous(memory_format=torch.channels_last_3d)
    assert result["flat"] is td["flat"]
    with pytest.raises(RuntimeError, match="rank 5"):  # torch's refusal for a 4-D leaf, as upstream
        td.set("image", torch.randn(2, 3, 4, 5)).to(memory_format=torch.channels_last_3d)
    image = TensorDict(image=torch.randn(2, 3, 4, 5), flat=torch.randn(2, 3), batch_size=[2])
    moved = image.to("meta", memory_format=torch.channels_last)
    assert moved["image"].stride() == torch.empty(2, 3, 4, 5).to(memory_format=torch.channels_last).stride()
    assert moved["flat"].device == META


def test_failed_to_calls_change_nothing():
    td = TensorDict(image=torch.randn(2, 3, 4, 5), volume=torch.randn(2, 3, 4, 5, 6), sub={"x": torch.zeros(2, 3)},
                    batch_size=[2])
    before = snapshot(td)
    with pytest.raises(RuntimeError):  # channels_last needs rank 4: the 5-D leaf refuses after the 4-D one
        td.to(memory_format=torch.channels_last, inplace=True)
    with pytest.raises(RuntimeError, match="incompatible with the batch-size"):
        td.to(torch.float64, inplace=True, batch_size=[2, 4])
    with pytest.raises(RuntimeError, match="incompatible with the batch-size"):
        td.to("meta", batch_size=[2, 4])
    with pytest.raises(ZeroDivisionError):
        td.to(torch.float64, inplace=True, cast_filter=lambda key, leaf: 1 / 0)
    with pytest.raises(ValueError, match="other and device"):
        td.to("cpu", other=TensorDict(device="meta"), inplace=True)
    with pytest.raises(TypeError):
        td.to("meta", inplace=True, bogus=1)
    assert_same_snapshot(before, snapshot(td))
    locked = td.clone().lock_()
    locked_before = snapshot(locked)
    with pytest.raises(RuntimeError, match="locked"):
        locked.to("meta", inplace=True)
    assert_same_snapshot(locked_before, snapshot(locked))


def test_to_with_a_batch_size_and_a_move_follows_upstream():
    # The result (not the source) gets the batch size, every nested TensorDict exactly that one, no names.
    for lib in (upstream, torchdict):
        td = lib.TensorDict(a=torch.zeros(3, 4), sub={"c": torch.zeros(3, 4, 5)}, batch_size=[3], names=["x"])
        td["sub"].batch_size = [3, 4, 5]
        with pytest.warns(FutureWarning):
            result = td.to("meta", batch_size=[3, 4])
        assert td.batch_size == torch.Size([3]) and result.batch_size == torch.Size([3, 4])
        assert result["sub"].batch_size == torch.Size([3, 4]) and result.names == [None, None], lib.__name__
    td = TensorDict(a=torch.zeros(3, 4), batch_size=[3])
    assert td.to(torch.float64, inplace=True, batch_size=[3, 4]) is td and td.batch_size == torch.Size([3, 4])


@pytest.mark.parametrize("kind", ["lazy stack", "tensorclass"])
def test_to_keywords_on_lazy_stacks_and_tensorclasses_match_upstream(kind):
    def make(lib):
        generator = torch.Generator().manual_seed(0)
        if kind == "lazy stack":
            return lib.lazy_stack([lib.TensorDict(a=torch.randn(3, 4, 5, 6, generator=generator),
                                                  b={"c": torch.arange(3)}, batch_size=[3]) for _ in range(2)], 1)

        @lib.tensorclass(cast_filter=lambda key, leaf: key == ("a",))
        class Item:
            a: torch.Tensor
            b: torch.Tensor

        return Item(a=torch.randn(3, 4, 5, 6, generator=generator), b=torch.arange(3), batch_size=[3])

    calls = {
        "meta": lambda c, lib: c.to("meta"),
        "float64": lambda c, lib: c.to(torch.float64),
        "memory_format": lambda c, lib: c.to("meta", memory_format=torch.channels_last),
        "other": lambda c, lib: c.to(other=lib.TensorDict(x=torch.zeros(1, dtype=torch.float16), device="meta")),
        "cast_filter": lambda c, lib: c.to(torch.float64, cast_filter=lambda key, leaf: key == ("b",)),
        "batch_size": lambda c, lib: c.to("meta", batch_size=c.batch_size),
        "inplace": lambda c, lib: c.to(torch.float64, inplace=True),
        "cpu(inplace)": lambda c, lib: c.cpu(inplace=True),
    }
    for name, call in calls.items():
        outcomes = []
        for lib in (upstream, torchdict):
            collection = make(lib)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    result = call(collection, lib)
            except Exception as error:  # noqa: BLE001
                result = error
            outcomes.append((_described(result, collection), _described(collection, collection)))
        assert outcomes[1] == outcomes[0], f"{kind} {name}\nupstream:  {outcomes[0]}\ntorchdict: {outcomes[1]}"


def test_lazy_stack_to_inplace_converts_the_members_and_returns_the_stack():
    members = [TensorDict(a=torch.zeros(2), batch_size=[2]) for _ in range(3)]
    stack = torchdict.lazy_stack(members)
    assert stack.to(torch.float64, inplace=True) is stack
    assert all(member["a"].dtype == torch.float64 for member in members) and stack.tensordicts[0] is members[0]
    members[2].lock_()
    with pytest.raises(RuntimeError, match="locked"):
        stack.to("meta", inplace=True)
    assert all(member["a"].device.type == "cpu" for member in members)  # nothing moved
    with pytest.raises(TypeError, match="batch-size"):
        stack.to(batch_size=[3])


def test_to_per_leaf_casts_each_leaf_as_its_attrs_say():
    td = TensorDict(a=torch.zeros(2), sub={"b": torch.ones(2, dtype=torch.int64)}, batch_size=[2], device="cpu")
    spec = TensorDict(a=torch.zeros(2, dtype=torch.float16), sub={"b": torch.zeros(2, device="meta")},
                      batch_size=[2]).attrs()
    result = td.to(spec)
    assert result["a"].dtype == torch.float16 and result["sub", "b"].device == META
    assert result["sub", "b"].dtype == torch.float32 and result.device is None  # as upstream: no device
    with pytest.raises(NotImplementedError):
        td.to(spec, non_blocking_pin=True)
    sub = td["sub"]
    assert td.to(spec, inplace=True) is td and td["sub"] is sub
    assert td["a"].dtype == torch.float16 and td["sub", "b"].device == META
