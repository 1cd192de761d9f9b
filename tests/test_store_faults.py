"""TensorDictStore when the server goes away, stops answering, restarts, or the connection is cut in the middle of
a write: a clear ConnectionError naming the server, quickly, and the previous value still readable."""
from __future__ import annotations

import socket
import threading
import time

import pytest
import torch

from torchdict import TensorDict
from torchdict.store import TensorDictStore
from _redis_server import start_or_skip

redis = pytest.importorskip("redis")


@pytest.fixture
def server():
    """A server of this test's own: these tests kill, freeze and restart it."""
    started = start_or_skip()
    yield started
    started.stop()


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def assert_connection_error(error, where):
    import torchdict.store

    assert isinstance(error, torchdict.store.StoreConnectionError)
    assert isinstance(error, ConnectionError)  # the builtin
    assert isinstance(error, redis.exceptions.ConnectionError)  # and redis-py's, for code written for upstream
    assert where in str(error)


def test_a_killed_server_gives_a_connection_error_quickly(server):
    store = TensorDictStore(host="127.0.0.1", port=server.port, batch_size=[4], prefix="faults")
    store["x"] = torch.zeros(4, 2)
    server.kill()
    for action in (lambda: store["x"], lambda: store[0:2], lambda: store.set("y", torch.ones(4)),
                   lambda: store.__setitem__(0, 1), lambda: store.keys()):
        started = time.monotonic()
        with pytest.raises(ConnectionError) as caught:
            action()
        assert time.monotonic() - started < 3.0
        assert_connection_error(caught.value, f"127.0.0.1:{server.port}")


def test_a_frozen_server_times_out_instead_of_hanging(server):
    store = TensorDictStore(unix_socket_path=server.unix_socket_path, batch_size=[4], prefix="faults",
                            socket_timeout=0.5)
    store["x"] = torch.zeros(4, 2)
    server.pause()
    try:
        started = time.monotonic()
        with pytest.raises(ConnectionError) as caught:
            store["x"]
        assert time.monotonic() - started < 3.0
        assert_connection_error(caught.value, server.unix_socket_path)
    finally:
        server.resume()
    assert store["x"].shape == (4, 2)  # the connection recovers once the server answers again


def test_nothing_listening_fails_within_the_timeout():
    port = _free_port()
    started = time.monotonic()
    with pytest.raises(ConnectionError) as caught:
        TensorDictStore(host="127.0.0.1", port=port, batch_size=[2], socket_connect_timeout=1.0)
    assert time.monotonic() - started < 3.0
    assert_connection_error(caught.value, f"127.0.0.1:{port}")


def test_a_timeout_of_none_is_refused():
    with pytest.raises(ValueError, match="socket_timeout"):
        TensorDictStore(host="127.0.0.1", port=_free_port(), socket_timeout=None)


def test_a_restarted_server_is_reconnected_to(server):
    store = TensorDictStore(host="127.0.0.1", port=server.port, batch_size=[2], prefix="faults")
    store["x"] = torch.zeros(2)
    server.restart()  # no persistence: the data is gone, the pooled connection is dead
    assert "x" not in store
    with pytest.raises(KeyError):
        store["x"]
    store["y"] = torch.ones(2)
    assert store["y"].tolist() == [1.0, 1.0]
    again = TensorDictStore.from_store(host="127.0.0.1", port=server.port, prefix="faults", td_id=store._td_id)
    assert again.keys() == ["y"]  # the root metadata came back with the first write


class CuttingProxy:
    """A TCP relay to the server that cuts the connection once ``budget`` bytes went to the server, and
    refuses every connection after that: a link that fails in the middle of a write."""

    def __init__(self, target_port):
        self.target_port = target_port
        self.budget = None
        self.cut = False
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(8)
        self.port = self.listener.getsockname()[1]
        self.sockets = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.cut:
                client.close()
                continue
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            self.sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, source, target, to_server):
        try:
            while True:
                chunk = source.recv(65536)
                if not chunk:
                    break
                if to_server and self.budget is not None:
                    if len(chunk) >= self.budget:
                        target.sendall(chunk[:self.budget])
                        self.cut = True
                        break
                    self.budget -= len(chunk)
                target.sendall(chunk)
        except OSError:
            pass
        for sock in (source, target):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def close(self):
        self.listener.close()
        for sock in self.sockets:
            sock.close()


@pytest.fixture
def proxy(server):
    relay = CuttingProxy(server.port)
    yield relay
    relay.close()


def _direct(server, store):
    return TensorDictStore.from_store(unix_socket_path=server.unix_socket_path, prefix=store._prefix,
                                      td_id=store._td_id)


@pytest.mark.parametrize("write", ["set", "rows", "replace_level", "update"])
def test_a_write_cut_short_leaves_the_previous_value(server, proxy, write):
    store = TensorDictStore(host="127.0.0.1", port=proxy.port, batch_size=[1000], prefix="cut")
    before = TensorDict({"x": torch.zeros(1000, 100), "n": {"a": torch.zeros(1000, 10)}}, batch_size=[1000])
    store.update(before)
    proxy.budget = 150_000  # the next write is cut after 150 kB of its ~400 kB
    actions = {
        "set": lambda: store.set("x", torch.ones(1000, 100, dtype=torch.float64)),
        "rows": lambda: store.__setitem__(slice(0, 900), TensorDict({"x": torch.ones(900, 100)}, batch_size=[900])),
        "replace_level": lambda: store.set("n", torch.ones(1000, 100)),
        "update": lambda: store.update({"x": torch.ones(1000, 100), "n": {"a": torch.ones(1000, 10)}}),
    }
    with pytest.raises(ConnectionError) as caught:
        actions[write]()
    assert_connection_error(caught.value, f"127.0.0.1:{proxy.port}")
    after = _direct(server, store)
    assert sorted(map(str, after.keys(True, True))) == sorted(map(str, before.keys(True, True)))
    local = after.to_tensordict()
    assert local["x"].dtype == torch.float32 and not local["x"].any()
    assert local["n", "a"].shape == (1000, 10) and not local["n", "a"].any()
    after.clear_redis()
