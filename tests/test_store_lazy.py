"""LazyStackedTensorDictStore on a real redis-server: a stored lazy stack whose members may be ragged, against
upstream's stored lazy stack and torchdict's LazyStackedTensorDict."""
from __future__ import annotations

import pickle
import uuid

import pytest
import torch

from torchdict import LazyStackedTensorDict, TensorDict, lazy_stack
from torchdict.store import LazyStackedTensorDictStore, TensorDictStore


@pytest.fixture(scope="session")
def upstream_store():
    return pytest.importorskip("tensordict.store", reason="upstream tensordict runs the differential tests")


@pytest.fixture
def connect(redis_server):
    made = []

    def options(**extra):
        return dict(unix_socket_path=redis_server.unix_socket_path, prefix=f"lazy-{uuid.uuid4().hex[:8]}", **extra)

    def store_of(local, upstream=None):
        cls = upstream.TensorDictStore if upstream is not None else TensorDictStore
        store = cls.from_tensordict(local, **options())
        made.append(store)
        return store

    store_of.options = options
    store_of.made = made
    yield store_of
    for store in made:
        try:
            store.clear_redis()
        except Exception:
            pass


def _members(ragged):
    torch.manual_seed(0)
    first = TensorDict({"x": torch.randn(3), "y": torch.randn(2, 2), "n": {"z": torch.arange(4)}}, batch_size=[])
    second = TensorDict({"x": torch.randn(5 if ragged else 3), "y": torch.randn(2, 2),
                         "n": {"z": torch.arange(4) * 2}}, batch_size=[])
    return [first, second]


def _upstream_stack(members):
    import tensordict

    def convert(td):
        return tensordict.TensorDict({key: convert(value) if isinstance(value, TensorDict) else value
                                      for key, value in ((key, td.get(key)) for key in td.keys())},
                                     batch_size=td.batch_size)

    return tensordict.lazy_stack([convert(member) for member in members])


def _same(a, b):
    if isinstance(b, torch.Tensor):
        assert isinstance(a, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    else:
        assert a.batch_size == b.batch_size
        assert sorted(map(str, a.keys(True, True))) == sorted(map(str, b.keys(True, True)))
        for key in b.keys(True, True):
            _same(a.get(key), b.get(key))


def _outcome(fn, *args):
    try:
        return "ok", fn(*args)
    except Exception as error:  # noqa: BLE001 - the type is compared
        return "error", type(error)


@pytest.mark.parametrize("ragged", [False, True])
def test_reads_match_upstream(connect, upstream_store, ragged):
    members = _members(ragged)
    mine = connect(lazy_stack(members))
    theirs = connect(_upstream_stack(members), upstream=upstream_store)
    assert type(mine) is LazyStackedTensorDictStore and type(theirs).__name__ == "LazyStackedTensorDictStore"
    assert mine.batch_size == theirs.batch_size == (2,)
    assert sorted(map(str, mine.keys(True))) == sorted(map(str, theirs.keys(True)))
    for read in (lambda td: td["y"], lambda td: td["x"], lambda td: td[0]["x"], lambda td: td[1]["x"],
                 lambda td: td[1]["n", "z"], lambda td: td["n", "z"], lambda td: td[-1]["y"], lambda td: td[2]):
        got, want = _outcome(read, mine), _outcome(read, theirs)
        assert got[0] == want[0], (got, want)
        if got[0] == "ok":
            _same(got[1], want[1])
        else:
            assert issubclass(got[1], want[1]) or issubclass(want[1], got[1])
    local = mine.to_tensordict()
    assert isinstance(local, LazyStackedTensorDict)
    for got, want in zip(local.tensordicts, members):
        _same(got, want)


def test_writes_match_upstream(connect, upstream_store):
    members = _members(ragged=True)
    mine = connect(lazy_stack(members))
    theirs = connect(_upstream_stack(members), upstream=upstream_store)
    import tensordict

    mine[1] = TensorDict({"x": torch.ones(5), "y": torch.zeros(2, 2)}, batch_size=[])
    theirs[1] = tensordict.TensorDict({"x": torch.ones(5), "y": torch.zeros(2, 2)}, batch_size=[])
    for store in (mine, theirs):
        store.set("y", torch.full((2, 2, 2), 3.0))
        store.set("w", torch.arange(2.0))
        store[0]["x"] = torch.full((3,), 9.0)
    for key in ("y", "w"):
        _same(mine[key], theirs[key])
    for position in (0, 1):
        _same(mine[position]["x"], theirs[position]["x"])
    assert sorted(mine.keys()) == sorted(theirs.keys())


def test_members_may_change_shape_and_hold_their_own_keys(connect):
    mine = connect(lazy_stack(_members(ragged=False)))
    mine[0] = TensorDict({"x": torch.ones(7)}, batch_size=[])  # ragged from now on
    assert mine[0]["x"].shape == (7,) and mine[1]["x"].shape == (3,)
    with pytest.raises(RuntimeError):
        mine["x"]  # as a LazyStackedTensorDict: ragged entries don't stack
    mine[1]["only_here"] = torch.zeros(1)
    assert "only_here" not in mine.keys() and "only_here" in mine[1].keys()
    reference = lazy_stack([member.to_tensordict() for member in mine.tensordicts])
    assert sorted(mine.keys()) == sorted(reference.keys())


def test_an_empty_stack_of_count_members(connect, redis_server):
    store = LazyStackedTensorDictStore(**connect.options(count=3, inner_batch_size=[2]))
    connect.made.append(store)
    assert store.batch_size == (3, 2) and store.keys() == []
    store.set("a", torch.arange(12.0).view(3, 2, 2))
    assert torch.equal(store["a"], torch.arange(12.0).view(3, 2, 2))
    assert torch.equal(store[1]["a"], torch.arange(4.0, 8.0).view(2, 2))
    assert torch.equal(store[1, 0]["a"], torch.tensor([4.0, 5.0]))
    store[2] = TensorDict({"a": torch.zeros(2, 2)}, batch_size=[2])
    assert not store["a"][2].any()
    again = LazyStackedTensorDictStore.from_store(unix_socket_path=redis_server.unix_socket_path,
                                                  prefix=store._prefix, td_id=store._td_id)
    assert again.batch_size == (3, 2) and torch.equal(again["a"], store["a"])
    assert type(TensorDictStore.from_store(unix_socket_path=redis_server.unix_socket_path, prefix=store._prefix,
                                           td_id=store._td_id)) is LazyStackedTensorDictStore


def test_stack_dim_one(connect):
    members = [TensorDict({"a": torch.randn(4, 2)}, batch_size=[4]) for _ in range(3)]
    local = lazy_stack(members, 1)
    store = connect(local)
    assert store.batch_size == local.batch_size == (4, 3) and store.stack_dim == 1
    assert torch.equal(store["a"], local["a"])
    assert torch.equal(store[:, 2]["a"], local[:, 2]["a"])
    assert torch.equal(store[1:3]["a"], local[1:3]["a"])


def test_generic_ops_and_update(connect):
    local = lazy_stack(_members(ragged=True))
    store = connect(local)
    result = store.apply(lambda x: x * 2)
    for got, want in zip(result.tensordicts, local.apply(lambda x: x * 2).tensordicts):
        _same(got, want)
    store.update({"y": torch.zeros(2, 2, 2)})
    assert not store["y"].any()
    store.zero_()
    assert not store[1]["x"].any()
    store.del_("y")
    assert "y" not in store.keys()
    with pytest.raises(KeyError):
        store.del_("y")


def test_lock_follows_to_members(connect):
    store = connect(lazy_stack(_members(ragged=False)))
    store.lock_()
    with pytest.raises(RuntimeError, match="Cannot modify locked"):
        store.set("new", torch.zeros(2))
    with pytest.raises(RuntimeError, match="Cannot modify locked"):
        store[1]["new"] = torch.zeros(1)
    store[1] = TensorDict({"x": torch.ones(3)}, batch_size=[])  # existing keys, in place
    assert store[1]["x"].tolist() == [1.0, 1.0, 1.0]
    store.unlock_()


def test_pickle_and_clear(connect, redis_server):
    store = connect(lazy_stack(_members(ragged=True)))
    again = pickle.loads(pickle.dumps(store))
    assert type(again) is LazyStackedTensorDictStore and torch.equal(again[1]["x"], store[1]["x"])
    import redis

    client = redis.Redis(unix_socket_path=redis_server.unix_socket_path)
    assert client.keys(f"{store._prefix}:*")
    store.clear_redis()
    assert client.keys(f"{store._prefix}:*") == []
    client.close()
