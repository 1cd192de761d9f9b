"""torch.stack / torch.cat and the other torch functions on TensorDicts, against torch per leaf."""
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchdict import NonTensorData, NonTensorStack, TensorDict
from torchdict._torch_function import TORCH_FUNCTIONS, implements

from _helpers import assert_same_snapshot, snapshot
from _tensor_strategies import batch_sizes, leaves, tensordicts

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def make_td(offset=0.0):
    return TensorDict(
        {"key 1": torch.arange(60.0).view(3, 4, 5) + offset, "n": {"x": torch.zeros(3, 4, 2)}, "s": "str"},
        batch_size=[3, 4],
    )


def _like(td: TensorDict, seed: int) -> TensorDict:
    """A TensorDict with ``td``'s structure and other values (non-tensor values too)."""
    generator = torch.Generator().manual_seed(seed)
    other = td.apply(lambda leaf: (torch.rand(leaf.shape, generator=generator) * 100).to(leaf.dtype))
    if "text" in td.keys():
        other["text"] = NonTensorStack([f"{seed}-{i}" for i in range(td.batch_size.numel())], td.batch_size) \
            if td.batch_size.numel() else f"{seed}"
    return other


def _non_tensor_values(leaf) -> np.ndarray:
    values = np.empty(len(leaf._flat_values()), dtype=object)
    values[:] = leaf._flat_values()
    return values.reshape(tuple(leaf.batch_size))


def assert_combined(result: TensorDict, tds: list, combine, dim: int) -> None:
    """Every leaf of ``result`` is ``combine`` of the leaves of ``tds`` (objects stacked by numpy alike)."""
    per_td = [leaves(td) for td in tds]
    result_leaves = leaves(result)
    assert set(result_leaves) == set(per_td[0])
    for key, got in result_leaves.items():
        parts = [items[key] for items in per_td]
        if isinstance(got, torch.Tensor):
            expected = combine(parts, dim)
            assert got.dtype == expected.dtype and torch.equal(got, expected), key
        else:
            np_combine = np.stack if combine is torch.stack else np.concatenate
            expected = np_combine([_non_tensor_values(part) for part in parts], axis=dim)
            assert tuple(got.batch_size) == expected.shape, key
            assert list(got._flat_values()) == list(expected.reshape(-1)), key


# ------------------------------------------------------------------------------- stack


@SETTINGS
@given(data=st.data())
def test_stack_equals_torch_stack_per_leaf(data):
    td = data.draw(tensordicts())
    count = data.draw(st.integers(1, 4))
    tds = [td] + [_like(td, seed) for seed in range(1, count)]
    n_batch = td.batch_dims
    dim = data.draw(st.integers(-n_batch - 1, n_batch))
    positive = dim % (n_batch + 1)
    for result in (torch.stack(tds, dim), TensorDict.stack(tds, dim), torch.stack(tuple(tds), dim=dim)):
        expected_batch = td.batch_size[:positive] + (count,) + td.batch_size[positive:]
        assert result.batch_size == expected_batch
        assert_combined(result, tds, torch.stack, positive)
        # Dense: the leaves are new tensors.
        for key, leaf in td.items(include_nested=True, leaves_only=True):
            assert result[key].untyped_storage().data_ptr() != leaf.untyped_storage().data_ptr()


def test_seed_stack_and_cat_examples():
    tensordicts = [TensorDict({"key 1": torch.ones(3, 4, 5), "key 2": torch.zeros(3, 4, 5, dtype=torch.bool)},
                              batch_size=[3, 4]) for _ in range(2)]
    stack_tensordict = torch.stack(tensordicts, 1)
    assert stack_tensordict.shape == torch.Size([3, 2, 4])
    assert stack_tensordict["key 1"].shape == torch.Size([3, 2, 4, 5])
    cat_tensordict = torch.cat(tensordicts, 0)
    assert cat_tensordict.shape == torch.Size([6, 4])
    assert cat_tensordict["key 1"].shape == torch.Size([6, 4, 5])


def test_stack_of_non_tensor_values_gives_a_stack_even_when_equal():
    stacked = torch.stack([TensorDict(s="a"), TensorDict(s="b")])
    assert stacked["s"] == ["a", "b"] and type(stacked.get("s")) is NonTensorStack
    same = torch.stack([TensorDict(s="a"), TensorDict(s="a")])
    assert same["s"] == ["a", "a"] and type(same.get("s")) is NonTensorStack


def test_stack_merges_devices_promotes_dtypes_and_keeps_names():
    assert torch.stack([TensorDict(a=1, device="cpu"), TensorDict(a=1.5)]).device == torch.device("cpu")
    assert torch.stack([TensorDict(a=1), TensorDict(a=1.5, device="cpu")]).device == torch.device("cpu")
    assert torch.stack([TensorDict(a=1), TensorDict(a=1.5)]).device is None
    assert torch.stack([TensorDict(a=1), TensorDict(a=1.5)])["a"].dtype == torch.float32
    td = make_td()
    td.names = ["a", "b"]
    assert torch.stack([td, td], 1).names == ["a", None, "b"]
    assert torch.stack([make_td(), make_td()], 1).names == [None, None, None]


def test_stack_result_is_unlocked_and_out_is_written_in_place():
    locked = make_td().lock_()
    assert not torch.stack([locked, locked]).is_locked
    out = torch.stack([make_td(), make_td()])
    leaf = out["key 1"]
    result = torch.stack([make_td(1.0), make_td(2.0)], 0, out=out)
    assert result is out and out["key 1"] is leaf
    assert torch.equal(leaf[1], make_td(2.0)["key 1"])
    assert out["s"] == [[["str"] * 4] * 3] * 2


def test_a_list_of_tensordicts_is_stacked_on_write():
    td = TensorDict(x=[TensorDict(a=1), TensorDict(a=2)])
    assert td["x"].batch_size == torch.Size([2]) and td["x", "a"].tolist() == [1, 2]


@pytest.mark.parametrize(
    "tds, error, fragment",
    [
        ([TensorDict(a=1), TensorDict(b=1)], RuntimeError, "The sets of keys in the tensordicts to stack are exclusive"),
        ([TensorDict(a=1), TensorDict(a=1, b=1)], RuntimeError, "are exclusive"),
        ([TensorDict(a={"b": 1}), TensorDict(a={"c": 1})], RuntimeError, "are exclusive"),
        ([make_td(), make_td()[:2]], RuntimeError,
         "stacking tensordicts requires them to have congruent batch sizes, got td[1].batch_size=torch.Size([2, 4]) "
         "and td[0].batch_size=torch.Size([3, 4])"),
        ([TensorDict(a=torch.ones(4)), TensorDict(a=torch.ones(3))], RuntimeError,
         "The shapes of the tensors to stack is incompatible: torch.Size([3]) vs torch.Size([4]) for key a."),
        ([TensorDict(a={"b": torch.ones(4)}), TensorDict(a={"b": torch.ones(3)})], RuntimeError,
         "The shapes of the tensors to stack is incompatible"),
        ([TensorDict(a=1), TensorDict(a="x")], TypeError, "Cannot stack the entries at key 'a'"),
        ([TensorDict(a=1), TensorDict(a={"b": 1})], TypeError, "Cannot stack the entries at key 'a'"),
        ([TensorDict(a=1), torch.ones(1)], TypeError, "got an element that is not a TensorDict"),
    ],
)
def test_stack_errors(tds, error, fragment):
    befores = [snapshot(td) for td in tds if isinstance(td, TensorDict)]
    with pytest.raises(error) as info:
        torch.stack(tds)
    assert fragment in str(info.value)
    assert [snapshot(td) for td in tds if isinstance(td, TensorDict)] is not None
    for before, td in zip(befores, [td for td in tds if isinstance(td, TensorDict)]):
        assert_same_snapshot(before, snapshot(td))


def test_stack_of_an_empty_list_and_a_dim_out_of_range():
    with pytest.raises(RuntimeError, match="stack expects a non-empty TensorList"):
        TensorDict.stack([])
    with pytest.raises(IndexError, match=r"Dimension out of range \(expected to be in range of \[-3, 2\], but got 3\)"):
        torch.stack([make_td(), make_td()], 3)


# ------------------------------------------------------------------------------- cat


@SETTINGS
@given(data=st.data())
def test_cat_equals_torch_cat_per_leaf(data):
    base = data.draw(tensordicts(batch=data.draw(batch_sizes(min_dims=1))))
    n_batch = base.batch_dims
    dim = data.draw(st.integers(-n_batch, n_batch - 1))
    positive = dim % n_batch
    size = base.batch_size[positive]
    cut = data.draw(st.integers(0, size))
    pieces = list(base.split([cut, size - cut], positive))
    pieces.append(_like(base, 7))
    result = torch.cat(pieces, dim)
    assert result.batch_size[positive] == 2 * size
    assert_combined(result, pieces, torch.cat, positive)
    assert_combined(TensorDict.cat(pieces, dim), pieces, torch.cat, positive)


def test_cat_keeps_a_shared_non_tensor_value_shared():
    result = torch.cat([make_td(), make_td()])
    assert type(result.get("s")) is NonTensorData and result.get("s").batch_size == torch.Size([6, 4])
    mixed = torch.cat([TensorDict(s="a", batch_size=[]).expand(2), TensorDict(s="b", batch_size=[]).expand(1)])
    assert mixed["s"] == ["a", "a", "b"]


def test_cat_out_and_names():
    td = make_td()
    td.names = ["a", "b"]
    assert torch.cat([td, td], 1).names == ["a", "b"]
    out = torch.cat([make_td(), make_td()], 0)
    leaf = out["n", "x"]
    assert torch.cat([make_td(), make_td(1.0)], 0, out=out) is out and out["n", "x"] is leaf
    assert torch.equal(out["key 1"][3:], make_td(1.0)["key 1"])


@pytest.mark.parametrize(
    "tds, dim, error, fragment",
    [
        ([make_td(), make_td().exclude("key 1")], 0, KeyError,
         "tensordict 1 has keys ['n', 's'] but tensordict 0 has keys ['key 1', 'n', 's']; "
         "all tensordicts must have the same keys"),
        ([TensorDict(a={"b": torch.ones(1)}, batch_size=[1]), TensorDict(a={"c": torch.ones(1)}, batch_size=[1])],
         0, KeyError, "tensordict 1 has keys ['c'] but tensordict 0 has keys ['b']"),
        ([TensorDict(a=1), TensorDict(a=1)], 0, RuntimeError,
         "dim must be in the range 0 <= dim < len(batch_size), got dim=0 and batch_size=[]"),
        ([make_td(), make_td()], 2, RuntimeError, "got dim=2 and batch_size=[3, 4]"),
        ([make_td(), make_td()[:, :2]], 0, RuntimeError,
         "Sizes of tensors must match except in dimension 0. Expected size 4 but got size 2 for tensor number 1"),
        ([TensorDict(a=torch.ones(2, 4), batch_size=[2]), TensorDict(a=torch.ones(2, 3), batch_size=[2])], 0,
         RuntimeError, "Sizes of tensors must match except in dimension 0"),
        ([TensorDict(a=torch.ones(2), batch_size=[2]), TensorDict(a="x", batch_size=[2])], 0, TypeError,
         "Cannot cat the entries at key 'a'"),
    ],
)
def test_cat_errors(tds, dim, error, fragment):
    befores = [snapshot(td) for td in tds]
    with pytest.raises(error) as info:
        torch.cat(tds, dim)
    assert fragment in str(info.value)
    for before, td in zip(befores, tds):
        assert_same_snapshot(before, snapshot(td))


def test_cat_of_an_empty_list():
    with pytest.raises(ValueError, match="expected a non-empty list of Tensors"):
        TensorDict.cat([])


# ------------------------------------------------------------------------------- other torch functions


@pytest.mark.parametrize(
    "function, args, kwargs, leaf_function",
    [
        (torch.zeros_like, (), {}, torch.zeros_like),
        (torch.ones_like, (), {"dtype": torch.float64}, torch.ones_like),
        (torch.full_like, (2.5,), {}, torch.full_like),
        (torch.empty_like, (), {}, torch.empty_like),
    ],
)
def test_like_functions_apply_to_every_leaf(function, args, kwargs, leaf_function):
    td = make_td()
    result = function(td, *args, **kwargs)
    assert result.batch_size == td.batch_size and result["s"] == "str"
    for key, leaf in td.items(include_nested=True, leaves_only=True):
        expected = leaf_function(leaf, *args, **kwargs)
        assert result[key].shape == expected.shape and result[key].dtype == expected.dtype
        if function is not torch.empty_like:
            assert torch.equal(result[key], expected)


def test_an_unknown_torch_function_raises_type_error():
    with pytest.raises(TypeError):
        torch.trace(make_td())


def test_other_modules_can_register_torch_functions():
    @implements(torch.numel)
    def numel(td):
        return td.numel()

    try:
        assert torch.numel(make_td()) == 12
    finally:
        del TORCH_FUNCTIONS[torch.numel]


@pytest.mark.skipif(not hasattr(TensorDict, "clone"), reason="clone is provided by the moves module")
def test_torch_clone_dispatches_to_the_method():
    td = make_td()
    cloned = torch.clone(td)
    assert torch.equal(cloned["key 1"], td["key 1"]) and cloned["key 1"] is not td["key 1"]


@pytest.mark.skipif(not hasattr(TensorDict, "where"), reason="where is provided by the ops module")
def test_torch_where_dispatches_to_the_method():
    td = make_td()
    condition = torch.zeros(3, 4, dtype=torch.bool)
    condition[0] = True
    result = torch.where(condition, td, td * 0)
    assert torch.equal(result["key 1"][0], td["key 1"][0]) and not result["key 1"][1:].any()


def test_module_level_stack_and_cat():
    import torchdict

    tds = [TensorDict({"a": torch.zeros(2, 3)}, batch_size=[2]), TensorDict({"a": torch.ones(2, 3)}, batch_size=[2])]
    assert torch.equal(torchdict.stack(tds, 1)["a"], torch.stack([tds[0]["a"], tds[1]["a"]], 1))
    assert torch.equal(torchdict.cat(tds)["a"], torch.cat([tds[0]["a"], tds[1]["a"]]))


def test_docstring_examples_run():
    import doctest

    import torchdict._indexing
    import torchdict._shape
    import torchdict._torch_function

    for module in (torchdict._indexing, torchdict._shape, torchdict._torch_function):
        failures, tried = doctest.testmod(module, extraglobs={"torch": torch, "TensorDict": TensorDict})
        assert tried and not failures, module.__name__


def test_tensorclasses_stack_and_cat_into_their_class():
    from torchdict import tensorclass

    @tensorclass
    class Pair:
        x: torch.Tensor
        label: str = "a"

    pairs = [Pair(x=torch.zeros(3, 2), batch_size=[3]), Pair(x=torch.ones(3, 2), batch_size=[3])]
    stacked = torch.stack(pairs, 1)
    assert type(stacked) is Pair and stacked.batch_size == torch.Size([3, 2])
    assert torch.equal(stacked.x, torch.stack([pairs[0].x, pairs[1].x], 1))
    assert type(torch.cat(pairs)) is Pair and torch.cat(pairs).batch_size == torch.Size([6])
    nested = torch.stack([TensorDict({"p": pairs[0]}, [3]), TensorDict({"p": pairs[1]}, [3])])
    assert type(nested["p"]) is Pair and nested["p"].batch_size == torch.Size([2, 3])
    data = TensorDict({}, [4])
    data[1] = TensorDict({"p": Pair(x=torch.ones(2), batch_size=[])})
    assert type(data["p"]) is Pair and data["p"].x.sum() == 2
