"""The entries of an archive in upstream tensordict 0.15's folder layout, so that ``tensordict`` opens the
archives torchdict writes (``td.save("x.tdz")``).

The save is staged as a torchdict folder first; this module translates each of its ``meta.json`` files into
upstream's flat form (``shape`` / ``device`` / ``_type`` / ``_class`` beside one dict per key) and names each
entry as upstream looks it up (its ``%XX``-escaped key). Non-tensor values become upstream's
``NonTensorData`` / ``NonTensorStack`` sub-folders. Folders the stage already holds in upstream's layout (a
lazy stack, a lone non-tensor leaf) are copied as they are.

What upstream's layout cannot say, it does not get: a key that upstream's ``meta.json`` reserves (``shape``,
``device``, ``_type``, ...), a tensorclass, a pickled value, a non-tensor leaf with more batch dims than its
TensorDict, or two entries whose upstream names collide. Then :func:`upstream_entries` returns None and the
archive keeps torchdict's own layout, which torchdict loads as well.
"""
from __future__ import annotations

import json
import os
from typing import Any

from .._filenames import escape_key, is_safe_name
from .._meta_json import FORMAT_NAME, META_FILE, TENSORDICT_CLASS, read_meta
from .._upstream_format import _UPSTREAM_RESERVED

__all__ = ["upstream_entries"]

_TD_TYPE = "<class 'tensordict._td.TensorDict'>"
_DATA_TYPE = "<class 'tensordict.tensorclass.NonTensorData'>"
_STACK_TYPE = "<class 'tensordict.tensorclass.NonTensorStack'>"


class _NotRepresentable(Exception):
    """The staged save holds something upstream's layout can't say."""


def _json_entry(name: str, meta: dict) -> Any:
    from .archive import _Entry

    data = json.dumps(meta).encode("utf-8")
    return _Entry(name, len(data), lambda: iter((data,)), False)


def _nest(values: list, shape: list) -> list:
    """The flat ``values`` of a non-tensor stack as nested lists of ``shape`` (upstream stores them so)."""
    if len(shape) <= 1:
        return list(values)
    step = len(values) // shape[0] if shape[0] else 0
    return [_nest(values[index * step:(index + 1) * step], shape[1:]) for index in range(shape[0])]


def _convert(folder: str, at: str, sources: dict, out: list, parent_names: list | None = None) -> str:
    """Append the entries of ``folder`` (and below) in upstream's layout; returns upstream's type name of it.

    ``parent_names``: the dim names of the TensorDict holding this one, which upstream gives its children too.
    """
    from .archive import _file_entry

    meta = read_meta(folder)
    if meta.get("format") != FORMAT_NAME:
        return _copy_upstream(folder, at, sources, out, meta)
    if meta.get("class") != TENSORDICT_CLASS:
        raise _NotRepresentable("a tensorclass")
    batch = meta["batch_size"]
    upstream: dict = {}
    files: list = []
    children: list = []
    file_names: set = set()
    for key, entry in meta["entries"].items():
        if key in _UPSTREAM_RESERVED or key == "_tensordict":
            raise _NotRepresentable(f"the key {key!r}")
        kind = entry["kind"]
        name = escape_key(key) + (".memmap" if kind == "tensor" else "")
        if name in file_names or not is_safe_name(name):
            raise _NotRepresentable(f"the name of {key!r}")
        file_names.add(name)
        if kind == "tensor":
            upstream[key] = {"device": "cpu", "shape": entry["shape"], "dtype": entry["dtype"], "is_nested": False}
            files.append(_file_entry(os.path.join(folder, entry["file"]), at + name, sources))
        elif kind == "collection":
            upstream[key] = None  # keeps the key's place; its type is known once the sub-folder is translated
            children.append((key, os.path.join(folder, entry["dir"]), f"{at}{name}/"))
        else:  # a non-tensor leaf: a sub-folder holding its meta.json
            if "pickle" in entry or entry["batch_size"] != batch:
                raise _NotRepresentable(f"the non-tensor entry {key!r}")
            if kind == "non_tensor":
                sub = {"_type": _DATA_TYPE, "data": entry["value"], "_metadata": None, "_is_non_tensor": True}
                upstream[key] = {"type": "NonTensorData"}
            else:
                sub = {"_type": _STACK_TYPE, "_format_version": 1, "_class": "tensordict:NonTensorStack",
                       "stack_dim": 0, "device": None, "data": _nest(entry["value"], batch)}
                upstream[key] = {"type": "NonTensorStack"}
            children.append((key, sub, f"{at}{name}/"))
    upstream.update(shape=batch, device="cpu", _type=_TD_TYPE, _format_version=1, _class="tensordict:TensorDict")
    names = meta.get("names")
    if names is None and parent_names is not None:
        names = list(parent_names) + [None] * (len(batch) - len(parent_names))
    if names is not None:
        upstream["_names"] = names
    out.append(None)  # this folder's meta.json goes first: filled in once the children's types are known
    position = len(out) - 1
    out.extend(files)
    for key, child, child_at in children:
        if isinstance(child, dict):
            out.append(_json_entry(child_at + META_FILE, child))
        else:
            upstream[key] = {"type": _convert(child, child_at, sources, out, names)}
    out[position] = _json_entry(at + META_FILE, upstream)
    return "TensorDict"


def _copy_upstream(folder: str, at: str, sources: dict, out: list, meta: dict) -> str:
    """A staged folder already in upstream's layout: its files as they are, its sub-folders translated."""
    from .archive import _file_entry

    out.append(_file_entry(os.path.join(folder, META_FILE), at + META_FILE, sources))
    children = []
    with os.scandir(folder) as listing:
        for item in sorted(listing, key=lambda item: item.name):
            if item.is_dir(follow_symlinks=False):
                children.append(item.name)
            elif item.name != META_FILE and item.is_file(follow_symlinks=False):
                out.append(_file_entry(item.path, at + item.name, sources))
    for name in children:
        _convert(os.path.join(folder, name), f"{at}{name}/", sources, out)
    kind = meta.get("_class") or ""
    return kind.split(":", 1)[1] if ":" in kind else "TensorDict"


def upstream_entries(folder: str, sources: dict) -> list | None:
    """The archive entries of the staged torchdict folder in upstream's layout, or None if it can't say it."""
    out: list = []
    try:
        _convert(folder, "", sources, out)
    except _NotRepresentable:
        return None
    return out
