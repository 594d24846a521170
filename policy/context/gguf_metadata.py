"""A GGUF file's metadata (its key-value section), read without its tensors.

The tokenizer a GGUF carries is metadata: its vocabulary, merges, special token ids and chat
template. gguf's own `GGUFReader` parses the whole file, every tensor's header and each token
string as numpy arrays (about 190 MB at peak for the demo's 135M model, and it imports OpenCV);
this reads the header and the key-value section only, from a memory map, and stops there
(the layout: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md).
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path
from typing import Any

__all__ = ["read_metadata"]

_VERSIONS = (2, 3)
# Fixed-size value types: uint8, int8, uint16, int16, uint32, int32, float32, bool, uint64,
# int64, float64 (8 is a string, 9 an array).
_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
            11: "<q", 12: "<d"}  # fmt: skip
_STRING, _ARRAY = 8, 9


def read_metadata(path: str | Path) -> dict[str, Any]:
    """Every metadata key with its value: numbers, booleans and strings as Python's, arrays as
    lists."""
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as blob:
        if blob[:4] != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file (no GGUF magic bytes)")
        version, _tensors, count = struct.unpack_from("<IQQ", blob, 4)
        if version not in _VERSIONS:
            raise ValueError(f"{path} is GGUF v{version}; v2 and v3 are read")
        position = 24
        metadata: dict[str, Any] = {}
        for _ in range(count):
            key, position = _string(blob, position)
            (kind,) = struct.unpack_from("<I", blob, position)
            metadata[key], position = _value(blob, position + 4, kind)
        return metadata


def _value(blob: mmap.mmap, position: int, kind: int) -> tuple[Any, int]:
    if kind in _FORMATS:
        fmt = _FORMATS[kind]
        return struct.unpack_from(fmt, blob, position)[0], position + struct.calcsize(fmt)
    if kind == _STRING:
        return _string(blob, position)
    if kind == _ARRAY:
        item_kind, length = struct.unpack_from("<IQ", blob, position)
        position += 12
        if item_kind in _FORMATS:
            fmt = _FORMATS[item_kind]
            values = struct.unpack_from(f"<{length}{fmt[1]}", blob, position)
            return list(values), position + length * struct.calcsize(fmt)
        items = []
        for _ in range(length):
            item, position = _value(blob, position, item_kind)
            items.append(item)
        return items, position
    raise ValueError(f"a GGUF metadata value of unknown type {kind}")


def _string(blob: mmap.mmap, position: int) -> tuple[str, int]:
    (length,) = struct.unpack_from("<Q", blob, position)
    start = position + 8
    return blob[start : start + length].decode("utf-8", errors="replace"), start + length
