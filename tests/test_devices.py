"""Moves between devices: to() and its non_blocking rules, cpu() / cuda(), pin_memory, record_stream.

Tests parametrized on ``device`` run on the CPU and the meta device everywhere, and on CUDA
where there is one (``scripts/gpu_check.sh`` runs them with ``-k cuda``). The parts that need
an accelerator (pinning, streams, the wait after a copy to the host) are also run on the CPU
with stand-ins for the one torch call that needs it, so their logic is tested in CI.
"""
from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

import torchdict
from torchdict import TensorDict, tensorclass
from torchdict import _consolidate, _moves

try:  # the differential tests need upstream; the device tests also run where it is not installed
    import tensordict as upstream
except ImportError:  # pragma: no cover - upstream is in the test requirements
    upstream = None
needs_upstream = pytest.mark.skipif(upstream is None, reason="needs upstream tensordict")

HAS_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
DEVICES = ["cpu", "meta", pytest.param("cuda", marks=needs_cuda)]


def _source(seed: int = 0) -> dict:
    generator = torch.Generator().manual_seed(seed)
    return {"a": torch.randn(3, 4, generator=generator), "i": torch.arange(3),
            "nested": {"b": torch.randn(3, generator=generator), "flag": torch.zeros(3, dtype=torch.bool)}}


def _pair(device: Any = None) -> tuple:
    mine = TensorDict(_source(), batch_size=[3], device=device)
    mine["note"] = "text"
    if upstream is None:
        return mine, None
    theirs = upstream.TensorDict(_source(), batch_size=[3], device=device)
    theirs["note"] = "text"
    return mine, theirs


def _assert_like(mine: Any, theirs: Any, values: bool = True) -> None:
    assert mine.batch_size == theirs.batch_size and str(mine.device) == str(theirs.device)
    assert mine.is_locked == theirs.is_locked
    keys = list(mine.keys(True, True))
    assert keys == list(theirs.keys(True, True))
    for key in keys:
        left, right = mine.get(key), theirs.get(key)
        if isinstance(left, torch.Tensor):
            assert (left.dtype, left.shape, left.device) == (right.dtype, right.shape, right.device), key
            if values and left.device.type != "meta":
                assert torch.equal(left.cpu(), right.cpu()), key
        else:
            assert left.data == right.data and str(left.device) == str(right.device), key


@pytest.fixture
def to_calls(monkeypatch: pytest.MonkeyPatch) -> list:
    """Every ``Tensor.to`` call made while the test runs."""
    calls: list = []
    original = torch.Tensor.to

    def counting(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        calls.append((args, kwargs))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", counting)
    return calls


# ---------------------------------------------------------------------------- to(): nothing moves
@needs_upstream
@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_to_where_the_leaves_are_makes_no_copy_and_no_to_call(device: str, to_calls: list) -> None:
    mine = TensorDict(_source(), batch_size=[3]).to(device)  # no device yet, leaves there
    to_calls.clear()
    moved = mine.clear_device_().to(device)
    assert not to_calls and moved is not mine and moved.device == torch.device(device)
    assert moved["a"] is mine["a"] and moved["nested", "b"] is mine["nested", "b"]
    assert moved["nested"].device == torch.device(device)
    theirs = upstream.TensorDict(_source(), batch_size=[3]).to(device).clear_device_().to(device)
    _assert_like(moved, theirs)
    assert mine.to(device).to(device) is not mine  # (a td with that device is returned as is)
    placed = mine.to(device)
    assert placed.to(device) is placed and placed.to(torch.device(device)) is placed


@needs_upstream
def test_nothing_moves_on_a_nested_tree_with_non_tensors(to_calls: list) -> None:
    mine, theirs = _pair()
    result = mine.to("cpu")
    assert not to_calls
    _assert_like(result, theirs.to("cpu"))
    assert result.get("note").device == torch.device("cpu")


# ---------------------------------------------------------------------------- to(): differential
_TO_CALLS = [
    (("meta",), {}), (("cpu",), {}), ((torch.float64,), {}), (("cpu", torch.float16), {}),
    ((), {"dtype": torch.int32}), ((), {"device": "meta", "non_blocking": True}),
    (("cpu",), {"non_blocking": False}), (("meta",), {"non_blocking": None}),
    ((torch.zeros(1, dtype=torch.float64),), {}), (("cpu", torch.float64, False), {}),
    ((), {"batch_size": [3]}),
]


@needs_upstream
@pytest.mark.parametrize("call", _TO_CALLS, ids=repr)
@pytest.mark.parametrize("device", [None, "cpu"])
def test_to_equals_upstream(call: tuple, device: Any) -> None:
    args, kwargs = call
    mine, theirs = _pair(device)
    _assert_like(mine.to(*args, **kwargs), theirs.to(*args, **kwargs))
    locked_mine, locked_theirs = _pair(device)
    _assert_like(locked_mine.lock_().to(*args, **kwargs), locked_theirs.lock_().to(*args, **kwargs))


@needs_upstream
def test_positional_true_warns_as_upstream() -> None:
    mine, theirs = _pair()
    with pytest.warns(FutureWarning, match="positional non_blocking=True"):
        mine.to("meta", torch.float32, True)
    with pytest.warns(FutureWarning):
        theirs.to("meta", torch.float32, True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mine.to("meta", torch.float32, False)
        mine.to("meta", non_blocking=True)


@pytest.mark.parametrize("non_blocking, compiling, on_host, expected", [
    (None, False, True, (True, False)),    # to the host from the host: asynchronous calls, nothing to wait for
    (None, False, False, (True, True)),    # to the host from an accelerator: wait once at the end
    (None, True, False, (False, False)),   # under torch.compile: blocking copies, no wait
    (True, False, False, (True, False)),   # non_blocking=True: never waits
    (False, False, False, (False, False)),  # non_blocking=False: blocking copies
])
def test_copy_mode_to_the_host(non_blocking: Any, compiling: bool, on_host: bool, expected: tuple) -> None:
    assert _moves.copy_mode(torch.device("cpu"), non_blocking, compiling, lambda: on_host) == expected


@pytest.mark.parametrize("compiling", [False, True])
def test_copy_mode_to_cuda_never_waits(compiling: bool) -> None:
    cuda = torch.device("cuda", 0)
    assert _moves.copy_mode(cuda, None, compiling, lambda: True) == (True, False)
    assert _moves.copy_mode(cuda, True, compiling, lambda: False) == (True, False)
    assert _moves.copy_mode(cuda, False, compiling, lambda: False) == (False, False)


def test_to_waits_only_when_the_mode_says(monkeypatch: pytest.MonkeyPatch) -> None:
    waits: list = []
    monkeypatch.setattr(_consolidate, "sync_transfers", lambda: waits.append(1))
    monkeypatch.setattr(_moves, "copy_mode", lambda device, *args: (False, device is not None))
    TensorDict(_source(), batch_size=[3]).to(torch.float64)  # a cast: no device, no wait
    TensorDict(_source(), batch_size=[3]).to("meta")
    assert waits == [1]


@needs_upstream
@pytest.mark.skipif(HAS_CUDA, reason="checks the error of a machine without CUDA")
@pytest.mark.parametrize("target", ["cuda", "cuda:3"])
def test_a_device_that_does_not_exist_raises_torchs_error_and_moves_nothing(target: str) -> None:
    mine, theirs = _pair()
    with pytest.raises(BaseException) as their_error:
        theirs.to(target, non_blocking=True)
    with pytest.raises(type(their_error.value)):
        mine.to(target, non_blocking=True)
    with pytest.raises(type(their_error.value)):
        mine.consolidate().to(target, non_blocking=True)
    assert mine["a"].device.type == "cpu" and mine.device is None


def test_check_device_exists_names_the_missing_index() -> None:
    _moves.check_device_exists(torch.device("cpu"))
    _moves.check_device_exists(torch.device("meta"))
    with pytest.raises(BaseException):
        _moves.check_device_exists(torch.device("cuda", torch.cuda.device_count() + 3))


# ---------------------------------------------------------------------------- cpu() / cuda()
@needs_upstream
def test_cpu_and_cuda_arguments_as_upstream() -> None:
    mine, theirs = _pair("cpu")
    assert mine.cpu() is mine and theirs.cpu() is theirs
    for bad in ("meta", torch.device("cpu")):
        with pytest.raises(RuntimeError, match="must be a cuda device"):
            mine.cuda(bad)
        with pytest.raises(RuntimeError, match="must be a cuda device"):
            theirs.cuda(bad)
    _assert_like(TensorDict(_source(), batch_size=[3]).cpu(), upstream.TensorDict(_source(), batch_size=[3]).cpu())


# ---------------------------------------------------------------------------- pin_memory / record_stream
@pytest.fixture
def fake_pinning(monkeypatch: pytest.MonkeyPatch) -> list:
    """Stand in for ``Tensor.pin_memory`` (which needs an accelerator): a marked copy."""
    pinned: list = []

    def pin(tensor: torch.Tensor) -> torch.Tensor:
        copy = tensor.clone()
        pinned.append(copy)
        return copy

    monkeypatch.setattr(_consolidate, "pin_tensor", pin)
    return pinned


@needs_upstream
@pytest.mark.skipif(torch.accelerator.is_available(), reason="checks the error of a machine without accelerator")
def test_pin_memory_without_accelerator_raises_as_upstream() -> None:
    mine, theirs = _pair()
    with pytest.raises(RuntimeError) as their_error:
        theirs.pin_memory()
    with pytest.raises(RuntimeError, match=str(their_error.value)):
        mine.pin_memory()
    with pytest.raises(RuntimeError), pytest.warns(DeprecationWarning):
        mine.pin_memory_()
    assert not mine.is_locked and mine["a"].device.type == "cpu"


@pytest.mark.parametrize("num_threads", [None, 0, 2])
def test_pin_memory_copies_every_leaf_once(fake_pinning: list, num_threads: Any) -> None:
    mine, _ = _pair()
    mine["same"] = mine["a"]  # one tensor under two keys: one pinned copy
    result = mine.pin_memory(num_threads=num_threads)
    assert len(fake_pinning) == 4 and result["same"] is result["a"]
    assert all(result[key] is not mine[key] for key in ("a", "i"))
    assert result.get("note").data == "text" and not result.is_locked
    assert torch.equal(result["nested", "b"], mine["nested", "b"])


def test_pin_memory_in_place(fake_pinning: list) -> None:
    mine, _ = _pair()
    nested = mine["nested"]
    assert mine.pin_memory(inplace=True) is mine
    assert mine["nested"] is nested and mine["a"] is fake_pinning[0]
    assert any(mine["nested", "b"] is copy for copy in fake_pinning)
    again, _ = _pair()
    with pytest.warns(DeprecationWarning, match="pin_memory"):  # as upstream
        assert again.pin_memory_(num_threads=2) is again and any(again["a"] is copy for copy in fake_pinning)
    locked, _ = _pair()
    locked.lock_()
    leaf = locked["a"]
    assert locked.pin_memory(inplace=True) is locked and locked["a"] is leaf  # a locked td keeps its leaves
    kept = locked.pin_memory()
    assert kept.is_locked and kept["a"] is not leaf


def test_pinned_moves_pin_first(fake_pinning: list) -> None:
    mine, _ = _pair()
    moved = mine.to("meta", non_blocking_pin=True)
    assert len(fake_pinning) == 4 and moved["a"].device.type == "meta"
    packed = mine.consolidate()
    fake_pinning.clear()
    assert packed.to("meta", non_blocking_pin=True).is_consolidated() and len(fake_pinning) == 1


@tensorclass
class Frame:
    pixels: torch.Tensor
    step: torch.Tensor


def test_pin_memory_of_a_tensorclass(fake_pinning: list) -> None:
    frame = Frame(torch.zeros(2, 4), torch.arange(2), batch_size=[2])
    pinned = frame.pin_memory()
    assert type(pinned) is Frame and pinned.pixels is fake_pinning[0]


def test_record_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    recorded: list = []
    monkeypatch.setattr(_consolidate, "record_tensor_stream", lambda tensor, stream: recorded.append((tensor, stream)))
    mine, _ = _pair()
    assert mine.record_stream("s1") is mine and len(recorded) == 4
    mine.record_stream("s1")
    with pytest.raises(RuntimeError, match="already associated"):
        mine.record_stream("s2")


def test_lazy_stack_pin_memory_and_record_stream_go_member_by_member(fake_pinning: list,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    members = [TensorDict(a=torch.zeros(2), sub={"b": torch.ones(2)}, batch_size=[2]) for _ in range(2)]
    stack = torchdict.lazy_stack(members)
    pinned = stack.pin_memory()
    assert type(pinned) is type(stack) and len(fake_pinning) == 4 and pinned.tensordicts[0]["a"] is fake_pinning[0]
    fake_pinning.clear()
    sub = members[0]["sub"]
    with pytest.warns(DeprecationWarning, match="pin_memory"):  # as upstream
        assert stack.pin_memory_() is stack
    assert members[0]["a"] is fake_pinning[0] and members[0]["sub"] is sub and len(fake_pinning) == 4
    recorded: list = []
    monkeypatch.setattr(_consolidate, "record_tensor_stream", lambda tensor, stream: recorded.append(stream))
    assert stack.record_stream("s1") is stack and recorded == ["s1"] * 4
    members[1].record_stream("s1")
    other = torchdict.lazy_stack([TensorDict(a=torch.zeros(2), batch_size=[2]), members[1]])
    recorded.clear()
    with pytest.raises(RuntimeError, match="already associated"):
        other.record_stream("s2")
    assert recorded == []  # checked on every member before any is marked


# ---------------------------------------------------------------------------- every device (CUDA too)
@pytest.mark.parametrize("device", DEVICES)
def test_move_to_device_and_back(device: str) -> None:
    mine = TensorDict(_source(), batch_size=[3])
    moved = mine.to(device)
    # "cuda" names the current device: the TensorDict records it with its index, as a tensor's device does
    assert moved.device == torch.empty(0, device=device).device and moved["nested", "b"].device.type == device
    assert all(leaf.device.type == device for leaf in moved.values(True, True))
    if device != "meta":
        back = moved.to("cpu")
        assert all(torch.equal(back[key], mine[key]) for key in mine.keys(True, True))
        assert back.device == torch.device("cpu")


@pytest.mark.parametrize("device", DEVICES)
def test_consolidated_move_to_device(device: str) -> None:
    mine = TensorDict(_source(), batch_size=[3])
    mine["note"] = "text"
    packed = mine.consolidate()
    moved = packed.to(device, non_blocking=True)
    if device == "cuda":
        torch.cuda.synchronize()
    assert moved.is_consolidated() and moved.is_locked and moved._consolidated["storage"].device.type == device
    assert moved.get("note").data == "text"
    if device != "meta":
        back = moved.to("cpu")
        assert back.is_consolidated()
        assert all(torch.equal(back[key], mine[key]) for key in mine.keys(True, True) if key != "note")


@pytest.mark.parametrize("device", DEVICES)
def test_consolidate_onto_device(device: str) -> None:
    mine = TensorDict(_source(), batch_size=[3])
    packed = mine.consolidate(device=device)
    assert packed._consolidated["storage"].device.type == device
    assert all(leaf.device.type == device for leaf in packed.values(True, True))
    if device != "meta":
        assert all(torch.equal(packed[key].cpu(), mine[key]) for key in mine.keys(True, True))


@pytest.mark.xfail(tuple(int(part) for part in torch.__version__.split(".")[:2]) < (2, 13), strict=False,
                   reason="Dynamo before torch 2.13 can't trace object.__new__ (TensorDict._new_unsafe)")
@pytest.mark.parametrize("device", DEVICES)
def test_compiled_move(device: str) -> None:
    torch_dynamo = pytest.importorskip("torch._dynamo")
    torch_dynamo.reset()
    mine = TensorDict(_source(), batch_size=[3])

    def move(td: Any) -> Any:
        return td.to(device)["a"].sum(-1) if device != "meta" else td.to(device)

    result = torch.compile(move, fullgraph=True, backend="eager")(mine)
    if device != "meta":
        assert torch.allclose(result.cpu(), mine["a"].sum(-1))
    torch_dynamo.reset()


@needs_cuda
def test_cuda_pinned_storage_and_async_copy() -> None:
    mine = TensorDict(_source(), batch_size=[3])
    pinned = mine.pin_memory()
    assert all(leaf.is_pinned() for leaf in pinned.values(True, True))
    packed = mine.consolidate(pin_memory=True)
    assert packed._consolidated["storage"].is_pinned()
    on_gpu = packed.to("cuda", non_blocking=True)
    torch.cuda.current_stream().synchronize()
    assert all(torch.equal(on_gpu[key].cpu(), mine[key]) for key in mine.keys(True, True))
    repinned = mine.consolidate().consolidate(pin_memory=True)  # upstream re-pins a pageable storage
    assert repinned._consolidated["storage"].is_pinned()


@needs_cuda
def test_cuda_to_host_waits_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    waits: list = []
    real = _consolidate.sync_transfers

    def counting() -> None:
        waits.append(1)
        real()

    monkeypatch.setattr(_consolidate, "sync_transfers", counting)
    on_gpu = TensorDict(_source(), batch_size=[3]).to("cuda")
    assert not waits  # a copy to CUDA: the stream orders what reads it
    on_gpu.to("cpu")
    assert waits == [1]
    on_gpu.to("cpu", non_blocking=True)
    assert waits == [1]
    on_gpu.consolidate().to("cpu")
    assert waits == [1, 1]


@needs_cuda
def test_cuda_record_stream_and_cuda_method() -> None:
    mine = TensorDict(_source(), batch_size=[3]).cuda()
    assert mine.device == torch.device("cuda", 0) or mine.device == torch.device("cuda")
    assert TensorDict(_source(), batch_size=[3]).cuda(0)["a"].device.index == 0
    stream = torch.cuda.Stream()
    assert mine.record_stream(stream) is mine
    with pytest.raises(RuntimeError):
        mine.record_stream(torch.cuda.Stream())


@needs_cuda
def test_cuda_device_that_does_not_exist() -> None:
    mine = TensorDict(_source(), batch_size=[3])
    with pytest.raises(BaseException):
        mine.to(f"cuda:{torch.cuda.device_count()}", non_blocking=True)
    assert mine["a"].device.type == "cpu"


def test_top_level_name() -> None:
    assert callable(torchdict.from_consolidated)


# ---------------------------------------------------------------------------- the GPU benchmark's Python parts
def _benchmark_module() -> Any:
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "h2d_transfer.py")
    spec = importlib.util.spec_from_file_location("h2d_transfer", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(HAS_CUDA, reason="checks the message of a machine without CUDA")
def test_benchmark_says_no_cuda_device_and_exits_0(capsys: pytest.CaptureFixture) -> None:
    benchmark = _benchmark_module()
    assert benchmark.main([]) == 0
    assert "no CUDA device" in capsys.readouterr().out


def test_benchmark_measures_and_reports_on_any_device() -> None:
    benchmark = _benchmark_module()
    libs = benchmark.libraries()
    assert "torchdict" in libs
    results = benchmark.measure("meta", n_leaves=5, leaf_shape=(4, 2), large_bytes=1024, repeat=2, pin=False,
                                libs=libs)
    assert ("raw", "pinned copy") in results and all(seconds >= 0 for seconds in results.values())
    text = benchmark.report(results, 1024)
    assert "torchdict: consolidated" in text and "of a single pinned copy" in text
    assert len(benchmark.small_leaves(torchdict, 100, (64, 16)).keys()) == 100
