"""torchdict.nn.probabilistic against upstream tensordict.nn: same weights, inputs and seeds give the same keys,
values, log-probabilities and exception types."""
from __future__ import annotations

import contextlib
import threading
import warnings
from types import SimpleNamespace

import pytest
import torch
from torch import distributions as D

import tensordict
import tensordict.nn as U
import tensordict.nn.distributions as up_dist
import tensordict.nn.probabilistic as up_prob
import torchdict
import torchdict.nn as T
import torchdict.nn.distributions as td_dist
import torchdict.nn.probabilistic as td_prob

UP = SimpleNamespace(
    TensorDict=tensordict.TensorDict, M=U.TensorDictModule, P=U.ProbabilisticTensorDictModule,
    S=U.ProbabilisticTensorDictSequential, Seq=U.TensorDictSequential, dist=up_dist, prob=up_prob,
    skip=U.set_skip_existing, NonTensorData=tensordict.NonTensorData,
)
TD = SimpleNamespace(
    TensorDict=torchdict.TensorDict, M=T.TensorDictModule, P=td_prob.ProbabilisticTensorDictModule,
    S=td_prob.ProbabilisticTensorDictSequential, Seq=T.TensorDictSequential, dist=td_dist, prob=td_prob,
    skip=T.set_skip_existing, NonTensorData=torchdict.NonTensorData,
)
LIBS = (UP, TD)
BATCHES = [(), (3,), (2, 3), (2, 1, 3)]
TYPES = ["deterministic", "mode", "mean", "random"]


def close(a, b):
    torch.testing.assert_close(a, b, equal_nan=True)


def leaves(data):
    return {key if isinstance(key, tuple) else (key,): value for key, value in data.items(True, True)}


def assert_same_td(theirs, ours):
    assert tuple(theirs.batch_size) == tuple(ours.batch_size)
    a, b = leaves(theirs), leaves(ours)
    assert set(a) == set(b), (sorted(map(str, a)), sorted(map(str, b)))
    for key in a:
        if isinstance(a[key], torch.Tensor):
            close(a[key], b[key])


def same_value(theirs, ours):
    if isinstance(theirs, torch.Tensor):
        close(theirs, ours)
    elif isinstance(theirs, tuple):
        assert len(theirs) == len(ours)
        for a, b in zip(theirs, ours):
            same_value(a, b)
    else:
        assert_same_td(theirs, ours)


@contextlib.contextmanager
def modes(interaction=None, aggregate=None):
    with contextlib.ExitStack() as stack:
        if interaction is not None:
            stack.enter_context(up_prob.set_interaction_type(interaction))
            stack.enter_context(td_prob.set_interaction_type(interaction))
        if aggregate is not None:
            stack.enter_context(U.set_composite_lp_aggregate(aggregate))
            stack.enter_context(td_prob.set_composite_lp_aggregate(aggregate))
        yield


def both(build, call, seed=0):
    """``call(lib, build(lib))`` for both libraries from the same seed; the two results."""
    results = []
    for lib in LIBS:
        thing = build(lib)
        torch.manual_seed(seed)
        results.append(call(lib, thing))
    return results


def both_or_same_error(build, call, seed=0):
    """As `both`, or ``None`` when upstream raises (ours must then raise the same type)."""
    try:
        thing = build(UP)
        torch.manual_seed(seed)
        theirs = call(UP, thing)
    except Exception as err:  # noqa: BLE001
        with pytest.raises(type(err)):
            thing = build(TD)
            torch.manual_seed(seed)
            call(TD, thing)
        return None
    thing = build(TD)
    torch.manual_seed(seed)
    return theirs, call(TD, thing)


def both_raise(build, call):
    """Both libraries raise, the same exception type; returns ours."""
    with pytest.raises(Exception) as theirs:
        call(UP, build(UP))
    with pytest.raises(type(theirs.value)) as ours:
        call(TD, build(TD))
    return ours.value


def normal_params(lib, batch, event=(4,)):
    torch.manual_seed(123)
    return lib.TensorDict(loc=torch.randn((*batch, *event)), scale=torch.rand((*batch, *event)) + 0.1,
                          batch_size=list(batch))


def independent_normal(**kwargs):
    return D.Independent(D.Normal(**kwargs), 1)


# ------------------------------------------------------------------------------------------------- modes


def test_interaction_type_enum():
    for name in ("random", "RANDOM", "Mode", "mean", "median", "deterministic"):
        assert str(U.InteractionType(name)) == str(td_prob.InteractionType(name))
        assert td_prob.InteractionType.from_str(name) is td_prob.InteractionType(name)
    assert [m.value for m in U.InteractionType] == [m.value for m in td_prob.InteractionType]
    assert f"{td_prob.InteractionType.RANDOM}" == "random" and td_prob.InteractionType.RANDOM == "random"
    for bad in ("nope", 3):
        with pytest.raises(ValueError):
            U.InteractionType(bad)
        with pytest.raises(ValueError):
            td_prob.InteractionType(bad)


def test_set_interaction_type_blocks_and_decorator():
    assert td_prob.interaction_type() is None
    with td_prob.set_interaction_type("RANDOM"):
        assert td_prob.interaction_type() is td_prob.InteractionType.RANDOM
        with td_prob.set_interaction_type(None):
            assert td_prob.interaction_type() is None
        assert td_prob.interaction_type() is td_prob.InteractionType.RANDOM
    assert td_prob.interaction_type() is None
    with td_prob.set_interaction_type():
        assert td_prob.interaction_type() is td_prob.InteractionType.DETERMINISTIC

    @td_prob.set_interaction_type("mean")
    def inside():
        return td_prob.interaction_type()

    assert inside() is td_prob.InteractionType.MEAN and td_prob.interaction_type() is None
    for bad in (3, "nope"):
        with pytest.raises(ValueError):
            U.set_interaction_type(bad)
        with pytest.raises(ValueError):
            td_prob.set_interaction_type(bad)


def test_interaction_type_thread_local():
    seen = {}
    entered, release = threading.Event(), threading.Event()

    def worker():
        with td_prob.set_interaction_type("mode", thread_local=True):
            with td_prob.set_interaction_type("mean"):  # stays in this thread
                seen["worker"] = td_prob.interaction_type()
                entered.set()
                release.wait(5)

    thread = threading.Thread(target=worker)
    thread.start()
    entered.wait(5)
    seen["main"] = td_prob.interaction_type()
    release.set()
    thread.join()
    assert seen == {"worker": td_prob.InteractionType.MEAN, "main": None}
    assert td_prob.interaction_type() is None


def test_composite_lp_aggregate_switch():
    assert td_prob.composite_lp_aggregate() is False and td_prob.composite_lp_aggregate(nowarn=True) is False
    switch = td_prob.set_composite_lp_aggregate(True)
    switch.set()
    try:
        assert td_prob.composite_lp_aggregate() is True
    finally:
        switch.unset()
    assert td_prob.composite_lp_aggregate() is False

    @td_prob.set_composite_lp_aggregate()
    def inside():
        return td_prob.composite_lp_aggregate()

    assert inside() is True and td_prob.composite_lp_aggregate() is False
    assert td_dist.set_interaction_type is td_prob.set_interaction_type
    assert td_dist.InteractionType is td_prob.InteractionType


def test_deterministic_register_is_deprecated():
    with pytest.warns(DeprecationWarning):
        register = td_prob.DETERMINISTIC_REGISTER
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = up_prob.DETERMINISTIC_REGISTER
    assert {c.__name__: str(v) for c, v in register.items()} == {c.__name__: str(v) for c, v in theirs.items()}
    with pytest.raises(AttributeError):
        td_prob.nothing_here  # noqa: B018


# ------------------------------------------------------------------------------------------------- one module


def _dist_cases(lib):
    """(distribution_class, params builder, in_keys, kwargs) cases."""
    return {
        "normal": (D.Normal, lambda b: normal_params(lib, b), ["loc", "scale"], {}),
        "independent": (independent_normal, lambda b: normal_params(lib, b), ["loc", "scale"], {}),
        "categorical": (D.Categorical, lambda b: lib.TensorDict(logits=torch.randn((*b, 5)), batch_size=list(b)),
                        ["logits"], {}),
        "onehot": (lib.dist.OneHotCategorical,
                   lambda b: lib.TensorDict(logits=torch.randn((*b, 5)), batch_size=list(b)), ["logits"], {}),
        "bernoulli": (D.Bernoulli, lambda b: lib.TensorDict(probs=torch.rand(b), batch_size=list(b)), ["probs"], {}),
        "truncated": (lib.dist.TruncatedNormal, lambda b: normal_params(lib, b), ["loc", "scale"],
                      {"a": -1.0, "b": 1.0}),
        "delta": (lib.dist.Delta, lambda b: lib.TensorDict(param=torch.randn((*b, 3)), batch_size=list(b)),
                  ["param"], {}),
    }


@pytest.mark.parametrize("case", ["normal", "independent", "categorical", "onehot", "bernoulli", "truncated", "delta"])
@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("itype", TYPES)
@pytest.mark.parametrize("return_log_prob", [False, True])
def test_module_values_and_log_probs(case, batch, itype, return_log_prob):
    if case in ("categorical", "onehot", "bernoulli") and itype == "mean":
        itype = "mode"

    def build(lib):
        cls, make, in_keys, kwargs = _dist_cases(lib)[case]
        module = lib.P(in_keys=in_keys, out_keys=[("agent", "action")], distribution_class=cls,
                       distribution_kwargs=kwargs, return_log_prob=return_log_prob, default_interaction_type=itype)
        torch.manual_seed(321)
        return module, make(batch)

    def call(lib, pair):
        module, data = pair
        out = module(data)
        result = [out, module.out_keys, module.dist_sample_keys, module.dist_params_keys]
        if return_log_prob:
            result.append(module.log_prob(out))
        result.append(module.get_dist(data).batch_shape)
        return result

    results = both_or_same_error(build, call)
    if results is None:
        return
    theirs, ours = results
    assert_same_td(theirs[0], ours[0])
    assert theirs[1:4] == ours[1:4]
    if return_log_prob:
        close(theirs[4], ours[4])
    assert theirs[-1] == ours[-1]


@pytest.mark.parametrize("itype", TYPES + ["median"])
def test_module_under_set_interaction_type(itype):
    def build(lib):
        return lib.P(in_keys=["loc", "scale"], out_keys=["x"], distribution_class=D.Normal, return_log_prob=True)

    def call(lib, module):
        with lib.prob.set_interaction_type(itype):
            return module(normal_params(lib, (3,)))

    results = both_or_same_error(build, call)
    if results is not None:
        assert_same_td(*results)
    else:
        assert itype == "median"  # Normal has no median in torch


@pytest.mark.parametrize("num_samples", [1, 3, (2, 2), torch.Size([4])])
@pytest.mark.parametrize("itype", ["random", "deterministic"])
def test_module_num_samples(num_samples, itype):
    def build(lib):
        return lib.P(in_keys=["loc", "scale"], out_keys=["x"], distribution_class=D.Normal, return_log_prob=True,
                     num_samples=num_samples, default_interaction_type=itype)

    def call(lib, module):
        data = normal_params(lib, (3,))
        out = module(data)
        return out, "x" in data.keys(), module.num_samples

    theirs, ours = both(build, call)
    assert_same_td(theirs[0], ours[0])
    assert theirs[1:] == ours[1:]


def test_module_dict_in_keys_nested_keys_and_keyword_call():
    def build(lib):
        return lib.P(in_keys={"loc": ("params", "mu"), "scale": "sigma"}, out_keys=["x"],
                     distribution_class=D.Normal, return_log_prob=True, default_interaction_type="random")

    def call(lib, module):
        data = lib.TensorDict({("params", "mu"): torch.zeros(3), "sigma": torch.ones(3)}, [3])
        out = module(data)
        torch.manual_seed(1)
        by_keyword = module(params_mu=torch.zeros(3), sigma=torch.ones(3))
        return out, module.in_keys, list(module.dist_keys), by_keyword

    theirs, ours = both(build, call)
    assert_same_td(theirs[0], ours[0])
    assert theirs[1] == ours[1] and theirs[2] == ours[2]
    same_value(theirs[3], ours[3])


def test_module_tuple_in_keys_feed_their_last_element():
    def build(lib):
        return lib.P(in_keys=[("a", "loc"), ("b", "scale")], out_keys="x", distribution_class=D.Normal)

    def call(lib, module):
        out = module(lib.TensorDict({("a", "loc"): torch.ones(2), ("b", "scale"): torch.ones(2)}, [2]))
        return out, module.in_keys, module.out_keys, module.dist_keys

    theirs, ours = both(build, call)
    assert_same_td(theirs[0], ours[0])
    assert theirs[1:] == ours[1:]


def test_module_tensordict_out_and_write_into_given():
    def build(lib):
        return lib.P(in_keys=["loc", "scale"], out_keys=["x"], distribution_class=D.Normal, return_log_prob=True)

    def call(lib, module):
        data = normal_params(lib, (3,))
        target = lib.TensorDict(batch_size=[3])
        returned = module(data, target)
        return returned is target, target, data

    theirs, ours = both(build, call)
    assert theirs[0] and ours[0]
    assert_same_td(theirs[1], ours[1])
    assert_same_td(theirs[2], ours[2])


@pytest.mark.parametrize("aggregate", [False, True])
@pytest.mark.parametrize("keys", [dict(log_prob_key="lp"), dict(log_prob_key=("n", "lp")),
                                  dict(log_prob_keys=["my_lp"]), dict()])
def test_module_log_prob_key_naming(aggregate, keys):
    def build(lib):
        return lib.P(in_keys=["loc", "scale"], out_keys=[("agent", "action")], distribution_class=D.Normal,
                     return_log_prob=True, **keys)

    def call(lib, module):
        out = module(normal_params(lib, (2,)))
        return out, module.out_keys, module.log_prob_keys, module.log_prob_key

    with modes(aggregate=aggregate):
        if aggregate and "log_prob_keys" in keys:
            both_raise(build, lambda lib, m: m)
            return
        theirs, ours = both(build, call)
    assert_same_td(theirs[0], ours[0])
    assert theirs[1:] == ours[1:]


def test_module_log_prob_key_errors():
    def build_two_keys(lib):
        return lib.P(in_keys=["param"], out_keys=["a", "b"], log_prob_key="lp")

    both_raise(build_two_keys, lambda lib, m: m)

    def build(lib):
        return lib.P(in_keys=["loc", "scale"], out_keys=["x"], distribution_class=D.Normal, return_log_prob=True)

    def read_after_switch(lib, module):
        with lib.prob.set_composite_lp_aggregate(True):
            return module.log_prob_key

    both_raise(build, read_after_switch)

    def keys_after_switch(lib, module):
        with lib.prob.set_composite_lp_aggregate(True):
            return module.log_prob_keys

    both_raise(build, keys_after_switch)

    def two_keys_log_prob_key(lib, module):
        return module.log_prob_key

    both_raise(lambda lib: lib.P(in_keys=["param"], out_keys=["a", "b"]), two_keys_log_prob_key)


@pytest.mark.parametrize("bad", ["x", ("x", "lp"), "p"])
def test_module_custom_log_prob_key_clashing_with_a_sample_key(bad):
    def build(lib):
        out_keys = ["x"] if bad != "p" else [("p", "x")]
        return lib.P(in_keys=["loc", "scale"], out_keys=out_keys, distribution_class=D.Normal, return_log_prob=True,
                     log_prob_key=bad)

    error = both_raise(build, lambda lib, m: m)
    assert "cannot be a sample key" in str(error)


def test_module_default_out_key_warns_once():
    def build(lib):
        return lib.P(in_keys=["loc", "scale"], distribution_class=D.Normal)

    for lib in LIBS:
        module = build(lib)
        assert module.out_keys == ["_"]
        with pytest.warns(FutureWarning, match='"_"'):
            out = module(normal_params(lib, (2,)))
        assert "_" in out.keys()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            module(normal_params(lib, (2,)))


def test_module_string_distribution_class_and_repr():
    def build(lib):
        return lib.P(in_keys=["param"], out_keys=["y"], distribution_class="delta")

    theirs, ours = both(build, lambda lib, m: (m.distribution_class.__name__, repr(m).replace("tensordict", "X")
                                              .replace("torchdict", "X")))
    assert theirs == ours
    theirs, ours = both(lambda lib: lib.P(in_keys=["loc", "scale"], out_keys=["y"], distribution_class=D.Normal,
                                          num_samples=2), lambda lib, m: repr(m))
    assert theirs == ours


def test_module_cache_dist_is_deprecated():
    with pytest.warns(DeprecationWarning):
        module = TD.P(in_keys=["param"], out_keys=["y"], cache_dist=True)
    assert module.cache_dist is True
    assert TD.P(in_keys=["loc"], out_keys=["y"], distribution_class=D.Normal, cache_dist=False).cache_dist is False


def test_module_get_dist_errors():
    def wrong_keyword(lib):
        return lib.P(in_keys=["mu", "scale"], out_keys=["y"], distribution_class=D.Normal)

    def call(lib, module):
        return module.get_dist(lib.TensorDict(mu=torch.zeros(2), scale=torch.ones(2)))

    assert "dist_keys" in str(both_raise(wrong_keyword, call))

    def missing_argument(lib):
        return lib.P(in_keys=["loc"], out_keys=["y"], distribution_class=lambda loc, scale: D.Normal(loc, scale))

    both_raise(missing_argument, lambda lib, m: m.get_dist(lib.TensorDict(loc=torch.zeros(2))))


def test_module_failed_call_leaves_input_unchanged():
    for lib in LIBS:
        module = lib.P(in_keys=["loc", "scale"], out_keys=["y"], distribution_class=D.Normal, return_log_prob=True,
                       distribution_kwargs={"validate_args": True})
        data = lib.TensorDict(loc=torch.zeros(2), scale=-torch.ones(2))
        with pytest.raises(ValueError):  # invalid scale
            module(data)
        assert set(data.keys()) == {"loc", "scale"}


class _NoMean(D.Normal):
    @property
    def mean(self):
        raise NotImplementedError

    @property
    def mode(self):
        raise AttributeError("no mode")


class _Unknown(D.Distribution):
    arg_constraints = {}
    has_rsample = True

    def __init__(self, loc):
        self.loc = loc
        super().__init__(loc.shape, validate_args=False)

    @property
    def support(self):
        return D.constraints.real

    @property
    def mean(self):
        return self.loc * 2

    def rsample(self, shape=()):
        return self.loc + torch.randn(torch.Size(shape) + self.loc.shape)


def test_module_mean_falls_back_on_an_empirical_estimate():
    def build(lib):
        return lib.P(in_keys=["loc", "scale"], out_keys=["y"], distribution_class=_NoMean,
                     default_interaction_type="mean", n_empirical_estimate=50)

    theirs, ours = both(build, lambda lib, m: m(normal_params(lib, (3,))))
    assert_same_td(theirs, ours)


def test_module_mode_not_implemented():
    def build(lib):
        return lib.P(in_keys=["loc", "scale"], out_keys=["y"], distribution_class=_NoMean, default_interaction_type="mode")

    both_raise(build, lambda lib, m: m(normal_params(lib, (3,))))


def test_module_deterministic_fallback_warns_for_unknown_classes():
    def build(lib):
        return lib.P(in_keys=["loc"], out_keys=["y"], distribution_class=_Unknown)

    results = []
    for lib in LIBS:
        with pytest.warns(UserWarning, match="deterministic_sample wasn't found"):
            results.append(build(lib)(lib.TensorDict(loc=torch.ones(2))))
    assert_same_td(*results)


def test_module_lkj_cholesky_refuses_point_values():
    def build(lib):
        return lib.P(in_keys=["concentration"], out_keys=["y"],
                     distribution_class=lambda concentration: D.LKJCholesky(3, concentration))

    both_raise(build, lambda lib, m: m(lib.TensorDict(concentration=torch.tensor(1.0))))


def test_module_not_a_distribution():
    both_raise(lambda lib: lib.P(in_keys=["x"], out_keys=["y"], distribution_class=lambda x: x),
               lambda lib, m: m(lib.TensorDict(x=torch.ones(2))))


def test_module_joint_sample_and_log_prob_is_used():
    class Scored(D.Normal):
        def rsample_and_log_prob(self, shape=()):
            value = self.rsample(shape)
            return value, torch.full_like(value, -3.0)

    def build(lib):
        return lib.P(in_keys=["loc", "scale"], out_keys=["y"], distribution_class=Scored, return_log_prob=True,
                     default_interaction_type="random")

    theirs, ours = both(build, lambda lib, m: m(normal_params(lib, (2,))))
    assert_same_td(theirs, ours)
    assert (ours["y_log_prob"] == -3.0).all()


# ------------------------------------------------------------------------------------------------- generators


@pytest.mark.parametrize("form", ["int", "generator", "key_tensor", "key_int", "key_generator", "key_missing"])
def test_module_generator(form):
    def build(lib):
        if form == "int":
            generator = 7
        elif form == "generator":
            generator = torch.Generator().manual_seed(7)
        else:
            generator = ("rng", "seed")
        return lib.P(in_keys=["loc", "scale"], out_keys=["y"], distribution_class=D.Normal, generator=generator,
                     default_interaction_type="random")

    def call(lib, module):
        data = normal_params(lib, ())
        if form == "key_tensor":
            data["rng", "seed"] = torch.tensor(11)
        elif form == "key_int":
            data.set(("rng", "seed"), lib.NonTensorData(11))
        elif form == "key_generator":
            data.set(("rng", "seed"), lib.NonTensorData(torch.Generator().manual_seed(11)))
        state = torch.get_rng_state()
        first = module(data.copy())["y"]
        second = module(data)["y"]
        global_untouched = torch.equal(state, torch.get_rng_state())
        seed = data.get(("rng", "seed"), None)
        if seed is not None and not isinstance(seed, torch.Tensor):
            seed = seed.data if isinstance(seed.data, int) else None
        return first, second, global_untouched, seed

    theirs, ours = both(build, call)
    close(theirs[0], ours[0])
    close(theirs[1], ours[1])
    assert theirs[2] == ours[2]
    if isinstance(theirs[3], torch.Tensor):
        assert torch.equal(theirs[3], ours[3])
    else:
        assert theirs[3] == ours[3]


def test_module_generator_errors():
    both_raise(lambda lib: lib.P(in_keys=["loc"], out_keys=["y"], generator=1.5), lambda lib, m: m)

    def call(lib, module):
        data = normal_params(lib, (3,))
        data["seed"] = torch.tensor([1, 2])
        return module(data)

    both_raise(lambda lib: lib.P(in_keys=["loc", "scale"], out_keys=["y"], distribution_class=D.Normal,
                                 generator="seed", default_interaction_type="random"), call)


# ------------------------------------------------------------------------------------------------- composite


def composite_params(lib, batch):
    torch.manual_seed(9)
    return lib.TensorDict({
        "params": {
            "cont": {"loc": torch.randn((*batch, 4)), "scale": torch.rand((*batch, 4)) + 0.1},
            ("nested", "disc"): {"logits": torch.randn((*batch, 5))},
        }
    }, list(batch))


COMPOSITE_MAP = {"cont": D.Normal, ("nested", "disc"): D.Categorical}


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("aggregate", [False, True])
@pytest.mark.parametrize("itype", ["random", "deterministic", "mode"])
@pytest.mark.parametrize("name_map", [None, {"cont": ("out", "c"), ("nested", "disc"): "d"}])
def test_composite_module(batch, aggregate, itype, name_map):
    kwargs = {"distribution_map": dict(COMPOSITE_MAP)}
    if name_map:
        kwargs["name_map"] = name_map

    def build(lib):
        return lib.P(in_keys=["params"], distribution_class=lib.dist.CompositeDistribution,
                     distribution_kwargs=kwargs, return_log_prob=True, default_interaction_type=itype)

    def call(lib, module):
        data = composite_params(lib, batch)
        out = module(data)
        lp = module.log_prob(out.clone())
        return out, module.out_keys, module.log_prob_keys, lp

    with modes(aggregate=aggregate):
        theirs, ours = both(build, call)
    assert_same_td(theirs[0], ours[0])
    assert theirs[1] == ours[1] and theirs[2] == ours[2]
    same_value(theirs[3], ours[3])


def test_composite_module_needs_a_distribution_map():
    both_raise(lambda lib: lib.P(in_keys=["params"], distribution_class=lib.dist.CompositeDistribution),
               lambda lib, m: m)


def test_composite_module_partial_name_map_warns():
    kwargs = {"distribution_map": dict(COMPOSITE_MAP), "name_map": {"cont": "c"}}
    for lib in LIBS:
        with pytest.warns(FutureWarning, match="name_map"):
            module = lib.P(in_keys=["params"], distribution_class=lib.dist.CompositeDistribution,
                           distribution_kwargs=kwargs)
        assert module.out_keys == ["c"]


def test_composite_module_custom_log_prob_keys():
    kwargs = {"distribution_map": dict(COMPOSITE_MAP)}

    def build(lib):
        return lib.P(in_keys=["params"], distribution_class=lib.dist.CompositeDistribution, distribution_kwargs=kwargs,
                     return_log_prob=True, log_prob_keys=["lp_c", ("lp", "d")], default_interaction_type="random")

    def call(lib, module):
        out = module(composite_params(lib, (3,)))
        return out, module.log_prob(out.clone()), module.out_keys

    theirs, ours = both(build, call)
    assert_same_td(theirs[0], ours[0])
    assert_same_td(theirs[1], ours[1])
    assert theirs[2] == ours[2]


def test_composite_module_aggregate_changed_after_init():
    kwargs = {"distribution_map": dict(COMPOSITE_MAP)}

    def build(lib):
        return lib.P(in_keys=["params"], distribution_class=lib.dist.CompositeDistribution, distribution_kwargs=kwargs,
                     return_log_prob=True)

    def call(lib, module):
        data = composite_params(lib, (3,))
        with lib.prob.set_composite_lp_aggregate(True):
            return module(data)

    both_raise(build, call)


# ------------------------------------------------------------------------------------------------- sequences


def actor(lib, dist_class=D.Normal, itype="random", return_log_prob=True, out_key=("agent", "action"), **kwargs):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4))
    return lib.S(
        lib.M(net, in_keys=["obs"], out_keys=["hidden"]),
        lib.M(lib.dist.NormalParamExtractor(), in_keys=["hidden"], out_keys=["loc", "scale"]),
        lib.P(in_keys=["loc", "scale"], out_keys=[out_key], distribution_class=dist_class,
              return_log_prob=return_log_prob, default_interaction_type=itype),
        **kwargs,
    )


def observations(lib, batch):
    torch.manual_seed(4)
    return lib.TensorDict(obs=torch.randn((*batch, 3)), batch_size=list(batch))


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("itype", TYPES)
@pytest.mark.parametrize("dist_class", [D.Normal, independent_normal])
def test_sequence_actor(batch, itype, dist_class):
    def call(lib, seq):
        out = seq(observations(lib, batch))
        return (out, seq.log_prob(out), seq.in_keys, seq.out_keys, seq.dist_sample_keys, seq.dist_params_keys,
                seq.log_prob_keys, seq.log_prob_key, seq.num_samples, str(seq.default_interaction_type),
                seq.return_composite, seq.get_dist(observations(lib, batch)).batch_shape)

    theirs, ours = both(lambda lib: actor(lib, dist_class, itype), call)
    assert_same_td(theirs[0], ours[0])
    close(theirs[1], ours[1])
    assert theirs[2:] == ours[2:]


def test_sequence_get_dist_params_and_build_dist():
    def call(lib, seq):
        data = observations(lib, (3,))
        params = seq.get_dist_params(data.copy())
        dist = seq.build_dist_from_params(params)
        return params, dist.loc, dist.scale, seq.get_dist(data).mean

    theirs, ours = both(actor, call)
    assert_same_td(theirs[0], ours[0])
    for a, b in zip(theirs[1:], ours[1:]):
        close(a, b)


def two_step(lib, return_composite=None, itype="random", return_log_prob=True):
    return lib.S(
        lib.M(lambda x: x + 1, in_keys=["x"], out_keys=["loc"]),
        lib.P(in_keys=["loc"], out_keys=["sample0"], distribution_class=D.Normal, distribution_kwargs={"scale": 1.0},
              return_log_prob=return_log_prob, default_interaction_type=itype),
        lib.M(lambda x: x * 2, in_keys=["sample0"], out_keys=["loc2"]),
        lib.P(in_keys={"loc": "loc2"}, out_keys=[("n", "sample1")], distribution_class=D.Normal,
              distribution_kwargs={"scale": 1.0}, return_log_prob=return_log_prob, default_interaction_type=itype),
        return_composite=return_composite,
    )


@pytest.mark.parametrize("return_composite", [None, True, False])
@pytest.mark.parametrize("aggregate", [False, True])
@pytest.mark.parametrize("itype", ["random", "deterministic"])
def test_sequence_two_probabilistic_modules(return_composite, aggregate, itype):
    def call(lib, seq):
        data = lib.TensorDict(x=torch.randn(3), batch_size=[3])
        out = seq(data.copy())
        torch.manual_seed(5)
        dist = seq.get_dist(data.copy())
        torch.manual_seed(6)
        sample = dist.sample()
        return out, seq.log_prob(out.clone()), sample, seq.return_composite, seq.out_keys, seq.log_prob_keys

    with modes(aggregate=aggregate):
        theirs, ours = both(lambda lib: two_step(lib, return_composite, itype), call)
    assert_same_td(theirs[0], ours[0])
    same_value(theirs[1], ours[1])
    same_value(theirs[2], ours[2])
    assert theirs[3:] == ours[3:]


def test_sequence_last_module_does_not_resample_a_written_key():
    def build(lib):
        return lib.S(
            lib.M(lambda x: (x + 1, x * 0 + 2), in_keys=["x"], out_keys=["loc", "y"]),
            lib.P(in_keys=["loc"], out_keys=["y"], distribution_class=D.Normal, distribution_kwargs={"scale": 1.0},
                  return_log_prob=True, default_interaction_type="random"),
        )

    theirs, ours = both(build, lambda lib, s: (s(lib.TensorDict(x=torch.zeros(2), batch_size=[2])),
                                               s._requires_sample))
    assert_same_td(theirs[0], ours[0])
    assert theirs[1] is ours[1] is False
    assert (ours[0]["y"] == 2).all()


@pytest.mark.parametrize("inplace", [None, True, False, "empty"])
def test_sequence_inplace_and_selected_out_keys(inplace):
    def build(lib):
        return actor(lib, itype="deterministic", inplace=inplace, selected_out_keys=[("agent", "action"), "loc"])

    def call(lib, seq):
        data = observations(lib, (2,))
        out = seq(data)
        return out, out is data, data

    theirs, ours = both(build, call)
    assert_same_td(theirs[0], ours[0])
    assert theirs[1] == ours[1]
    assert_same_td(theirs[2], ours[2])


def test_sequence_tensordict_out():
    def call(lib, seq):
        data = observations(lib, (2,))
        target = lib.TensorDict(batch_size=[2])
        out = seq(data, target)
        return out is target, target, data

    theirs, ours = both(lambda lib: actor(lib, itype="mode"), call)
    assert theirs[0] == ours[0]
    assert_same_td(theirs[1], ours[1])
    assert_same_td(theirs[2], ours[2])


def test_sequence_named_modules_nested_and_slicing():
    def build(lib):
        inner = actor(lib, itype="mode")
        return lib.S({"prep": lib.M(lambda x: x * 2, in_keys=["raw"], out_keys=["obs"]), "policy": inner})

    def call(lib, seq):
        out = seq(lib.TensorDict(raw=torch.ones(2, 3), batch_size=[2]))
        return out, type(seq["policy"]).__name__, seq.dist_sample_keys, seq.return_composite, seq.out_keys

    theirs, ours = both(build, call)
    assert_same_td(theirs[0], ours[0])
    assert theirs[1:] == ours[1:]
    assert both_or_same_error(build, lambda lib, seq: seq[:1]) is None  # a ModuleDict cannot be sliced


def test_sequence_slices_keep_their_kind():
    def call(lib, seq):
        return [type(seq[s]).__name__ for s in (slice(0, 1), slice(0, 2), slice(1, 4), slice(0, 4))]

    theirs, ours = both(lambda lib: two_step(lib), call)
    assert theirs == ours
    theirs, ours = both(lambda lib: two_step(lib, return_composite=False), call)
    assert theirs == ours


def test_sequence_errors():
    both_raise(lambda lib: lib.S(), lambda lib, s: s)
    both_raise(lambda lib: lib.S(lib.M(lambda x: x, in_keys=["x"], out_keys=["y"]), return_composite=False),
               lambda lib, s: s)

    def failing(lib):
        return lib.S(lib.M(lambda x: x.undefined, in_keys=["x"], out_keys=["y"]),
                     lib.P(in_keys=["y"], out_keys=["z"]), return_composite=True)

    error = both_raise(failing, lambda lib, s: s(lib.TensorDict(x=torch.zeros(2))))
    assert "Failed while executing module '0'" in str(error)
    both_raise(lambda lib: lib.S(lib.M(lambda x: x, in_keys=["x"], out_keys=["y"])),
               lambda lib, s: s.get_dist(lib.TensorDict(x=torch.zeros(2))))
    both_raise(lambda lib: lib.S(lib.M(lambda x: x, in_keys=["x"], out_keys=["y"])),
               lambda lib, s: s.build_dist_from_params(lib.TensorDict(x=torch.zeros(2))))
    both_raise(lambda lib: two_step(lib), lambda lib, s: s.log_prob_key)


def test_sequence_without_probabilistic_modules_is_a_plain_sequence():
    def build(lib):
        return lib.S(lib.M(lambda x: x + 1, in_keys=["x"], out_keys=["y"]))

    theirs, ours = both(build, lambda lib, s: (s(lib.TensorDict(x=torch.zeros(2))), s.return_composite,
                                               s.num_samples, s.log_prob_keys))
    assert_same_td(theirs[0], ours[0])
    assert theirs[1:] == ours[1:]


def test_sequence_edit_refreshes_and_refuses():
    def build(lib):
        return two_step(lib, return_composite=False)

    def call(lib, seq):
        with pytest.raises(TypeError):
            seq[3] = lib.M(lambda x: x, in_keys=["x"], out_keys=["w"])
        with pytest.raises(TypeError):
            del seq[3]
        kept = type(seq[3]).__name__
        seq[3] = lib.P(in_keys={"loc": "loc2"}, out_keys=["other"], distribution_class=D.Normal,
                       distribution_kwargs={"scale": 1.0})
        return kept, seq.out_keys, seq.dist_sample_keys, seq._requires_sample

    theirs, ours = both(build, call)
    assert theirs == ours


def test_sequence_det_part_is_deprecated():
    seq = actor(TD)
    with pytest.warns(DeprecationWarning):
        part = seq.det_part
    assert isinstance(part, T.TensorDictSequential) and len(part) == 2
    assert "_det_part" not in dict(seq.named_children())
    assert len(list(seq.parameters())) == 4


def test_sequence_custom_log_prob_keys_renamed_in_log_prob():
    def build(lib):
        return lib.S(
            lib.M(lambda x: x + 1, in_keys=["x"], out_keys=["loc"]),
            lib.P(in_keys=["loc"], out_keys=["a"], distribution_class=D.Normal, distribution_kwargs={"scale": 1.0},
                  return_log_prob=True, log_prob_key="lp_a", default_interaction_type="random"),
            lib.P(in_keys={"loc": "a"}, out_keys=["b"], distribution_class=D.Normal, distribution_kwargs={"scale": 1.0},
                  return_log_prob=True, default_interaction_type="random"),
        )

    def call(lib, seq):
        out = seq(lib.TensorDict(x=torch.zeros(3), batch_size=[3]))
        return out, seq.log_prob(out.clone()), seq.log_prob_keys

    theirs, ours = both(build, call)
    assert_same_td(theirs[0], ours[0])
    assert_same_td(theirs[1], ours[1])
    assert theirs[2] == ours[2]


def test_sequence_keyword_arguments_reach_plain_modules():
    class Scaled(torch.nn.Module):
        def forward(self, x, factor=1.0):
            return x * factor

    def build(lib):
        return lib.S(lib.M(Scaled(), in_keys=["x"], out_keys=["loc"]),
                     lib.P(in_keys=["loc"], out_keys=["y"], distribution_class=D.Normal,
                           distribution_kwargs={"scale": 1.0}))

    theirs, ours = both(build, lambda lib, s: (s(lib.TensorDict(x=torch.ones(2)), factor=3.0),
                                               s.get_dist_params(lib.TensorDict(x=torch.ones(2)), factor=2.0)))
    assert_same_td(theirs[0], ours[0])
    assert_same_td(theirs[1], ours[1])


def test_sequence_skip_existing():
    def call(lib, seq):
        data = observations(lib, (2,))
        data["agent", "action"] = torch.zeros(2, 2)
        data["agent", "action_log_prob"] = torch.zeros(2, 2)
        prob = seq[-1]
        with lib.skip(True):
            out = prob(data)
        return out, out is data

    theirs, ours = both(lambda lib: actor(lib, itype="mode"), call)
    assert_same_td(theirs[0], ours[0])
    assert theirs[1] == ours[1]


# ------------------------------------------------------------------------------------------------- transforms


def test_autograd_through_rsample():
    grads = []
    for lib in LIBS:
        seq = actor(lib, itype="random")
        torch.manual_seed(8)
        out = seq(observations(lib, (5,)))
        (out["agent", "action"].pow(2).sum() + out["agent", "action_log_prob"].sum()).backward()
        grads.append([p.grad.clone() for p in seq.parameters()])
    for a, b in zip(*grads):
        close(a, b)


def test_vmap_over_stacked_parameters():
    results = []
    for lib in LIBS:
        seq = actor(lib, itype="deterministic")
        params = lib.TensorDict.from_module(seq)
        torch.manual_seed(2)
        stacked = params.apply(lambda p: torch.stack([p, p + 0.1 * torch.randn_like(p)]), batch_size=[2])
        data = observations(lib, (3,))

        def call(data, p):
            with p.to_module(seq):
                return seq(data)

        results.append(torch.vmap(call, (None, 0))(data, stacked))
    assert_same_td(*results)


def test_vmap_random_sampling_same_randomness():
    results = []
    for lib in LIBS:
        seq = actor(lib, itype="random")
        params = lib.TensorDict.from_module(seq)
        stacked = params.apply(lambda p: torch.stack([p, p * 2]), batch_size=[2])
        data = observations(lib, (3,))

        def call(data, p):
            with p.to_module(seq):
                return seq(data)

        torch.manual_seed(12)
        results.append(torch.vmap(call, (None, 0), randomness="same")(data, stacked))
    assert_same_td(*results)
    assert results[1]["agent", "action"].shape == (2, 3, 2)


def test_functional_call_with_swapped_parameters():
    seq = actor(TD, itype="mode")
    data = observations(TD, (2,))
    params = {name: torch.zeros_like(p) for name, p in seq.named_parameters()}
    out = torch.func.functional_call(seq, params, (data.copy(),))
    assert torch.equal(out["agent", "action"], torch.zeros(2, 2))


@pytest.mark.slow
def test_compiled_sequence_matches_eager_without_graph_breaks():
    seq = actor(TD, itype="deterministic")
    data = observations(TD, (5,))
    validate = D.Distribution._validate_args
    try:
        compiled = torch.compile(seq, fullgraph=True)
        assert_same_td(seq(data.copy()), compiled(data.copy()))
    finally:
        # torch.compile turns distribution argument validation off process-wide.
        D.Distribution.set_default_validate_args(validate)


def test_sequence_nested_with_return_composite_false_inside():
    def build(lib):
        inner = lib.S(lib.M(lambda x: x + 1, in_keys=["x"], out_keys=["loc"]),
                      lib.P(in_keys=["loc"], out_keys=["a"], distribution_class=D.Normal,
                            distribution_kwargs={"scale": 1.0}, return_log_prob=True,
                            default_interaction_type="random"), return_composite=False)
        return lib.S(inner, lib.M(lambda a: a * 2, in_keys=["a"], out_keys=["loc2"]),
                     lib.P(in_keys={"loc": "loc2"}, out_keys=["b"], distribution_class=D.Normal,
                           distribution_kwargs={"scale": 1.0}, return_log_prob=True, default_interaction_type="random"),
                     return_composite=True)

    def call(lib, seq):
        data = lib.TensorDict(x=torch.zeros(3), batch_size=[3])
        out = seq(data.copy())
        torch.manual_seed(3)
        dist = seq.get_dist(data.copy())
        torch.manual_seed(4)
        target = lib.TensorDict(batch_size=[3])
        return out, dist.sample(), seq.log_prob(out.clone(), target), seq.log_prob_keys, seq.dist_sample_keys

    theirs, ours = both(build, call)
    assert_same_td(theirs[0], ours[0])
    assert_same_td(theirs[1], ours[1])
    same_value(theirs[2], ours[2])
    assert theirs[3:] == ours[3:]


@pytest.mark.parametrize("aggregate", [False, True])
def test_composite_last_module_scores_samples_written_by_the_prefix(aggregate):
    kwargs = {"distribution_map": {"c": D.Normal}}

    def build(lib):
        return lib.S(
            lib.M(lambda x: (x, x + 1), in_keys=["x"], out_keys=[("params", "c", "loc"), "c"]),
            lib.M(lambda x: x * 0 + 1, in_keys=["x"], out_keys=[("params", "c", "scale")]),
            lib.P(in_keys=["params"], distribution_class=lib.dist.CompositeDistribution, distribution_kwargs=kwargs,
                  return_log_prob=True),
        )

    with modes(aggregate=aggregate):
        theirs, ours = both(build, lambda lib, s: (s(lib.TensorDict(x=torch.zeros(3), batch_size=[3])),
                                                   s._requires_sample))
    assert_same_td(theirs[0], ours[0])
    assert theirs[1] is ours[1] is False


def test_composite_module_before_the_last_feeds_its_sample_forward():
    # Upstream's get_dist fails here (it zips the keys with the sample TensorDict): a deliberate difference.
    kwargs = {"distribution_map": {"c": D.Normal}}
    seq = TD.S(
        TD.P(in_keys=["params"], distribution_class=TD.dist.CompositeDistribution, distribution_kwargs=kwargs,
             default_interaction_type="mode"),
        TD.M(lambda c: c + 1, in_keys=["c"], out_keys=["loc"]),
        TD.P(in_keys=["loc"], out_keys=["z"], distribution_class=D.Normal, distribution_kwargs={"scale": 1.0},
             default_interaction_type="mode"),
    )
    data = TD.TensorDict(params={"c": {"loc": torch.full((3,), 2.0), "scale": torch.ones(3)}}, batch_size=[3])
    dist = seq.get_dist(data)
    assert list(dist) == ["c", "z"]
    assert dist.mode["z"].tolist() == [3.0, 3.0, 3.0]
    assert seq(data)["z"].tolist() == [3.0, 3.0, 3.0]


@pytest.mark.parametrize("return_composite", [True, False])
def test_sequence_failed_call_leaves_input_unchanged(return_composite):
    seq = TD.S(
        TD.M(lambda x: x + 1, in_keys=["x"], out_keys=[("n", "loc")]),
        TD.P(in_keys={"loc": ("n", "loc")}, out_keys=["y"], distribution_class=D.Normal,
             distribution_kwargs={"scale": -1.0, "validate_args": True}, return_log_prob=True),
        return_composite=return_composite,
    )
    data = TD.TensorDict(x=torch.zeros(2), y=torch.ones(2), batch_size=[2])
    expected_error = RuntimeError if return_composite else ValueError
    with pytest.raises(expected_error):
        seq(data)
    assert sorted(data.keys()) == ["x", "y"] and torch.equal(data["y"], torch.ones(2))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("itype", ["random", "mean"])
def test_module_dtypes(dtype, itype):
    def build(lib):
        return lib.P(in_keys=["loc", "scale"], out_keys=["y"], distribution_class=D.Normal, return_log_prob=True,
                     default_interaction_type=itype)

    def call(lib, module):
        data = normal_params(lib, (2, 3)).to(dtype)
        return module(data)

    theirs, ours = both(build, call)
    assert ours["y"].dtype == ours["y_log_prob"].dtype == dtype
    assert_same_td(theirs, ours)
