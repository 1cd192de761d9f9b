"""Copies and moves: clone, detach, data, requires_grad, contiguous, to(), share_memory_, pin_memory.

Device moves are tested on CPU with the ``meta`` device standing in for an accelerator:
it has its own device type, so every "is it already there" and "move it" branch runs.
"""
from __future__ import annotations

import doctest

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


def test_to_a_tensor_or_a_tensordict_takes_its_device_and_dtype():
    td = make_td()
    template = torch.zeros((), dtype=torch.float64, device="meta")
    result = td.to(template)
    assert result.device == META and result["i"].dtype == torch.float64
    assert td.to(TensorDict(device="meta")).device == META
    assert td.to(TensorDict()) is td


def test_to_batch_size_sets_it_in_place():
    td = TensorDict(a=torch.zeros(3, 4), batch_size=[3])
    assert td.to(batch_size=[3, 4]) is td and td.batch_size == torch.Size([3, 4])
    moved = td.to("meta", batch_size=[3])
    assert td.batch_size == torch.Size([3]) and moved.batch_size == torch.Size([3]) and moved.device == META
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
