"""torchdict.nn.distributions against upstream tensordict.nn.distributions: same inputs and seeds, same results."""
from __future__ import annotations

import math
import uuid
import warnings

import pytest
import torch
from torch import distributions as D

import tensordict
import tensordict.nn.distributions as up
import tensordict.nn.distributions.truncated_normal as up_tn
import torchdict
import torchdict.nn.distributions as td
import torchdict.nn.distributions.truncated_normal as td_tn
from torchdict.nn.distributions import utils as td_utils
from tensordict.nn import utils as up_utils
from torchdict.nn.probabilistic import set_composite_lp_aggregate as td_aggregate
from tensordict.nn import set_composite_lp_aggregate as up_aggregate

BATCHES = [(), (3,), (2, 3), (2, 1, 3)]


def close(a, b):
    torch.testing.assert_close(a, b, equal_nan=True)


def leaves(data):
    """{flat key tuple: tensor} of a TensorDict (upstream's or ours)."""
    out = {}
    for key, value in data.items(True, True):
        out[key if isinstance(key, tuple) else (key,)] = value
    return out


def assert_same_td(theirs, ours):
    assert tuple(theirs.batch_size) == tuple(ours.batch_size)
    a, b = leaves(theirs), leaves(ours)
    assert set(a) == set(b)
    for key in a:
        close(a[key], b[key])


def seeded(fn, seed=0):
    torch.manual_seed(seed)
    return fn()


def raises_same(call_up, call_td):
    with pytest.raises(Exception) as theirs:
        call_up()
    with pytest.raises(type(theirs.value)):
        call_td()
    return theirs.value


# ---------------------------------------------------------------------------------------------- names


def test_public_names_match_upstream():
    public = lambda module: sorted(n for n in dir(module) if not n.startswith("_"))  # noqa: E731
    expected = {n for n in public(up) if n != "deprecated_attributes"}
    assert expected <= set(public(td))
    assert sorted(up.__all__) == sorted(td.__all__)


def test_distributions_maps_is_deprecated_and_equal():
    with pytest.warns(DeprecationWarning):
        ours = td.distributions_maps
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = up.distributions_maps
    assert sorted(ours) == sorted(theirs)
    assert all(ours[name].__name__ == theirs[name].__name__ for name in ours)
    with pytest.raises(AttributeError):
        td.not_a_name  # noqa: B018


def test_truncated_normal_constants_are_deprecated():
    for name in ("CONST_SQRT_2", "CONST_INV_SQRT_2PI", "CONST_INV_SQRT_2", "CONST_LOG_INV_SQRT_2PI",
                 "CONST_LOG_SQRT_2PI_E"):
        with pytest.warns(DeprecationWarning):
            ours = getattr(td_tn, name)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert ours == getattr(up_tn, name)


# ---------------------------------------------------------------------------------------------- mappings


@pytest.mark.parametrize("key", ["softplus", "exp", "relu", "biased_softplus", "none", "expln",
                                 "biased_softplus_2.0", "biased_softplus_0.5_0.1", "biased_softplus_3_-0.5"])
def test_mappings_match(key):
    x = torch.linspace(-5, 5, 23)
    close(up_utils.mappings(key)(x), td_utils.mappings(key)(x))
    close(up.mappings(key)(x), td.mappings(key)(x))


@pytest.mark.parametrize("key", ["nope", "biased_softplus_1_2_3", "biased_softplus_a"])
def test_mappings_errors_match(key):
    raises_same(lambda: up_utils.mappings(key), lambda: td_utils.mappings(key))


def test_add_custom_mapping():
    name = f"custom_{uuid.uuid4().hex}"
    td.add_custom_mapping(name, lambda x: x * 3)
    assert td.mappings(name)(torch.ones(2)).tolist() == [3.0, 3.0]
    with pytest.raises(NotImplementedError):
        up.mappings(name)  # registries are separate
    extractor = td.NormalParamExtractor(scale_mapping=name, scale_lb=0.0)
    assert extractor(torch.ones(4))[1].tolist() == [3.0, 3.0]


@pytest.mark.parametrize("bias", [0.5, 1.0, 3.0, -1.0, 0.0, torch.tensor([0.1, 2.0])])
def test_inv_softplus(bias):
    theirs, ours = up_utils.inv_softplus(bias), td_utils.inv_softplus(bias)
    assert type(theirs) is type(ours)
    if isinstance(ours, torch.Tensor):
        close(theirs, ours)
    else:
        assert theirs == ours


@pytest.mark.parametrize("bias,min_val", [(1.0, 0.01), (2.0, 0.1), (0.5, 0.0)])
def test_biased_softplus(bias, min_val):
    x = torch.randn(7)
    close(up_utils.biased_softplus(bias, min_val)(x), td_utils.biased_softplus(bias, min_val)(x))
    assert td_utils.biased_softplus(bias, min_val).bias == up_utils.biased_softplus(bias, min_val).bias


def test_expln_values_grad_and_vmap():
    x = torch.tensor([-30.0, -1.0, 0.0, 1e-3, 1.0, 50.0, float("nan")])
    close(up_utils.expln(x), td_utils.expln(x))
    leaf = x[:-1].clone().requires_grad_()
    td_utils.expln(leaf).sum().backward()
    expected = torch.where(leaf <= 0, leaf.exp(), 1 / (1 + leaf)).detach()
    close(leaf.grad, expected)
    batched = torch.randn(4, 3)
    close(torch.vmap(td_utils.expln)(batched), up_utils.expln(batched))


# ---------------------------------------------------------------------------------------------- continuous


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("size", [2, 5, 8])
@pytest.mark.parametrize("mapping,lb", [("biased_softplus_1.0", 1e-4), ("exp", 0.5), ("relu", 0.0)])
def test_normal_param_extractor(batch, size, mapping, lb):
    x = torch.randn(*batch, size)
    extra = torch.randn(2)
    theirs = up.NormalParamExtractor(mapping, lb)(x, extra)
    ours = td.NormalParamExtractor(mapping, lb)(x, extra)
    assert len(theirs) == len(ours) == 3
    for a, b in zip(theirs, ours):
        close(a, b)


@pytest.mark.parametrize("scale_shape,loc_shape", [(None, (3, 4)), (4, (3, 4)), ((2, 4), (5, 2, 4)), (4, (4,))])
@pytest.mark.parametrize("make_param", [True, False])
def test_add_state_independent_normal_scale(scale_shape, loc_shape, make_param):
    kwargs = dict(scale_mapping="softplus", scale_lb=0.2, make_param=make_param, init_value=-1.0)
    theirs = up.AddStateIndependentNormalScale(scale_shape, **kwargs)
    ours = td.AddStateIndependentNormalScale(scale_shape, **kwargs)
    assert list(theirs.state_dict()) == list(ours.state_dict())
    assert len(list(theirs.parameters())) == len(list(ours.parameters()))
    loc = torch.randn(loc_shape)
    for a, b in zip(theirs(loc, loc), ours(loc, loc)):
        close(a, b)


def test_add_state_independent_normal_scale_shape_error():
    raises_same(lambda: up.AddStateIndependentNormalScale(3)(torch.zeros(2, 4)),
                lambda: td.AddStateIndependentNormalScale(3)(torch.zeros(2, 4)))


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("event", [(), (2,)])
def test_delta(batch, event):
    param = torch.randn((*batch, *event))
    shapes = dict(batch_shape=torch.Size(batch), event_shape=torch.Size(event)) if event else {}
    theirs, ours = up.Delta(param, **shapes), td.Delta(param, **shapes)
    assert theirs.batch_shape == ours.batch_shape and theirs.event_shape == ours.event_shape
    near = param + 1e-8
    far = param.clone()
    if far.numel():
        far.view(-1)[0] += 1
    for value in (param, near, far):
        close(theirs.log_prob(value), ours.log_prob(value))
    for attr in ("mode", "mean", "deterministic_sample"):
        close(getattr(theirs, attr), getattr(ours, attr))
    close(theirs.sample((4,)), ours.sample((4,)))


@pytest.mark.parametrize("batch", BATCHES)
def test_delta_multi_dim_event_reduces_the_event_dims(batch):
    # Upstream reduces the wrong dims for events of 2+ dims (a deliberate difference): check against torch.
    param = torch.randn((*batch, 2, 3))
    dist = td.Delta(param, batch_shape=torch.Size(batch), event_shape=torch.Size([2, 3]))
    far = param.clone()
    far[..., 1, 2] += 1
    if batch:
        far[(0,) * len(batch)] = param[(0,) * len(batch)]
    expected = torch.where((far == param).flatten(-2).all(-1), torch.tensor(float("inf")), torch.tensor(-float("inf")))
    close(dist.log_prob(far), expected)
    assert dist.log_prob(param).shape == torch.Size(batch)
    assert torch.isinf(dist.log_prob(param)).all() and (dist.log_prob(param) > 0).all()


def test_delta_sample_and_rsample_grad():
    param = torch.randn(3, requires_grad=True)
    assert td.Delta(param).sample().requires_grad == up.Delta(param).sample().requires_grad
    dist = td.Delta(param)
    dist.rsample((2,)).sum().backward()
    close(param.grad, torch.full((3,), 2.0))
    dist.update(torch.zeros(3))
    assert dist.mean.tolist() == [0.0, 0.0, 0.0]


def test_delta_integer_log_prob_fails_like_upstream():
    raises_same(lambda: up.Delta(torch.tensor([1, 2])).log_prob(torch.tensor([1, 2])),
                lambda: td.Delta(torch.tensor([1, 2])).log_prob(torch.tensor([1, 2])))


# ---------------------------------------------------------------------------------------------- discrete


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("seed", [0, 1])
def test_rand_one_hot(batch, seed):
    values = torch.randn(*batch, 5)
    assert torch.equal(seeded(lambda: up.rand_one_hot(values), seed), seeded(lambda: td.rand_one_hot(values), seed))
    probs = values.softmax(-1)
    assert torch.equal(seeded(lambda: up.rand_one_hot(probs, False), seed),
                       seeded(lambda: td.rand_one_hot(probs, False), seed))


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("use_probs", [False, True])
def test_one_hot_categorical(batch, use_probs):
    logits = torch.randn(*batch, 4)
    kwargs = {"probs": logits.softmax(-1)} if use_probs else {"logits": logits}
    theirs, ours = up.OneHotCategorical(**kwargs), td.OneHotCategorical(**kwargs)
    assert theirs.batch_shape == ours.batch_shape
    for shape in [(), (3,), None]:
        a = seeded(lambda: theirs.sample(shape))
        b = seeded(lambda: ours.sample(shape))
        assert a.dtype == b.dtype and torch.equal(a, b)
        close(theirs.log_prob(a), ours.log_prob(b))
    assert torch.equal(theirs.mode, ours.mode) and theirs.mode.dtype == ours.mode.dtype
    assert torch.equal(theirs.deterministic_sample, ours.deterministic_sample)
    close(theirs.entropy(), ours.entropy())


def test_one_hot_categorical_ties_and_singleton_dim():
    logits = torch.tensor([[1.0, 3.0, 3.0], [0.0, 0.0, 0.0]])
    assert torch.equal(up.OneHotCategorical(logits=logits).mode, td.OneHotCategorical(logits=logits).mode)
    squeezed = torch.randn(3, 1)
    assert up.OneHotCategorical(logits=squeezed).batch_shape == td.OneHotCategorical(logits=squeezed).batch_shape


def test_one_hot_categorical_rsample_straight_through():
    logits = torch.randn(2, 5)
    weights = torch.randn(2, 5)
    theirs = seeded(lambda: up.OneHotCategorical(logits=logits).rsample((4,)), 3)
    leaf = logits.clone().requires_grad_()
    ours = seeded(lambda: td.OneHotCategorical(logits=leaf).rsample((4,)), 3)
    assert torch.equal(theirs.detach(), ours.detach())
    assert set(ours.unique().tolist()) <= {0.0, 1.0} and ours.sum(-1).eq(1).all()
    (ours * weights).sum().backward()
    # The gradient is the relaxed sample's (upstream's differs: a deliberate difference, see docs).
    relaxed_leaf = logits.clone().requires_grad_()
    relaxed = seeded(lambda: D.RelaxedOneHotCategorical(1.0, logits=relaxed_leaf).rsample((4,)), 3)
    (relaxed * weights).sum().backward()
    close(leaf.grad, relaxed_leaf.grad)


def test_one_hot_categorical_rsample_under_vmap():
    logits = torch.randn(3, 4)
    out = torch.vmap(lambda l: td.OneHotCategorical(logits=l).rsample(), randomness="different")(logits)  # noqa: E741
    assert out.shape == (3, 4) and out.sum(-1).eq(1).all()


# ---------------------------------------------------------------------------------------------- truncated normal


def _tn_args(batch):
    torch.manual_seed(7)
    loc = torch.randn(batch)
    scale = torch.rand(batch) + 0.1
    return loc, scale


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("bounds", [(-1.0, 1.0), (0.5, 3.0), (-float("inf"), 0.0), (-2.0, float("inf")), (-9.0, -8.0)])
def test_truncated_normal(batch, bounds):
    loc, scale = _tn_args(batch)
    a, b = bounds
    theirs, ours = up.TruncatedNormal(loc, scale, a, b), td.TruncatedNormal(loc, scale, a, b)
    assert theirs.batch_shape == ours.batch_shape
    for attr in ("mean", "variance", "auc"):
        close(getattr(theirs, attr), getattr(ours, attr))
    close(theirs.entropy(), ours.entropy())
    sample_t = seeded(lambda: theirs.rsample((5,)))
    sample_o = seeded(lambda: ours.rsample((5,)))
    close(sample_t, sample_o)
    assert (sample_o >= a).all() and (sample_o <= b).all()
    close(theirs.log_prob(sample_t), ours.log_prob(sample_o))
    close(theirs.cdf(sample_t), ours.cdf(sample_o))
    p = torch.rand(batch)
    close(theirs.icdf(p), ours.icdf(p))
    close(seeded(lambda: theirs.sample()), seeded(lambda: ours.sample()))


@pytest.mark.parametrize("batch", BATCHES)
def test_truncated_standard_normal(batch):
    a = -torch.rand(batch) - 0.1
    b = torch.rand(batch) + 0.1
    theirs, ours = up_tn.TruncatedStandardNormal(a, b), td_tn.TruncatedStandardNormal(a, b)
    for attr in ("mean", "variance", "auc"):
        close(getattr(theirs, attr), getattr(ours, attr))
    close(theirs.entropy(), ours.entropy())
    close(seeded(lambda: theirs.rsample((3,))), seeded(lambda: ours.rsample((3,))))
    value = torch.zeros(batch)
    close(theirs.log_prob(value), ours.log_prob(value))
    close(theirs.cdf(value), ours.cdf(value))
    assert up_tn.TruncatedStandardNormal(-1.0, 1.0).batch_shape == td_tn.TruncatedStandardNormal(-1.0, 1.0).batch_shape


@pytest.mark.parametrize("args", [
    (0.0, 1.0, 1.0, 1.0),
    (0.0, 1.0, 2.0, 1.0),
    (torch.zeros(2), torch.ones(2), torch.tensor([0.0, 1.0]), torch.tensor([1.0, 0.5])),
])
def test_truncated_normal_bad_range(args):
    raises_same(lambda: up.TruncatedNormal(*args), lambda: td.TruncatedNormal(*args))


def test_truncated_bounds_dtype_mismatch():
    raises_same(lambda: up_tn.TruncatedStandardNormal(torch.zeros(2), torch.ones(2, dtype=torch.float64)),
                lambda: td_tn.TruncatedStandardNormal(torch.zeros(2), torch.ones(2, dtype=torch.float64)))


def test_truncated_normal_validation_out_of_support():
    raises_same(lambda: up.TruncatedNormal(0.0, 1.0, -1.0, 1.0, validate_args=True).log_prob(torch.tensor(2.0)),
                lambda: td.TruncatedNormal(0.0, 1.0, -1.0, 1.0, validate_args=True).log_prob(torch.tensor(2.0)))
    raises_same(lambda: up.TruncatedNormal(0.0, 1.0, -1.0, 1.0, validate_args=True).cdf(torch.tensor(-2.0)),
                lambda: td.TruncatedNormal(0.0, 1.0, -1.0, 1.0, validate_args=True).cdf(torch.tensor(-2.0)))
    # without validation, no error and the same (unnormalized) value
    close(up.TruncatedNormal(0.0, 1.0, -1.0, 1.0, validate_args=False).log_prob(torch.tensor(2.0)),
          td.TruncatedNormal(0.0, 1.0, -1.0, 1.0, validate_args=False).log_prob(torch.tensor(2.0)))


def test_truncated_normal_rsample_gradients_match():
    grads = []
    for lib in (up, td):
        loc = torch.tensor([0.2, -0.4, 2.5], requires_grad=True)
        scale = torch.tensor([0.5, 1.0, 0.3], requires_grad=True)
        torch.manual_seed(11)
        sample = lib.TruncatedNormal(loc, scale, -1.0, 1.0).rsample((6,))
        sample.pow(2).sum().backward()
        grads.append((loc.grad, scale.grad))
    close(grads[0][0], grads[1][0])
    close(grads[0][1], grads[1][1])


def test_truncated_normal_log_prob_under_vmap():
    locs = torch.randn(4, 3)
    value = torch.zeros(3)

    def score(loc):
        return td.TruncatedNormal(loc, torch.ones(3), -2.0, 2.0, validate_args=False).log_prob(value)

    expected = torch.stack([up.TruncatedNormal(loc, torch.ones(3), -2.0, 2.0).log_prob(value) for loc in locs])
    close(torch.vmap(score)(locs), expected)


# ---------------------------------------------------------------------------------------------- composite


def _params(lib, batch):
    torch.manual_seed(5)
    return lib.TensorDict({
        "cont": {"loc": torch.randn(*batch, 4), "scale": torch.rand(*batch, 4) + 0.1},
        ("nested", "disc"): {"logits": torch.randn(*batch, 6)},
        "bern": {"probs": torch.rand(batch)},
    }, list(batch))


DIST_MAP = {"cont": D.Normal, ("nested", "disc"): D.Categorical, "bern": D.Bernoulli}


def _pair(batch, **kwargs):
    theirs = up.CompositeDistribution(_params(tensordict, batch), dict(DIST_MAP), **kwargs)
    ours = td.CompositeDistribution(_params(torchdict, batch), dict(DIST_MAP), **kwargs)
    return theirs, ours


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("shape", [None, (), (2,), (2, 3)])
def test_composite_sample_and_values(batch, shape):
    theirs, ours = _pair(batch)
    assert theirs.batch_shape == ours.batch_shape and theirs.event_shape == ours.event_shape
    assert list(theirs.keys()) == list(ours.keys()) and len(theirs) == len(ours)
    assert_same_td(seeded(lambda: theirs.sample(shape)), seeded(lambda: ours.sample(shape)))
    for attr in ("mode", "mean", "deterministic_sample"):
        assert_same_td(getattr(theirs, attr), getattr(ours, attr))


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("aggregate", [False, True])
def test_composite_log_prob_and_entropy(batch, aggregate):
    theirs, ours = _pair(batch)
    sample_t = seeded(lambda: theirs.sample((2,)))
    sample_o = seeded(lambda: ours.sample((2,)))
    with up_aggregate(aggregate), td_aggregate(aggregate):
        for name in ("log_prob",):
            a, b = getattr(theirs, name)(sample_t.clone()), getattr(ours, name)(sample_o.clone())
            if aggregate:
                close(a, b)
            else:
                assert_same_td(a, b)
        a, b = theirs.entropy(), ours.entropy()
        if aggregate:
            close(a, b)
        else:
            assert_same_td(a, b)
        for include_sum in (None, True, False):
            assert_same_td(theirs.log_prob_composite(sample_t.clone(), include_sum=include_sum),
                           ours.log_prob_composite(sample_o.clone(), include_sum=include_sum))
            assert_same_td(theirs.entropy_composite(include_sum=include_sum),
                           ours.entropy_composite(include_sum=include_sum))


def test_composite_log_prob_composite_writes_into_sample_when_aggregating():
    _, ours = _pair((3,))
    sample = ours.sample()
    with td_aggregate(True):
        out = ours.log_prob_composite(sample)
    assert out is sample and "sample_log_prob" in sample.keys()
    out = ours.log_prob_composite(sample.select("cont", "nested", "bern"))
    assert "cont" not in out.keys()


@pytest.mark.parametrize("reparameterized", [False, True])
@pytest.mark.parametrize("aggregate", [False, True])
def test_composite_sample_and_log_prob(reparameterized, aggregate):
    dmap = {"a": D.Normal, ("n", "b"): D.Normal}
    params = lambda lib: lib.TensorDict({"a": {"loc": torch.zeros(3), "scale": torch.ones(3)},  # noqa: E731
                                         ("n", "b"): {"loc": torch.ones(3, 2), "scale": torch.ones(3, 2)}}, [3])
    theirs = up.CompositeDistribution(params(tensordict), dmap)
    ours = td.CompositeDistribution(params(torchdict), dmap)
    name = "rsample_and_log_prob" if reparameterized else "sample_and_log_prob"
    with up_aggregate(aggregate), td_aggregate(aggregate):
        s_t, lp_t = seeded(lambda: getattr(theirs, name)((2,)))
        s_o, lp_o = seeded(lambda: getattr(ours, name)((2,)))
    assert_same_td(s_t, s_o)
    if aggregate:
        close(lp_t, lp_o)
    else:
        assert_same_td(lp_t, lp_o)


def test_composite_uses_component_joint_method():
    class Scored(D.Normal):
        def sample_and_log_prob(self, shape):
            value = self.sample(shape)
            return value, torch.full_like(value, -7.0)

    params = torchdict.TensorDict({"a": {"loc": torch.zeros(2), "scale": torch.ones(2)}}, [2])
    dist = td.CompositeDistribution(params, {"a": Scored})
    _, lp = dist.sample_and_log_prob()
    assert lp["a_log_prob"].tolist() == [-7.0, -7.0]


def test_composite_name_map_extra_kwargs_and_keys():
    dmap = {"cont": D.Normal, ("nested", "disc"): D.Categorical}
    name_map = {"cont": ("out", "action"), ("nested", "disc"): "choice"}
    p_t = tensordict.TensorDict({"cont": {"loc": torch.zeros(3)}, ("nested", "disc"): {"logits": torch.zeros(3, 2)}}, [3])
    p_o = torchdict.TensorDict({"cont": {"loc": torch.zeros(3)}, ("nested", "disc"): {"logits": torch.zeros(3, 2)}}, [3])
    extra = {"cont": {"scale": 2.0}}
    theirs = up.CompositeDistribution(p_t, dmap, name_map=name_map, extra_kwargs=extra, log_prob_key="lp",
                                      entropy_key=("e", "sum"))
    ours = td.CompositeDistribution(p_o, dmap, name_map=name_map, extra_kwargs=extra, log_prob_key="lp",
                                    entropy_key=("e", "sum"))
    assert list(theirs) == list(ours) == [("out", "action"), "choice"]
    assert ours.log_prob_key == "lp" and ours.entropy_key == ("e", "sum")
    close(theirs[("out", "action")].scale, ours[("out", "action")].scale)
    assert_same_td(seeded(lambda: theirs.sample()), seeded(lambda: ours.sample()))
    assert_same_td(theirs.entropy_composite(include_sum=True), ours.entropy_composite(include_sum=True))
    ours.log_prob_key = None
    assert ours.log_prob_key == "sample_log_prob"
    assert dict(ours.items()).keys() == dict(theirs.items()).keys()
    assert ours.get("missing", 5) == 5


def test_composite_missing_param_and_bad_sample():
    p_t = tensordict.TensorDict({"a": {"loc": torch.zeros(2), "scale": torch.ones(2)}}, [2])
    p_o = torchdict.TensorDict({"a": {"loc": torch.zeros(2), "scale": torch.ones(2)}}, [2])
    raises_same(lambda: up.CompositeDistribution(p_t, {"b": D.Normal}),
                lambda: td.CompositeDistribution(p_o, {"b": D.Normal}))
    theirs, ours = up.CompositeDistribution(p_t, {"a": D.Normal}), td.CompositeDistribution(p_o, {"a": D.Normal})
    raises_same(lambda: theirs.log_prob(torch.zeros(2)), lambda: ours.log_prob(torch.zeros(2)))
    raises_same(lambda: theirs.icdf(tensordict.TensorDict(batch_size=[2])),
                lambda: ours.icdf(torchdict.TensorDict(batch_size=[2])))


def test_composite_cdf_icdf():
    dmap = {"a": D.Normal, ("n", "b"): D.Normal}
    build = lambda lib: lib.TensorDict({"a": {"loc": torch.zeros(2), "scale": torch.ones(2)},  # noqa: E731
                                        ("n", "b"): {"loc": torch.ones(2), "scale": torch.ones(2)}}, [2])
    theirs = up.CompositeDistribution(build(tensordict), dmap)
    ours = td.CompositeDistribution(build(torchdict), dmap)
    s_t = tensordict.TensorDict({"a": torch.tensor([0.0, 1.0]), ("n", "b"): torch.tensor([0.5, 2.0])}, [2])
    s_o = torchdict.TensorDict({"a": torch.tensor([0.0, 1.0]), ("n", "b"): torch.tensor([0.5, 2.0])}, [2])
    assert theirs.cdf(s_t) is s_t and ours.cdf(s_o) is s_o
    assert_same_td(s_t, s_o)
    assert_same_td(theirs.icdf(s_t), ours.icdf(s_o))
    s_t2 = tensordict.TensorDict({"a": torch.tensor([0.0, 1.0]), ("n", "b"): torch.tensor([0.5, 2.0])}, [2])
    s_o2 = torchdict.TensorDict({"a": torch.tensor([0.0, 1.0]), ("n", "b"): torch.tensor([0.5, 2.0])}, [2])
    assert_same_td(theirs.icdf(s_t2), ours.icdf(s_o2))


def test_composite_entropy_monte_carlo_and_deprecated_flag():
    class NoEntropy(D.Normal):
        def entropy(self):
            raise NotImplementedError

    build = lambda lib: lib.TensorDict({"a": {"loc": torch.zeros(3), "scale": torch.ones(3)}}, [3])  # noqa: E731
    theirs = up.CompositeDistribution(build(tensordict), {"a": NoEntropy})
    ours = td.CompositeDistribution(build(torchdict), {"a": NoEntropy})
    assert_same_td(seeded(lambda: theirs.entropy(10)), seeded(lambda: ours.entropy(10)))
    with pytest.warns(DeprecationWarning):
        ours.entropy(aggregate_probabilities=True)


def test_composite_deterministic_sample_fallbacks():
    class Unknown(D.Distribution):
        arg_constraints = {}
        support = D.constraints.real

        def __init__(self, loc):
            self.loc = loc
            super().__init__(loc.shape, validate_args=False)

        @property
        def mean(self):
            return self.loc + 1

    class UnknownNoMean(Unknown):
        @property
        def mean(self):
            raise NotImplementedError

    for cls in (Unknown,):
        build = lambda lib: lib.TensorDict({"a": {"loc": torch.zeros(2)}}, [2])  # noqa: E731
        with pytest.warns(UserWarning, match="deterministic_sample"):
            theirs = up.CompositeDistribution(build(tensordict), {"a": cls}).deterministic_sample
        with pytest.warns(UserWarning, match="deterministic_sample"):
            ours = td.CompositeDistribution(build(torchdict), {"a": cls}).deterministic_sample
        assert_same_td(theirs, ours)
    build = lambda lib: lib.TensorDict({"a": {"loc": torch.zeros(2)}}, [2])  # noqa: E731
    raises_same(lambda: up.CompositeDistribution(build(tensordict), {"a": UnknownNoMean}).deterministic_sample,
                lambda: td.CompositeDistribution(build(torchdict), {"a": UnknownNoMean}).deterministic_sample)


@pytest.mark.parametrize("make", [
    lambda lib: D.LogisticNormal(torch.zeros(2, 3), torch.ones(2, 3)),
    lambda lib: D.Independent(D.LogisticNormal(torch.zeros(2, 3), torch.ones(2, 3)), 1),
    lambda lib: D.RelaxedBernoulli(torch.tensor(0.5), probs=torch.tensor([0.2, 0.9])),
    lambda lib: D.RelaxedOneHotCategorical(torch.tensor(0.5), probs=torch.tensor([[0.2, 0.8], [0.6, 0.4]])),
    lambda lib: D.Independent(D.Normal(torch.zeros(2, 3), torch.ones(2, 3)), 1),
    lambda lib: lib.Delta(torch.ones(2, 3)),
    lambda lib: D.Independent(lib.Delta(torch.ones(2, 3), batch_shape=(2, 3)), 1),
    lambda lib: lib.TruncatedNormal(torch.zeros(2), torch.ones(2), -1.0, 0.5),
    lambda lib: lib.OneHotCategorical(logits=torch.arange(8.0).view(2, 4)),
    lambda lib: D.Poisson(torch.ones(2)),
])
def test_composite_deterministic_sample_registered(make):
    theirs = up.CompositeDistribution.from_distributions(tensordict.TensorDict(batch_size=[2]), {"x": make(up)})
    ours = td.CompositeDistribution.from_distributions(torchdict.TensorDict(batch_size=[2]), {"x": make(td)})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # registered classes fall back without a warning
        assert_same_td(theirs.deterministic_sample, ours.deterministic_sample)


def test_composite_from_distributions_and_repr():
    dists = {"a": D.Normal(torch.zeros(3), torch.ones(3)), ("n", "b"): D.Bernoulli(torch.full((3,), 0.5))}
    theirs = up.CompositeDistribution.from_distributions(tensordict.TensorDict(batch_size=[3]), dists,
                                                         name_map={"a": "x", "zz": "ignored"})
    ours = td.CompositeDistribution.from_distributions(torchdict.TensorDict(batch_size=[3]), dists,
                                                       name_map={"a": "x", "zz": "ignored"})
    assert list(theirs) == list(ours)
    assert repr(theirs) == repr(ours)
    assert_same_td(seeded(lambda: theirs.sample()), seeded(lambda: ours.sample()))
    assert ours.has_rsample is False and theirs.has_rsample is False


def test_composite_rsample_autograd_and_vmap():
    loc = torch.zeros(3, requires_grad=True)
    params = torchdict.TensorDict({"a": {"loc": loc, "scale": torch.ones(3)}}, [3])
    dist = td.CompositeDistribution(params, {"a": D.Normal})
    sample = dist.rsample((4,))
    sample["a"].sum().backward()
    close(loc.grad, torch.full((3,), 4.0))

    def score(loc_b):
        p = torchdict.TensorDict({"a": {"loc": loc_b, "scale": torch.ones(3)}}, [3])
        with td_aggregate(True):
            return td.CompositeDistribution(p, {"a": D.Normal}).log_prob(
                torchdict.TensorDict({"a": torch.zeros(3)}, [3]))

    locs = torch.randn(5, 3)
    expected = torch.stack([D.Normal(l, torch.ones(3)).log_prob(torch.zeros(3)) for l in locs])  # noqa: E741
    close(torch.vmap(score)(locs), expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_truncated_normal_dtypes(dtype):
    loc = torch.randn(4, dtype=dtype)
    scale = torch.rand(4, dtype=dtype) + 0.1
    a, b = torch.full((4,), -1.0, dtype=dtype), torch.full((4,), 2.0, dtype=dtype)
    theirs, ours = up.TruncatedNormal(loc, scale, a, b), td.TruncatedNormal(loc, scale, a, b)
    assert ours.mean.dtype == dtype
    close(theirs.mean, ours.mean)
    close(theirs.entropy(), ours.entropy())
    sample_t, sample_o = seeded(lambda: theirs.rsample((3,))), seeded(lambda: ours.rsample((3,)))
    assert sample_t.dtype == sample_o.dtype
    close(sample_t, sample_o)
    close(theirs.log_prob(sample_t), ours.log_prob(sample_o))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_param_extractors_keep_dtype(dtype):
    x = torch.randn(3, 6, dtype=dtype)
    for a, b in zip(up.NormalParamExtractor()(x), td.NormalParamExtractor()(x)):
        assert a.dtype == b.dtype == dtype
        close(a, b)
