"""Store benchmarks (issue 24): ``TensorDictStore`` against upstream's and against hand-written redis-py code.

The suite starts its own ``redis-server`` (persistence off) on a unix socket in a temporary folder and stops
it at exit; every implementation talks to that server through the socket. The ``floor`` column is what a
careful user writes with redis-py alone:

- reading rows: one ``GET`` of the whole tensor's bytes, ``torch.frombuffer``, then index (what the issue
  compares ``store[idx]`` to: the store must move only the picked rows);
- bulk write: one pipeline of ``SET`` of each tensor's raw bytes (no copy on the client);
- row write: one pipeline of ``SETRANGE`` per picked row (the rows as ``bytes``).

Without a ``redis-server`` binary (``TORCHDICT_REDIS_SERVER`` names another one) or without the ``redis``
client library every column reports ``n/a`` instead of failing the run.
"""
from __future__ import annotations

import atexit
import os
import sys
import warnings

import torch

from _harness import FLOOR, TORCHDICT, UPSTREAM, Case, for_libraries

ROWS, FEATURES = 100_000, 84
SAMPLED = 32
BULK_LEAVES, BULK_BYTES = 4, 100 << 20  # 4 float32 leaves of 25 MB

_TESTS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
_SERVER: list = []  # [RedisServer] once started, [None] when none can be started
_REASON: list = []  # why there is no server


def _server():
    """The suite's server, started on first use; None (and a reason in _REASON) when there can be none."""
    if not _SERVER:
        try:
            import redis  # noqa: F401  (the client every implementation needs)

            if _TESTS_DIR not in sys.path:
                sys.path.insert(0, _TESTS_DIR)
            from _redis_server import RedisServer

            server = RedisServer().start()
            atexit.register(server.stop)
            _SERVER.append(server)
        except ImportError as error:
            _SERVER.append(None)
            _REASON.append(f"the redis client library is not installed ({error})")
        except (OSError, RuntimeError) as error:  # FileNotFoundError: no binary
            _SERVER.append(None)
            _REASON.append(f"no redis-server could be started ({error})")
    return _SERVER[0]


def _client():
    import redis

    return redis.Redis(unix_socket_path=_server().unix_socket_path)


def _setup(make):
    """A case's setup: an empty server (nothing left by the previous case) and the case's data, or a marker
    that makes every prepare drop its column."""
    def setup():
        server = _server()
        if server is None:
            return {"unavailable": _REASON[0]}
        _client().flushall()
        return make()

    return setup


def _needs_server(prepare):
    def checked(data):
        if "unavailable" in data:
            raise ImportError(data["unavailable"])
        return prepare(data)

    return checked


def _store(lib, batch_size, prefix):
    from importlib import import_module

    store_module = import_module(f"{lib.__name__}.store")
    return store_module.TensorDictStore(unix_socket_path=_server().unix_socket_path, prefix=prefix,
                                        batch_size=batch_size)


def _byte_view(tensor: torch.Tensor) -> memoryview:
    return memoryview(tensor.contiguous().view(torch.uint8).reshape(-1).numpy())


# --------------------------------------------------------------------------- store[idx]
def _read_rows_case() -> Case:
    def make():
        generator = torch.Generator().manual_seed(0)
        return {"obs": torch.randn(ROWS, FEATURES, generator=generator),
                "index": torch.randint(0, ROWS, (SAMPLED,), generator=generator)}

    def library(lib, data):
        store = _store(lib, [ROWS], f"bench-read-{lib.__name__}")
        store["obs"] = data["obs"]
        index = data["index"]
        return lambda: store[index]

    def floor(data):
        client, index = _client(), data["index"]
        client.set("bench-read-floor", _byte_view(data["obs"]))

        def run():
            raw = client.get("bench-read-floor")
            with warnings.catch_warnings():  # frombuffer warns once that bytes are read-only; we only read
                warnings.simplefilter("ignore")
                whole = torch.frombuffer(raw, dtype=torch.float32).view(ROWS, FEATURES)
            return whole[index]

        return run

    impls = {label: _needs_server(prepare) for label, prepare in {**for_libraries(library), FLOOR: floor}.items()}
    return Case(f"store[idx]: {SAMPLED} random rows of [{ROWS // 1000}k, {FEATURES}] float32 "
                "(floor: GET whole + index)", setup=_setup(make), impls=impls, target="<= 0.1x floor",
                note="store[idx] returns a TensorDict of the 32 rows; the floor fetches the whole 33.6 MB tensor "
                     "with one GET and indexes it.")


# --------------------------------------------------------------------------- bulk write
def _bulk_write_case() -> Case:
    def make():
        generator = torch.Generator().manual_seed(1)
        rows = BULK_BYTES // (BULK_LEAVES * 4 * FEATURES)
        return {"leaves": {f"leaf{i}": torch.randn(rows, FEATURES, generator=generator)
                           for i in range(BULK_LEAVES)}, "rows": rows}

    def library(lib, data):
        store = _store(lib, [data["rows"]], f"bench-bulk-{lib.__name__}")
        td = lib.TensorDict(data["leaves"], batch_size=[data["rows"]])
        return lambda: store.update(td)

    def floor(data):
        client = _client()
        items = [(f"bench-bulk-floor:{key}", _byte_view(tensor)) for key, tensor in data["leaves"].items()]

        def run():
            pipe = client.pipeline(transaction=False)
            for key, view in items:
                pipe.set(key, view)
            return pipe.execute()

        return run

    impls = {label: _needs_server(prepare) for label, prepare in {**for_libraries(library), FLOOR: floor}.items()}
    return Case(f"bulk write {BULK_BYTES >> 20} MB ({BULK_LEAVES} leaves): store.update(td) "
                "(floor: pipelined SET loop)", setup=_setup(make), impls=impls, target="<= 1.2x floor",
                max_samples=5,
                note="Each call overwrites the entries written by the call before (the first call creates them).")


# --------------------------------------------------------------------------- store[idx] = td
def _write_rows_case() -> Case:
    def make():
        generator = torch.Generator().manual_seed(2)
        return {"obs": torch.randn(ROWS, FEATURES, generator=generator),
                "rows": torch.randn(SAMPLED, FEATURES, generator=generator),
                "index": torch.randint(0, ROWS, (SAMPLED,), generator=generator)}

    def library(lib, data):
        store = _store(lib, [ROWS], f"bench-write-{lib.__name__}")
        store["obs"] = data["obs"]
        value = lib.TensorDict({"obs": data["rows"]}, batch_size=[SAMPLED])
        index = data["index"]

        def run():
            store[index] = value

        return run

    def floor(data):
        client = _client()
        client.set("bench-write-floor", _byte_view(data["obs"]))
        row_bytes = FEATURES * 4
        index, rows = data["index"], data["rows"]

        def run():
            if rows.shape[0] != index.shape[0]:
                raise RuntimeError("the value does not fit the indexed rows")
            payload = rows.numpy().tobytes()  # small values: bytes, which redis-py packs into one send
            pipe = client.pipeline(transaction=False)
            for slot, row in enumerate(index.tolist()):
                pipe.setrange("bench-write-floor", row * row_bytes,
                              payload[slot * row_bytes:(slot + 1) * row_bytes])
            return pipe.execute()

        return run

    impls = {label: _needs_server(prepare) for label, prepare in {**for_libraries(library), FLOOR: floor}.items()}
    return Case(f"store[idx] = td: {SAMPLED} random rows of [{ROWS // 1000}k, {FEATURES}] float32 "
                "(floor: SETRANGE pipeline)", setup=_setup(make), impls=impls, target="<= 2x floor")


def cases() -> list:
    return [_read_rows_case(), _bulk_write_case(), _write_rows_case()]
