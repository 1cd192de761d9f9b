"""Saving and loading TensorDicts as folders of raw tensor files (memmap, memmap_like, load_memmap).

On-disk format (``"format": "torchdict"``, version 1): one folder per TensorDict, holding

- ``<name>.memmap`` per tensor leaf: the raw elements, C order, little-endian, no header;
- ``<name>/`` per nested TensorDict (or tensorclass): a folder of the same format, which loads
  on its own with ``TensorDict.load_memmap(folder / name)``;
- ``<name>.pickle`` per non-tensor value that is not plain JSON, only when the caller passed
  ``allow_pickle=True``;
- ``meta.json``: batch size, device, names, class, and one entry per key (dtype, shape and
  file name of tensors; JSON non-tensor values inline). It is written last, atomically
  (temporary file + ``os.replace``), so a folder whose save did not finish has no ``meta.json``
  and refuses to load.

Keys become file names only through :func:`key_to_filename`, which can never produce a path
separator, ``.`` or ``..``: no key can write outside the folder. Folders written by upstream
tensordict 0.15.x (a flat ``meta.json``) load too; see ``_load_upstream_folder``.

Speed: tensor bytes are written with plain ``write`` calls, optionally from a thread pool
(``num_threads``), then mapped with ``torch.from_file``; loading maps files and copies nothing.
"""
from __future__ import annotations

import os
from typing import Any, Callable

import torch

from ._base import TensorCollection
from .memmap import (
    MemoryMappedTensor,
    _anonymous,
    _check_storable,
    allocate_file,
    map_file,
    write_tensor_file,
)
from .nontensor import NonTensorData, NonTensorStack

__all__ = [
    "PersistenceMixin",
    "key_to_filename",
    "load_memmap",
    "register_saved_class",
]

META_FILE = "meta.json"
FORMAT_NAME = "torchdict"
FORMAT_VERSION = 1
_CPU = torch.device("cpu")

# ---------------------------------------------------------------------- key -> file name
# Characters upstream tensordict escapes as %XX (kept identical so its folders load):
# path separators, characters Windows forbids, space, '%' itself and control characters.
_ESCAPED_CHARS = frozenset('/<>:"|?*\\ %') | frozenset(map(chr, range(32))) | {chr(127)}
# Folder names must not look like the files that sit beside them.
_FILE_SUFFIXES = (".memmap", ".pickle", ".json")
# Filesystems cap a name at 255 bytes; leave room for the ".memmap"/".pickle" suffix.
_MAX_NAME_BYTES = 200
_filename_cache: dict = {}


def _escape(key: str) -> str:
    if key == "":
        return "%"
    if key == ".":
        return "%2E"
    if key == "..":
        return "%2E%2E"
    parts = []
    for char in key:
        if char in _ESCAPED_CHARS:
            parts.append(f"%{ord(char):02X}")
        elif "\ud800" <= char <= "\udfff":
            # A lone surrogate has no UTF-8 form; escape its surrogatepass bytes.
            parts.extend(f"%{byte:02X}" for byte in char.encode("utf-8", "surrogatepass"))
        else:
            parts.append(char)
    return "".join(parts)


def key_to_filename(key: str, directory: bool = False) -> str:
    """The file (or folder) name that stores ``key``: the one escaping function of the format.

    Unsafe characters become ``%XX`` as in upstream tensordict (``"a/b"`` -> ``"a%2Fb"``,
    ``".."`` -> ``"%2E%2E"``, ``""`` -> ``"%"``); other characters, non-ASCII included, are kept.
    A name longer than 200 bytes is cut and suffixed with ``%~`` and a hash of the full key
    (a plain escaped name never holds ``%~``, so this cannot collide); ``meta.json`` records
    every key with its name, so nothing is lost. Folder names ending like a stored file
    (``.memmap``, ``.pickle``, ``.json``) get their last dot escaped.

    >>> key_to_filename("key 1"), key_to_filename("../x"), key_to_filename("meta.json", directory=True)
    ('key%201', '..%2Fx', 'meta%2Ejson')
    """
    cache_key = (key, directory)
    name = _filename_cache.get(cache_key)
    if name is not None:
        return name
    name = _escape(key)
    if directory and name.endswith(_FILE_SUFFIXES):
        dot = name.rfind(".")
        name = f"{name[:dot]}%2E{name[dot + 1:]}"
    if len(name.encode("utf-8")) > _MAX_NAME_BYTES:
        import hashlib

        digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        head = name.encode("utf-8")[: _MAX_NAME_BYTES - 18].decode("utf-8", "ignore")
        name = f"{head}%~{digest}"
    if len(_filename_cache) < 65536:
        _filename_cache[cache_key] = name
    return name


def _is_safe_name(name: object) -> bool:
    """A name read from meta.json may only designate an entry of its own folder."""
    return (
        type(name) is str
        and name not in ("", ".", "..")
        and "/" not in name
        and "\\" not in name
        and "\x00" not in name
        # at most 4 bytes per character: only long names need encoding to be measured
        and (len(name) <= 63 or len(name.encode("utf-8", "surrogatepass")) <= 255)
    )


# ---------------------------------------------------------------------- JSON values
_JSON_SCALARS = (type(None), bool, int, float, str)


def _is_plain_json(value: Any) -> bool:
    """True when ``json.loads(json.dumps(value)) == value`` with the same types."""
    kind = type(value)
    if kind in _JSON_SCALARS:
        return True
    try:
        if kind is list:
            return all(_is_plain_json(item) for item in value)
        if kind is dict:
            return all(type(k) is str and _is_plain_json(v) for k, v in value.items())
    except RecursionError:  # a self-referencing container
        return False
    return False


def _non_json_error(key_path: tuple, value: Any) -> TypeError:
    return TypeError(
        f"Cannot save the non-tensor entry {_show_key(key_path)} of type {type(value).__name__}: "
        "without pickling, only JSON values are stored (None, bool, int, float, str, and lists or "
        "str-keyed dicts of them). Pass allow_pickle=True to pickle it; loading it back will then "
        "need allow_pickle=True too."
    )


def _show_key(key_path: tuple) -> str:
    return repr(key_path[0] if len(key_path) == 1 else key_path)


# ---------------------------------------------------------------------- classes in meta.json
_SAVED_CLASSES: dict = {}


def _class_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def register_saved_class(cls: type) -> type:
    """Make a tensor collection class (e.g. a ``@tensorclass``) loadable by name.

    Loading never imports modules: a folder saved from class ``mod:Name`` loads only once
    that class has been registered (the tensorclass decorator does it; saving an instance
    does it too). The class must provide ``from_tensordict(td)``. Returns ``cls``.

    >>> class Pair:
    ...     @classmethod
    ...     def from_tensordict(cls, td):
    ...         return cls()
    >>> register_saved_class(Pair) is Pair
    True
    """
    _SAVED_CLASSES[_class_name(cls)] = cls
    return cls


_TENSORDICT: Any = None  # torchdict.TensorDict, bound on first use (tensordict.py imports this module)


def _is_tensordict(value: Any) -> bool:
    global _TENSORDICT
    if _TENSORDICT is None:
        from .tensordict import TensorDict

        _TENSORDICT = TensorDict
    return isinstance(value, _TENSORDICT)


# ---------------------------------------------------------------------- saving: plan
class _Node:
    """One folder of a save: what to write there, computed before anything touches the disk."""

    __slots__ = ("source", "td", "path", "key_path", "entries", "leaves", "children", "non_tensors",
                 "pickles", "class_name")

    def __init__(self, source: Any, td: Any, path: str | None, key_path: tuple) -> None:
        self.source = source  # the TensorDict or tensorclass instance being saved
        self.td = td  # its TensorDict
        self.path = path
        self.key_path = key_path
        self.entries: dict = {}  # key -> meta entry (filled for tensors once written)
        self.leaves: list = []  # (key, tensor, file path or None)
        self.children: list = []  # (key, _Node)
        self.non_tensors: list = []  # (key, leaf) copied into the result
        self.pickles: list = []  # (file path, bytes)
        self.class_name = None if _is_tensordict(source) else _class_name(type(source))


class _Options:
    __slots__ = ("like", "copy_existing", "existsok", "allow_pickle")

    def __init__(self, like: bool, copy_existing: bool, existsok: bool, allow_pickle: bool) -> None:
        self.like = like
        self.copy_existing = copy_existing
        self.existsok = existsok
        self.allow_pickle = allow_pickle


def _collection_td(value: Any) -> Any:
    return value if _is_tensordict(value) else value._tensordict


def _plan(source: Any, path: str | None, key_path: tuple, options: _Options) -> _Node:
    td = _collection_td(source)
    node = _Node(source, td, path, key_path)
    if key_path and path is not None and os.path.islink(path):
        raise RuntimeError(f"Refusing to write the memory-mapped TensorDict through the symlink {path}.")
    for key, value in td._tensordict.items():
        full_key = key_path + (key,)
        if isinstance(value, torch.Tensor):
            _check_storable(value, full_key[0] if len(full_key) == 1 else full_key)
            file_path = None
            if path is not None:
                file_name = key_to_filename(key) + ".memmap"
                file_path = path + os.sep + file_name
                _check_target(value, file_path, options)
                node.entries[key] = {"kind": "tensor", "file": file_name, "dtype": str(value.dtype),
                                     "shape": list(value.shape)}
            node.leaves.append((key, value, file_path))
        elif isinstance(value, TensorCollection):
            child_path = None
            if path is not None:
                dir_name = key_to_filename(key, directory=True)
                child_path = path + os.sep + dir_name
                node.entries[key] = {"kind": "collection", "dir": dir_name}
            node.children.append((key, _plan(value, child_path, full_key, options)))
        elif type(value) is NonTensorData or type(value) is NonTensorStack:
            node.non_tensors.append((key, value))
            if path is not None:
                node.entries[key] = _non_tensor_entry(key, value, path, full_key, node, options)
        else:
            raise TypeError(f"Cannot save the entry {_show_key(full_key)} of type {type(value).__name__}.")
    return node


def _check_target(tensor: torch.Tensor, file_path: str, options: _Options) -> None:
    source_file = getattr(tensor, "_mapped_file", None)
    if source_file is not None and not options.like:
        same = os.path.abspath(source_file.path) == os.path.abspath(file_path)
        if not same and not options.copy_existing:
            raise RuntimeError(
                f"A filename was provided ({file_path}) but the tensor already has a file associated "
                f"({source_file.path}). To copy the tensor onto the new location, pass copy_existing=True."
            )
        if same:
            return
    if not options.existsok and os.path.lexists(file_path):
        raise RuntimeError(f"The file {file_path} already exists.")


def _non_tensor_entry(key: str, leaf: Any, path: str, key_path: tuple, node: _Node,
                      options: _Options) -> dict:
    is_stack = type(leaf) is NonTensorStack
    entry: dict = {
        "kind": "non_tensor_stack" if is_stack else "non_tensor",
        "batch_size": list(leaf.batch_size),
    }
    value = leaf._flat_values() if is_stack else leaf.data
    if _is_plain_json(value):
        entry["value"] = value
        return entry
    if not options.allow_pickle:
        bad = next((item for item in value if not _is_plain_json(item)), value) if is_stack else value
        raise _non_json_error(key_path, bad)
    import pickle

    file_name = key_to_filename(key) + ".pickle"
    node.pickles.append((os.path.join(path, file_name), pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)))
    entry["pickle"] = file_name
    return entry


def _walk(node: _Node):
    yield node
    for _, child in node.children:
        yield from _walk(child)


# ---------------------------------------------------------------------- saving: execute
def _store_leaf(tensor: torch.Tensor, file_path: str | None, like: bool) -> MemoryMappedTensor:
    """Write (or allocate) one leaf and return it mapped."""
    if file_path is None:
        if like:
            return _anonymous(tensor.dtype, tensor.shape)
        return MemoryMappedTensor.from_tensor(tensor.detach())
    mapped = getattr(tensor, "_mapped_file", None)
    if (
        mapped is not None
        and mapped.writable
        and os.path.abspath(mapped.path) == os.path.abspath(file_path)
        and tensor.storage_offset() == 0
        and tensor.is_contiguous()
        and tensor.untyped_storage().nbytes() == tensor.nbytes
    ):
        return tensor  # already this very file, whole and in order: nothing to write
    if like:
        allocate_file(file_path, tensor.numel() * tensor.element_size())
    else:
        write_tensor_file(file_path, tensor)
    return map_file(file_path, tensor.dtype, tensor.shape, size_checked=True)


def _write_json_atomic(folder: str, text: str) -> None:
    """Write ``folder/meta.json`` so that it is either absent, old or complete, never partial.

    The temporary name starts with ``%m``, which no escaped key can produce.
    """
    import threading

    temporary = f"{folder}{os.sep}%meta-{os.getpid()}-{threading.get_ident()}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        data = text.encode("utf-8")
        written = 0
        while written < len(data):
            written += os.write(fd, data[written:])
    finally:
        os.close(fd)
    os.replace(temporary, folder + os.sep + META_FILE)


def _remove_meta(folder: str) -> None:
    try:
        os.remove(folder + os.sep + META_FILE)
    except FileNotFoundError:
        pass


def _make_folder(path: str, is_root: bool) -> bool:
    """Create ``path`` (its parents too for the root); True when it did not exist before."""
    try:
        os.mkdir(path)
        return True
    except FileExistsError:
        if not os.path.isdir(path):
            raise NotADirectoryError(f"Cannot save into {path}: it exists and is not a folder.") from None
        return False
    except FileNotFoundError:
        if not is_root:
            raise
        os.makedirs(path, exist_ok=True)
        return True


def _same_file_content(path: str, text: str) -> bool:
    try:
        with open(path, "rb") as handle:
            return handle.read() == text.encode("utf-8")
    except OSError:
        return False


def _folder_meta(node: _Node) -> dict:
    td = node.td
    return {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "class": node.class_name or "torchdict:TensorDict",
        "batch_size": list(td._batch_size),
        "device": "cpu",
        "names": None if td._names is None else list(td._names),
        "entries": node.entries,
    }


def _execute(root: _Node, options: _Options, num_threads: int, inplace: bool) -> Any:
    import json

    nodes = list(_walk(root))
    metas: dict = {}
    if root.path is not None:
        fresh = {id(node): _make_folder(node.path, node is root) for node in nodes}
        metas = {id(node): json.dumps(_folder_meta(node)) for node in nodes}
        for node in nodes:  # root first
            if fresh[id(node)]:
                continue
            if options.like and _same_file_content(node.path + os.sep + META_FILE, metas[id(node)]):
                # memmap_like writes no data: files only get (re)sized to what this very
                # meta.json already describes, so the folder stays consistent throughout.
                metas[id(node)] = None
                continue
            # Mark the folder incomplete before touching a file: a save killed from here on
            # leaves no meta.json that would describe half-written data.
            _remove_meta(node.path)
    jobs = [(node, key, tensor, file_path) for node in nodes for key, tensor, file_path in node.leaves]
    stored: list

    def run(job: tuple) -> MemoryMappedTensor:
        return _store_leaf(job[2], job[3], options.like)

    if num_threads and num_threads > 0 and len(jobs) > 1:
        from concurrent.futures import ThreadPoolExecutor

        order = sorted(range(len(jobs)), key=lambda i: -jobs[i][2].nbytes)
        results: list = [None] * len(jobs)
        with ThreadPoolExecutor(max_workers=num_threads) as pool:
            for index, result in zip(order, pool.map(run, [jobs[i] for i in order])):
                results[index] = result
        stored = results
    else:
        stored = [run(job) for job in jobs]
    mapped = {(id(job[0]), job[1]): result for job, result in zip(jobs, stored)}
    if root.path is not None:
        for node in nodes:
            for file_path, payload in node.pickles:
                with open(file_path, "wb") as handle:
                    handle.write(payload)
        # Children before parents, the root last: the root's meta.json marks the save complete.
        for node in reversed(nodes):
            if metas[id(node)] is not None:
                _write_json_atomic(node.path, metas[id(node)])
    result = _assemble(root, mapped, inplace)
    result_td = _collection_td(result)
    result_td._lock_tree()
    return result


def _assemble(node: _Node, mapped: dict, inplace: bool) -> Any:
    """Build the memory-mapped result (or update the source in place) from the stored leaves."""
    children = {key: _assemble(child, mapped, inplace) for key, child in node.children}
    non_tensors = {key: leaf._to_device(_CPU) for key, leaf in node.non_tensors}
    td = node.td
    node_id = id(node)
    if inplace:
        storage = td._tensordict
        for key in list(storage):
            if key in children:
                continue  # updated in place by the recursion
            storage[key] = mapped[(node_id, key)] if (node_id, key) in mapped else non_tensors[key]
        td._device = _CPU
        target = td
        result = node.source
    else:
        storage = {}
        for key in td._tensordict:
            if key in children:
                storage[key] = children[key]
            elif (node_id, key) in mapped:
                storage[key] = mapped[(node_id, key)]
            else:
                storage[key] = non_tensors[key]
        target = type(td)._new_unsafe(storage, td._batch_size, _CPU,
                                      None if td._names is None else list(td._names))
        result = target if node.class_name is None else node.source._rewrap(target)
    target._is_memmap = True
    target._saved_path = node.path
    return result


def save_collection(source: Any, prefix: Any = None, *, copy_existing: bool = False, num_threads: int = 0,
                    return_early: bool = False, existsok: bool = True, allow_pickle: bool = False,
                    like: bool = False, inplace: bool = False) -> Any:
    """Memory-map a TensorDict or tensorclass instance (the engine behind ``memmap*``).

    Everything that can be refused (bad keys, non-JSON values, existing files) is refused
    before the first byte is written.
    """
    path = None if prefix is None else os.path.abspath(os.fspath(prefix))
    options = _Options(like, copy_existing, existsok, allow_pickle)
    root = _plan(source, path, (), options)
    if path is not None:
        for node in _walk(root):
            if node.class_name is not None:
                register_saved_class(type(node.source))
    if not return_early:
        return _execute(root, options, num_threads, inplace)
    from concurrent.futures import ThreadPoolExecutor

    executor = ThreadPoolExecutor(max_workers=1)
    future = executor.submit(_execute, root, options, num_threads, inplace)
    executor.shutdown(wait=False)
    return future


# ---------------------------------------------------------------------- loading
_DTYPES: dict = {}  # "torch.float32" -> torch.float32, filled on first load


def _dtype_table() -> dict:
    if not _DTYPES:
        _DTYPES.update({str(value): value for value in vars(torch).values() if isinstance(value, torch.dtype)})
    return _DTYPES


def _corrupt(folder: str, detail: str) -> ValueError:
    return ValueError(f"The saved TensorDict in {folder} has an invalid {META_FILE}: {detail}")


def _read_meta(folder: str) -> dict:
    import json

    meta_path = os.path.join(folder, META_FILE)
    try:
        with open(meta_path, encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        if not os.path.isdir(folder):
            raise FileNotFoundError(2, "No such file or directory", meta_path) from None
        raise FileNotFoundError(
            2,
            f"No such file or directory: {folder} has no {META_FILE}, so it is not a saved TensorDict, or the "
            "save that wrote it did not finish (meta.json is written last)",
            meta_path,
        ) from None
    try:
        meta = json.loads(text)
    except ValueError as error:
        raise _corrupt(folder, f"not valid JSON ({error})") from None
    if type(meta) is not dict:
        raise _corrupt(folder, "expected a JSON object")
    return meta


def _parse_dtype(folder: str, name: Any) -> torch.dtype:
    dtype = _dtype_table().get(name) if type(name) is str else None
    if dtype is None:
        raise _corrupt(folder, f"unknown dtype {name!r}")
    return dtype


def _parse_shape(folder: str, shape: Any) -> torch.Size:
    if type(shape) is not list:
        raise _corrupt(folder, f"invalid shape {shape!r}")
    for size in shape:
        if type(size) is not int or size < 0:
            raise _corrupt(folder, f"invalid shape {shape!r}")
    return torch.Size(shape)


def _child_path(folder: str, name: Any) -> str:
    if not _is_safe_name(name):
        raise _corrupt(folder, f"unsafe file name {name!r}")
    return folder + os.sep + name


class _LoadOptions:
    __slots__ = ("cls", "mode", "allow_pickle", "pool")

    def __init__(self, cls: type, mode: str, allow_pickle: bool, pool: Any) -> None:
        self.cls = cls
        self.mode = mode
        self.allow_pickle = allow_pickle
        self.pool = pool


def _map(options: _LoadOptions, path: str, dtype: torch.dtype, shape: torch.Size) -> Any:
    if options.pool is None:
        return map_file(path, dtype, shape, mode=options.mode)
    return options.pool.submit(map_file, path, dtype, shape, mode=options.mode)


def _check_fits(folder: str, key: str, shape: torch.Size, batch_size: torch.Size) -> None:
    if shape[: len(batch_size)] != batch_size:
        raise _corrupt(folder, f"entry {key!r} has shape {list(shape)}, which does not start with the "
                               f"batch size {list(batch_size)}")


def _load_pickle(path: str, options: _LoadOptions) -> Any:
    if not options.allow_pickle:
        raise RuntimeError(
            f"Refusing to load pickled non-tensor data from {path}: unpickling can run arbitrary code. "
            "Pass allow_pickle=True if you trust this folder."
        )
    import pickle

    with open(path, "rb") as handle:
        return pickle.load(handle)


def _load_folder(folder: str, options: _LoadOptions, parent_batch: torch.Size | None = None) -> Any:
    meta = _read_meta(folder)
    if meta.get("format") == FORMAT_NAME:
        return _load_torchdict_folder(folder, meta, options, parent_batch)
    return _load_upstream_folder(folder, meta, options, parent_batch)


def _load_torchdict_folder(folder: str, meta: dict, options: _LoadOptions,
                           parent_batch: torch.Size | None) -> Any:
    version = meta.get("version")
    if type(version) is not int or version > FORMAT_VERSION:
        raise _corrupt(folder, f"format version {version!r} is newer than this torchdict reads "
                               f"({FORMAT_VERSION}); upgrade torchdict")
    batch_size = _parse_shape(folder, meta.get("batch_size"))
    if parent_batch is not None and batch_size[: len(parent_batch)] != parent_batch:
        raise _corrupt(folder, f"batch size {list(batch_size)} does not extend the parent's {list(parent_batch)}")
    entries = meta.get("entries")
    if type(entries) is not dict:
        raise _corrupt(folder, "missing 'entries'")
    storage: dict = {}
    for key, entry in entries.items():
        kind = entry.get("kind") if type(entry) is dict else None
        if kind == "tensor":
            shape = _parse_shape(folder, entry.get("shape"))
            _check_fits(folder, key, shape, batch_size)
            dtype = _parse_dtype(folder, entry.get("dtype"))
            storage[key] = _map(options, _child_path(folder, entry.get("file")), dtype, shape)
        elif kind == "collection":
            storage[key] = _load_folder(_child_path(folder, entry.get("dir")), options, batch_size)
        elif kind in ("non_tensor", "non_tensor_stack"):
            leaf_batch = _parse_shape(folder, entry.get("batch_size"))
            _check_fits(folder, key, leaf_batch, batch_size)
            if "pickle" in entry:
                value = _load_pickle(_child_path(folder, entry["pickle"]), options)
            elif "value" in entry:
                value = entry["value"]
            else:
                raise _corrupt(folder, f"entry {key!r} has no value")
            if kind == "non_tensor":
                storage[key] = NonTensorData(value, leaf_batch, _CPU)
            else:
                if type(value) is not list or len(value) != leaf_batch.numel():
                    raise _corrupt(folder, f"entry {key!r} does not hold one value per batch element")
                storage[key] = NonTensorStack(value, leaf_batch, _CPU)
        else:
            raise _corrupt(folder, f"entry {key!r} has an unknown kind {kind!r}")
    device = meta.get("device")
    names = meta.get("names")
    if names is not None and (type(names) is not list or len(names) != len(batch_size)):
        raise _corrupt(folder, f"invalid names {names!r}")
    return _build(storage, batch_size, device, names, meta.get("class"), options, folder)


def _build(storage: dict, batch_size: torch.Size, device: Any, names: Any, class_name: Any,
           options: _LoadOptions, folder: str) -> Any:
    if options.pool is not None:
        from concurrent.futures import Future

        for key, value in storage.items():
            if type(value) is Future:
                storage[key] = value.result()  # a mapping done by the thread pool
    device = None if device in (None, "None") else torch.device(device)
    td_class = options.cls
    td = td_class._new_unsafe(storage, batch_size, device, names)
    if class_name in (None, "torchdict:TensorDict") or _is_tensordict_class_name(class_name):
        return td
    collection_class = _SAVED_CLASSES.get(class_name)
    if collection_class is None:
        raise RuntimeError(
            f"Could not find the class {class_name} saved in {folder}. Loading never imports modules: "
            "import the module that defines it (a @tensorclass registers itself) and load again."
        )
    return collection_class.from_tensordict(td)


def _is_tensordict_class_name(class_name: Any) -> bool:
    return type(class_name) is str and class_name.startswith("torchdict:") and class_name.endswith("TensorDict")


# ---------------------------------------------------------------------- upstream 0.15.x folders
_UPSTREAM_RESERVED = frozenset(
    ("shape", "device", "_type", "_format_version", "_class", "_names", "_metadata", "_is_non_tensor",
     "data", "stack_dim", "stack_dim_name")
)


def _upstream_kind(meta: dict) -> str:
    """Which upstream class wrote a folder, from ``_class`` (0.15) or ``_type`` (older)."""
    class_name = meta.get("_class")
    if type(class_name) is str and class_name.startswith("tensordict:"):
        return class_name.split(":", 1)[1]
    type_name = meta.get("_type")
    if type(type_name) is str and type_name.startswith("<class '") and type_name.endswith("'>"):
        qualified = type_name[len("<class '"):-2]
        if qualified.startswith("tensordict."):
            return qualified.rsplit(".", 1)[1]
        return "external:" + qualified
    if type(class_name) is str:
        return "external:" + class_name.replace(":", ".")
    return "TensorDict"


def _upstream_entry_path(folder: str, key: str, suffix: str) -> str:
    """The file of ``key`` in an upstream folder: the %XX name, or the legacy raw key name."""
    encoded = os.path.join(folder, _escape(key) + suffix)
    if os.path.exists(encoded) or not _is_safe_name(key + suffix):
        return encoded
    legacy = os.path.join(folder, key + suffix)
    return legacy if os.path.exists(legacy) else encoded


def _load_upstream_folder(folder: str, meta: dict, options: _LoadOptions,
                          parent_batch: torch.Size | None) -> Any:
    kind = _upstream_kind(meta)
    if kind in ("NonTensorData", "MetaData"):
        value = meta["data"] if "data" in meta else None
        pickle_path = os.path.join(folder, "other.pickle")
        if "data" not in meta and os.path.exists(pickle_path):
            value = _load_pickle(pickle_path, options)["data"]
        return NonTensorData(value, parent_batch or torch.Size(()), _CPU)
    if kind == "NonTensorStack":
        return _upstream_non_tensor_stack(folder, meta, options, parent_batch)
    if kind == "LazyStackedTensorDict":
        return _upstream_lazy_stack(folder, meta, options)
    if kind.startswith("external:"):
        return _upstream_tensorclass(folder, meta, kind[len("external:"):], options, parent_batch)
    if kind != "TensorDict":
        raise RuntimeError(f"Could not find the class tensordict.{kind} saved in {folder}.")
    batch_size = _parse_shape(folder, meta.get("shape", []))
    storage: dict = {}
    for key, entry in meta.items():
        if key in _UPSTREAM_RESERVED or type(entry) is not dict:
            continue
        if "dtype" in entry:
            storage[key] = _upstream_tensor(folder, key, entry, batch_size, options)
        elif "type" in entry:
            storage[key] = _load_folder(_upstream_entry_path(folder, key, ""), options, batch_size)
    names = meta.get("_names")
    device = meta.get("device", "cpu")
    return _build(storage, batch_size, device, names if type(names) is list else None, None, options, folder)


def _upstream_tensor(folder: str, key: str, entry: dict, batch_size: torch.Size, options: _LoadOptions) -> Any:
    dtype = _parse_dtype(folder, entry.get("dtype"))
    shape = _parse_shape(folder, entry.get("shape"))
    path = _upstream_entry_path(folder, key, ".memmap")
    if not entry.get("is_nested", False):
        _check_fits(folder, key, shape, batch_size)
        return _map(options, path, dtype, shape)
    # A nested tensor: <key>.shape.memmap holds one row of sizes per element.
    sizes = map_file(_upstream_entry_path(folder, key, ".shape.memmap"), torch.int64, shape, mode="r")
    element_shapes = [torch.Size(row) for row in sizes.tolist()]
    total = sum(element.numel() for element in element_shapes)
    flat = map_file(path, dtype, torch.Size([total]), mode=options.mode)
    pieces = []
    offset = 0
    for element in element_shapes:
        pieces.append(flat[offset: offset + element.numel()].view(element))
        offset += element.numel()
    return torch.nested.as_nested_tensor(pieces, layout=torch.strided)


def _upstream_non_tensor_stack(folder: str, meta: dict, options: _LoadOptions,
                               parent_batch: torch.Size | None) -> Any:
    data = meta.get("data")
    if data is None and os.path.exists(os.path.join(folder, "other.pickle")):
        data = _load_pickle(os.path.join(folder, "other.pickle"), options)["data"]
    if type(data) is not list:
        raise _corrupt(folder, "a NonTensorStack without a list of values")
    stack = NonTensorStack.from_nested_list(data, parent_batch)
    stack_dim = meta.get("stack_dim", 0)
    if stack_dim not in (0, None):
        raise RuntimeError(f"Loading a NonTensorStack stacked along dim {stack_dim} ({folder}) is not supported.")
    return stack._to_device(_CPU)


def _upstream_lazy_stack(folder: str, meta: dict, options: _LoadOptions) -> Any:
    members = []
    index = 0
    while os.path.isdir(os.path.join(folder, str(index))):
        members.append(_load_folder(os.path.join(folder, str(index)), options))
        index += 1
    stack_dim = meta.get("stack_dim", 0)
    if not members:
        raise _corrupt(folder, "a stacked TensorDict without members")
    try:
        return torch.stack(members, stack_dim)
    except Exception as error:
        raise RuntimeError(
            f"The upstream LazyStackedTensorDict in {folder} could not be loaded as one dense TensorDict "
            f"(torchdict stacks densely): {error}"
        ) from error


def _upstream_tensorclass(folder: str, meta: dict, qualified: str, options: _LoadOptions,
                          parent_batch: torch.Size | None) -> Any:
    module, _, qualname = qualified.rpartition(".")
    class_name = f"{module}:{qualname}"
    cls = _SAVED_CLASSES.get(class_name)
    if cls is None:
        raise RuntimeError(
            f"Could not find the class {qualified} saved in {folder}. Loading never imports modules: "
            "import and register it (a @tensorclass registers itself) and load again."
        )
    td = _load_folder(os.path.join(folder, "_tensordict"), options, parent_batch)
    for key, value in meta.items():
        if key not in _UPSTREAM_RESERVED and key != "_tensordict":
            td._tensordict[key] = NonTensorData(value, td._batch_size, _CPU)
    return cls.from_tensordict(td)


def load_memmap(prefix: Any, device: Any = None, non_blocking: bool = False, *, num_threads: int = 0,
                allow_pickle: bool = False, mode: str = "r+", cls: type | None = None) -> Any:
    """Load a folder written by ``memmap`` (or by upstream tensordict 0.15.x), mapping its files.

    See :meth:`PersistenceMixin.load_memmap`.
    """
    if cls is None:
        from .tensordict import TensorDict as cls
    if mode not in ("r", "r+"):
        raise ValueError(f"mode must be 'r' or 'r+', got {mode!r}.")
    folder = os.path.abspath(os.fspath(prefix))
    pool = None
    if num_threads and num_threads > 0:
        from concurrent.futures import ThreadPoolExecutor

        pool = ThreadPoolExecutor(max_workers=num_threads)
    try:
        result = _load_folder(folder, _LoadOptions(cls, mode, allow_pickle, pool))
    finally:
        if pool is not None:
            pool.shutdown(wait=True)
    if device is not None:
        device = torch.device(device)
        if device != _CPU:
            result = result.to(device, non_blocking=non_blocking)
    return result


# ---------------------------------------------------------------------- TensorDict methods
class PersistenceMixin:
    """memmap / memmap_ / memmap_like / load_memmap / save / load on TensorDict."""

    __slots__ = ()

    def memmap(self, prefix: Any = None, copy_existing: bool = False, *, num_threads: int = 0,
               return_early: bool = False, existsok: bool = True, allow_pickle: bool = False) -> Any:
        """A new, locked, memory-mapped copy on the CPU, written to folder ``prefix``.

        Every tensor leaf becomes a :class:`MemoryMappedTensor` backed by
        ``prefix/<key>.memmap`` (anonymous shared memory when ``prefix`` is None); nested
        TensorDicts become sub-folders; non-tensor values go to ``meta.json`` as JSON
        (anything else needs ``allow_pickle=True``). The source is unchanged.
        ``num_threads`` writes files from a thread pool; ``return_early=True`` returns a
        ``concurrent.futures.Future`` at once. ``existsok=False`` refuses to overwrite files.
        A leaf already mapped from another file is copied only with ``copy_existing=True``.

        >>> import tempfile, torch
        >>> from torchdict import TensorDict
        >>> td = TensorDict({"a": torch.arange(3), "b": {"c": torch.ones(3)}}, batch_size=[3])
        >>> saved = td.memmap(tempfile.mkdtemp())
        >>> type(saved["b", "c"]).__name__, saved.is_locked, saved.is_memmap()
        ('MemoryMappedTensor', True, True)
        """
        return save_collection(self, prefix, copy_existing=copy_existing, num_threads=num_threads,
                               return_early=return_early, existsok=existsok, allow_pickle=allow_pickle)

    def save(self, prefix: Any = None, copy_existing: bool = False, *, num_threads: int = 0,
             return_early: bool = False, existsok: bool = True, allow_pickle: bool = False) -> Any:
        """Alias of :meth:`memmap`.

        >>> import tempfile
        >>> from torchdict import TensorDict
        >>> TensorDict(a=1).save(tempfile.mkdtemp())["a"].item()
        1
        """
        return self.memmap(prefix, copy_existing, num_threads=num_threads, return_early=return_early,
                           existsok=existsok, allow_pickle=allow_pickle)

    dumps = save

    def memmap_(self, prefix: Any = None, copy_existing: bool = False, *, num_threads: int = 0,
                return_early: bool = False, existsok: bool = True, allow_pickle: bool = False) -> Any:
        """Memory-map in place: the leaves are replaced by MemoryMappedTensors; returns self (locked).

        The leaves are only swapped once every file is written, so a failed save leaves
        the TensorDict as it was.

        >>> import tempfile, torch
        >>> from torchdict import TensorDict
        >>> td = TensorDict(a=torch.zeros(2))
        >>> td.memmap_(tempfile.mkdtemp()) is td, type(td["a"]).__name__
        (True, 'MemoryMappedTensor')
        """
        return save_collection(self, prefix, copy_existing=copy_existing, num_threads=num_threads,
                               return_early=return_early, existsok=existsok, allow_pickle=allow_pickle,
                               inplace=True)

    def memmap_like(self, prefix: Any = None, copy_existing: bool = False, *, existsok: bool = True,
                    num_threads: int = 0, return_early: bool = False, allow_pickle: bool = False) -> Any:
        """Same keys, dtypes and shapes, as zero-filled memory-mapped files; no data is copied.

        Files are allocated at full size *sparsely* (``ftruncate``): allocating a 50 GB
        dataset takes microseconds and no disk blocks until written. Expanded leaves become
        full-size contiguous files. Files that already exist keep their bytes (resized).

        >>> import tempfile, torch
        >>> from torchdict import TensorDict
        >>> image = torch.zeros(8, 8, 3, dtype=torch.uint8)
        >>> data = TensorDict({"images": image.expand(1000, 8, 8, 3)}, batch_size=[1000])
        >>> data = data.memmap_like(tempfile.mkdtemp())
        >>> data.shape, data["images"].shape
        (torch.Size([1000]), torch.Size([1000, 8, 8, 3]))
        """
        return save_collection(self, prefix, copy_existing=copy_existing, num_threads=num_threads,
                               return_early=return_early, existsok=existsok, allow_pickle=allow_pickle,
                               like=True)

    @classmethod
    def load_memmap(cls, prefix: Any, device: Any = None, non_blocking: bool = False, *, num_threads: int = 0,
                    allow_pickle: bool = False, mode: str = "r+") -> Any:
        """Load a saved folder lazily: files are mapped, nothing is read until used.

        A sub-folder (``prefix/"0"``) loads on its own as that nested TensorDict. The result is
        unlocked, with MemoryMappedTensor leaves. ``mode="r"`` maps copy-on-write (writes stay
        in memory). Pickled values load only with ``allow_pickle=True``. ``device`` moves the
        result there. Folders written by upstream tensordict 0.15.x load too.

        >>> import tempfile, torch
        >>> from torchdict import TensorDict
        >>> folder = tempfile.mkdtemp()
        >>> _ = TensorDict({"0": {"w": torch.ones(2)}}).memmap(folder)
        >>> TensorDict.load_memmap(folder + "/0")["w"].tolist()
        [1.0, 1.0]
        """
        return load_memmap(prefix, device, non_blocking, num_threads=num_threads, allow_pickle=allow_pickle,
                           mode=mode, cls=cls)

    @classmethod
    def load(cls, prefix: Any, device: Any = None, non_blocking: bool = False, *, num_threads: int = 0,
             allow_pickle: bool = False, mode: str = "r+") -> Any:
        """Alias of :meth:`load_memmap`.

        >>> import tempfile
        >>> from torchdict import TensorDict
        >>> folder = tempfile.mkdtemp()
        >>> _ = TensorDict(a=2).save(folder)
        >>> TensorDict.load(folder)["a"].item()
        2
        """
        return load_memmap(prefix, device, non_blocking, num_threads=num_threads, allow_pickle=allow_pickle,
                           mode=mode, cls=cls)

    def is_memmap(self) -> bool:
        """True for the results of ``memmap``/``memmap_``/``memmap_like`` while they stay locked.

        (As in upstream, a freshly loaded TensorDict is not "memmap": it is unlocked.)

        >>> from torchdict import TensorDict
        >>> TensorDict(a=1).is_memmap()
        False
        """
        return self._is_memmap

    @property
    def saved_path(self) -> str:
        """The folder this memory-mapped TensorDict was saved to.

        >>> import tempfile, os
        >>> from torchdict import TensorDict
        >>> folder = tempfile.mkdtemp()
        >>> TensorDict(a=1).memmap(folder).saved_path == os.path.abspath(folder)
        True
        """
        if not self._is_memmap or self._saved_path is None:
            raise AttributeError(
                f"The tensordict has no saved path (memmap={self._is_memmap}, path={self._saved_path})"
            )
        return self._saved_path
