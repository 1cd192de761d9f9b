"""logsumexp, norm, quantile, cummax / cummin and ``max``/``min(return_indices=False)``, against plain torch.

The rule, as for the other reductions (tests/test_ops.py): the result on a TensorDict equals the torch op on
every leaf over the same batch dims (nested TensorDicts follow their own batch), and a dim that is not a batch
dim raises without touching the TensorDict.
"""
from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchdict import NonTensorData, NonTensorStack, TensorDict

from _helpers import assert_same_snapshot, snapshot
from _tensor_strategies import leaves, tensordicts

# TORCHDICT_EXAMPLES=500 for a deeper search than the default quick run (as in test_ops.py).
SETTINGS = settings(max_examples=int(os.environ.get("TORCHDICT_EXAMPLES", 40)), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def make_td() -> TensorDict:
    """Batch [3, 4]: a leaf with a feature dim, a nested TensorDict, one nested deeper with an extra batch dim."""
    generator = torch.Generator().manual_seed(0)
    deeper = TensorDict(x=torch.randn(3, 4, 5, 2, generator=generator), batch_size=[3, 4, 5])
    nested = TensorDict(b=torch.randn(3, 4, generator=generator), c=deeper, batch_size=[3, 4])
    return TensorDict(a=torch.randn(3, 4, 2, generator=generator), n=nested, s="shared", batch_size=[3, 4])


def tensor_leaves(td: TensorDict) -> dict:
    return {key: value for key, value in leaves(td).items() if isinstance(value, torch.Tensor)}


def assert_leafwise(result: TensorDict, td: TensorDict, leaf_op, batch_size) -> None:
    """Every tensor leaf of ``result`` is ``leaf_op`` of the same leaf of ``td`` (dtype and shape too)."""
    assert isinstance(result, TensorDict)
    assert result.batch_size == torch.Size(batch_size)
    expected = tensor_leaves(td)
    got = tensor_leaves(result)
    assert set(got) == set(expected)
    for key, leaf in expected.items():
        torch.testing.assert_close(got[key], leaf_op(leaf), msg=str(key))


def positive(dim, n_batch: int = 2):
    return tuple(sorted(d % n_batch for d in dim)) if isinstance(dim, tuple) else dim % n_batch


DIMS = [0, 1, -1, -2, (0, 1), (1, 0), (-1,)]


# --------------------------------------------------------------------------- logsumexp


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("dim", DIMS)
def test_logsumexp_over_batch_dims_equals_torch(dim, keepdim):
    td = make_td()
    dims = positive(dim)
    as_tuple = dims if isinstance(dims, tuple) else (dims,)
    batch = [1 if d in as_tuple else s for d, s in enumerate(td.batch_size) if keepdim or d not in as_tuple]
    result = td.logsumexp(dim, keepdim=keepdim)
    assert_leafwise(result, td, lambda leaf: torch.logsumexp(leaf, dims, keepdim), batch)
    assert result["n", "c"].batch_size == torch.Size(batch + [5])
    assert result["s"] == "shared"


def test_logsumexp_without_dim_reduces_every_batch_dim_and_keeps_feature_dims():
    td = make_td()
    result = td.logsumexp()
    assert_leafwise(result, td, lambda leaf: torch.logsumexp(leaf, (0, 1)), [])
    assert result["a"].shape == torch.Size([2]) and result["n", "c", "x"].shape == torch.Size([5, 2])
    kept = td.logsumexp(keepdim=True)
    assert_leafwise(kept, td, lambda leaf: torch.logsumexp(leaf, (0, 1), keepdim=True), [1, 1])
    # Stable where a naive log(sum(exp)) overflows.
    big = TensorDict(a=torch.tensor([1000.0, 1000.0]), batch_size=[2]).logsumexp()["a"]
    torch.testing.assert_close(big, torch.tensor(1000.0) + torch.log(torch.tensor(2.0)))


def test_logsumexp_without_batch_dims_reduces_nothing():
    leaf = torch.randn(3, 2)
    torch.testing.assert_close(TensorDict(a=leaf).logsumexp()["a"], leaf)


def test_logsumexp_feature_and_reduce():
    td = TensorDict(a=torch.randn(3, 2, 2), b=torch.randn(3), batch_size=[3])
    result = td.logsumexp("feature")
    torch.testing.assert_close(result["a"], torch.logsumexp(td["a"], (1, 2)))
    torch.testing.assert_close(result["b"], td["b"])  # no feature dims: nothing to reduce
    pooled = torch.cat([td["a"].flatten(1), td["b"][:, None]], dim=1)
    torch.testing.assert_close(td.logsumexp(reduce=True), torch.logsumexp(pooled.flatten(), 0))
    torch.testing.assert_close(td.logsumexp(0, reduce=True), torch.logsumexp(pooled, (0, 1)))


def test_logsumexp_of_integer_leaves_is_floating_like_torch():
    td = TensorDict(i=torch.arange(6).view(3, 2), batch_size=[3])
    result = td.logsumexp(0)["i"]
    assert result.dtype == torch.logsumexp(td["i"], 0).dtype == torch.float32
    torch.testing.assert_close(result, torch.logsumexp(td["i"], 0))


# --------------------------------------------------------------------------- norm


def test_norm_without_dim_is_each_leafs_two_norm():
    assert TensorDict(a=torch.ones(3), batch_size=[3]).norm()["a"].item() == pytest.approx(3 ** 0.5)
    td = make_td()
    result = td.norm()
    assert_leafwise(result, td, torch.linalg.vector_norm, [])
    assert result["s"] == "shared"
    assert_leafwise(td.norm(p="fro"), td, torch.linalg.vector_norm, [])  # torch.norm's default name for it
    assert_leafwise(td.norm(keepdim=True), td, lambda leaf: torch.linalg.vector_norm(leaf).reshape(
        (1,) * leaf.ndim), [1, 1])


@pytest.mark.parametrize("p", [2, 1, float("inf"), 0.5])
@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("dim", DIMS)
def test_norm_over_batch_dims_equals_vector_norm(dim, keepdim, p):
    td = make_td()
    dims = positive(dim)
    result = td.norm(dim, keepdim, p=p)
    expected_batch = torch.linalg.vector_norm(torch.zeros(3, 4), p, dims, keepdim).shape
    assert_leafwise(result, td, lambda leaf: torch.linalg.vector_norm(leaf, p, dims, keepdim), expected_batch)


def test_norm_dtype_and_reduce():
    td = TensorDict(a=torch.tensor([[3.0], [0.0]]), b=torch.tensor([0.0, 4.0]), batch_size=[2])
    assert td.norm(dtype=torch.float64)["a"].dtype == torch.float64
    assert td.norm(reduce=True).item() == 5.0  # the norm of all the elements together
    torch.testing.assert_close(td.norm(0, reduce=True), torch.tensor(5.0))
    torch.testing.assert_close(td.norm("feature", reduce=True), torch.tensor([3.0, 4.0]))


def test_norm_of_integer_leaves_raises_torchs_error():
    td = TensorDict(i=torch.arange(3), batch_size=[3])
    with pytest.raises(RuntimeError, match="floating point"):
        torch.linalg.vector_norm(td["i"])
    with pytest.raises(RuntimeError, match="floating point"):
        td.norm()


# --------------------------------------------------------------------------- max / min without indices


@pytest.mark.parametrize("name", ["max", "min"])
@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("dim", [0, -1, (0, 1)])
def test_max_min_without_indices_is_the_values_tensordict(name, dim, keepdim):
    td = make_td()
    result = getattr(td, name)(dim, keepdim, return_indices=False)
    with_indices = getattr(td, name)(dim, keepdim)
    assert isinstance(result, TensorDict) and isinstance(with_indices, getattr(torch.return_types, name))
    dims = positive(dim)
    reference = torch.amax if name == "max" else torch.amin
    assert_leafwise(result, td, lambda leaf: reference(leaf, dims, keepdim), with_indices.values.batch_size)
    for key, leaf in tensor_leaves(with_indices.values).items():
        assert torch.equal(result[key], leaf)
    assert result["s"] == "shared"  # kept, as amax keeps it (the named tuple drops non-tensor entries)
    assert "s" not in with_indices.values.keys()


@pytest.mark.parametrize("name", ["max", "min"])
def test_max_min_without_dim_ignore_return_indices(name):
    td = make_td()
    result = getattr(td, name)(return_indices=False)
    assert_leafwise(result, td, getattr(torch, name), [])
    for key, leaf in tensor_leaves(getattr(td, name)()).items():
        assert torch.equal(result[key], leaf)


# --------------------------------------------------------------------------- cummax / cummin


@pytest.mark.parametrize("name", ["cummax", "cummin"])
@pytest.mark.parametrize("dim", [0, 1, -1, -2])
def test_cummax_cummin_equal_torch_and_keep_the_batch(name, dim):
    td = make_td()
    result = getattr(td, name)(dim)
    assert isinstance(result, getattr(torch.return_types, name))
    position = dim % 2
    fn = getattr(torch, name)
    assert_leafwise(result.values, td, lambda leaf: fn(leaf, position).values, td.batch_size)
    assert_leafwise(result.indices, td, lambda leaf: fn(leaf, position).indices, td.batch_size)
    assert result.values["n", "c"].batch_size == torch.Size([3, 4, 5])
    assert "s" not in result.values.keys() and "s" not in result.indices.keys()
    values_only = getattr(td, name)(dim=dim, return_indices=False)
    assert_leafwise(values_only, td, lambda leaf: fn(leaf, position).values, td.batch_size)
    assert values_only["s"] == "shared"


def test_cummax_keeps_names_and_pools_leaves_with_reduce():
    td = TensorDict(a=torch.tensor([[1.0, 5.0], [3.0, 2.0]]), b=torch.tensor([4.0, 0.0]), batch_size=[2],
                    names=["t"])
    assert td.cummax(0).values.names == ["t"]
    pooled = torch.cat([td["a"], td["b"][:, None]], dim=1)
    result = td.cummin(0, reduce=True)
    assert isinstance(result, torch.return_types.cummin)
    assert torch.equal(result.values, torch.cummin(pooled, 0).values)
    assert torch.equal(result.indices, torch.cummin(pooled, 0).indices)
    assert torch.equal(td.cummax(-1, reduce=True, return_indices=False), torch.cummax(pooled, 0).values)


def test_cummax_drops_per_element_non_tensor_entries():
    td = TensorDict(a=torch.tensor([2.0, 1.0, 3.0]), batch_size=[3])
    td["t"] = NonTensorStack(["p", "q", "r"], torch.Size([3]))
    assert "t" not in td.cummax(0, return_indices=False).keys()  # its values would not follow the maxima


# --------------------------------------------------------------------------- quantile


def test_quantile_without_dim_is_each_leafs_quantile():
    assert TensorDict({"a": torch.tensor([1.0, 3.0, 2.0])}, [3]).quantile(0.5)["a"] == torch.tensor(2.0)
    td = make_td()
    result = td.quantile(0.3)
    assert_leafwise(result, td, lambda leaf: torch.quantile(leaf, 0.3), [])
    assert result["s"] == "shared"
    kept = td.quantile(0.3, keepdim=True)
    assert_leafwise(kept, td, lambda leaf: torch.quantile(leaf, 0.3).reshape((1,) * leaf.ndim), [1, 1])


@pytest.mark.parametrize("interpolation", ["linear", "lower", "nearest", "midpoint"])
@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("dim", [0, 1, -1, -2])
def test_quantile_over_one_batch_dim_equals_torch(dim, keepdim, interpolation):
    td = make_td()
    position = dim % 2
    result = td.quantile(0.3, dim, keepdim, interpolation=interpolation)
    batch = torch.quantile(torch.zeros(3, 4), 0.3, position, keepdim).shape
    assert_leafwise(result, td, lambda leaf: torch.quantile(leaf, 0.3, position, keepdim,
                                                              interpolation=interpolation), batch)


@pytest.mark.parametrize("keepdim", [False, True])
def test_quantile_over_several_batch_dims_pools_their_elements(keepdim):
    td = make_td()

    def reference(leaf):
        result = torch.quantile(leaf.flatten(0, 1), 0.3, 0)
        return result[None, None] if keepdim else result

    assert_leafwise(td.quantile(0.3, (0, 1), keepdim), td, reference, [1, 1] if keepdim else [])
    assert_leafwise(td.quantile(0.3, (-1, 0), keepdim), td, reference, [1, 1] if keepdim else [])


def test_quantile_with_several_q_adds_a_leading_dim():
    td = make_td()
    q = torch.tensor([0.25, 0.5, 0.75])
    result = td.quantile(q, 1)
    assert_leafwise(result, td, lambda leaf: torch.quantile(leaf, q, 1), [3, 3])
    assert result["n", "c"].batch_size == torch.Size([3, 3, 5])
    kept = td.quantile(q, 0, keepdim=True)
    assert_leafwise(kept, td, lambda leaf: torch.quantile(leaf, q, 0, keepdim=True), [3, 1, 4])
    # Without dim the batch is [] (as upstream); with keepdim the q dim leads it.
    assert_leafwise(td.quantile(q), td, lambda leaf: torch.quantile(leaf, q), [])
    assert_leafwise(td.quantile(q, keepdim=True), td,
                    lambda leaf: torch.quantile(leaf, q).reshape((3,) + (1,) * leaf.ndim), [3, 1, 1])
    assert_leafwise(td.quantile(q, (0, 1), keepdim=True), td,
                    lambda leaf: torch.quantile(leaf.flatten(0, 1), q, 0)[:, None, None], [3, 1, 1])


def test_quantile_feature_and_reduce():
    td = TensorDict(a=torch.randn(3, 2, 2), b=torch.randn(3), batch_size=[3])
    result = td.quantile(0.5, "feature")
    torch.testing.assert_close(result["a"], torch.quantile(td["a"].flatten(1), 0.5, 1))
    torch.testing.assert_close(result["b"], td["b"])
    pooled = torch.cat([td["a"].flatten(1), td["b"][:, None]], dim=1)
    torch.testing.assert_close(td.quantile(0.5, reduce=True), torch.quantile(pooled, 0.5))
    torch.testing.assert_close(td.quantile(0.5, 0, reduce=True), torch.quantile(pooled.flatten(), 0.5))


@pytest.mark.parametrize("call, error", [
    (lambda td: td.quantile(1.5, 0), RuntimeError),
    (lambda td: td.quantile(0.5, 0, interpolation="cubic"), RuntimeError),
    (lambda td: td.int().quantile(0.5), RuntimeError),
])
def test_quantile_raises_torchs_errors(call, error):
    td = make_td()
    before = snapshot(td)
    with pytest.raises(error, match="quantile"):
        call(td)
    assert_same_snapshot(before, snapshot(td))


# --------------------------------------------------------------------------- dims that are not batch dims


@pytest.mark.parametrize("call", [
    lambda td: td.logsumexp(2),
    lambda td: td.logsumexp((0, -3)),
    lambda td: td.norm(2),
    lambda td: td.quantile(0.5, -3),
    lambda td: td.cummax(2),
    lambda td: td.cummin(-3),
    lambda td: td.max(2, return_indices=False),
])
def test_a_dim_outside_the_batch_raises_like_the_other_reductions(call):
    td = make_td()
    before = snapshot(td)
    with pytest.raises(IndexError, match="Incompatible dim"):
        td.sum(2)  # the existing reductions' error ...
    with pytest.raises(IndexError, match="Incompatible dim"):
        call(td)  # ... is the new ones' too
    assert_same_snapshot(before, snapshot(td))


def test_bad_dims_raise():
    td = make_td()
    before = snapshot(td)
    with pytest.raises(RuntimeError, match="appears multiple times"):
        td.logsumexp((0, -2))
    with pytest.raises(TypeError, match="cummax takes one batch dim"):
        td.cummax((0, 1))  # as torch.cummax, one dim only
    with pytest.raises(TypeError):
        td.cummin("feature")
    with pytest.raises(TypeError):
        td.cummax()  # dim is required, as in torch
    assert_same_snapshot(before, snapshot(td))


# --------------------------------------------------------------------------- random TensorDicts


@st.composite
def cases(draw):
    td = draw(tensordicts(non_tensor=True))
    n_batch = td.batch_dims
    dim = draw(st.integers(-n_batch, n_batch - 1)) if n_batch and draw(st.booleans()) else None
    return td, dim, draw(st.booleans())


def torch_op(name, leaf, dim, keepdim, n_batch):
    """The reference for one leaf (``dim``: None or a non-negative batch dim)."""
    if name == "logsumexp":
        if dim is None:  # every batch dim; with none, each element alone (x itself, as torch's result dtype)
            return torch.logsumexp(leaf, tuple(range(n_batch)), keepdim) if n_batch else torch.logsumexp(
                leaf.unsqueeze(-1), -1)
        return torch.logsumexp(leaf, dim, keepdim)
    fn = {"norm": torch.linalg.vector_norm, "quantile": lambda x, *args: torch.quantile(x, 0.25, *args)}[name]
    if dim is None:
        result = fn(leaf)
        return result.reshape((1,) * leaf.ndim) if keepdim else result
    return fn(leaf, dim, keepdim) if name == "quantile" else fn(leaf, 2, dim, keepdim)


@SETTINGS
@given(case=cases(), name=st.sampled_from(["logsumexp", "norm", "quantile"]))
def test_new_reductions_equal_torch_on_random_tensordicts(case, name):
    td, dim, keepdim = case
    n_batch = td.batch_dims
    position = None if dim is None else dim % n_batch
    args = (0.25,) if name == "quantile" else ()
    call = getattr(td, name)
    expected = {}
    error = None
    for key, leaf in tensor_leaves(td).items():
        try:
            expected[key] = torch_op(name, leaf, position, keepdim, n_batch)
        except RuntimeError as exc:  # e.g. an integer leaf: the TensorDict op raises the same type
            error = exc
            break
    before = snapshot(td)
    if error is not None:
        with pytest.raises(type(error)):
            call(*args, dim, keepdim) if dim is not None else call(*args, keepdim=keepdim)
        assert_same_snapshot(before, snapshot(td))
        return
    result = call(*args, dim, keepdim) if dim is not None else call(*args, keepdim=keepdim)
    got = tensor_leaves(result)
    assert set(got) == set(expected)
    for key, value in expected.items():
        torch.testing.assert_close(got[key], value, equal_nan=True, msg=str(key))
    for key, leaf in leaves(td).items():
        if isinstance(leaf, NonTensorData):
            assert result.get(key).data == leaf.data
        elif isinstance(leaf, NonTensorStack):
            assert key not in result.keys(include_nested=True)


def test_torch_functions_call_the_new_reductions():
    td = TensorDict({"a": torch.tensor([[1.0, 2.0], [3.0, 4.0]]), "n": {"b": torch.randn(2, 3)}}, batch_size=[2])
    for key in ("a", ("n", "b")):
        leaf = td[key]
        assert torch.allclose(torch.norm(td)[key], torch.linalg.vector_norm(leaf))
        assert torch.allclose(torch.norm(td, 1, 0)[key], torch.linalg.vector_norm(leaf, 1, 0))
        assert torch.allclose(torch.linalg.vector_norm(td, 1, 0)[key], torch.linalg.vector_norm(leaf, 1, 0))
        assert torch.allclose(torch.logsumexp(td, 0, keepdim=True)[key], torch.logsumexp(leaf, 0, keepdim=True))
        assert torch.allclose(torch.quantile(td, 0.5, 0)[key], torch.quantile(leaf, 0.5, 0))
        assert torch.equal(torch.cummax(td, 0).values[key], torch.cummax(leaf, 0).values)
        assert torch.equal(torch.cummin(td, dim=0).indices[key], torch.cummin(leaf, 0).indices)
    with pytest.raises(TypeError, match=r"out=\.\.\.\) is not supported"):
        torch.norm(td, out=td)
