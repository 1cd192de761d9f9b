"""EnsembleModule and the tensorclass modules, differential against upstream ``tensordict.nn``."""

import pytest
import torch
from torch import nn

from torchdict import TensorClass, TensorDict
from torchdict.nn import (
    EnsembleModule,
    TensorClassModuleBase,
    TensorClassModuleWrapper,
    TensorDictModule,
    TensorDictSequential,
)

from _nn_helpers import assert_same_td, both, leaves, pair


def _member(lnn):
    return lnn.TensorDictModule(nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 2)), in_keys=["x"],
                                out_keys=["y"])


@pytest.mark.parametrize("num_copies", [1, 4])
@pytest.mark.parametrize("batch", [(), (5,), (2, 3)])
def test_ensemble_matches_upstream(num_copies, batch):
    up, ours = both(lambda lib, lnn: lnn.EnsembleModule(_member(lnn), num_copies=num_copies))
    assert up.in_keys == ours.in_keys and up.out_keys == ours.out_keys
    assert [n for n, _ in up.named_parameters()] == [n for n, _ in ours.named_parameters()]
    for (name, p_up), (_, p_ours) in zip(up.named_parameters(), ours.named_parameters()):
        assert torch.equal(p_up, p_ours), name  # same seed, same resets
    td_up, td_ours = pair({"x": torch.randn(*batch, 3)}, batch)
    out_up, out_ours = up(td_up), ours(td_ours)
    assert tuple(out_ours.batch_size) == (num_copies, *batch)
    assert_same_td(out_up, out_ours, exact=False)


def test_copies_differ_and_match_a_hand_written_vmap():
    torch.manual_seed(0)
    member = _member(__import__("torchdict").nn)
    ensemble = EnsembleModule(member, num_copies=3)
    weights = ensemble.params_td["module", "0", "weight"]
    assert not torch.equal(weights[0], weights[1])
    td = TensorDict(x=torch.randn(6, 3), batch_size=[6])
    out = ensemble(td)
    params = ensemble.params_td._param_td
    for i in range(3):
        with params[i].to_module(member):
            assert torch.allclose(out["y"][i], member(td.clone())["y"], atol=1e-6)

    def by_hand(p, x):
        return torch.func.functional_call(member.module, {k: v for k, v in zip(
            ["0.weight", "0.bias", "2.weight", "2.bias"], p)}, (x,))

    stacked = [params["module", "0", "weight"], params["module", "0", "bias"], params["module", "2", "weight"],
               params["module", "2", "bias"]]
    expected = torch.vmap(by_hand, (0, None))(stacked, td["x"])
    assert torch.allclose(out["y"], expected, atol=1e-6)


def test_ensemble_without_expansion_and_grads():
    torch.manual_seed(0)
    ensemble = EnsembleModule(_member(__import__("torchdict").nn), num_copies=2, expand_input=False)
    td = TensorDict(x=torch.randn(2, 4, 3), batch_size=[2, 4])
    out = ensemble(td)
    assert out["y"].shape == (2, 4, 2)
    out["y"].sum().backward()
    grads = [p.grad for name, p in ensemble.named_parameters() if name.startswith("params_td")]
    assert grads and all(g is not None and g.shape[0] == 2 for g in grads)
    optimiser = torch.optim.SGD(ensemble.parameters(), lr=0.1)
    before = ensemble.params_td["module", "0", "weight"].detach().clone()
    optimiser.step()
    assert not torch.equal(before, ensemble.params_td["module", "0", "weight"])


def test_ensemble_reset_parameters_recursive():
    torch.manual_seed(0)
    ensemble = EnsembleModule(_member(__import__("torchdict").nn), num_copies=3)
    with pytest.raises(ValueError):
        ensemble.reset_parameters_recursive()
    params = ensemble.params_td._param_td.detach().clone()
    kept = params.clone()
    stack = ensemble.reset_parameters_recursive(params)
    assert stack.batch_size == torch.Size([3])
    assert not torch.equal(params["module", "0", "weight"], kept["module", "0", "weight"])


def test_ensemble_in_a_sequence():
    torch.manual_seed(0)
    seq = TensorDictSequential(
        TensorDictModule(lambda x: x * 2, in_keys=["obs"], out_keys=["x"]),
        EnsembleModule(_member(__import__("torchdict").nn), num_copies=2),
    )
    out = seq(TensorDict(obs=torch.ones(4, 3), batch_size=[4]))
    assert out["y"].shape == (2, 4, 2)


# ------------------------------------------------------------------ tensorclass modules
def _tc_classes(lib, lnn):
    class Pair(lib.TensorClass):
        a: torch.Tensor
        b: torch.Tensor

    class Inner(lib.TensorClass):
        total: torch.Tensor

    class Result(lib.TensorClass):
        inner: Inner
        diff: torch.Tensor

    class Add(lnn.TensorClassModuleBase[Pair, Result]):
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.tensor(2.0))

        def forward(self, x):
            return Result(inner=Inner(total=(x.a + x.b) * self.scale, batch_size=x.batch_size), diff=x.a - x.b,
                          batch_size=x.batch_size)

    return Pair, Add


def test_tensorclass_module_matches_upstream():
    (pair_up, add_up), (pair_ours, add_ours) = both(_tc_classes)
    a, b = torch.randn(3), torch.randn(3)
    out_up = add_up()(pair_up(a=a, b=b, batch_size=[3]))
    out_ours = add_ours()(pair_ours(a=a, b=b, batch_size=[3]))
    assert torch.equal(out_up.inner.total, out_ours.inner.total) and torch.equal(out_up.diff, out_ours.diff)
    assert add_ours.input_type is pair_ours
    wrapped_up, wrapped_ours = add_up().as_td_module(), add_ours().as_td_module()
    assert isinstance(wrapped_ours, TensorClassModuleWrapper)
    assert wrapped_up.in_keys == wrapped_ours.in_keys == ["a", "b"]
    assert wrapped_up.out_keys == wrapped_ours.out_keys == [("inner", "total"), "diff"]
    td_up, td_ours = pair({"a": a, "b": b, "extra": torch.zeros(3)}, [3])
    assert_same_td(wrapped_up(td_up), wrapped_ours(td_ours))
    assert [n for n, _ in wrapped_ours.named_parameters()] == ["tc_module.scale"]
    assert torch.equal(wrapped_ours(a=a, b=b)[1], a - b)


def test_tensorclass_module_in_sequence_and_errors():
    _, add = _tc_classes(__import__("torchdict"), __import__("torchdict").nn)
    seq = TensorDictSequential(
        TensorDictModule(lambda x: (x, x * 2), in_keys=["x"], out_keys=["a", "b"]),
        add().as_td_module(),
    )
    out = seq(TensorDict(x=torch.ones(2), batch_size=[2]))
    assert torch.equal(out["inner", "total"], torch.full((2,), 6.0))

    class TensorIn(TensorClassModuleBase[torch.Tensor, torch.Tensor]):
        def forward(self, x):
            return x + 1

    assert torch.equal(TensorIn()(torch.zeros(1)), torch.ones(1))
    with pytest.raises(ValueError):
        TensorIn().as_td_module()

    class Untyped(TensorClassModuleBase):
        def forward(self, x):
            return x

    with pytest.raises(ValueError):
        Untyped().as_td_module()
    with pytest.raises(TypeError):
        TensorClassModuleBase()  # abstract


def test_tensorclass_wrapper_warns_on_extra_arguments():
    _, add = _tc_classes(__import__("torchdict"), __import__("torchdict").nn)
    wrapped = add().as_td_module()
    with pytest.warns(FutureWarning, match="ignores"):
        wrapped(TensorDict(a=torch.ones(1), b=torch.ones(1), batch_size=[1]), unused=1)
    wrapped.eval()
    assert not wrapped.training


def test_leaves_helper_sanity():
    assert sorted(leaves(TensorDict({"a": {"b": torch.zeros(1)}}))) == [("a", "b")]
