"""``parse_tensor_dict_string``: a TensorDict rebuilt from its printed form (a debugging aid).

The repr holds keys, shapes, dtypes, devices and batch sizes but no values, so every tensor of the result is
zeros. Both forms are read: the detailed one (torchdict's default, upstream's ``compact=False``)::

    TensorDict(
        fields={
            a: Tensor(shape=torch.Size([3, 2]), device=cpu, dtype=torch.float32, is_shared=False)},
        batch_size=torch.Size([3]),
        device=None,
        is_shared=False)

and the compact one (``set_printoptions(compact=True)``, upstream's default)::

    TensorDict(batch_size=[3], device=cpu, fields={a: f32[2], b: [4]{c: i64[]}})

A field that is neither a tensor nor a TensorDict (non-tensor data, a tensorclass) is refused with a
``ValueError``, as upstream does.
"""
from __future__ import annotations

import re
from typing import Any, Optional, Tuple

import torch

_SHORT_DTYPES = {
    "f16": torch.float16, "f32": torch.float32, "f64": torch.float64, "bf16": torch.bfloat16,
    "i8": torch.int8, "i16": torch.int16, "i32": torch.int32, "i64": torch.int64,
    "u8": torch.uint8, "u16": torch.uint16, "u32": torch.uint32, "u64": torch.uint64,
    "c32": torch.complex32, "c64": torch.complex64, "c128": torch.complex128, "bool": torch.bool,
}
_TOKEN = re.compile(r"([A-Za-z0-9_]*)\[([-0-9,]*)\](?:@([A-Za-z0-9_:,]+))?")
_FIELDS_OPEN = "fields={"


def _refuse(text: str) -> ValueError:
    return ValueError(f"Cannot parse the field {text!r}: parse_tensor_dict_string reads Tensor and TensorDict "
                      "fields printed with the default print options.")


class _Reader:
    """A cursor over the text, with the few reads the two grammars need."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def skip_space(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in " \t\n\r":
            self.pos += 1

    def peek(self, prefix: str) -> bool:
        return self.text.startswith(prefix, self.pos)

    def expect(self, prefix: str) -> None:
        if not self.peek(prefix):
            raise ValueError(f"Expected {prefix!r} at position {self.pos} of the string, found "
                             f"{self.text[self.pos:self.pos + 20]!r}")
        self.pos += len(prefix)

    def until_balanced(self, closers: str) -> str:
        """The text up to the first of ``closers`` outside brackets (not consumed)."""
        depth = 0
        start = self.pos
        while self.pos < len(self.text):
            char = self.text[self.pos]
            if depth == 0 and char in closers:
                break
            if char in "([{":
                depth += 1
            elif char in ")]}":
                depth -= 1
            self.pos += 1
        return self.text[start:self.pos]

    def key(self) -> str:
        end = self.text.find(": ", self.pos)
        if end < 0:
            raise ValueError(f"A field without a key at position {self.pos} of the string")
        key = self.text[self.pos:end]
        self.pos = end + 2
        return key


def _sizes(text: str) -> list:
    return [int(size) for size in text.split(",") if size.strip()]


def _detailed_collection(reader: _Reader) -> Tuple[dict, torch.Size, Optional[torch.device]]:
    """``TensorDict(fields={...}, batch_size=torch.Size([...]), device=..., is_shared=...)`` after the
    class name: the entries (key -> (shape, dtype, device) or a nested triple), batch size and device."""
    reader.expect("(")
    entries: dict = {}
    batch_size: Optional[torch.Size] = None
    device: Optional[torch.device] = None
    while True:
        reader.skip_space()
        if reader.peek(")"):
            reader.pos += 1
            break
        if reader.peek(_FIELDS_OPEN):
            reader.pos += len(_FIELDS_OPEN)
            while True:
                reader.skip_space()
                if reader.peek("}"):
                    reader.pos += 1
                    break
                key = reader.key()
                start = reader.pos
                value = _detailed_value(reader)
                if value is None:
                    raise _refuse(f"{key}: {reader.text[start:reader.pos].strip()}")
                entries[key] = value
                reader.skip_space()
                if reader.peek(","):
                    reader.pos += 1
        else:
            name = reader.until_balanced("=")
            reader.expect("=")
            value = reader.until_balanced(",)").strip()
            if name.strip() == "batch_size":
                batch_size = torch.Size(_sizes(value.replace("torch.Size(", "").strip("[]()")))
            elif name.strip() == "device" and value != "None":
                device = torch.device(value)
        reader.skip_space()
        if reader.peek(","):
            reader.pos += 1
    if batch_size is None:
        raise ValueError("Batch size not found in the string")
    return entries, batch_size, device


def _detailed_value(reader: _Reader) -> Any:
    """A field's value: a nested triple, ``(shape, dtype, device)`` of a tensor, or None (not readable)."""
    if reader.peek("TensorDict("):
        reader.pos += len("TensorDict")
        return _detailed_collection(reader)
    if reader.peek("Tensor(") or reader.peek("MemoryMappedTensor("):
        reader.pos = reader.text.index("(", reader.pos)
        reader.expect("(")
        body = reader.until_balanced(")")
        reader.expect(")")
        shape = re.search(r"shape=torch\.Size\(\[([-0-9, ]*)\]\)", body)
        dtype = re.search(r"dtype=torch\.(\w+)", body)
        device = re.search(r"device=([\w:]+)", body)
        if shape is None:
            return None
        return (torch.Size(_sizes(shape.group(1))), getattr(torch, dtype.group(1)) if dtype else torch.float32,
                torch.device(device.group(1)) if device else None)
    reader.until_balanced(",}")
    return None


def _compact_collection(reader: _Reader) -> Tuple[dict, torch.Size, Optional[torch.device]]:
    reader.expect("(")
    batch_size: Optional[torch.Size] = None
    device: Optional[torch.device] = None
    entries: dict = {}
    while True:
        reader.skip_space()
        if reader.peek(")"):
            reader.pos += 1
            break
        if reader.peek(_FIELDS_OPEN):
            reader.pos += len("fields=")
            entries = _compact_entries(reader, batch_size or torch.Size(()))
        else:
            name = reader.until_balanced("=").strip()
            reader.expect("=")
            value = reader.until_balanced(",)").strip()
            if name == "batch_size":
                batch_size = torch.Size(_sizes(value.strip("[]")))
            elif name == "device":
                device = torch.device(value)
            elif name == "exclusive_fields":
                raise ValueError("Cannot parse the repr of a lazy stack with exclusive keys.")
        reader.skip_space()
        if reader.peek(","):
            reader.pos += 1
    if batch_size is None:
        raise ValueError("Batch size not found in the string")
    return entries, batch_size, device


def _compact_entries(reader: _Reader, batch_size: torch.Size) -> dict:
    reader.expect("{")
    entries: dict = {}
    while True:
        reader.skip_space()
        if reader.peek("}"):
            reader.pos += 1
            return entries
        key = reader.key()
        start = reader.pos
        nested = re.match(r"\[([0-9,]*)\]\{|\{", reader.text[reader.pos:])
        if nested:
            extra = _sizes(nested.group(1)) if nested.group(1) is not None else []
            reader.pos += nested.end() - 1
            inner_batch = batch_size + torch.Size(extra)
            entries[key] = (_compact_entries(reader, inner_batch), inner_batch, None)
        else:
            token = reader.until_balanced(",}").strip()
            match = _TOKEN.fullmatch(token)
            if match is None or match.group(1) not in _SHORT_DTYPES and match.group(1) != "":
                raise _refuse(f"{key}: {reader.text[start:reader.pos].strip()}")
            dtype = _SHORT_DTYPES.get(match.group(1), torch.float32)
            device = torch.device(match.group(3).split(",")[0]) if match.group(3) else None
            entries[key] = (batch_size + torch.Size(_sizes(match.group(2))), dtype, device)
        reader.skip_space()
        if reader.peek(","):
            reader.pos += 1


def _build(entries: dict, batch_size: torch.Size, device: Optional[torch.device]) -> Any:
    from .tensordict import TensorDict

    source: dict = {}
    for key, value in entries.items():
        if isinstance(value[0], dict):
            source[key] = _build(*value)
        else:
            shape, dtype, leaf_device = value
            source[key] = torch.zeros(tuple(max(size, 0) for size in shape), dtype=dtype,
                                      device=leaf_device or device or "cpu")
    return TensorDict(source, batch_size=batch_size, device=device)


def parse_tensor_dict_string(s: str) -> Any:
    """A TensorDict of zeros with the keys, shapes, dtypes, devices and batch sizes of a printed one.

    >>> import torch
    >>> from torchdict import TensorDict
    >>> td = TensorDict(obs=torch.ones(3, 4), next=TensorDict(done=torch.ones(3, 1, dtype=torch.bool)), batch_size=[3])
    >>> rebuilt = parse_tensor_dict_string(repr(td))
    >>> rebuilt["next", "done"].dtype, rebuilt.batch_size, rebuilt["obs"].sum()
    (torch.bool, torch.Size([3]), tensor(0.))
    """
    reader = _Reader(s)
    name = re.match(r"\s*(\w+)\(", s)
    if name is None:
        raise ValueError("Batch size not found in the string")
    reader.pos = name.end(1)
    # The detailed form breaks the line after the class name; the compact one goes on.
    if not s[reader.pos + 1:reader.pos + 2].isspace():
        return _build(*_compact_collection(reader))
    return _build(*_detailed_collection(reader))
