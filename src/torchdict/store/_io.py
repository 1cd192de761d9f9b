"""Reads and writes of stored trees, each one atomic step of the server.

Every read returns the tree's metadata from the same step as the bytes, and decodes the bytes with that
metadata, so a read never pairs a new shape with old bytes. Whole values come from one MULTI/EXEC planned
on a snapshot of the tree (the cached one with ``cache_metadata``), planned again only when entries were
added or removed meanwhile; rows come from a script that computes their byte ranges from the metadata as
it is. Writes of whole entries queue a subtree deletion (a script), the new metadata and the new bytes in
one MULTI/EXEC, so readers see the old entry or the new one, and a write cut short by a lost connection is
discarded by the server; row writes run a script that checks the metadata they were planned with.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from ..nontensor import NonTensorData, NonTensorStack
from . import _schema
from ._client import DELETE_SUBTREES, Connection, Link
from ._ranges import RANGE_OVERHEAD_BYTES, Selection
from ._schema import JSON_STACK, JSON_VALUE, NODE, TENSOR, Tree

_ATTEMPTS = 8  # whole reads planned on a tree whose entries keep coming and going give up after this many

# redis-py sends every memoryview argument with a socket write of its own (no copy: right for large
# tensors), but packs bytes shorter than its buffer cutoff (6000) into one buffer. The 32 rows of a sample
# as memoryviews cost 32 system calls; as bytes, one.
_SEND_IN_PLACE_BYTES = 6000


def _on_wire(data: Any) -> Any:
    """``data`` as the client sends it cheapest: small values copied into bytes, large ones as they are."""
    return bytes(data) if isinstance(data, memoryview) and data.nbytes <= _SEND_IN_PLACE_BYTES else data

Path = Tuple[str, ...]


def below(tree: Tree, path: Path) -> List[Tuple[Path, dict]]:
    """The entries under ``path`` (not ``path`` itself), parents before children, siblings in write order."""
    field = _schema.field_of(path)
    start = _schema.child_prefix(field)
    found = [(_schema.path_of(name), meta) for name, (_, meta) in tree.items() if name.startswith(start)]
    found.sort(key=lambda item: (len(item[0]), item[1].get("n", 0), item[0]))
    return found


def children(tree: Tree, path: Path) -> List[Tuple[str, dict]]:
    depth = len(path) + 1
    return [(entry_path[-1], meta) for entry_path, meta in below(tree, path) if len(entry_path) == depth]


def fetch_trees(connection: Connection, links: Sequence[Link], fresh: bool = False) -> List[Tree]:
    """The tree of each link: the cached one (unless ``fresh``), else read, all in one round trip."""
    wanted = [link for link in links if fresh or link.tree is None]
    if wanted:
        def run() -> List[Any]:
            pipe = connection.client.pipeline(transaction=False)
            for link in wanted:
                pipe.hgetall(link.tree_key)
            return pipe.execute()

        read = {id(link): link.remember(_schema.parse_tree(raw)) for link, raw in zip(wanted, connection.run(run))}
    else:
        read = {}
    trees = []
    for link in links:
        tree = read[id(link)] if id(link) in read else link.tree
        assert tree is not None  # a link without its tree was read above
        trees.append(tree)
    return trees


# ---------------------------------------------------------------------- reads
def read_entries(connection: Connection, requests: Sequence[Tuple[Link, Path]]) -> List[Tuple[Optional[dict], Any]]:
    """``(metadata, bytes)`` of one entry per request (``(None, None)`` when missing), read atomically."""
    def build(pipe: Any) -> None:
        for link, path in requests:
            field = _schema.field_of(path)
            pipe.hget(link.tree_key, field)
            pipe.get(link.data_key(field))

    replies = connection.transaction(build)
    results: List[Tuple[Optional[dict], Any]] = []
    for position in range(len(requests)):
        raw, data = replies[2 * position], replies[2 * position + 1]
        results.append((None, None) if raw is None else (_schema.decode_meta(raw), data))
    return results


def read_trees(connection: Connection, targets: Sequence[Tuple[Link, Path]],
               selection: Optional[Selection] = None) -> List[Tuple[Tree, Dict[Path, Any]]]:
    """For each ``(link, path)``: the tree and the value of every tensor under ``path`` (whole, or the cells
    of ``selection``), all from one atomic step of the server, decoded with the metadata of that step."""
    if selection is not None:
        return _read_rows(connection, targets, selection)
    links = [link for link, _ in targets]
    trees = fetch_trees(connection, links, fresh=not connection.cache_metadata)
    for _ in range(_ATTEMPTS):
        plans = [_tensor_entries(tree, path) for tree, (_, path) in zip(trees, targets)]

        def build(pipe: Any) -> None:  # a transaction, not a script: a script would copy large values
            for (link, _), plan in zip(targets, plans):
                pipe.hgetall(link.tree_key)
                for entry_path in plan:
                    pipe.get(link.data_key(_schema.field_of(entry_path)))

        replies = iter(connection.transaction(build))
        results, fresh_trees, stale = [], [], False
        for (link, path), plan in zip(targets, plans):
            now = link.remember(_schema.parse_tree(next(replies), link.tree))
            fresh_trees.append(now)
            data = [next(replies) for _ in plan]
            # Metadata and bytes come from the same step: only a change of *which* entries hold tensors
            # (one added, removed, turned into a level) leaves the planned reads incomplete.
            if _tensor_entries(now, path) != plan:
                stale = True
                continue
            metas = dict(below(now, path))
            results.append((now, {entry_path: _whole(raw, metas[entry_path], None)
                                  for entry_path, raw in zip(plan, data)}))
        if not stale:
            return results
        trees = fresh_trees
    raise RuntimeError(f"TensorDictStore: entries kept being added or removed while being read ({_ATTEMPTS} "
                       "tries); another process is rewriting them.")


def _tensor_entries(tree: Tree, path: Path) -> List[Path]:
    return [entry_path for entry_path, meta in below(tree, path) if meta["kind"] == TENSOR]


def _read_rows(connection: Connection, targets: Sequence[Tuple[Link, Path]],
               selection: Selection) -> List[Tuple[Tree, Dict[Path, Any]]]:
    """The picked cells of every tensor under each path: one script call (``_client.READ_ROWS``)."""
    runs = " ".join([f"{start} {count}" for start, count in selection.runs])
    args: List[Any] = [runs, selection.depth, selection.count, RANGE_OVERHEAD_BYTES]
    for link, path in targets:
        args += [link.data_key(""), _schema.child_prefix(_schema.field_of(path))]
    keys = [link.tree_key for link, _ in targets]
    replies = connection.run(lambda: connection.read_rows(keys=keys, args=args))
    results = []
    for position, (link, _) in enumerate(targets):
        tree = link.remember(_schema.parse_tree(_pairs(replies[2 * position]), link.tree))
        found = replies[2 * position + 1]
        values = {}
        for at in range(0, len(found), 3):
            field, mode, data = found[at].decode("ascii"), found[at + 1], found[at + 2]
            meta = tree[field][1]
            values[_schema.path_of(field)] = (_whole(data, meta, selection) if mode == b"w"
                                              else _from_parts(data, meta, selection))
        results.append((tree, values))
    return results


def _pairs(flat: List[bytes]) -> Dict[bytes, bytes]:
    return dict(zip(flat[0::2], flat[1::2]))


def _whole(data: Optional[bytes], meta: dict, selection: Optional[Selection]) -> torch.Tensor:
    tensor = _schema.tensor_from_bytes(data or b"", _schema.DTYPES[meta["dtype"]], meta["shape"])
    return tensor if selection is None else selection.from_whole(tensor)


def _from_parts(data: bytes, meta: dict, selection: Selection) -> torch.Tensor:
    dtype = _schema.DTYPES[meta["dtype"]]
    shape = list(selection.result_shape(meta["shape"]))
    return _schema.tensor_from_bytes(data, dtype, shape)


def non_tensor_at(meta: dict, selection: Optional[Selection], device: Optional[torch.device]) -> Any:
    """A stored non-tensor entry, or the cells of it that ``selection`` picks."""
    if selection is None:
        return _schema.non_tensor_from_meta(meta, device)
    batch = torch.Size(meta["batch_size"])
    new_batch = selection.result_shape(batch)
    if meta["kind"] == JSON_VALUE:
        return NonTensorData(meta["value"], batch_size=new_batch, device=device)
    cell = selection.cell_elements(batch)
    values = meta["values"]
    picked = [value for position in selection.positions() for value in values[position * cell:(position + 1) * cell]]
    return NonTensorStack._from_flat(picked, new_batch, device)


def assemble(tree: Tree, path: Path, values: Dict[Path, Any], batch_size: torch.Size,
             device: Optional[torch.device], selection: Optional[Selection] = None) -> Any:
    """The TensorDict of the entries under ``path`` (read by :func:`read_trees`)."""
    from ..tensordict import TensorDict

    levels: Dict[Path, dict] = {path: {}}
    batches: Dict[Path, torch.Size] = {path: batch_size}
    for entry_path, meta in below(tree, path):
        parent = levels.get(entry_path[:-1])
        if parent is None:
            continue  # under a level that a concurrent write left incomplete: not part of this tree
        kind = meta["kind"]
        if kind == NODE:
            node_batch = torch.Size(meta["batch_size"])
            levels[entry_path] = {}
            batches[entry_path] = node_batch if selection is None else selection.result_shape(node_batch)
            parent[entry_path[-1]] = entry_path  # replaced by the built level below
        elif kind == TENSOR:
            tensor = values[entry_path]
            parent[entry_path[-1]] = tensor if device is None else tensor.to(device)
        elif kind in (JSON_VALUE, JSON_STACK):
            parent[entry_path[-1]] = non_tensor_at(meta, selection, device)

    def build(level: Path) -> Any:
        source = {key: build(value) if isinstance(value, tuple) else value for key, value in levels[level].items()}
        return TensorDict(source, batch_size=batches[level], device=device)

    return build(path)


# ---------------------------------------------------------------------- writes
class WritePlan:
    """Changes to one or more stored trees, planned on snapshots and committed as one transaction."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.deleted: Dict[Link, List[str]] = {}
        self.metas: Dict[Link, Dict[str, bytes]] = {}
        self.datas: List[Tuple[str, Any]] = []
        self.zeroed: List[Tuple[str, int]] = []  # (data key, size): entries the server fills with zeros
        self.snapshots: Dict[Link, Tree] = {}
        self.next_order: Dict[Link, int] = {}

    def tree(self, link: Link) -> Tree:
        """The tree of ``link`` as the server holds it now (fetched once per plan)."""
        snapshot = self.snapshots.get(link)
        if snapshot is None:
            snapshot = self.snapshots[link] = link.fetch_tree()
        return snapshot

    def prefetch(self, links: Sequence[Link]) -> None:
        """Fetch the trees of many links in one round trip (a write to every member of a stack)."""
        links = [link for link in links if link not in self.snapshots]
        for link, tree in zip(links, fetch_trees(self.connection, links, fresh=True)):
            self.snapshots[link] = tree

    def meta(self, link: Link, path: Path) -> Optional[dict]:
        """The entry at ``path`` once the planned changes are made (None when there is none)."""
        field = _schema.field_of(path)
        planned = self.metas.get(link, {}).get(field)
        if planned is not None:
            return _schema.decode_meta(planned)
        for gone in self.deleted.get(link, ()):
            if field == gone or field.startswith(_schema.child_prefix(gone)):
                return None
        entry = self.tree(link).get(field)
        return None if entry is None else entry[1]

    def order(self, link: Link, path: Path) -> int:
        current = self.tree(link).get(_schema.field_of(path))
        if current is not None and "n" in current[1]:
            return current[1]["n"]
        if link not in self.next_order:
            self.next_order[link] = 1 + max((meta.get("n", 0) for _, meta in self.tree(link).values()), default=0)
        order = self.next_order[link]
        self.next_order[link] = order + 1
        return order

    def delete(self, link: Link, path: Path) -> None:
        field = _schema.field_of(path)
        self.deleted.setdefault(link, []).append(field)
        metas = self.metas.get(link, {})
        start = _schema.child_prefix(field)
        for planned in [name for name in metas if name == field or name.startswith(start)]:
            del metas[planned]

    def put_meta(self, link: Link, path: Path, meta: dict) -> None:
        self.metas.setdefault(link, {})[_schema.field_of(path)] = _schema.encode_meta(meta)

    def allocate(self, link: Link, path: Path, shape: torch.Size, dtype: torch.dtype) -> None:
        """A new tensor entry of zeros, allocated by the server (SETRANGE past the end pads with zeros)."""
        self.delete(link, path)
        self.put_meta(link, path, _schema.tensor_meta(shape, dtype, self.order(link, path)))
        meta = _schema.tensor_meta(shape, dtype, 0)
        self.zeroed.append((link.data_key(_schema.field_of(path)), _schema.nbytes(meta)))

    def put(self, link: Link, path: Path, leaf: Any, *, replace: bool = True) -> None:
        """Write ``leaf`` (a tensor, a TensorDict, non-tensor data) at ``path``, replacing what is there.

        Every check (dtype, layout, JSON) runs here, before :meth:`commit` sends anything.
        """
        from ..base import TensorDictBase

        order = self.order(link, path)
        if replace:
            self.delete(link, path)
        if isinstance(leaf, torch.Tensor):
            _schema.check_tensor(leaf, path[-1])
            self.put_meta(link, path, _schema.tensor_meta(leaf.shape, leaf.dtype, order))
            self.datas.append((link.data_key(_schema.field_of(path)), _schema.tensor_bytes(leaf)))
        elif type(leaf) in (NonTensorData, NonTensorStack):
            self.put_meta(link, path, _schema.non_tensor_meta(leaf, path[-1], order))
        elif isinstance(leaf, TensorDictBase):
            source = leaf._dense() if not _is_plain_tensordict(leaf) else leaf
            self.put_meta(link, path, _schema.node_meta(source.batch_size, order))
            for key in source.keys():
                self.put(link, path + (key,), source._get_str(key, None), replace=False)
        else:
            raise TypeError(f"TensorDictStore can't store a {type(leaf).__name__} (at {path!r}): it stores tensors, "
                            "TensorDicts and JSON-compatible non-tensor data.")

    def commit(self) -> None:
        if not (self.deleted or self.metas or self.datas or self.zeroed):
            return

        def build(pipe: Any) -> None:
            for link, fields in self.deleted.items():
                pairs = [part for field in fields for part in (field, _schema.child_prefix(field))]
                pipe.eval(DELETE_SUBTREES, 1, link.tree_key, link.data_key(""), *pairs)
            for link, metas in self.metas.items():
                if metas:
                    pipe.hset(link.tree_key, mapping=metas)
            for key, data in self.datas:
                pipe.set(key, _on_wire(data))
            for key, size in self.zeroed:
                if size:
                    pipe.setrange(key, size - 1, b"\0")
                else:
                    pipe.set(key, b"")
            for link in self.metas:
                if link.root_raw is not None:  # a store cleared by clear_redis gets its root back
                    pipe.hsetnx(link.tree_key, _schema.ROOT_FIELD, link.root_raw)

        try:
            self.connection.transaction(build)
        except BaseException:
            for link in set(self.deleted) | set(self.metas):
                link.forget()
            raise
        for link in set(self.deleted) | set(self.metas) | set(self.snapshots):
            self._remember_after_commit(link)

    def _remember_after_commit(self, link: Link) -> None:
        if not self.connection.cache_metadata:
            return
        tree = dict(self.snapshots.get(link) or link.tree or {})
        if link not in self.snapshots and link.tree is None:
            return  # nothing known to update: the next read fetches it
        for gone in self.deleted.get(link, ()):
            start = _schema.child_prefix(gone)
            for field in [name for name in tree if name == gone or name.startswith(start)]:
                del tree[field]
        for field, raw in self.metas.get(link, {}).items():
            tree[field] = (raw, _schema.decode_meta(raw))
        link.tree = tree


def _is_plain_tensordict(value: Any) -> bool:
    from ..tensordict import TensorDict

    return isinstance(value, TensorDict)


def write_rows(connection: Connection, link: Link, entries: List[tuple]) -> int:
    """Run the row-writing script for ``entries`` = ``(field, expected raw meta, new raw meta or b'',
    [(offset, bytes), ...])``; 0 when written, else the 1-based entry whose metadata changed."""
    keys = [link.tree_key] + [link.data_key(field) for field, _, _, _ in entries]
    args: List[Any] = []
    for field, expected, new, ranges in entries:
        args += [field, expected, new, len(ranges)]
        for offset, data in ranges:
            args += [offset, _on_wire(data)]
    return int(connection.run(lambda: connection.write_rows(keys=keys, args=args)))
