"""Stores: TensorDicts kept on a Redis-protocol server (Redis, Valkey, KeyDB, Dragonfly), shared by processes
and machines. See docs/store.md.

Importing this module does not import the ``redis`` client; making a store does (``pip install
torchdict[store]``).
"""
from ._store import STORE_BACKENDS, TensorDictStore
from ._lazy import LazyStackedTensorDictStore

__all__ = ["LazyStackedTensorDictStore", "STORE_BACKENDS", "StoreConnectionError", "TensorDictStore"]


def __getattr__(name: str) -> object:
    # The error class derives from redis-py's ConnectionError, so it exists once ``redis`` is imported.
    if name == "StoreConnectionError":
        from ._client import StoreConnectionError

        return StoreConnectionError
    raise AttributeError(f"module 'torchdict.store' has no attribute {name!r}")
