"""The connection of a store to its server: the ``redis`` client, timeouts, errors, server-side scripts.

This module imports ``redis`` and is itself imported only when a store is made, so ``import torchdict``
and ``import torchdict.store`` work without the client library.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

try:
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry
except ImportError as error:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError("TensorDictStore needs the redis client library: pip install torchdict[store]") from error

from . import _schema

# Every call has a deadline: a server that stops answering ends in an error, never a hang.
DEFAULT_SOCKET_TIMEOUT = 10.0
DEFAULT_CONNECT_TIMEOUT = 5.0


class StoreConnectionError(ConnectionError, redis.exceptions.ConnectionError):
    """The store's server could not be reached, or stopped answering, during a call.

    A builtin ``ConnectionError`` (an ``OSError``) and a ``redis.exceptions.ConnectionError`` at once, so
    code written for either keeps catching it.
    """


# Delete entries and everything below them. KEYS[1]: the tree hash. ARGV[1]: the prefix of the data
# keys; ARGV[2..]: pairs (field, prefix of its descendants' fields). Returns how many entries went.
DELETE_SUBTREES = """
local removed = 0
local fields = redis.call('HKEYS', KEYS[1])
for _, field in ipairs(fields) do
  for i = 2, #ARGV, 2 do
    local target, below = ARGV[i], ARGV[i + 1]
    if field == target or (below ~= '' and string.sub(field, 1, #below) == below) then
      redis.call('HDEL', KEYS[1], field)
      redis.call('DEL', ARGV[1] .. field)
      removed = removed + 1
      break
    end
  end
end
return removed
"""

# Write rows of entries whose metadata is still what the caller planned with, all or nothing.
# KEYS[1]: the tree hash; KEYS[2..]: one data key per entry. ARGV, per entry: field, expected metadata,
# new metadata ('' keeps it), number of ranges r, then r pairs (byte offset, bytes).
# Returns 0 when written, else the 1-based position of the first entry whose metadata changed.
WRITE_ROWS = """
local at = 1
for i = 2, #KEYS do
  local current = redis.call('HGET', KEYS[1], ARGV[at])
  if current ~= ARGV[at + 1] then return i - 1 end
  at = at + 4 + 2 * tonumber(ARGV[at + 3])
end
at = 1
for i = 2, #KEYS do
  local ranges = tonumber(ARGV[at + 3])
  if ARGV[at + 2] ~= '' then redis.call('HSET', KEYS[1], ARGV[at], ARGV[at + 2]) end
  for j = 0, ranges - 1 do
    redis.call('SETRANGE', KEYS[i], tonumber(ARGV[at + 4 + 2 * j]), ARGV[at + 5 + 2 * j])
  end
  at = at + 4 + 2 * ranges
end
return 0
"""


# Read the picked rows of every tensor under a path, in one or more trees, in one atomic step that also
# returns each tree: the byte ranges are computed here from the metadata as it is, so a concurrent change
# of shape can't make them wrong. KEYS: one tree hash per tree. ARGV[1]: the runs as one text of
# space-separated pairs "first count ..." (one argument, not two per run: a sample's 32 runs as 64
# arguments cost the client more to pack than the server to read); ARGV[2..4]: the leading dims the cells
# span, the number of picked cells, the cost of one range in bytes; then per tree: its data key prefix and
# the field prefix of the entries to read.
# Returns per tree: its HGETALL array, then an array of triples (field, 'r' (the rows) or 'w' (the whole
# value: the rows would cover most of it), bytes).
READ_ROWS = """
local itemsize = {bool = 1, uint8 = 1, int8 = 1, int16 = 2, int32 = 4, int64 = 8, uint16 = 2, uint32 = 4,
  uint64 = 8, float16 = 2, bfloat16 = 2, float32 = 4, float64 = 8, complex64 = 8, complex128 = 16,
  float8_e4m3fn = 1, float8_e5m2 = 1, float8_e4m3fnuz = 1, float8_e5m2fnuz = 1, float8_e8m0fnu = 1}
local firsts, counts = {}, {}
for first, count in string.gmatch(ARGV[1], '(%d+) (%d+)') do
  firsts[#firsts + 1] = tonumber(first)
  counts[#counts + 1] = tonumber(count)
end
local runs = #firsts
local depth = tonumber(ARGV[2])
local picked = tonumber(ARGV[3])
local overhead = tonumber(ARGV[4])
local out = {}
for t = 1, #KEYS do
  local prefix, below = ARGV[3 + 2 * t], ARGV[4 + 2 * t]
  local tree = redis.call('HGETALL', KEYS[t])
  local found = {}
  for i = 1, #tree, 2 do
    local field = tree[i]
    if string.sub(field, 1, #below) == below then
      local meta = cjson.decode(tree[i + 1])
      if meta['kind'] == 'tensor' then
        local cell, total = itemsize[meta['dtype']], itemsize[meta['dtype']]
        for d, size in ipairs(meta['shape']) do
          total = total * size
          if d > depth then cell = cell * size end
        end
        local key = prefix .. field
        found[#found + 1] = field
        if runs > 1 and picked * cell + overhead * runs >= total then
          found[#found + 1] = 'w'
          found[#found + 1] = redis.call('GET', key) or ''
        else
          local parts = {}
          if cell > 0 then
            for r = 1, runs do
              local first = firsts[r] * cell
              local last = first + counts[r] * cell - 1
              parts[#parts + 1] = redis.call('GETRANGE', key, string.format('%d', first), string.format('%d', last))
            end
          end
          found[#found + 1] = 'r'
          found[#found + 1] = table.concat(parts)
        end
      end
    end
  end
  out[#out + 1] = tree
  out[#out + 1] = found
end
return out
"""


def _client_settings(client: Any) -> Dict[str, Any]:
    """The connection settings of a client made elsewhere (sync or asyncio), to open our own client."""
    settings = dict(getattr(getattr(client, "connection_pool", None), "connection_kwargs", None) or {})
    if not settings:
        raise TypeError(f"TensorDictStore: client must be a redis.Redis or redis.asyncio.Redis client, got "
                        f"{type(client).__name__}.")
    kept = ("host", "port", "db", "path", "username", "password", "socket_timeout", "socket_connect_timeout")
    return {name: settings[name] for name in kept if name in settings}


class Connection:
    """A synchronous client for one server, with its address for error messages and its settings for
    reopening in another process (a store is pickled as its settings, never its data)."""

    def __init__(self, *, host: str, port: int, db: int, unix_socket_path: Optional[str], backend: str,
                 cache_metadata: bool, client: Any = None, redis_kwargs: Optional[Dict[str, Any]] = None) -> None:
        _schema.check_byte_order()
        kwargs = dict(redis_kwargs or {})
        if client is not None:
            settings = _client_settings(client)
            unix_socket_path = settings.pop("path", None)
            host, port, db = settings.pop("host", host), settings.pop("port", port), settings.pop("db", db)
            if isinstance(client, redis.Redis):
                self.client = client  # used as given; its own timeouts apply
            kwargs = {**settings, **kwargs}
        kwargs.setdefault("socket_timeout", DEFAULT_SOCKET_TIMEOUT)
        kwargs.setdefault("socket_connect_timeout", DEFAULT_CONNECT_TIMEOUT)
        for name in ("socket_timeout", "socket_connect_timeout"):
            if kwargs[name] is None:  # no deadline would let a silent server hang the caller
                raise ValueError(f"TensorDictStore: {name} must be a number of seconds, not None.")
        self.host, self.port, self.db, self.unix_socket_path = host, int(port), int(db), unix_socket_path
        self.backend, self.cache_metadata = backend, bool(cache_metadata)
        self.redis_kwargs = kwargs
        self.closed = False
        if not hasattr(self, "client"):
            self.client = self._open()
        # EVALSHA, loading the script again when the server lost it (a restart): outside transactions only.
        self.read_rows = self.client.register_script(READ_ROWS)
        self.write_rows = self.client.register_script(WRITE_ROWS)

    def _open(self) -> Any:
        # One immediate retry on a dropped connection: a pooled socket to a restarted server fails once
        # and then reconnects. A server that is gone fails the retry at once (connection refused).
        options = {"retry": Retry(NoBackoff(), 1, supported_errors=(redis.exceptions.ConnectionError,)),
                   **self.redis_kwargs}
        if self.unix_socket_path is not None:
            return redis.Redis(unix_socket_path=self.unix_socket_path, db=self.db, **options)
        return redis.Redis(host=self.host, port=self.port, db=self.db, **options)

    @property
    def address(self) -> str:
        where = (f"unix socket {self.unix_socket_path}" if self.unix_socket_path is not None
                 else f"{self.host}:{self.port}")
        return f"{where} (db {self.db})"

    def settings(self) -> Dict[str, Any]:
        """What :func:`reopen` needs in another process."""
        kwargs = {name: value for name, value in self.redis_kwargs.items() if name != "retry"}
        return dict(host=self.host, port=self.port, db=self.db, unix_socket_path=self.unix_socket_path,
                    backend=self.backend, cache_metadata=self.cache_metadata, redis_kwargs=kwargs)

    def run(self, action: Callable[[], Any]) -> Any:
        """``action()``, with a lost or silent server reported as a :class:`StoreConnectionError`."""
        if self.closed:
            raise RuntimeError("This TensorDictStore is closed: open a new one (or from_store) to use the data.")
        try:
            return action()
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as error:
            raise StoreConnectionError(
                f"TensorDictStore: the server at {self.address} did not answer ({type(error).__name__}: "
                f"{error}). Nothing was changed by a write that failed this way.") from error

    def transaction(self, build: Callable[[Any], None]) -> List[Any]:
        """Run the commands that ``build`` queues on a pipeline as one MULTI/EXEC; their replies."""
        def execute() -> List[Any]:
            pipe = self.client.pipeline(transaction=True)
            build(pipe)
            return pipe.execute()

        return self.run(execute)

    def call(self, *command: Any) -> Any:
        return self.run(lambda: self.client.execute_command(*command))

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.client.close()


_CONNECTIONS: Dict[tuple, Connection] = {}


def reopen(settings: Dict[str, Any]) -> Connection:
    """A connection made from :meth:`Connection.settings`, shared by the stores unpickled in one process."""
    key = tuple(sorted((name, repr(value)) for name, value in settings.items()))
    connection = _CONNECTIONS.get(key)
    if connection is None or connection.closed:
        connection = _CONNECTIONS[key] = Connection(**settings)
    return connection


class Link:
    """One stored tree (a store's root or a member of a stored lazy stack) on a connection, with the
    process-local cache of its metadata."""

    def __init__(self, connection: Connection, ns: str) -> None:
        self.connection = connection
        self.ns = ns
        self.tree_key = _schema.tree_key(ns)
        self.tree: Optional[_schema.Tree] = None  # the last snapshot seen, when caching
        self.locked = False
        self.root_raw: Optional[bytes] = None  # the root metadata, rewritten if the tree was cleared

    def data_key(self, field: str) -> str:
        return _schema.data_key(self.ns, field)

    def remember(self, tree: _schema.Tree) -> _schema.Tree:
        if self.connection.cache_metadata:
            self.tree = tree
        return tree

    def forget(self) -> None:
        self.tree = None

    def fetch_tree(self) -> _schema.Tree:
        raw = self.connection.run(lambda: self.connection.client.hgetall(self.tree_key))
        return self.remember(_schema.parse_tree(raw))

    def planning_tree(self) -> _schema.Tree:
        """The tree to plan with: the cached one (the server checks it again), else fetched."""
        return self.tree if self.tree is not None else self.fetch_tree()
