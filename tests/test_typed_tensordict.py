"""TypedTensorDict: fields declared as annotations, on any backing collection; checked against upstream."""
from __future__ import annotations

import pickle
from typing import ClassVar

import pytest
import torch
from hypothesis import given, settings
from torch import Tensor

import torchdict
from _dropin_diff import build, outcome, plain, same_outcome, specs, upstream

try:
    from typing import NotRequired
except ImportError:  # Python < 3.11
    from typing_extensions import NotRequired

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")


def _classes(lib):
    class State(lib.TypedTensorDict):
        eta: Tensor
        X: Tensor
        opt: NotRequired[Tensor]
        d: Tensor = torch.ones(())
        c: ClassVar[int] = 3

    class Child(State):
        y: Tensor

    class Frozen(lib.TypedTensorDict["frozen"]):
        a: Tensor

    class Shadowing(lib.TypedTensorDict, frozen=True, shadow=True):
        sum: Tensor

    return State, Child, Frozen, Shadowing


def _state(lib, batch=(5,)):
    State = _classes(lib)[0]
    return State(eta=torch.arange(float(torch.Size(batch).numel() * 3)).view(*batch, 3),
                 X=torch.zeros(*batch, 4), batch_size=list(batch))


def test_fields_and_options():
    def described(lib):
        State, Child, Frozen, Shadowing = _classes(lib)
        return (sorted(State.__expected_keys__), sorted(State.__required_keys__), sorted(State.__optional_keys__),
                sorted(Child.__required_keys__), Frozen(a=torch.zeros(2)).is_locked, Frozen.__mro__[1].__name__,
                Shadowing(sum=torch.zeros(1)).is_locked, plain(Shadowing(sum=torch.zeros(1)).sum),
                plain(State.__field_defaults__["d"]), State.c)

    same_outcome(described)


OPS = ["s[0]", "s.clone()", "s + 1", "s.to_tensordict()", "s.unsqueeze(0)", "s.exclude('X')", "s.select('eta')",
       "s.isnan()", "s.all(0)", "s.sum(0)", "s.abs()", "s < s", "s == s", "s.max(0)",
       "s.masked_fill(torch.ones(5, dtype=torch.bool), 1)", "s.named_apply(lambda k, v: v)", "s.expand(2, 5)",
       "s.empty()", "s.new_zeros(2)", "s.data", "s.float()", "s.to_lazystack()", "s.exp_()", "s.add_(1)",
       "s.update({'X': torch.ones(5, 4)})", "s.flatten()", "s.apply(lambda x: x + 1)", "s.split(2)", "s.unbind(0)",
       "torch.stack([s, s])", "torch.cat([s, s])", "s.detach()", "s.reshape(5)", "s.copy()", "list(s)",
       "s.get('eta')", "s['eta']", "s[:2]", "s.to('cpu')", "pickle.loads(pickle.dumps(s))",
       "s.filter_non_tensor_data()", "s.prod()", "s.gather(0, torch.tensor([0]))", "s.eta", "s.d", "s.opt",
       "s.batch_size", "s.names", "s.device", "dict(**s)", "s.to_dict()", "s.zz"]


@pytest.mark.parametrize("expression", OPS)
def test_members_as_upstream(expression):
    def run(lib):
        s = _state(lib)  # noqa: F841 - used by the expression
        result = eval(expression)
        kinds = [type(item).__name__ for item in result] if isinstance(result, (list, tuple)) else type(result).__name__
        return kinds, plain(result)

    same_outcome(run)


@pytest.mark.parametrize("expression", ["State(eta=torch.zeros(5, 3))", "State(eta=1, X=1, zz=2)",
                                        "State.from_tensordict(lib.TensorDict())", "lib.TypedTensorDict['bogus']",
                                        "State.from_tensordict(lib.TensorDict(), check=False).batch_size",
                                        "State.from_tensordict(lib.TensorDict(), check=False).eta",
                                        "State({'eta': torch.zeros(2), 'X': torch.zeros(2)}, batch_size=[2])",
                                        "State.from_dict({'eta': torch.zeros(2), 'X': torch.zeros(2)})",
                                        "State.from_dict({'eta': torch.zeros(2)}, check=False)"])
def test_construction_as_upstream(expression):
    def run(lib):
        State = _classes(lib)[0]  # noqa: F841 - used by the expression
        result = eval(expression)
        return type(result).__name__, plain(result)

    same_outcome(run)


def test_shadowing_a_member_is_refused():
    for lib in (upstream, torchdict):
        with pytest.raises(AttributeError, match="shadows"):
            class Bad(lib.TypedTensorDict):
                sum: Tensor


def test_writes_through_fields_and_to_the_source():
    def run(lib):
        s = _state(lib)
        s.eta = torch.ones(5, 3)
        s.note = 1  # not a field: a plain attribute
        source = lib.TensorDict(eta=torch.zeros(3), X=torch.zeros(3), batch_size=[3])
        wrapped = _classes(lib)[0].from_tensordict(source)
        wrapped.eta += 1
        wrapped.lock_()
        locked = source.is_locked
        refused = outcome(lambda: wrapped.__setitem__("y", torch.zeros(3)))
        wrapped.unlock_()
        return plain(s), s.note, sorted(s.keys()), plain(source), locked, refused

    same_outcome(run)


def test_on_a_lazy_stack():
    def run(lib):
        State = _classes(lib)[0]
        stack = lib.lazy_stack([lib.TensorDict(eta=torch.zeros(()), X=torch.zeros(())),
                                lib.TensorDict(eta=torch.ones(()), X=torch.zeros(()))])
        s = State.from_tensordict(stack)
        return type(s[0]).__name__, type(s.clone()).__name__, type(s + 1).__name__, plain(s.eta)

    same_outcome(run)


@given(spec=specs(min_rank=1, float_only=True))
@settings(max_examples=20)
def test_batch_ops_match_the_plain_tensordict(spec):
    """Every result of a batch op is the TensorDict op's result, wrapped in the class."""
    class Any_(torchdict.TypedTensorDict):
        pass

    td = build(torchdict, spec)
    typed = Any_.from_tensordict(td, check=False)
    for op in (lambda x: x[0], lambda x: x.clone(), lambda x: x * 2, lambda x: x.unsqueeze(0),
               lambda x: x.reshape(-1), lambda x: x.apply(torch.neg)):
        result = op(typed)
        assert type(result) is Any_
        assert plain(result._source) == plain(op(td))


def test_compact_repr_as_upstream():
    def run(lib):
        with lib.set_printoptions(compact=True):
            return repr(_state(lib))

    same_outcome(run)
    assert repr(_state(torchdict)).startswith("State(\n    fields={")


class Picklable(torchdict.TypedTensorDict):
    x: Tensor


def test_pickling_keeps_the_class():
    original = Picklable(x=torch.arange(3), batch_size=[3])
    copy = pickle.loads(pickle.dumps(original))
    assert type(copy) is Picklable and torch.equal(copy.x, original.x) and copy.batch_size == original.batch_size
