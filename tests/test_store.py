"""TensorDictStore on a real redis-server: differential against upstream's store on the same server, the stored
format (no pickle, documented schema), row-range reads and writes, isolation, bad input, the optional client."""
from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import uuid

import pytest
import torch

from torchdict import NonTensorData, TensorDict
from torchdict.store import TensorDictStore

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def make_store(redis_server):
    """Stores on the test server, each under a prefix of its own; deleted after the test."""
    made = []

    def make(cls=TensorDictStore, **kwargs):
        kwargs.setdefault("unix_socket_path", redis_server.unix_socket_path)
        kwargs.setdefault("prefix", f"test-{uuid.uuid4().hex[:8]}")
        store = cls(**kwargs)
        made.append(store)
        return store

    yield make
    for store in made:
        try:
            store.clear_redis()
        except Exception:
            pass


@pytest.fixture
def raw_client(redis_server):
    import redis

    client = redis.Redis(unix_socket_path=redis_server.unix_socket_path)
    yield client
    client.close()


@pytest.fixture(scope="session")
def upstream_store():
    return pytest.importorskip("tensordict.store", reason="upstream tensordict runs the differential tests")


@pytest.fixture
def pair(redis_server, upstream_store):
    """``make(batch_size)``: a torchdict store and an upstream store on the same server, different prefixes."""
    made = []

    def make(batch_size, **kwargs):
        mine = TensorDictStore(unix_socket_path=redis_server.unix_socket_path, prefix=f"mine-{uuid.uuid4().hex[:8]}",
                               batch_size=batch_size, **kwargs)
        theirs = upstream_store.TensorDictStore(unix_socket_path=redis_server.unix_socket_path,
                                                prefix=f"up-{uuid.uuid4().hex[:8]}", batch_size=batch_size, **kwargs)
        made.extend([mine, theirs])
        return mine, theirs

    yield make
    for store in made:
        try:
            store.clear_redis()
        except Exception:
            pass
    for store in made[1::2]:
        store.close()


# ---------------------------------------------------------------------- comparison helpers
def leaf_keys(td):
    return sorted(tuple(key) if isinstance(key, tuple) else (key,) for key in td.keys(True, True))


def assert_same(mine, theirs):
    """Equal values: tensors (shape, dtype, values), or TensorDict-likes (batch size, leaf keys, leaves)."""
    if isinstance(theirs, torch.Tensor):
        assert isinstance(mine, torch.Tensor), type(mine)
        assert mine.dtype == theirs.dtype and mine.shape == theirs.shape
        assert torch.equal(mine, theirs)
        return
    if hasattr(theirs, "batch_size") and hasattr(theirs, "keys"):
        assert mine.batch_size == theirs.batch_size
        assert leaf_keys(mine) == leaf_keys(theirs)
        for key in theirs.keys(True, True):
            assert_same(mine.get(key), theirs.get(key))
        return
    assert mine == theirs


def upstream_td(td):
    """The same entries as an upstream TensorDict (upstream's store does not read torchdict's nested levels)."""
    import tensordict

    def convert(value):
        if isinstance(value, TensorDict):
            return tensordict.TensorDict({key: convert(value.get(key)) for key in value.keys()},
                                         batch_size=value.batch_size)
        return value

    return convert(td)


def write_both(mine, theirs, fn, value):
    """``fn(store, value)`` on both stores, upstream's getting its own TensorDict class."""
    fn(mine, value)
    fn(theirs, upstream_td(value) if isinstance(value, TensorDict) else value)


def outcome(fn, *args):
    try:
        return "ok", fn(*args)
    except Exception as error:  # noqa: BLE001 - the type is what's compared
        return "error", type(error)


def assert_same_outcome(fn, mine, theirs):
    got, want = outcome(fn, mine), outcome(fn, theirs)
    assert got[0] == want[0], (got, want)
    if got[0] == "ok":
        assert_same(got[1], want[1])
    else:
        assert issubclass(got[1], want[1]) or issubclass(want[1], got[1]), (got, want)


def sample(batch_size, nested=True, seed=0):
    torch.manual_seed(seed)
    data = {
        "obs": torch.randn(*batch_size, 3),
        "done": torch.rand(*batch_size) > 0.5,
        "count": torch.randint(0, 100, (*batch_size, 2), dtype=torch.int64),
    }
    if nested:
        data["next"] = {"obs": torch.randn(*batch_size, 3), "deep": {"r": torch.randn(*batch_size).double()}}
    return TensorDict(data, batch_size=batch_size)


BATCHES = [[6], [4, 3], [3, 2, 2]]


# ---------------------------------------------------------------------- differential: dict API
@pytest.mark.parametrize("batch_size", BATCHES)
@pytest.mark.parametrize("nested", [False, True])
def test_set_get_keys_match_upstream(pair, batch_size, nested):
    mine, theirs = pair(batch_size)
    data = sample(batch_size, nested)
    for key in data.keys(True, True):
        mine.set(key, data.get(key))
        theirs.set(key, data.get(key))
    assert sorted(map(str, mine.keys())) == sorted(map(str, theirs.keys()))
    assert leaf_keys(mine) == leaf_keys(theirs)
    assert sorted(map(str, mine.keys(True))) == sorted(map(str, theirs.keys(True)))
    for key in data.keys(True, True):
        assert_same(mine.get(key), theirs.get(key))
        assert_same(mine[key], theirs[key])
    assert_same(mine.to_tensordict(), theirs.to_tensordict())
    assert_same(mine.to_tensordict(), data)
    for key in ["missing", ("next", "missing"), ("obs", "through")]:
        assert_same_outcome(lambda td: key in td, mine, theirs)
        # through a leaf, reads raise as on a TensorDict (upstream's store returns None or a KeyError there)
        reference = data if key[0] == "obs" else theirs
        assert_same_outcome(lambda td: td[key], mine, reference)
        assert_same_outcome(lambda td: td.get(key), mine, reference)
    assert mine.get("missing", "default") == theirs.get("missing", "default") == "default"


@pytest.mark.parametrize("batch_size", BATCHES)
def test_bad_writes_fail_like_upstream_and_change_nothing(pair, batch_size):
    mine, theirs = pair(batch_size)
    local = TensorDict({"obs": torch.zeros(*batch_size, 2)}, batch_size=batch_size)
    for store in (mine, theirs):
        store["obs"] = torch.zeros(*batch_size, 2)
    bad = [
        lambda td: td.set("wrong", torch.zeros(batch_size[0] + 1)),
        lambda td: td.set("scalar", torch.tensor(1.0)),
        lambda td: td.set_("missing", torch.zeros(*batch_size)),
    ]
    for fn in bad:
        assert_same_outcome(fn, mine, theirs)
        assert_same_outcome(fn, mine, local)
        assert leaf_keys(mine) == [("obs",)]
        assert not mine["obs"].any()
    # as a TensorDict does: an in-place write of another shape is refused (upstream's store replaces the
    # entry), and so is deleting a missing key (upstream's store warns and does nothing)
    assert_same_outcome(lambda td: td.set_("obs", torch.zeros(*batch_size, 5)), mine, local)
    assert_same_outcome(lambda td: td.del_("missing"), mine, local)
    assert mine["obs"].shape == (*batch_size, 2)


@pytest.mark.parametrize("batch_size", BATCHES)
def test_update_matches_upstream(pair, batch_size):
    mine, theirs = pair(batch_size)
    data = sample(batch_size)
    write_both(mine, theirs, lambda store, value: store.update(value), data)
    assert_same(mine.to_tensordict(), theirs.to_tensordict())
    change = TensorDict({"obs": torch.ones(*batch_size, 3), "next": {"obs": torch.full((*batch_size, 3), 2.0)},
                         "new": torch.zeros(*batch_size, 1)}, batch_size=batch_size)
    write_both(mine, theirs, lambda store, value: store.update(value), change)
    assert_same(mine.to_tensordict(), theirs.to_tensordict())
    assert_same(mine["next", "deep", "r"], data["next", "deep", "r"])  # merged, not replaced
    for store in (mine, theirs):
        store.update({"count": torch.zeros(*batch_size, 2, dtype=torch.int64)}, inplace=True)
    assert_same(mine.to_tensordict(), theirs.to_tensordict())


def test_update_with_keys_to_update(make_store):
    store = make_store(batch_size=[3])
    store.update(sample([3]))
    local = sample([3])
    local.update(sample([3], seed=1), keys_to_update=["obs", ("next", "obs")])
    store.update(sample([3], seed=1), keys_to_update=["obs", ("next", "obs")])
    assert_same(store.to_tensordict(), local)


def test_update_takes_tensordicts_keywords(make_store):
    store = make_store(batch_size=[3])
    store.update(a=torch.zeros(3), n={"b": torch.ones(3)})  # the entries as keywords, as TensorDict.update
    store.update({"a": torch.ones(3)}, c=torch.full((3,), 2.0), non_blocking=True, is_leaf=None)
    assert sorted(map(str, store.keys(True, True))) == sorted(["a", "c", str(("n", "b"))])
    assert torch.equal(store["a"], torch.ones(3)) and torch.equal(store["c"], torch.full((3,), 2.0))
    assert [key for key, _ in store.items(sort=True)] == sorted(key for key in store.keys())
    with pytest.raises(RuntimeError, match="update_batch_size"):
        store.update({"d": torch.zeros(3, 2)}, update_batch_size=True)
    assert "d" not in store.keys()
    store.lock_()
    with pytest.raises(RuntimeError):
        store.update({"e": torch.zeros(3)})
    store.update({"e": torch.zeros(3)}, ignore_lock=True)
    assert store.is_locked and "e" in store.keys()
    store.unlock_()
    store.update_(a=torch.full((3,), 5.0), non_blocking=True)
    store.set_("c", torch.zeros(3), non_blocking=True)
    assert torch.equal(store["a"], torch.full((3,), 5.0)) and torch.equal(store["c"], torch.zeros(3))


@pytest.mark.filterwarnings("ignore:.*quantize")
def test_a_refused_update_writes_nothing(make_store):
    store = make_store(batch_size=[4])
    store.update(sample([4]))
    before = store.to_tensordict()
    with pytest.raises(RuntimeError):
        store.update({"obs": torch.ones(4, 3), "next": {"obs": torch.ones(5, 3)}})
    with pytest.raises(TypeError):
        store.update({"obs": torch.ones(4, 3), "q": torch.quantize_per_tensor(torch.zeros(4), 0.1, 0, torch.qint8)})
    assert_same(store.to_tensordict(), before)


# ---------------------------------------------------------------------- differential: indexing
def _indices(batch_size):
    first = batch_size[0]
    indices = [0, -1, slice(None), slice(1, None), slice(None, None, 2), slice(1, 1),
               torch.tensor([0, first - 1, 1]), torch.tensor([1, 1, 0]), [0, 1],
               torch.arange(first) % 2 == 0, torch.tensor(first - 1), (Ellipsis,), None, first, -first - 1]
    if len(batch_size) > 1:
        indices += [(slice(None), 0), (0, 1), (Ellipsis, 1), (slice(1, None), slice(None, 1)),
                    torch.ones(batch_size[:2], dtype=torch.bool), (torch.tensor([0, 1]), torch.tensor([1, 0])),
                    (None, 0), (slice(None), -1)]
    if len(batch_size) > 2:
        indices += [(0, 1, 1), (Ellipsis, 0, slice(None)), (slice(None), slice(None), 1)]
    return indices


@pytest.mark.parametrize("batch_size", BATCHES)
@pytest.mark.parametrize("nested", [False, True])
def test_indexing_matches_upstream_and_tensordict(pair, batch_size, nested):
    mine, theirs = pair(batch_size)
    data = sample(batch_size, nested)
    write_both(mine, theirs, lambda store, value: store.update(value), data)
    for index in _indices(batch_size):
        assert_same_outcome(lambda td: td[index], mine, theirs)
        got = outcome(lambda td: td[index], mine)
        if got[0] == "ok":
            assert_same(got[1], data[index])
            assert type(got[1]) is TensorDict


@pytest.mark.parametrize("batch_size", BATCHES)
def test_setitem_matches_upstream_and_tensordict(pair, batch_size):
    mine, theirs = pair(batch_size)
    data = sample(batch_size)
    local = data.clone()
    write_both(mine, theirs, lambda store, value: store.update(value), data)
    for position, index in enumerate(_indices(batch_size)):
        try:
            slot = local[index]
        except (IndexError, RuntimeError, ValueError):
            assert_same_outcome(lambda td: td.__setitem__(index, 0), mine, theirs)
            continue
        value = slot.apply(lambda x: torch.full_like(x, position + 1) if x.dtype is not torch.bool else ~x)
        write_both(mine, theirs, lambda store, value: store.__setitem__(index, value), value)
        local[index] = value
        assert_same(mine.to_tensordict(), theirs.to_tensordict())
        assert_same(mine.to_tensordict(), local)


def test_setitem_with_a_number_or_dict(make_store):
    store = make_store(batch_size=[4, 3])
    local = sample([4, 3])
    store.update(local)
    for index, value in [(0, 7), ((slice(None), 1), torch.tensor(3.0)), (slice(1, 3), {"obs": torch.ones(2, 3, 3)})]:
        store[index] = value
        local[index] = value
        assert_same(store.to_tensordict(), local)


def test_setitem_creates_new_keys_like_tensordict(make_store):
    store = make_store(batch_size=[4])
    local = TensorDict({"a": torch.zeros(4)}, batch_size=[4])
    store.update(local)
    value = TensorDict({"a": torch.ones(2), "b": torch.ones(2, 3)}, batch_size=[2])
    store[1:3] = value
    local[1:3] = value
    assert_same(store.to_tensordict(), local)


def test_setitem_refusals_change_nothing(make_store):
    store = make_store(batch_size=[4])
    store.update(sample([4]))
    before = store.to_tensordict()
    with pytest.raises(RuntimeError):
        store[0:2] = TensorDict({"obs": torch.ones(2, 5)}, batch_size=[2])  # feature shape does not fit
    with pytest.raises(IndexError):
        store[9] = 0
    with pytest.raises(RuntimeError):
        store[0:2] = TensorDict({"obs": torch.ones(3, 3)}, batch_size=[3])
    assert_same(store.to_tensordict(), before)


def test_rows_are_read_and_written_by_byte_range(make_store, raw_client):
    """td[idx] moves only the picked rows; td[idx] = v sends only their bytes."""
    store = make_store(batch_size=[20_000])
    data = torch.randn(20_000, 84)  # 6.7 MB
    store["obs"] = data
    idx = torch.randint(0, 20_000, (32,))

    def server_bytes(field):
        return int(raw_client.info("stats")[field])

    sent_before = server_bytes("total_net_output_bytes")
    rows = store[idx]
    sent = server_bytes("total_net_output_bytes") - sent_before
    assert torch.equal(rows["obs"], data[idx])
    assert sent < 32 * 84 * 4 + 20_000, sent  # the rows plus metadata, not 6.7 MB
    received_before = server_bytes("total_net_input_bytes")
    store[idx] = TensorDict({"obs": torch.zeros(32, 84)}, batch_size=[32])
    received = server_bytes("total_net_input_bytes") - received_before
    assert received < 32 * 84 * 4 + 20_000, received
    data[idx] = 0
    assert torch.equal(store["obs"], data)


def test_row_writes_from_two_handles_keep_both(make_store, redis_server):
    store = make_store(batch_size=[10])
    store["x"] = torch.zeros(10, 2)
    other = TensorDictStore.from_store(unix_socket_path=redis_server.unix_socket_path, prefix=store._prefix,
                                       td_id=store._td_id)
    store[0:5] = TensorDict({"x": torch.ones(5, 2)}, batch_size=[5])
    other[5:] = TensorDict({"x": torch.full((5, 2), 2.0)}, batch_size=[5])
    assert store["x"][:, 0].tolist() == [1.0] * 5 + [2.0] * 5


def test_a_stale_cache_never_pairs_new_bytes_with_an_old_shape(make_store, redis_server):
    store = make_store(batch_size=[6])
    store["x"] = torch.zeros(6, 2)
    assert store[0:2]["x"].shape == (2, 2)  # the metadata is now cached
    other = TensorDictStore.from_store(unix_socket_path=redis_server.unix_socket_path, prefix=store._prefix,
                                       td_id=store._td_id)
    other["x"] = torch.arange(6 * 5, dtype=torch.float64).view(6, 5)
    rows = store[torch.tensor([1, 4])]
    assert rows["x"].dtype == torch.float64 and torch.equal(rows["x"], other["x"][torch.tensor([1, 4])])
    store[2] = TensorDict({"x": torch.ones(5)}, batch_size=[])  # planned on the cached (old) shape: retried
    assert store["x"][2].tolist() == [1.0] * 5 and store["x"].shape == (6, 5)


@pytest.mark.parametrize("cache_metadata", [True, False])
def test_cache_metadata_off_gives_the_same_results(make_store, cache_metadata):
    store = make_store(batch_size=[5, 2], cache_metadata=cache_metadata)
    local = sample([5, 2])
    store.update(local)
    for index in _indices([5, 2]):
        want = outcome(lambda td: td[index], local)
        got = outcome(lambda td: td[index], store)
        assert got[0] == want[0]
        if got[0] == "ok":
            assert_same(got[1], want[1])


# ---------------------------------------------------------------------- the rest of the API
def test_nested_levels_are_store_views(make_store):
    store = make_store(batch_size=[3])
    store["a", "b"] = torch.zeros(3, 2)
    nested = store["a"]
    assert isinstance(nested, TensorDictStore) and nested.batch_size == (3,)
    nested["c"] = torch.ones(3)
    nested[1] = TensorDict({"b": torch.ones(2), "c": torch.zeros(())}, batch_size=[])
    assert store["a", "c"].tolist() == [1.0, 0.0, 1.0]
    assert store["a", "b"][1].tolist() == [1.0, 1.0]
    assert sorted(map(str, store.keys(True))) == sorted(map(str, ["a", ("a", "b"), ("a", "c")]))
    assert nested.keys() == ["b", "c"]


def test_nested_batch_sizes(make_store):
    store = make_store(batch_size=[4])
    local = TensorDict({"a": TensorDict({"x": torch.randn(4, 3, 2)}, batch_size=[4, 3])}, batch_size=[4])
    store.update(local)
    assert store["a"].batch_size == (4, 3)
    assert_same(store[1:3], local[1:3])
    assert_same(store[torch.tensor([3, 0])], local[torch.tensor([3, 0])])


def test_generic_ops_run_on_a_copy_and_write_back(make_store):
    store = make_store(batch_size=[4])
    local = sample([4])
    store.update(local)
    assert_same(store.apply(lambda x: x * 2), local.apply(lambda x: x * 2))
    assert_same((store.exclude("done") + 1), local.exclude("done") + 1)
    store.exclude("done")  # a new TensorDict; the store keeps its keys
    assert ("done",) in leaf_keys(store)
    store.apply_(lambda x: x + 1 if x.dtype is not torch.bool else x)
    local.apply_(lambda x: x + 1 if x.dtype is not torch.bool else x)
    assert_same(store.to_tensordict(), local)
    store.zero_()
    assert not store["obs"].any()
    store.rename_key_("obs", "observation")
    assert "observation" in store and "obs" not in store
    assert store.pop("observation").shape == (4, 3)
    assert "observation" not in store


def test_locking(make_store):
    store = make_store(batch_size=[2])
    store["a"] = torch.zeros(2)
    store.lock_()
    assert store.is_locked and store["a"] is not None
    from torchdict._errors import LOCKED_MESSAGE

    for fn in [lambda: store.set("new", torch.zeros(2)), lambda: store.set("a", torch.ones(2)),
               lambda: store.del_("a"), lambda: store.update({"a": torch.ones(2)})]:
        with pytest.raises(RuntimeError, match="Cannot modify locked"):
            fn()
    store.set("a", torch.ones(2), inplace=True)
    store.set_("a", torch.full((2,), 3.0))
    store[0] = 5
    assert store["a"].tolist() == [5.0, 3.0]
    assert LOCKED_MESSAGE.startswith("Cannot modify locked")
    store.unlock_()
    store["b"] = torch.ones(2)


def test_in_place_writes_keep_dtype_and_shape(make_store):
    store = make_store(batch_size=[3])
    store["a"] = torch.zeros(3, 2)
    store.set("a", torch.ones(3, 2, dtype=torch.int64), inplace=True)
    assert store["a"].dtype == torch.float32
    store.set_("a", torch.ones(3, 1) * 2)  # broadcast to the entry's shape
    assert store["a"].tolist() == [[2.0, 2.0]] * 3
    from torchdict import InplaceWriteError

    with pytest.raises(InplaceWriteError):
        store.set("a", torch.ones(3, 4), inplace=True)


@pytest.mark.parametrize("dtype", sorted(__import__("torchdict.store._schema", fromlist=["x"]).DTYPES.values(),
                                         key=str))
def test_every_supported_dtype_round_trips(make_store, dtype):
    store = make_store(batch_size=[3])
    torch.manual_seed(0)
    value = (torch.randn(3, 2, 2) * 10).to(dtype) if dtype is not torch.bool else torch.rand(3, 2, 2) > 0.5
    store["x"] = value
    back = store["x"]
    assert back.dtype == dtype and back.shape == value.shape
    assert torch.equal(back.view(torch.uint8), value.view(torch.uint8))
    rows = torch.tensor([2, 0])
    assert torch.equal(store[rows]["x"].view(torch.uint8), value[rows].view(torch.uint8))


@pytest.mark.filterwarnings("ignore:.*quantize")
def test_unsupported_values_are_refused_with_clear_errors(make_store):
    store = make_store(batch_size=[2])
    store["keep"] = torch.ones(2)
    quantized = torch.quantize_per_tensor(torch.zeros(2), 0.1, 0, torch.qint8)
    with pytest.raises(TypeError, match="dtype torch.qint8"):
        store["q"] = quantized
    with pytest.raises(TypeError, match="dense"):
        store["s"] = torch.zeros(2, 2).to_sparse()
    with pytest.raises(TypeError, match="never pickles"):
        store["obj"] = NonTensorData(object(), batch_size=[2])
    assert leaf_keys(store) == [("keep",)]


def test_keys_with_separators_and_odd_characters(make_store):
    store = make_store(batch_size=[2])
    odd = ["a.b", "x:y", '["q"]', "é ü", "", "{brace}", "t:[\"a\"]", "\\"]
    for position, key in enumerate(odd):
        store[key] = torch.full((2,), float(position))
    store["a", "b"] = torch.ones(2)
    assert sorted(store.keys()) == sorted(odd + ["a"])
    for position, key in enumerate(odd):
        assert store[key].tolist() == [float(position)] * 2
    assert store["a", "b"].tolist() == [1.0, 1.0]
    local = store.to_tensordict()
    assert local["a.b"].tolist() == [0.0, 0.0] and local["a", "b"].tolist() == [1.0, 1.0]


def test_non_tensor_data(make_store):
    store = make_store(batch_size=[3])
    store["name"] = "hello"
    store["stack"] = NonTensorData("x", batch_size=[3])
    store.set("labels", ["a", "b", "c"])  # a list of str becomes a NonTensorStack
    assert store["name"] == "hello"
    assert store.get("labels").tolist() == ["a", "b", "c"]
    assert store[1]["labels"] == "b"
    assert store[torch.tensor([2, 0])].get("labels").tolist() == ["c", "a"]
    store[1] = TensorDict({"labels": NonTensorData("B")}, batch_size=[])
    assert store.get("labels").tolist() == ["a", "B", "c"]
    assert store.entry_class("name") is NonTensorData


def test_from_schema_allocates_zeros_on_the_server(make_store, redis_server):
    store = TensorDictStore.from_schema({"obs": ([84, 84, 3], torch.uint8), ("next", "r"): ([], torch.float32)},
                                        batch_size=[10], unix_socket_path=redis_server.unix_socket_path,
                                        prefix=f"schema-{uuid.uuid4().hex[:6]}")
    try:
        assert store["obs"].shape == (10, 84, 84, 3) and not store["obs"].any()
        assert store["next", "r"].shape == (10,)
        store[3] = TensorDict({"obs": torch.ones(84, 84, 3, dtype=torch.uint8), "next": {"r": torch.ones(())}}, [])
        assert store["obs"][3].all() and store["obs"].sum() == 84 * 84 * 3
    finally:
        store.clear_redis()


def test_from_tensordict_from_dict_and_from_store(make_store, redis_server):
    local = sample([4, 2])
    store = TensorDictStore.from_tensordict(local, unix_socket_path=redis_server.unix_socket_path, prefix="fromtd")
    try:
        assert_same(store.to_tensordict(), local)
        again = TensorDictStore.from_store(unix_socket_path=redis_server.unix_socket_path, prefix="fromtd",
                                           td_id=store._td_id)
        assert again.batch_size == (4, 2)
        assert_same(again.to_tensordict(), local)
        with pytest.warns(DeprecationWarning):
            assert_same(again.to_local(), local)
        with pytest.raises(KeyError):
            TensorDictStore.from_store(unix_socket_path=redis_server.unix_socket_path, prefix="other",
                                       td_id=store._td_id)
    finally:
        store.clear_redis()
    made = TensorDictStore.from_dict({"a": torch.zeros(3, 2)}, auto_batch_size=True,
                                     unix_socket_path=redis_server.unix_socket_path, prefix="fromdict")
    try:
        assert made.batch_size == (3, 2)
    finally:
        made.clear_redis()


def test_from_store_matches_upstream_errors(redis_server, upstream_store):
    for cls in (TensorDictStore, upstream_store.TensorDictStore):
        with pytest.raises(KeyError):
            cls.from_store(unix_socket_path=redis_server.unix_socket_path, prefix="nowhere", td_id="missing-id")


def test_a_second_store_with_the_same_id_and_another_layout_is_refused(make_store, redis_server):
    store = make_store(batch_size=[3])
    with pytest.raises(ValueError, match="from_store"):
        TensorDictStore(unix_socket_path=redis_server.unix_socket_path, prefix=store._prefix, td_id=store._td_id,
                        batch_size=[4])


def test_prefixes_and_ids_are_isolated(make_store, redis_server, raw_client):
    a = make_store(batch_size=[2], prefix="iso", td_id="same")
    b = make_store(batch_size=[2], prefix="iso2", td_id="same")
    c = make_store(batch_size=[2], prefix="iso", td_id="other")
    a["x"] = torch.zeros(2)
    b["x"] = torch.ones(2)
    c["y"] = torch.full((2,), 2.0)
    assert a.keys() == ["x"] and b.keys() == ["x"] and c.keys() == ["y"]
    assert a["x"].tolist() == [0.0, 0.0] and b["x"].tolist() == [1.0, 1.0]
    a.clear_redis()
    assert b["x"].tolist() == [1.0, 1.0] and c["y"].tolist() == [2.0, 2.0]
    assert not [key for key in raw_client.keys("iso:{same}*")]
    with pytest.raises(ValueError, match="braces"):
        TensorDictStore(unix_socket_path=redis_server.unix_socket_path, prefix="a{b}")


def test_stored_format_is_json_and_raw_bytes(make_store, raw_client):
    """The documented schema (docs/store.md): one hash of JSON metadata, raw C-ordered little-endian bytes."""
    store = make_store(batch_size=[2], prefix="fmt", td_id="doc")
    store["obs"] = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    store["nested", "flag"] = torch.tensor([True, False])
    store["label"] = "text"
    tree = {field.decode(): json.loads(raw) for field, raw in raw_client.hgetall("fmt:{doc}:tree").items()}
    assert tree["[]"] == {"format": "torchdict.store/1", "kind": "td", "batch_size": [2], "device": None,
                          "backend": "redis"}
    assert tree['["obs"]'] == {"kind": "tensor", "dtype": "float32", "shape": [2, 2], "n": 1}
    assert tree['["nested"]'] == {"kind": "td", "batch_size": [2], "n": 2}
    assert tree['["nested","flag"]'] == {"kind": "tensor", "dtype": "bool", "shape": [2], "n": 3}
    assert tree['["label"]'] == {"kind": "json", "batch_size": [2], "value": "text", "n": 4}
    assert raw_client.get('fmt:{doc}:t:["obs"]') == torch.tensor([1.0, 2.0, 3.0, 4.0]).numpy().astype("<f4").tobytes()
    assert raw_client.get('fmt:{doc}:t:["nested","flag"]') == b"\x01\x00"
    assert sorted(raw_client.keys("fmt:{doc}*")) == sorted(
        [b"fmt:{doc}:tree", b'fmt:{doc}:t:["obs"]', b'fmt:{doc}:t:["nested","flag"]'])
    for key in raw_client.keys("fmt:{doc}*"):  # nothing pickled anywhere
        value = raw_client.hgetall(key).values() if raw_client.type(key) == b"hash" else [raw_client.get(key)]
        assert not any(part.startswith(b"\x80") for part in value)


def test_replacing_a_level_removes_its_old_entries(make_store, raw_client):
    store = make_store(batch_size=[2], prefix="repl", td_id="one")
    store["a", "b", "c"] = torch.zeros(2)
    store["a"] = torch.ones(2)
    assert leaf_keys(store) == [("a",)]
    assert sorted(raw_client.keys("repl:{one}*")) == [b'repl:{one}:t:["a"]', b"repl:{one}:tree"]
    store.del_("a")
    assert store.keys() == [] and raw_client.keys("repl:{one}:t:*") == []


def test_clone_makes_a_new_stored_copy(make_store):
    store = make_store(batch_size=[3])
    store.update(sample([3]))
    copy = store.clone()
    try:
        assert isinstance(copy, TensorDictStore) and copy._td_id != store._td_id
        assert_same(copy.to_tensordict(), store.to_tensordict())
        copy["obs"] = torch.zeros(3, 3)
        assert store["obs"].any()
        handle = store.clone(False)
        handle["obs"] = torch.zeros(3, 3)
        assert not store["obs"].any()
    finally:
        copy.clear_redis()


def test_pickled_store_reconnects_by_address(make_store):
    store = make_store(batch_size=[2])
    store["x"] = torch.arange(2.0)
    again = pickle.loads(pickle.dumps(store))
    assert isinstance(again, TensorDictStore) and again._td_id == store._td_id
    assert again["x"].tolist() == [0.0, 1.0]
    nested = pickle.loads(pickle.dumps(store.set(("n", "y"), torch.ones(2))["n"]))
    assert nested.keys() == ["y"]
    assert b"tensor" not in pickle.dumps(store)  # the address, never the data


def test_device_is_kept_and_applied_to_reads(make_store):
    store = make_store(batch_size=[2], device="cpu")
    store["x"] = torch.zeros(2)
    assert store.device == torch.device("cpu") and store["x"].device == torch.device("cpu")
    again = TensorDictStore.from_store(unix_socket_path=store._connection.unix_socket_path, prefix=store._prefix,
                                       td_id=store._td_id)
    assert again.device == torch.device("cpu")


def test_an_asyncio_client_or_a_sync_client_is_accepted(make_store, redis_server):
    import redis
    import redis.asyncio

    sync_client = redis.Redis(unix_socket_path=redis_server.unix_socket_path)
    store = make_store(client=sync_client, batch_size=[2])
    store["x"] = torch.ones(2)
    assert store._connection.client is sync_client
    async_client = redis.asyncio.Redis(unix_socket_path=redis_server.unix_socket_path)
    other = TensorDictStore.from_store(client=async_client, prefix=store._prefix, td_id=store._td_id)
    assert other["x"].tolist() == [1.0, 1.0]
    with pytest.raises(TypeError):
        TensorDictStore(client=object())


# ---------------------------------------------------------------------- the optional client library
def _run(code):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src"))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)


def test_without_redis_the_store_names_the_extra():
    result = _run(
        "import sys; sys.modules['redis'] = None\n"
        "import torchdict.store\n"
        "from torchdict import TensorDictStore\n"
        "try:\n"
        "    TensorDictStore(batch_size=[1])\n"
        "except ImportError as error:\n"
        "    print('ImportError:', error)\n")
    assert result.returncode == 0, result.stderr
    assert "pip install torchdict[store]" in result.stdout


def test_import_torchdict_imports_neither_the_store_nor_redis():
    result = _run(
        "import sys, torchdict\n"
        "print('torchdict.store' in sys.modules, 'redis' in sys.modules)\n"
        "print(torchdict.TensorDictStore.__module__, torchdict.LazyStackedTensorDictStore.__name__)\n"
        "print('redis' in sys.modules)\n"
        "import torchdict.store\n"
        "print(torchdict.store.StoreConnectionError.__mro__[1].__name__, 'redis' in sys.modules)\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False", "torchdict.store._store", "LazyStackedTensorDictStore",
                                     "False", "ConnectionError", "True"]


# ---------------------------------------------------------------------- the generic TensorDict API (test_base's)
from test_base import IN_PLACE, OPS, _assert_same as assert_generic_same  # noqa: E402


def _base_pair(make_store):
    torch.manual_seed(0)
    local = TensorDict({"obs": torch.randn(3, 4, 2), "done": torch.rand(3, 4) > 0.5,
                        "next": {"x": torch.randn(3, 4, 5)}}, batch_size=[3, 4])
    store = make_store(batch_size=[3, 4])
    store.update(local)
    return store, local


@pytest.mark.parametrize("name", sorted(OPS))
def test_the_generic_api_agrees_with_tensordict(make_store, name):
    store, local = _base_pair(make_store)
    assert_generic_same(OPS[name](store), OPS[name](local))


# These write through ``select`` / ``exclude``, which on a TensorDict share the tensors; on a store they are
# local copies (the bytes live on the server), so the write stays in the copy, as documented.
_THROUGH_A_COPY = {"clamp_", "masked_fill_", "iadd"}


@pytest.mark.parametrize("name", sorted(IN_PLACE))
def test_generic_writes_agree_with_tensordict(make_store, name):
    store, local = _base_pair(make_store)
    before = local.clone()
    IN_PLACE[name](store)
    IN_PLACE[name](local)
    assert_generic_same(store.to_tensordict(), before if name in _THROUGH_A_COPY else local)


def test_to_store_is_a_member_of_every_collection(redis_server):
    from torchdict import lazy_stack

    td = TensorDict({"a": torch.arange(4.0), "n": {"b": torch.ones(4, 2)}}, batch_size=[4])
    prefix = f"to-store-{uuid.uuid4().hex[:8]}"
    store = td.to_store(unix_socket_path=redis_server.unix_socket_path, prefix=prefix)
    try:
        assert type(store).__name__ == "TensorDictStore"
        assert torch.equal(store["a"], td["a"]) and torch.equal(store["n", "b"], td["n", "b"])
    finally:
        store.clear_redis()
    stacked = lazy_stack([TensorDict(a=torch.zeros(2, 1), batch_size=[2]), TensorDict(a=torch.ones(2, 3), batch_size=[2])])
    lazy_store = stacked.to_store(unix_socket_path=redis_server.unix_socket_path, prefix=prefix + "-lazy")
    try:
        assert type(lazy_store).__name__ == "LazyStackedTensorDictStore"
        assert lazy_store[1]["a"].shape == (2, 3)  # ragged members stay apart
    finally:
        lazy_store.clear_redis()
