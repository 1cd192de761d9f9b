"""CudaGraphModule: on a machine without CUDA (CI) it is a checked pass-through, as upstream's; the capture and
replay path runs where CUDA is present (skipped otherwise)."""
import warnings

import pytest
import torch
from torch import nn

from torchdict import TensorDict
from torchdict.nn import CudaGraphModule, TensorDictModule, TensorDictSequential

needs_no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="pass-through behaviour without CUDA")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need CUDA")


def _build(lib, lnn, **kwargs):
    module = lnn.TensorDictModule(nn.Linear(3, 2), in_keys=["x"], out_keys=["y"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return lnn.CudaGraphModule(module, **kwargs)


@needs_no_cuda
def test_pass_through_matches_upstream():
    # upstream is only needed here: the CUDA tests below run where it is not installed
    from _nn_helpers import assert_same_outcome, assert_same_td, both, pair

    with pytest.warns(UserWarning, match="without CUDA"):
        CudaGraphModule(lambda x: x)
    up, ours = both(_build)
    assert up.in_keys == ours.in_keys and up.out_keys == ours.out_keys
    with torch.no_grad():
        for _ in range(4):
            td_up, td_ours = pair({"x": torch.randn(4, 3)}, [4])
            assert_same_td(up(td_up), ours(td_ours))
        x = torch.randn(3)
        assert_same_outcome(lambda: up(x=x), lambda: ours(x=x))
    assert ours.counter == 0
    # a leaf that requires grad is refused, by both
    td_up, td_ours = pair({"x": torch.randn(4, 3, requires_grad=True)}, [4])
    assert_same_outcome(lambda: up(td_up), lambda: ours(td_ours))


@needs_no_cuda
def test_pass_through_function_of_tensors():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = CudaGraphModule(lambda a, b: (a + b, a * b), warmup=3)
    a, b = torch.ones(2), torch.full((2,), 3.0)
    total, product = graph(a, b)
    assert torch.equal(total, torch.full((2,), 4.0)) and torch.equal(product, torch.full((2,), 3.0))
    with pytest.raises(RuntimeError, match="gradients"):
        graph(torch.ones(1, requires_grad=True), b)


@pytest.mark.parametrize("warmup", [0, -1, 1.5, "2"])
def test_bad_warmup(warmup):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match="warmup"):
            CudaGraphModule(lambda x: x, warmup=warmup)


def test_keys_given_and_ignored():
    module = TensorDictModule(lambda x: x, in_keys=["x"], out_keys=["y"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        graph = CudaGraphModule(module, in_keys=["other"])
    assert graph.in_keys == ["x"]
    assert any("ignores in_keys" in str(w.message) for w in caught)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = CudaGraphModule(lambda td: td, in_keys=["a"])
    assert plain.out_keys == [] and plain._is_tensordict_module
    assert "warmup=2" in repr(plain)
    assert plain.state_dict() == {}
    seq = TensorDictSequential(module)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        wrapped = CudaGraphModule(seq)
    assert wrapped.state_dict().keys() == seq.state_dict().keys()


@needs_cuda
def test_capture_and_replay_tensordict_module():
    torch.manual_seed(0)
    module = TensorDictModule(nn.Linear(3, 2), in_keys=["x"], out_keys=["y"]).cuda()
    graph = CudaGraphModule(module, warmup=2)
    with torch.no_grad():
        for step in range(5):
            td = TensorDict(x=torch.randn(4, 3, device="cuda"), batch_size=[4], device="cuda")
            expected = module.module(td["x"])
            out = graph(td)
            assert torch.allclose(out["y"], expected), step
        assert graph.counter == 2  # one warmup call, then the capture
        with pytest.raises(ValueError, match="batch_size"):
            graph(TensorDict(x=torch.randn(5, 3, device="cuda"), batch_size=[5], device="cuda"))


@needs_cuda
def test_capture_and_replay_function():
    graph = CudaGraphModule(lambda a, b: a * b + 1, warmup=1)
    for step in range(4):
        a, b = torch.randn(8, device="cuda"), torch.randn(8, device="cuda")
        assert torch.allclose(graph(a, b), a * b + 1), step
    with pytest.raises(ValueError, match="shape"):
        graph(torch.randn(3, device="cuda"), torch.randn(3, device="cuda"))
