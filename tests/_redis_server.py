"""A throwaway ``redis-server`` for the store tests: started on a free port (and a unix socket) in a temporary
folder, with persistence off, waited for until it answers PING, and stopped (or killed, or restarted).

Tests that need one skip only when no ``redis-server`` binary can be found or started; CI installs it and
sets ``TORCHDICT_REQUIRE_REDIS=1``, which turns those skips into failures. Set ``TORCHDICT_REDIS_SERVER``
to the binary to use another one.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from typing import Optional

_CANDIDATES = ("redis-server", "/usr/bin/redis-server", "/usr/local/bin/redis-server", "valkey-server")


def find_binary() -> Optional[str]:
    configured = os.environ.get("TORCHDICT_REDIS_SERVER")
    if configured:
        return configured if os.path.exists(configured) or shutil.which(configured) else None
    for candidate in _CANDIDATES:
        found = shutil.which(candidate)
        if found:
            return found
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _answers_ping(port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One ``redis-server`` process; ``port`` and ``unix_socket_path`` address it."""

    def __init__(self, binary: Optional[str] = None) -> None:
        self.binary = binary or find_binary()
        if self.binary is None:
            raise FileNotFoundError("redis-server not found")
        self.folder = tempfile.mkdtemp(prefix="torchdict-redis-")
        self.unix_socket_path = os.path.join(self.folder, "redis.sock")
        self.port = _free_port()
        self.process: Optional[subprocess.Popen] = None

    def start(self, timeout: float = 10.0) -> "RedisServer":
        """Start the server (on the same port and socket as before, after a restart)."""
        for attempt in range(3):
            log = open(os.path.join(self.folder, "redis.log"), "ab")
            self.process = subprocess.Popen(
                [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--dir", self.folder, "--unixsocket", self.unix_socket_path, "--unixsocketperm", "700",
                 "--daemonize", "no", "--protected-mode", "no", "--loglevel", "warning"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            log.close()
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    break  # exited: most likely the port was taken meanwhile
                if _answers_ping(self.port):
                    return self
                time.sleep(0.05)
            self._end(signal.SIGKILL)
            if attempt < 2:
                self.port = _free_port()
        raise RuntimeError(f"redis-server did not start; its log: {self.log()[-2000:]}")

    def log(self) -> str:
        try:
            with open(os.path.join(self.folder, "redis.log"), "rb") as file:
                return file.read().decode(errors="replace")
        except OSError:
            return ""

    def _end(self, sig: int) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(sig)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)

    def kill(self) -> None:
        """End the server at once, as a crash would (SIGKILL): its data is gone."""
        self._end(signal.SIGKILL)

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): it holds its connections but answers nothing."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def restart(self) -> "RedisServer":
        self.kill()
        return self.start()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.resume_if_paused()
        self._end(signal.SIGTERM)
        shutil.rmtree(self.folder, ignore_errors=True)

    def resume_if_paused(self) -> None:
        try:
            self.process.send_signal(signal.SIGCONT)
        except (OSError, AttributeError):
            pass


def start_or_skip() -> RedisServer:
    """A started server, or ``pytest.skip`` when no redis-server can be found or started (a failure when
    ``TORCHDICT_REQUIRE_REDIS`` is set)."""
    import pytest

    give_up = pytest.fail if os.environ.get("TORCHDICT_REQUIRE_REDIS") else pytest.skip
    binary = find_binary()
    if binary is None:
        give_up("redis-server is not installed (apt-get install redis-server; scripts/ensure_redis.sh)")
    try:
        return RedisServer(binary).start()
    except (OSError, RuntimeError) as error:
        give_up(f"redis-server could not be started: {error}")
    raise AssertionError("unreachable")
