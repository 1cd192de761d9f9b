"""TensorDicts under torch.vmap and torch.func, stated against the same transforms on plain tensors."""
import pytest
import torch
from torch import nn

from torchdict import TensorDict


def _sample() -> TensorDict:
    torch.manual_seed(0)
    td = TensorDict({"a": torch.randn(2, 3, 4), "nested": {"b": torch.randn(2, 3, 5, 6)}}, batch_size=[2, 3])
    td["nested"].batch_size = [2, 3, 5]
    return td


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2))


# ------------------------------------------------------------------------------------ seed examples


def test_seed_functional_call():
    module = torch.nn.Sequential(torch.nn.Linear(3, 4))
    td = TensorDict.from_module(module)
    td_zero = td.detach().clone().zero_()
    with td_zero.to_module(module):
        y = module(torch.randn(3))
    assert (y == 0).all()
    assert module[0].weight is td["0", "weight"]


def test_seed_vmap_over_parameter_configurations():
    module = torch.nn.Sequential(torch.nn.Linear(3, 4))
    td = TensorDict.from_module(module)
    td_zero = td.detach().clone().zero_()
    td_one = td.detach().clone() * 0 + 1
    td_stack = torch.stack([td_zero, td_one])

    def call_module(x, td):
        with td.to_module(module):
            return module(x)

    x = torch.ones(2, 10, 3)
    y = torch.vmap(call_module)(x, td_stack)
    assert (y[0] == 0).all()
    assert (y[1] == 4).all()
    assert module[0].weight is td["0", "weight"]


# ----------------------------------------------------------------------------------- in/out dims


@pytest.mark.parametrize("in_dim", [0, 1])
def test_in_dims_on_a_batch_dim(in_dim):
    td = _sample()
    seen = {}

    def fn(inner):
        seen["batch"] = inner.batch_size
        seen["nested"] = inner["nested"].batch_size
        return inner["a"].sum(-1) + inner["nested", "b"].sum((-1, -2))

    out = torch.vmap(fn, in_dims=in_dim)(td)
    expected = torch.vmap(lambda a, b: a.sum(-1) + b.sum((-1, -2)), in_dims=in_dim)(td["a"], td["nested", "b"])
    assert torch.allclose(out, expected)
    kept = [size for dim, size in enumerate(td.batch_size) if dim != in_dim]
    assert seen["batch"] == torch.Size(kept)
    assert seen["nested"] == torch.Size(kept + [5])


def test_in_dims_none_passes_the_tensordict_unchanged():
    td = _sample()
    x = torch.randn(7, 4)

    def fn(inner, row):
        assert inner.batch_size == torch.Size([2, 3])
        return inner["a"] @ row

    out = torch.vmap(fn, in_dims=(None, 0))(td, x)
    assert torch.allclose(out, torch.stack([td["a"] @ row for row in x]))


@pytest.mark.parametrize("in_dim,out_dim", [(0, 0), (1, 1), (1, 0), (0, 1)])
def test_tensordict_outputs_with_out_dims(in_dim, out_dim):
    td = _sample()
    out = torch.vmap(lambda inner: inner.apply(lambda t: t * 2), in_dims=in_dim, out_dims=out_dim)(td)
    for key in ("a", ("nested", "b")):
        expected = torch.vmap(lambda t: t * 2, in_dims=in_dim, out_dims=out_dim)(td[key])
        assert torch.equal(out[key], expected)
    kept = [size for dim, size in enumerate(td.batch_size) if dim != in_dim]
    kept.insert(out_dim, td.batch_size[in_dim])
    assert out.batch_size == torch.Size(kept)
    assert out["nested"].batch_size == torch.Size(kept + [5])


def test_tensordict_built_inside_vmap_gets_the_vmapped_batch():
    x = torch.randn(5, 3)
    out = torch.vmap(lambda row: TensorDict(row=row, total=row.sum()))(x)
    assert out.batch_size == torch.Size([5])
    assert torch.equal(out["row"], x) and torch.allclose(out["total"], x.sum(-1))


def test_chunked_and_nested_vmap():
    td = _sample()
    fn = lambda inner: inner["a"].sum(-1)  # noqa: E731
    expected = td["a"].sum(-1)
    assert torch.allclose(torch.vmap(fn, chunk_size=1)(td), expected)
    assert torch.allclose(torch.vmap(torch.vmap(fn))(td), expected)
    back = torch.vmap(lambda inner: inner, chunk_size=1)(td)
    assert back.batch_size == td.batch_size and back["nested"].batch_size == torch.Size([2, 3, 5])


def test_non_tensor_data_follows_through_vmap():
    td = TensorDict({"a": torch.randn(4, 2)}, batch_size=[4])
    td["label"] = "run-1"
    labels = []

    def fn(inner):
        labels.append(inner["label"])
        return inner

    out = torch.vmap(fn)(td)
    assert labels == ["run-1"] and out["label"] == "run-1" and out.batch_size == torch.Size([4])


# -------------------------------------------------------------------------------- parameter ensembles


def test_ensemble_of_five_mlps_equals_five_calls():
    torch.manual_seed(0)
    members = [_mlp() for _ in range(5)]
    base = _mlp().to("meta")
    params = TensorDict.from_modules(*members)
    x = torch.randn(11, 3)

    def call(td, x):
        with td.to_module(base):
            return base(x)

    out = torch.vmap(call, (0, None))(params, x)
    expected = torch.stack([member(x) for member in members])
    assert torch.allclose(out, expected, atol=1e-6)
    # Gradients reach the stacked parameters.
    out.sum().backward()
    assert params["0", "weight"].grad is not None
    assert params["0", "weight"].grad.shape == (5, 8, 3)
    # The base module is restored after every call.
    assert base[0].weight.device.type == "meta" and isinstance(base[0].weight, nn.Parameter)


def test_ensemble_with_separate_inputs_per_member():
    torch.manual_seed(0)
    members = [_mlp() for _ in range(3)]
    params = TensorDict.from_modules(*members)
    base = _mlp()
    x = torch.randn(3, 4, 3)

    def call(td, x):
        with td.to_module(base):
            return base(x)

    out = torch.vmap(call)(params, x)
    assert torch.allclose(out, torch.stack([member(xi) for member, xi in zip(members, x)]), atol=1e-6)


def test_batchnorm_ensemble_in_eval_mode():
    torch.manual_seed(0)
    members = []
    for _ in range(3):
        member = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
        member(torch.randn(16, 3))  # moves the running statistics
        members.append(member.eval())
    params = TensorDict.from_modules(*members)
    assert params["1", "running_mean"].shape == (3, 4)
    base = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)).eval()
    x = torch.randn(6, 3)

    def call(td, x):
        with td.to_module(base):
            return base(x)

    out = torch.vmap(call, (0, None))(params, x)
    assert torch.allclose(out, torch.stack([member(x) for member in members]), atol=1e-5)


# -------------------------------------------------------------------------------------- torch.func


def _loss_with(module):
    def loss(params, x, y):
        with params.to_module(module):
            return nn.functional.mse_loss(module(x), y)

    return loss


def test_grad_over_a_params_tensordict_equals_functional_call():
    torch.manual_seed(0)
    module = _mlp()
    x, y = torch.randn(8, 3), torch.randn(8, 2)
    params = TensorDict.from_module(module).apply(lambda t: t.detach())
    grads = torch.func.grad(_loss_with(module))(params, x, y)
    assert type(grads) is TensorDict and grads.batch_size == torch.Size([])
    flat = {name: tensor.detach() for name, tensor in module.named_parameters()}
    expected = torch.func.grad(
        lambda p, x, y: nn.functional.mse_loss(torch.func.functional_call(module, p, (x,)), y))(flat, x, y)
    for name, grad in expected.items():
        assert torch.allclose(grads[tuple(name.split("."))], grad, atol=1e-6), name
    assert all(isinstance(p, nn.Parameter) for p in module.parameters())


def test_per_sample_gradients_with_vmap_of_grad():
    torch.manual_seed(0)
    module = _mlp()
    x, y = torch.randn(4, 3), torch.randn(4, 2)
    params = TensorDict.from_module(module).apply(lambda t: t.detach())
    per_sample = torch.vmap(torch.func.grad(_loss_with(module)), (None, 0, 0))(params, x, y)
    assert per_sample.batch_size == torch.Size([4])
    for index in range(4):
        single = torch.func.grad(_loss_with(module))(params, x[index], y[index])
        for key, grad in single.items(True, True):
            assert torch.allclose(per_sample[key][index], grad, atol=1e-6), key


def test_jacrev_returns_tensordicts():
    module = nn.Linear(3, 2)
    params = TensorDict.from_module(module).apply(lambda t: t.detach())
    x = torch.randn(3)

    def forward(params):
        with params.to_module(module):
            return module(x)

    jacobian = torch.func.jacrev(forward)(params)
    assert jacobian["weight"].shape == (2, 2, 3)
    assert torch.allclose(jacobian["bias"], torch.eye(2))
