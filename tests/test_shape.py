"""Shape operations on the batch dims, stated against torch on a tensor of the batch shape.

For every op, ``op(td)`` holds each leaf rearranged the way ``op`` rearranges
``arange(numel).view(batch)`` (the *grid*); feature dims are untouched.
"""
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchdict import TensorDict

from _helpers import assert_same_snapshot, snapshot
from _tensor_strategies import assert_matches_grid, batch_sizes, grid_of, tensordicts

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def make_td():
    return TensorDict(
        {"key 1": torch.arange(60.0).view(3, 4, 5), "n": {"x": torch.zeros(3, 4, 2)}, "s": "str"},
        batch_size=[3, 4],
    )


def check_views(result, td):
    """Every tensor leaf of ``result`` lives in the storage of the same leaf of ``td``."""
    for key, leaf in td.items(include_nested=True, leaves_only=True):
        if leaf.numel():
            assert result[key].untyped_storage().data_ptr() == leaf.untyped_storage().data_ptr(), key


@st.composite
def td_and_dim(draw, min_dims=1, extra=0):
    td = draw(tensordicts(batch=draw(batch_sizes(min_dims=min_dims))))
    n_batch = td.batch_dims
    return td, draw(st.integers(-n_batch - extra, n_batch - 1 + extra))


# ------------------------------------------------------------------------------- single-result ops


@st.composite
def new_shapes(draw, batch):
    numel = batch.numel()
    options = [(numel,), tuple(reversed(batch)), (1, *batch), (*batch, 1)]
    divisors = [d for d in range(1, numel + 1) if numel % d == 0]
    first = draw(st.sampled_from(divisors))
    options.append((first, numel // first))
    shape = list(draw(st.sampled_from(options)))
    if shape and draw(st.booleans()):
        shape[draw(st.integers(0, len(shape) - 1))] = -1
    return tuple(shape)


@SETTINGS
@given(data=st.data())
def test_view_and_reshape_equal_torch_and_view_shares_storage(data):
    td = data.draw(tensordicts())
    shape = data.draw(new_shapes(td.batch_size))
    expected = grid_of(td.batch_size).view(shape)
    viewed = td.view(*shape) if data.draw(st.booleans()) else td.view(shape)
    assert_matches_grid(viewed, td, expected)
    check_views(viewed, td)
    assert_matches_grid(td.reshape(shape), td, expected)
    assert_matches_grid(torch.reshape(td, shape), td, expected)


@SETTINGS
@given(data=st.data())
def test_reshape_of_a_non_contiguous_tensordict_copies_like_torch(data):
    td = data.draw(tensordicts(batch=data.draw(batch_sizes(min_dims=2))))
    transposed = td.transpose(0, 1)
    grid = grid_of(td.batch_size).transpose(0, 1)
    assert_matches_grid(transposed.reshape(-1), td, grid.reshape(-1))


@SETTINGS
@given(data=st.data())
def test_unsqueeze_and_squeeze_equal_torch(data):
    td, dim = data.draw(td_and_dim(min_dims=0, extra=1))
    grid = grid_of(td.batch_size)
    unsqueezed = td.unsqueeze(dim)
    assert_matches_grid(unsqueezed, td, grid.unsqueeze(dim))
    check_views(unsqueezed, td)
    assert_matches_grid(torch.unsqueeze(td, dim), td, grid.unsqueeze(dim))
    assert_matches_grid(unsqueezed.squeeze(dim), td, grid)
    assert_matches_grid(unsqueezed.squeeze(), td, grid.unsqueeze(dim).squeeze())
    assert_matches_grid(torch.squeeze(unsqueezed), td, grid.unsqueeze(dim).squeeze())


@SETTINGS
@given(data=st.data())
def test_permute_transpose_movedim_equal_torch(data):
    td = data.draw(tensordicts(batch=data.draw(batch_sizes(min_dims=1))))
    n_batch = td.batch_dims
    grid = grid_of(td.batch_size)
    order = data.draw(st.permutations(range(n_batch)))
    order = [dim - n_batch if data.draw(st.booleans()) else dim for dim in order]
    permuted = td.permute(*order)
    assert_matches_grid(permuted, td, grid.permute(*order))
    assert_matches_grid(td.permute(order), td, grid.permute(*order))
    assert_matches_grid(torch.permute(td, order), td, grid.permute(*order))
    check_views(permuted, td)
    dim0, dim1 = (data.draw(st.integers(-n_batch, n_batch - 1)) for _ in range(2))
    assert_matches_grid(td.transpose(dim0, dim1), td, grid.transpose(dim0, dim1))
    assert_matches_grid(torch.transpose(td, dim0, dim1), td, grid.transpose(dim0, dim1))
    assert_matches_grid(td.swapaxes(dim0, dim1), td, grid.swapaxes(dim0, dim1))
    assert_matches_grid(td.movedim(dim0, dim1), td, grid.movedim(dim0, dim1))
    assert_matches_grid(torch.movedim(td, dim0, dim1), td, grid.movedim(dim0, dim1))


@SETTINGS
@given(data=st.data())
def test_expand_equals_torch(data):
    td = data.draw(tensordicts(batch=data.draw(batch_sizes(min_size=1, max_size=2))))
    new_dims = data.draw(st.lists(st.integers(1, 3), max_size=2))
    shape = list(new_dims)
    for size in td.batch_size:
        shape.append(data.draw(st.sampled_from([size, -1] + ([3] if size == 1 else []))))
    expanded = td.expand(*shape)
    assert_matches_grid(expanded, td, grid_of(td.batch_size).expand(shape))
    assert_matches_grid(td.expand(shape), td, grid_of(td.batch_size).expand(shape))
    check_views(expanded, td)


@SETTINGS
@given(data=st.data())
def test_flatten_and_unflatten_equal_torch(data):
    td = data.draw(tensordicts(batch=data.draw(batch_sizes(min_dims=1))))
    n_batch = td.batch_dims
    grid = grid_of(td.batch_size)
    start = data.draw(st.integers(0, n_batch - 1))
    end = data.draw(st.integers(start, n_batch - 1))
    start, end = (start - n_batch if data.draw(st.booleans()) else start), end
    flat = td.flatten(start, end)
    assert_matches_grid(flat, td, grid.flatten(start, end))
    assert_matches_grid(torch.flatten(td, start, end), td, grid.flatten(start, end))
    check_views(flat, td)
    dim = data.draw(st.integers(-n_batch, n_batch - 1))
    size = td.batch_size[dim]
    sizes = data.draw(st.sampled_from([(1, size), (size, 1), (-1, 1), (1, -1, 1)]))
    assert_matches_grid(td.unflatten(dim, sizes), td, grid.unflatten(dim, sizes))


def test_flatten_of_a_zero_dim_tensordict_gives_one_dim():
    td = TensorDict(a=torch.zeros(3))
    assert td.flatten().batch_size == torch.Size([1]) and td.flatten()["a"].shape == (1, 3)


@SETTINGS
@given(data=st.data())
def test_flip_roll_narrow_repeat_gather_equal_torch(data):
    td, dim = data.draw(td_and_dim())
    grid = grid_of(td.batch_size)
    assert_matches_grid(td.flip(dim), td, grid.flip(dim))
    assert_matches_grid(torch.flip(td, (dim,)), td, grid.flip(dim))
    shift = data.draw(st.integers(-3, 3))
    assert_matches_grid(td.roll(shift, dim), td, grid.roll(shift, dim))
    assert_matches_grid(td.roll(shift), td, grid.roll(shift))
    size = td.batch_size[dim]
    start = data.draw(st.integers(0, size - 1))
    length = data.draw(st.integers(0, size - start))
    assert_matches_grid(td.narrow(dim, start, length), td, grid.narrow(dim, start, length))
    repeats = data.draw(st.lists(st.integers(1, 2), min_size=td.batch_dims, max_size=td.batch_dims))
    assert_matches_grid(td.repeat(*repeats), td, grid.repeat(*repeats))
    index_shape = list(td.batch_size)
    index_shape[dim] = data.draw(st.integers(1, 3))
    index = torch.randint(0, size, index_shape)
    assert_matches_grid(td.gather(dim, index), td, grid.gather(dim, index))
    assert_matches_grid(torch.gather(td, dim, index), td, grid.gather(dim, index))


# ------------------------------------------------------------------------------- several results


@SETTINGS
@given(data=st.data())
def test_unbind_split_chunk_tensor_split_equal_torch(data):
    td, dim = data.draw(td_and_dim())
    grid = grid_of(td.batch_size)
    size = td.batch_size[dim]
    pieces_by_op = [
        (td.unbind(dim), grid.unbind(dim)),
        (torch.unbind(td, dim), grid.unbind(dim)),
    ]
    split_size = data.draw(st.integers(1, size + 1))
    pieces_by_op.append((td.split(split_size, dim), grid.split(split_size, dim)))
    pieces_by_op.append((torch.split(td, split_size, dim), grid.split(split_size, dim)))
    cut = data.draw(st.integers(0, size))
    pieces_by_op.append((td.split([cut, size - cut], dim), grid.split([cut, size - cut], dim)))
    chunks = data.draw(st.integers(1, 4))
    pieces_by_op.append((td.chunk(chunks, dim), grid.chunk(chunks, dim)))
    pieces_by_op.append((torch.chunk(td, chunks, dim), grid.chunk(chunks, dim)))
    pieces_by_op.append((td.tensor_split(chunks, dim), grid.tensor_split(chunks, dim)))
    for pieces, expected in pieces_by_op:
        assert isinstance(pieces, tuple) and len(pieces) == len(expected)
        for piece, grid_piece in zip(pieces, expected):
            assert_matches_grid(piece, td, grid_piece)
            check_views(piece, td)


def test_iteration_unbinds_dim_zero():
    td = make_td()
    rows = list(td)
    assert len(rows) == 3 and all(row.batch_size == torch.Size([4]) for row in rows)
    assert torch.equal(rows[2]["key 1"], td["key 1"][2])
    with pytest.raises(TypeError):
        iter(TensorDict(a=1))


# ------------------------------------------------------------------------------- identities, views, names


def test_ops_that_change_nothing_return_self():
    td = make_td()
    assert td.view(3, 4) is td and td.view((3, 4)) is td and td.view(-1, 4) is td
    assert td.reshape(3, 4) is td
    assert td.permute(0, 1) is td and td.transpose(1, 1) is td
    assert td.squeeze() is td and td.squeeze(0) is td


def test_edits_through_a_view_reach_the_parent():
    td = make_td()
    td.view(-1)["key 1"][0] = -1
    td.permute(1, 0)["n", "x"][0, 0] = 5
    td.unsqueeze(0)["key 1"][0, 2] = -2
    assert (td["key 1"][0, 0] == -1).all() and (td["n", "x"][0, 0] == 5).all() and (td["key 1"][2] == -2).all()


def test_names_follow_the_batch_dims():
    td = make_td()
    td.names = ["a", "b"]
    assert td.permute(1, 0).names == ["b", "a"]
    assert td.transpose(0, 1).names == ["b", "a"]
    assert td.unsqueeze(1).names == ["a", None, "b"]
    assert td.unsqueeze(1).squeeze(1).names == ["a", "b"]
    assert td.expand(2, 3, 4).names == [None, "a", "b"]
    assert td.unbind(0)[0].names == ["b"]
    assert td.split(1, 0)[0].names == ["a", "b"]
    assert td.view(-1).names == [None]
    assert td.flatten().names == [None]


def test_view_dtype_reinterprets_every_leaf():
    td = TensorDict({"a": torch.ones(3, 2), "b": torch.zeros(3, 4)}, batch_size=[3])
    viewed = td.view(torch.int32)
    assert viewed["a"].dtype == torch.int32 and torch.equal(viewed["a"], td["a"].view(torch.int32))
    with pytest.raises(RuntimeError, match="batch dimension mismatch"):
        TensorDict({"a": torch.ones(3)}, batch_size=[3]).view(torch.int8)


def test_view_keywords():
    td = make_td()
    assert td.view(size=(12,)).batch_size == torch.Size([12])
    assert td.view(batch_size=[2, 6]).batch_size == torch.Size([2, 6])


def test_inplace_flatten_and_unflatten():
    td = make_td()
    leaf = td["key 1"]
    assert td.flatten(inplace=True) is td
    assert td.batch_size == torch.Size([12]) and td["key 1"].shape == (12, 5)
    assert td["key 1"].untyped_storage().data_ptr() == leaf.untyped_storage().data_ptr()
    td.unflatten(0, (3, 4), inplace=True)
    assert td.batch_size == torch.Size([3, 4]) and torch.equal(td["key 1"], leaf)


def test_empty_keeps_structure_only_when_asked():
    td = make_td()
    assert list(td.empty().keys()) == [] and td.empty().batch_size == td.batch_size
    nested = td.empty(recurse=True)
    assert list(nested.keys(include_nested=True)) == ["n", "s"]
    assert nested["n"].batch_size == torch.Size([3, 4]) and nested["s"] == "str"
    other = TensorDict({"n": TensorDict({"x": torch.zeros(3, 4)}, [3, 4])}, [3]).empty(recurse=True, batch_size=[3])
    assert other["n"].batch_size == torch.Size([3, 4])
    assert td.empty(batch_size=[2]).batch_size == torch.Size([2])


def test_new_zeros_ones_full_empty_keep_the_structure():
    td = make_td()
    zeros = td.new_zeros(2, 3)
    assert zeros.batch_size == torch.Size([2, 3])
    assert zeros["key 1"].shape == (2, 3, 5) and not zeros["key 1"].any()
    assert zeros["n", "x"].shape == (2, 3, 2) and zeros["s"] == "str"
    assert (td.new_ones((2,))["key 1"] == 1).all()
    full = td.new_full([2], 7.0)
    assert (full["key 1"] == 7).all() and full["key 1"].dtype == torch.float32
    assert td.new_empty(4)["n", "x"].shape == (4, 2)
    assert td.new_zeros(2, dtype=torch.int32)["key 1"].dtype == torch.int32


# ------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "op, error, fragment",
    [
        (lambda td: td.view(5), RuntimeError, "invalid shape [5] for a batch of 12 elements"),
        (lambda td: td.view(-1, 5), RuntimeError, "invalid shape [-1, 5] for a batch of 12 elements"),
        (lambda td: td.view(-1, -1), RuntimeError, "only one dimension can be inferred"),
        (lambda td: td.reshape(5), RuntimeError, "invalid shape [5] for a batch of 12 elements"),
        (lambda td: td.transpose(0, 1).view(-1), RuntimeError, "view size is not compatible"),
        (lambda td: td.unsqueeze(3), RuntimeError,
         "unsqueezing is allowed for dims comprised between `-td.batch_dims - 1` and `td.batch_dims` only. "
         "Got dim=3 with a batch size of torch.Size([3, 4])."),
        (lambda td: td.unsqueeze(-4), RuntimeError, "Got dim=-4"),
        (lambda td: td.squeeze(3), IndexError, "Incompatible dim 3 for tensordict with shape torch.Size([3, 4])."),
        (lambda td: td.permute(0, 0), ValueError,
         "Cannot compute the permutation, got dims=[0, 0] but expected a permutation of [0, 1]."),
        (lambda td: td.permute(0), ValueError, "permutation order incompatible with the tensordict shape"),
        (lambda td: td.permute(0, 2), ValueError, "permutation order incompatible with the tensordict shape"),
        (lambda td: td.transpose(0, 2), ValueError, "dim0 and dim1 must be within the range of the number of dimensions."),
        (lambda td: td.movedim(0, 2), IndexError, "Dimension out of range"),
        (lambda td: td.expand(4), RuntimeError,
         "the number of sizes provided (1) must be greater or equal to the number of dimensions in the TensorDict (2)"),
        (lambda td: td.expand(2, 3, 5), RuntimeError,
         "Incompatible expanded shape: The expanded shape length at non-singleton dimension should be same as the "
         "original length. target_shape = (2, 3, 5), existing_shape = torch.Size([3, 4])"),
        (lambda td: td.flatten(0, 2), IndexError, "Dimension out of range"),
        (lambda td: td.unflatten(1, (3, 2)), RuntimeError, "don't multiply up to the size of dim 1 (4)"),
        (lambda td: td.unflatten(2, (5, 1)), IndexError, "Incompatible dim 2"),
        (lambda td: td.unbind(2), IndexError, "Incompatible dim 2 for tensordict with shape torch.Size([3, 4])."),
        (lambda td: td.split([1, 2], 1), RuntimeError, "split_with_sizes expects split_sizes to sum exactly to 4"),
        (lambda td: td.split(2, 2), IndexError, "Incompatible dim 2"),
        (lambda td: td.chunk(2, 3), IndexError, "Incompatible dim 3"),
        (lambda td: td.repeat(2), ValueError,
         "The number of repeat elements must match the number of dimensions of the tensordict. Got 1 but ndim=2."),
    ],
)
def test_shape_errors_match_upstream_and_change_nothing(op, error, fragment):
    td = make_td()
    before = snapshot(td)
    with pytest.raises(error) as info:
        op(td)
    assert fragment in str(info.value)
    assert_same_snapshot(before, snapshot(td))


@pytest.mark.parametrize("op", [lambda td: td.unbind(0), lambda td: td.chunk(2, 0), lambda td: td.split(1)])
def test_split_like_ops_on_a_zero_dim_tensordict_raise(op):
    with pytest.raises(IndexError, match=r"Incompatible dim 0 for tensordict with shape torch.Size\(\[\]\)"):
        op(TensorDict(a=1))


def test_expand_a_zero_dim_tensordict_to_any_batch():
    expanded = TensorDict(a=torch.tensor([1.0, 2.0])).expand(3, 2)
    assert expanded.batch_size == torch.Size([3, 2]) and expanded["a"].shape == (3, 2, 2)
    assert expanded["a"].stride()[:2] == (0, 0)


def test_squeeze_keeps_feature_dims_of_size_one():
    td = TensorDict({"a": torch.zeros(3, 1)}, batch_size=[3])
    assert td.squeeze()["a"].shape == (3, 1)
    assert math.prod(td.unsqueeze(0).squeeze(0)["a"].shape) == 3


_LOCK_KEEPING_OPS = {
    "view": lambda td: td.view(-1), "reshape": lambda td: td.reshape(4, 3), "unsqueeze": lambda td: td.unsqueeze(0),
    "squeeze": lambda td: td.unsqueeze(0).squeeze(0), "permute": lambda td: td.permute(1, 0),
    "transpose": lambda td: td.transpose(0, 1), "movedim": lambda td: td.movedim(0, 1),
    "expand": lambda td: td.expand(2, 3, 4), "flatten": lambda td: td.flatten(),
    "unflatten": lambda td: td.unflatten(1, (2, 2)), "flip": lambda td: td.flip(0),
    "roll": lambda td: td.roll(1, 0), "narrow": lambda td: td.narrow(0, 0, 2),
    "split": lambda td: td.split(2)[0], "chunk": lambda td: td.chunk(2)[1], "add": lambda td: td + 1,
    "neg": lambda td: -td, "exp": lambda td: td.exp(), "mul td": lambda td: td * td,
    "lerp": lambda td: td.float().lerp(td.float() + 1, 0.5), "zeros_like": torch.zeros_like,
    "full_like": lambda td: torch.full_like(td, 2), "ones_like": torch.ones_like,
}


@pytest.mark.parametrize("name", sorted(_LOCK_KEEPING_OPS))
def test_view_like_and_pointwise_results_of_a_locked_td_are_locked(name):
    # As upstream: these results keep the lock (select, clone, indexing, unbind and apply don't).
    # The result holds sub-TensorDicts of its own: unlocking the source frees its children.
    op = _LOCK_KEEPING_OPS[name]
    expected = op(make_td())
    assert not expected.is_locked
    td = make_td().lock_()
    result = op(td)
    assert result.is_locked and result["n"].is_locked
    for key, leaf in expected.items(include_nested=True, leaves_only=True):
        assert torch.equal(result[key], leaf)
    td.unlock_()
    td["n"].unlock_()  # not pinned by the locked result
    assert result.is_locked


def test_unlocked_results_of_a_locked_td():
    td = make_td().lock_()
    for result in (td[0], td[:2], td.clone(), td.select("key 1"), td.unbind(0)[0], td.apply(lambda x: x),
                   td.exclude("s") == 0, td.sum(0)):
        assert not result.is_locked


@pytest.mark.parametrize("call, message", [
    (lambda td: td.split(0), "TensorDict.split: split_size must be positive, got 0."),
    (lambda td: td.split(-1), "TensorDict.split: split_size must be positive, got -1."),
    (lambda td: td.chunk(0), "chunks must be a strictly positive integer, got 0."),
])
def test_split_and_chunk_refuse_non_positive_sizes_with_upstreams_value_error(call, message):
    td = make_td()
    before = snapshot(td)
    with pytest.raises(ValueError, match=message):
        call(td)
    assert_same_snapshot(before, snapshot(td))


@pytest.mark.parametrize("reps", [(2,), (2, 1), (1, 2), (2, 2, 2), ((3, 2),)])
def test_tile_is_torch_tile_of_the_batch(reps):
    td = make_td()
    result = td.tile(*reps)
    dims = reps[0] if isinstance(reps[0], tuple) else reps
    grid = torch.arange(12).view(3, 4).tile(dims)
    assert result.batch_size == grid.shape
    assert torch.equal(result["key 1"], td["key 1"].reshape(12, 5)[grid.reshape(-1)].view(*grid.shape, 5))
    assert result["n", "x"].shape == grid.shape + (2,) and result["s"] == "str"
    assert torch.equal(torch.tile(td, dims)["key 1"], result["key 1"])


@pytest.mark.parametrize("args, kwargs", [((2,), {}), ((2,), {"dim": 1}), ((torch.tensor([1, 0, 2]),), {"dim": 0}),
                                          ((3,), {"dim": -1, "output_size": 12})])
def test_repeat_interleave_is_torchs_on_the_batch(args, kwargs):
    td = make_td()
    result = td.repeat_interleave(*args, **kwargs)
    grid = torch.arange(12).view(3, 4).repeat_interleave(*args, **kwargs)
    assert result.batch_size == grid.shape
    assert torch.equal(result["key 1"], td["key 1"].reshape(12, 5)[grid.reshape(-1)].view(*grid.shape, 5))
    assert torch.equal(torch.repeat_interleave(td, *args, **kwargs)["key 1"], result["key 1"])


def test_masked_select_is_boolean_indexing_and_refuses_other_masks():
    td = make_td()
    mask = torch.tensor([[True, False, True, False], [False, False, True, True], [True, True, True, True]])
    result = td.masked_select(mask)
    assert torch.equal(result["key 1"], td["key 1"][mask]) and result.batch_size == torch.Size([int(mask.sum())])
    assert torch.equal(torch.masked_select(td, mask[:, 0])["key 1"], td["key 1"][mask[:, 0]])
    before = snapshot(td)
    with pytest.raises(RuntimeError, match="expected a bool tensor for the mask, got a torch.int64 tensor"):
        td.masked_select(mask.long())
    with pytest.raises(IndexError):
        td.masked_select(torch.ones(4, dtype=torch.bool))
    assert_same_snapshot(before, snapshot(td))
