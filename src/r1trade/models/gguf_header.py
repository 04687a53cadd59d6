"""A GGUF file's header walked with bounds before transformers reads it: a file cut short or with absurd counts is
one line.

transformers' GGUF reader trusts the counts and lengths a file declares (how many keys and tensors, how long each
string and array is), so a truncated or planted file ends in a `struct.error` traceback deep inside it, or in a long
walk. `check_gguf` reads the same layout (GGUF v2 and v3: magic, version, tensor count, key count, the key-value
pairs, the tensor table, the data section at `general.alignment`) and checks every count and length against the
bytes the file has left and against the limits below, and every tensor's data against the end of the file. It
reads the header only, never the tensor data.
"""

from __future__ import annotations

import mmap
import struct
from math import prod
from pathlib import Path

from r1trade.errors import UsageError

VERSIONS = (2, 3)
MAX_KEYS = 1 << 16
"""Metadata keys (files in the wild hold a few dozen)."""
MAX_TENSORS = 1 << 20
MAX_ARRAY = 1 << 24
"""Elements of one metadata array (a vocabulary of 256k tokens and its merges fit many times over)."""
MAX_KEY_BYTES = (1 << 16) - 1
"""The longest key and tensor name (the GGUF specification's limit for keys)."""
MAX_DIMS = 4
"""ggml's `GGML_MAX_DIMS`."""
DEFAULT_ALIGNMENT = 32

_HEADER = "<4sIQQ"  # magic, version, tensor count, key count
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_SMALLEST_KEY = 8 + 4 + 1  # length, value type, a one-byte value
_SMALLEST_TENSOR = 8 + 4 + 4 + 8  # name length, dimension count, ggml type, offset


class _Cut(Exception):
    """The header runs past the end of the file, or declares more than the limits allow."""


class _Cursor:
    """Reads the header front to back, never past the end of the file."""

    def __init__(self, data: mmap.mmap | bytes) -> None:
        self.data = data
        self.pos = 0

    def left(self) -> int:
        return len(self.data) - self.pos

    def unpack(self, fmt: str, what: str) -> tuple:
        self.skip(struct.calcsize(fmt), what)
        return struct.unpack_from(fmt, self.data, self.pos - struct.calcsize(fmt))

    def skip(self, count: int, what: str) -> None:
        if count > self.left():
            raise _Cut(f"cut short: {what} at byte {self.pos} needs {count} bytes, {self.left()} are left")
        self.pos += count

    def string(self, what: str, limit: int | None = None) -> bytes:
        (length,) = self.unpack("<Q", f"the length of {what}")
        if limit is not None and length > limit:
            raise _Cut(f"{what} at byte {self.pos - 8} is {length} bytes long (at most {limit})")
        self.skip(length, what)
        return bytes(self.data[self.pos - length : self.pos])


def check_gguf(path: Path) -> None:
    """Refuse, in one `UsageError` line naming `path`, a GGUF file whose header transformers could not walk safely:
    truncated, with more keys, tensors or array elements than the file can hold or the limits allow, a string
    longer than what is left, an unknown value or tensor type, or tensor data past the end of the file."""
    try:
        with path.open("rb") as file:
            if path.stat().st_size < struct.calcsize(_HEADER):
                _walk(file.read())  # (mmap refuses an empty file)
                return
            with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
                _walk(data)
    except _Cut as exc:
        raise UsageError(f"cannot read GGUF model {path}: {exc}") from None
    except OSError as exc:
        raise UsageError(f"cannot read GGUF model {path}: {exc.strerror or exc}") from None


def _walk(data: mmap.mmap | bytes) -> None:
    cursor = _Cursor(data)
    magic, version, tensors, keys = cursor.unpack(_HEADER, "the header")
    if magic != b"GGUF":
        raise _Cut("not a GGUF file (it does not start with GGUF)")
    if version not in VERSIONS:
        raise _Cut(f"GGUF version {version} (transformers reads versions {' and '.join(map(str, VERSIONS))})")
    _bounded(keys, "metadata keys", MAX_KEYS, cursor.left(), _SMALLEST_KEY)
    alignment = DEFAULT_ALIGNMENT
    for _ in range(keys):
        key = cursor.string("a metadata key", MAX_KEY_BYTES)
        (value_type,) = cursor.unpack("<I", f"the type of key {_shown(key)}")
        value = _value(cursor, value_type, _shown(key))
        if key == b"general.alignment":
            alignment = value
    if not (isinstance(alignment, int) and alignment > 0 and alignment & (alignment - 1) == 0):
        raise _Cut(f"general.alignment {alignment!r} is not a power of two")
    _bounded(tensors, "tensors", MAX_TENSORS, cursor.left(), _SMALLEST_TENSOR)
    types = _ggml_types()
    table = [_tensor(cursor, types) for _ in range(tensors)]
    data_start = -(-cursor.pos // alignment) * alignment
    for name, offset, size in table:
        if data_start + offset + size > len(data):
            raise _Cut(f"the data of tensor {name} ({size} bytes at {offset}) runs past the end of the file")


def _value(cursor: _Cursor, value_type: int, key: str) -> object:
    """One metadata value (a scalar's value; strings and arrays are walked and skipped)."""
    if value_type in _SCALARS:
        return cursor.unpack(_SCALARS[value_type], f"the value of key {key}")[0]
    if value_type == _STRING:
        cursor.string(f"the value of key {key}")
        return None
    if value_type != _ARRAY:
        raise _Cut(f"key {key} has value type {value_type}, which GGUF does not define")
    element_type, count = cursor.unpack("<IQ", f"the array of key {key}")
    if element_type in _SCALARS:
        width = struct.calcsize(_SCALARS[element_type])
        _bounded(count, f"elements in the array of key {key}", MAX_ARRAY, cursor.left(), width)
        cursor.skip(count * width, f"the array of key {key}")
    elif element_type == _STRING:
        _bounded(count, f"strings in the array of key {key}", MAX_ARRAY, cursor.left(), 8)
        what = f"a string in the array of key {key}"
        for _ in range(count):
            (length,) = cursor.unpack("<Q", what)
            cursor.skip(length, what)
    else:
        raise _Cut(f"key {key} holds an array of type {element_type}, which transformers does not read")
    return None


def _ggml_types() -> dict[int, tuple[int, int]]:
    """Each ggml tensor type GGUF defines: (elements per block, bytes per block), from the gguf package."""
    from gguf.constants import GGML_QUANT_SIZES

    return {int(kind): sizes for kind, sizes in GGML_QUANT_SIZES.items()}


def _tensor(cursor: _Cursor, types: dict[int, tuple[int, int]]) -> tuple[str, int, int]:
    """One entry of the tensor table: its name, data offset and data size in bytes."""
    name = _shown(cursor.string("a tensor name", MAX_KEY_BYTES))
    (dims,) = cursor.unpack("<I", f"the dimension count of tensor {name}")
    if dims > MAX_DIMS:
        raise _Cut(f"tensor {name} has {dims} dimensions (at most {MAX_DIMS})")
    shape = cursor.unpack(f"<{dims}Q", f"the shape of tensor {name}")
    ggml_type, offset = cursor.unpack("<IQ", f"the type and offset of tensor {name}")
    if ggml_type not in types:
        raise _Cut(f"tensor {name} has ggml type {ggml_type}, which GGUF does not define")
    block, block_bytes = types[ggml_type]
    return name, offset, prod(shape) // block * block_bytes


def _bounded(count: int, what: str, limit: int, left: int, smallest: int) -> None:
    """Refuse `count` entries of at least `smallest` bytes each where the `left` bytes cannot hold them, or above
    `limit`."""
    if count > limit:
        raise _Cut(f"it declares {count} {what}, more than the limit of {limit}")
    if count * smallest > left:
        raise _Cut(f"it declares {count} {what}, more than the {left} bytes left can hold")


def _shown(raw: bytes) -> str:
    return repr(raw[:60].decode("utf-8", errors="replace"))
