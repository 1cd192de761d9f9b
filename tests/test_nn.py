"""from_module / from_modules / to_module / TensorDictParams, stated against plain torch.nn."""
import pytest
import torch
from torch import nn

from torchdict import TensorDict
from torchdict.nn import TensorDictParams


def _mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(3, 5), nn.BatchNorm1d(5))
        self.head = nn.Linear(5, 2, bias=False)
        self.register_buffer("scale", torch.tensor(2.0))

    def forward(self, x):
        return self.head(self.encoder(x)) * self.scale


def _state(module: nn.Module) -> dict:
    """Every parameter/buffer of the module: (object, copy of its value)."""
    named = dict(module.named_parameters(remove_duplicate=False))
    named.update(module.named_buffers(remove_duplicate=False))
    return {name: (tensor, tensor.detach().clone()) for name, tensor in named.items()}


def _assert_unchanged(module: nn.Module, before: dict) -> None:
    after = dict(module.named_parameters(remove_duplicate=False))
    after.update(module.named_buffers(remove_duplicate=False))
    assert after.keys() == before.keys()
    for name, (tensor, value) in before.items():
        assert after[name] is tensor, name
        assert torch.equal(after[name], value), name


def _dotted(key) -> str:
    return key if isinstance(key, str) else ".".join(key)


def _replacement(params: TensorDict, fill: float) -> TensorDict:
    return params.apply(lambda t: torch.full_like(t, fill).detach())


# ------------------------------------------------------------------------------------ from_module


def test_from_module_holds_the_modules_own_objects_nested_by_attribute_name():
    module = Encoder()
    params = TensorDict.from_module(module)
    expected = dict(module.named_parameters())
    expected.update(module.named_buffers())
    got = {_dotted(key): leaf for key, leaf in params.items(True, True)}
    assert got.keys() == expected.keys()
    for name, leaf in got.items():
        assert leaf is expected[name], name
    assert params["encoder", "0", "weight"] is module.encoder[0].weight
    assert type(params["encoder", "0", "weight"]) is nn.Parameter
    # BatchNorm buffers are part of it, bias=False leaves no entry.
    assert set(params["encoder", "1"].keys()) == {
        "weight", "bias", "running_mean", "running_var", "num_batches_tracked"}
    assert set(params["head"].keys()) == {"weight"}
    assert params.batch_size == torch.Size([]) and params["encoder"].batch_size == torch.Size([])
    assert not params.is_locked


def test_from_module_skips_empty_submodules_unless_asked():
    module = _mlp()
    assert list(TensorDict.from_module(module).keys()) == ["0", "2"]
    kept = TensorDict.from_module(module, filter_empty=False)
    assert list(kept.keys()) == ["0", "1", "2"]
    assert list(kept["1"].keys()) == []
    assert list(TensorDict.from_module(nn.ReLU()).keys()) == []


def test_from_module_seed_repr():
    module = nn.Sequential(nn.Linear(3, 4))
    text = repr(TensorDict.from_module(module))
    assert "bias: Parameter(shape=torch.Size([4]), device=cpu, dtype=torch.float32, is_shared=False)" in text
    assert "weight: Parameter(shape=torch.Size([4, 3])" in text


def test_from_module_writes_reach_the_module():
    module = _mlp()
    params = TensorDict.from_module(module)
    with torch.no_grad():
        params.apply_(lambda t: t.zero_())
    for tensor in module.parameters():
        assert (tensor == 0).all()


def test_from_module_data_zero_zeroes_the_module_seed():
    module = nn.Sequential(nn.Linear(3, 4))
    state_dict = TensorDict.from_module(module)
    state_dict.data.zero_()
    assert (module[0].weight == 0).all() and (module[0].bias == 0).all()
    state_dict.to_module(module, inplace=True)
    assert (module[0].weight == 0).all()


def test_from_module_lock():
    params = TensorDict.from_module(_mlp(), lock=True)
    assert params.is_locked and params["0"].is_locked
    with pytest.raises(RuntimeError, match="Cannot modify locked TensorDict"):
        params["new"] = torch.zeros(())


def test_from_module_rejects_non_modules():
    with pytest.raises(TypeError, match="torch.nn.Module"):
        TensorDict.from_module({"weight": torch.zeros(3)})


def test_from_module_use_state_dict_runs_the_hooks():
    module = _mlp()

    def add_entry(mod, state_dict, prefix, local_metadata):
        state_dict[prefix + "extra"] = torch.ones(2)

    module[0]._register_state_dict_hook(add_entry)
    params = TensorDict.from_module(module, use_state_dict=True)
    state = module.state_dict()
    flat = {_dotted(key): leaf for key, leaf in params.items(True, True)}
    assert flat.keys() == state.keys()
    for name, value in state.items():
        assert torch.equal(flat[name], value)
    assert torch.equal(params["0", "extra"], torch.ones(2))
    # Detached (like state_dict()), sharing the storage.
    assert type(params["0", "weight"]) is torch.Tensor
    assert params["0", "weight"].data_ptr() == module[0].weight.data_ptr()


def test_from_module_as_module():
    module = Encoder()
    params = TensorDict.from_module(module, as_module=True)
    assert isinstance(params, TensorDictParams) and isinstance(params, nn.Module)
    names = {name: tensor for name, tensor in params.named_parameters()}
    assert names.keys() == dict(module.named_parameters()).keys()
    for name, tensor in module.named_parameters():
        assert names[name] is tensor
    buffers = dict(params.named_buffers())
    assert buffers["encoder.1.running_mean"] is module.encoder[1].running_mean
    assert params.state_dict().keys() == module.state_dict().keys()
    # TensorDict behaviour on top of the module.
    assert params["encoder", "0", "weight"] is module.encoder[0].weight
    assert params.batch_size == torch.Size([])
    assert set(params.keys()) == {"encoder", "head", "scale"}
    # An optimizer sees the parameters.
    assert len(list(params.parameters())) == len(list(module.parameters()))


def test_tensordict_params_converts_plain_tensors_unless_told_not_to():
    def make():
        return TensorDict({"w": torch.randn(3), "steps": torch.zeros((), dtype=torch.long), "sub": {"b": torch.ones(2)}})
    td = make()
    storage = td["w"].data_ptr()
    converted = TensorDictParams(td)
    assert isinstance(converted.w, nn.Parameter) and converted.w.data_ptr() == storage
    assert "steps" in dict(converted.named_buffers())  # integer tensors can't be parameters
    assert isinstance(converted["sub", "b"], nn.Parameter)
    td = make()
    kept = TensorDictParams(td, no_convert=True)
    assert dict(kept.named_parameters()) == {}
    assert kept.w is td["w"]
    locked = TensorDictParams(make(), lock=True)
    assert locked.is_locked


def test_tensordict_params_to_module_and_from_module_round_trip():
    source, target = _mlp(0), _mlp(1)
    params = TensorDict.from_module(source, as_module=True)
    with params.to_module(target):
        for (name, mine), theirs in zip(target.named_parameters(), source.parameters()):
            assert mine is theirs, name
    again = TensorDict.from_module(params)
    assert again["0", "weight"] is source[0].weight


# ----------------------------------------------------------------------------------- from_modules


def test_from_modules_stacks_like_torch_stack():
    modules = [Encoder() for _ in range(3)]
    params = TensorDict.from_modules(*modules)
    assert params.batch_size == torch.Size([3])
    assert params["encoder"].batch_size == torch.Size([3])
    for key, leaf in params.items(True, True):
        members = [TensorDict.from_module(module)[key] for module in modules]
        assert torch.equal(leaf, torch.stack(members)), key
        assert type(leaf) is type(members[0]), key
        assert leaf.requires_grad == members[0].requires_grad, key
    assert params.is_locked  # upstream's default for from_modules
    assert not TensorDict.from_modules(*modules, lock=False).is_locked


def test_from_modules_gradients_reach_the_stack_not_the_modules():
    modules = [nn.Linear(3, 2) for _ in range(2)]
    params = TensorDict.from_modules(*modules)
    params["weight"].sum().backward()
    assert params["weight"].grad is not None and params["weight"].is_leaf
    assert modules[0].weight.grad is None


def test_from_modules_expand_identical_shares_the_tensor():
    shared = nn.Linear(3, 2)
    modules = [nn.Sequential(shared, nn.Linear(2, 2)) for _ in range(3)]
    params = TensorDict.from_modules(*modules, expand_identical=True)
    weight = params["0", "weight"]
    assert weight.shape == (3, 2, 3) and weight.stride(0) == 0
    assert torch.equal(weight[1], shared.weight)
    assert params["1", "weight"].stride(0) != 0


def test_from_modules_errors():
    with pytest.raises(ValueError, match="at least one module"):
        TensorDict.from_modules()
    with pytest.raises(KeyError, match="module 1 does not have the structure of module 0"):
        TensorDict.from_modules(nn.Linear(3, 2), nn.Linear(3, 2, bias=False))
    with pytest.raises(RuntimeError, match="'weight', whose shapes differ between modules"):
        TensorDict.from_modules(nn.Linear(3, 2), nn.Linear(4, 2))
    with pytest.raises(TypeError, match="torch.nn.Module"):
        TensorDict.from_modules(nn.Linear(3, 2), "not a module")


def test_from_modules_as_module():
    modules = [nn.Linear(3, 2) for _ in range(4)]
    params = TensorDict.from_modules(*modules, as_module=True)
    assert isinstance(params, TensorDictParams)
    assert params.batch_size == torch.Size([4])
    assert params.weight.shape == (4, 2, 3) and isinstance(params.weight, nn.Parameter)


# ------------------------------------------------------------------------------ to_module (swap)


def test_to_module_swaps_values_in_and_returns_the_old_ones():
    module = Encoder()
    originals = TensorDict.from_module(module)
    new = _replacement(originals, 0.5)
    old = new.to_module(module)
    for key, leaf in new.items(True, True):
        assert old[key] is originals[key], key
    assert module.encoder[0].weight is new["encoder", "0", "weight"]
    assert module.encoder[1].running_mean is new["encoder", "1", "running_mean"]
    # A plain tensor stays a plain tensor: no new Parameter wraps it.
    assert type(module.head.weight) is torch.Tensor
    # The swapped values are used by forward.
    out = module.eval()(torch.ones(2, 3))
    expected = torch.func.functional_call(
        module, {_dotted(key): leaf for key, leaf in new.items(True, True)}, (torch.ones(2, 3),))
    assert torch.equal(out, expected)
    # Swapping the old values back restores the exact objects.
    old.to_module(module)
    for key, leaf in originals.items(True, True):
        assert TensorDict.from_module(module)[key] is leaf


def test_to_module_keeps_parameters_parameters():
    source, target = _mlp(0), _mlp(1)
    TensorDict.from_module(source).to_module(target)
    assert target[0].weight is source[0].weight
    assert isinstance(target[0].weight, nn.Parameter)
    assert [name for name, _ in target.named_parameters()] == ["0.weight", "0.bias", "2.weight", "2.bias"]


def test_to_module_as_context_manager_restores():
    module = _mlp()
    before = _state(module)
    zeros = _replacement(TensorDict.from_module(module), 0.0)
    with zeros.to_module(module) as swapped:
        assert (module(torch.randn(5, 3)) == 0).all()
        assert swapped["0", "weight"] is before["0.weight"][0]
    _assert_unchanged(module, before)


def test_to_module_context_manager_restores_when_the_block_raises():
    module = _mlp()
    before = _state(module)
    zeros = _replacement(TensorDict.from_module(module), 0.0)
    with pytest.raises(ZeroDivisionError):
        with zeros.to_module(module):
            assert module[0].weight is zeros["0", "weight"]
            1 / 0
    _assert_unchanged(module, before)


def test_to_module_nested_context_managers_unwind_in_order():
    module = _mlp()
    before = _state(module)
    ones, twos = (_replacement(TensorDict.from_module(module), fill) for fill in (1.0, 2.0))
    with ones.to_module(module):
        with twos.to_module(module):
            assert module[0].weight is twos["0", "weight"]
        assert module[0].weight is ones["0", "weight"]
    _assert_unchanged(module, before)


def test_gradients_reach_the_swapped_in_leaves():
    module = _mlp()
    x = torch.randn(6, 3)
    params = TensorDict.from_module(module).apply(lambda t: t.detach().clone().requires_grad_())
    with params.to_module(module):
        module(x).pow(2).sum().backward()
    flat = {_dotted(key): leaf.detach().clone().requires_grad_() for key, leaf in params.items(True, True)}
    torch.func.functional_call(module, flat, (x,)).pow(2).sum().backward()
    for key, leaf in params.items(True, True):
        assert torch.allclose(leaf.grad, flat[_dotted(key)].grad), key
    assert all(p.grad is None for p in module.parameters())


def test_to_module_missing_key_names_key_and_module_path_and_changes_nothing():
    module = Encoder()
    before = _state(module)
    params = _replacement(TensorDict.from_module(module), 3.0)
    params["encoder", "1", "zz"] = torch.zeros(())  # after keys that would be swapped first
    with pytest.raises(KeyError, match=r"'zz' not found in module 'encoder\.1' \(BatchNorm1d\)"):
        params.to_module(module)
    _assert_unchanged(module, before)
    with pytest.raises(KeyError, match=r"'zz' not found in module '<root>' \(Linear\)"):
        TensorDict(zz=torch.zeros(2)).to_module(nn.Linear(2, 2))


def test_to_module_shape_mismatch_is_clear_and_changes_nothing():
    module = _mlp()
    before = _state(module)
    params = _replacement(TensorDict.from_module(module), 3.0)
    params["2", "bias"] = torch.zeros(7)
    with pytest.raises(RuntimeError, match=r"Shape mismatch for 'bias' of module '2' \(Linear\).*\(2,\).*\(7,\)"):
        params.to_module(module)
    _assert_unchanged(module, before)
    stacked = TensorDict.from_modules(_mlp(), _mlp())
    with pytest.raises(RuntimeError, match="torch.vmap"):
        stacked.to_module(module)
    _assert_unchanged(module, before)


def test_to_module_structure_mismatch_errors():
    module = _mlp()
    before = _state(module)
    with pytest.raises(TypeError, match="'0' is a submodule"):
        TensorDict({"0": torch.zeros(3)}).to_module(module)
    with pytest.raises(TypeError, match="'weight' is a parameter or buffer"):
        TensorDict({"0": {"weight": {"x": torch.zeros(3)}}}).to_module(module)
    with pytest.raises(TypeError, match="non-tensor data"):
        TensorDict({"0": {"weight": "text"}}).to_module(module)
    with pytest.raises(TypeError, match="torch.nn.Module"):
        TensorDict().to_module(object())
    _assert_unchanged(module, before)


def test_to_module_return_swap_false_and_swap_dest():
    module = _mlp()
    originals = TensorDict.from_module(module)
    new = _replacement(originals, 1.0)
    assert new.to_module(module, return_swap=False) is None
    assert module[0].weight is new["0", "weight"]
    dest = TensorDict(other=torch.zeros(()))
    result = originals.to_module(module, swap_dest=dest)
    assert result is dest
    assert dest["0", "weight"] is new["0", "weight"] and "other" in dest.keys()
    assert module[0].weight is originals["0", "weight"]


def test_to_module_partial_tensordict_only_touches_its_keys():
    module = _mlp()
    before = _state(module)
    part = TensorDict({"2": {"bias": torch.zeros(2)}})
    with part.to_module(module):
        assert module[2].bias is part["2", "bias"]
        assert module[0].weight is before["0.weight"][0]
    _assert_unchanged(module, before)


def test_to_module_shared_submodule_is_swapped_once_and_restored():
    shared = nn.Linear(2, 2)
    module = nn.Sequential(shared, nn.ReLU(), shared)
    before = _state(module)
    params = TensorDict.from_module(module)
    assert set(params.keys()) == {"0", "2"}
    new = _replacement(params, 1.0)
    with new.to_module(module) as old:
        assert shared.weight is new["0", "weight"]
        assert old["0", "weight"] is before["0.weight"][0]
        assert old["2", "weight"] is before["0.weight"][0]
    _assert_unchanged(module, before)


def test_to_module_into_lazy_module():
    lazy = nn.LazyLinear(4)
    params = TensorDict({"weight": torch.ones(4, 3), "bias": torch.zeros(4)})
    with params.to_module(lazy):
        assert torch.equal(lazy(torch.ones(1, 3)), torch.full((1, 4), 3.0))


def test_to_module_batchnorm_buffers_follow_the_tensordict():
    bn = nn.BatchNorm1d(3)
    before = _state(bn)
    stats = TensorDict.from_module(bn).apply(lambda t: t.detach().clone())
    x = torch.randn(8, 3) * 4 + 1
    with stats.to_module(bn):
        bn(x)  # training mode: running stats are updated in place
    _assert_unchanged(bn, before)
    expected = nn.BatchNorm1d(3)
    expected(x)
    assert torch.allclose(stats["running_mean"], expected.running_mean)
    assert torch.allclose(stats["running_var"], expected.running_var)
    assert stats["num_batches_tracked"] == 1


# ---------------------------------------------------------------------------- to_module (inplace)


def test_to_module_inplace_copies_and_keeps_identity():
    module = _mlp()
    objects = {name: tensor for name, tensor in module.named_parameters()}
    values = {name: tensor.detach().clone() for name, tensor in objects.items()}
    new = _replacement(TensorDict.from_module(module), 2.0)
    old = new.to_module(module, inplace=True, non_blocking=True)
    for name, tensor in module.named_parameters():
        assert tensor is objects[name]
        assert (tensor == 2.0).all()
        assert torch.equal(old[tuple(name.split("."))], values[name])
        assert old[tuple(name.split("."))] is not tensor


def test_to_module_inplace_context_manager_copies_back():
    module = _mlp()
    before = _state(module)
    new = _replacement(TensorDict.from_module(module), 2.0)
    with pytest.raises(ValueError, match="inside"):
        with new.to_module(module, inplace=True):
            assert (module[0].weight == 2.0).all()
            raise ValueError("inside")
    _assert_unchanged(module, before)


def test_to_module_inplace_checks_everything_first():
    module = _mlp()
    before = _state(module)
    new = _replacement(TensorDict.from_module(module), 2.0)
    new["2", "weight"] = torch.zeros(9, 9)
    with pytest.raises(RuntimeError, match="Shape mismatch for 'weight' of module '2'"):
        new.to_module(module, inplace=True)
    _assert_unchanged(module, before)
    with pytest.raises(KeyError, match="'nope' not found"):
        TensorDict(nope=torch.zeros(1)).to_module(module, inplace=True)
    with pytest.raises(ValueError, match="holds None"):
        TensorDict(bias=torch.zeros(2)).to_module(nn.Linear(3, 2, bias=False), inplace=True)
    _assert_unchanged(module, before)


# ---------------------------------------------------------------------- to_module (use_state_dict)


def test_to_module_use_state_dict_runs_load_hooks_and_restores():
    module = _mlp()
    before = _state(module)
    calls = []
    module.register_load_state_dict_pre_hook(lambda *args, **kwargs: calls.append(args[1]))
    new = _replacement(TensorDict.from_module(module), 4.0)
    with new.to_module(module, use_state_dict=True) as old:
        assert calls
        assert (module[0].weight == 4.0).all()
        assert isinstance(module[0].weight, nn.Parameter)
        assert old["0", "weight"] is before["0.weight"][0]
    assert all(torch.equal(tensor, before[name][1]) for name, tensor in module.state_dict().items())


def test_to_module_use_state_dict_inplace_and_errors():
    module = _mlp()
    before = _state(module)
    new = _replacement(TensorDict.from_module(module), 4.0)
    new.to_module(module, use_state_dict=True, inplace=True)
    assert module[0].weight is before["0.weight"][0] and (module[0].weight == 4.0).all()
    module = _mlp()
    before = _state(module)
    with pytest.raises(KeyError, match="zz"):
        TensorDict({"0": {"zz": torch.zeros(1)}}).to_module(module, use_state_dict=True)
    with pytest.raises(RuntimeError, match="Shape mismatch for '0.bias'"):
        TensorDict({"0": {"weight": torch.zeros(4, 3), "bias": torch.zeros(5)}}).to_module(
            module, use_state_dict=True)
    _assert_unchanged(module, before)
