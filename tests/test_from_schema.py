"""TensorDict.from_schema against upstream: each storage gives a zero-filled collection of the same kind."""
from __future__ import annotations

import warnings

import pytest
import torch

import torchdict

tensordict = pytest.importorskip("tensordict")
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")

SCHEMA = {"obs": ([2, 3], torch.uint8), "reward": ([], torch.float32), "mask": (torch.Size([1]), torch.bool)}


def described(td):
    return (type(td).__name__, tuple(td.batch_size),
            {key: (tuple(td[key].shape), td[key].dtype, bool((td[key] == 0).all())) for key in sorted(td.keys())})


@pytest.mark.parametrize("batch_size", [None, [4], [2, 3]])
@pytest.mark.parametrize("storage", [None, "shared", "memmap", "h5", "zarr"])
def test_from_schema_matches_upstream(tmp_path, storage, batch_size):
    results = []
    for lib in (torchdict, tensordict):
        kwargs = {}
        if storage == "memmap":
            kwargs["prefix"] = str(tmp_path / f"{lib.__name__}-mm")
        elif storage in ("h5", "zarr"):
            kwargs["filename"] = str(tmp_path / f"{lib.__name__}.{storage}")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            td = lib.TensorDict.from_schema(SCHEMA, batch_size=batch_size, storage=storage, **kwargs)
        results.append(described(td))
        if storage == "shared":
            assert all(leaf.is_shared() for leaf in td.values())
        if storage == "memmap":
            assert td.is_memmap()
    assert results[0] == results[1]


def test_unknown_storage_raises_value_error_as_upstream():
    for lib in (torchdict, tensordict):
        with pytest.raises(ValueError, match="Unknown storage backend 'x'"):
            lib.TensorDict.from_schema(SCHEMA, storage="x")


def test_a_lazy_stack_builds_the_same_collection():
    td = torchdict.LazyStackedTensorDict.from_schema(SCHEMA, batch_size=[3])
    assert described(td) == described(torchdict.TensorDict.from_schema(SCHEMA, batch_size=[3]))


def test_the_store_storage_builds_a_store(redis_server):
    store = torchdict.TensorDict.from_schema(SCHEMA, batch_size=[4], storage="redis",
                                             unix_socket_path=redis_server.unix_socket_path, prefix="schema-test")
    try:
        assert type(store).__name__ == "TensorDictStore" and store.batch_size == torch.Size([4])
        assert store["obs"].shape == (4, 2, 3) and not store["obs"].any()
    finally:
        store.clear_redis()
