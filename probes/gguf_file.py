"""The one reader of a GGUF file's header and tensor index (docs/MODEL.md "The shape").

Both the engine's loader (which dequantises the tensors it finds here) and the model's shape
(`ModelShape.from_gguf`, torch-free) read a GGUF file through this module. It reads the key-value
header in file order as Python values (what the gguf package's `GGUFReader` gives as each field's
`contents()`), and, when asked, the tensor index after it; it builds no object per header value,
so the bundled model's header (its tokenizer's 49,152 strings) takes about 0.06 s where GGUFReader
takes seconds. A file that is not GGUF, of an unknown version, or torn or forged anywhere in what
is read raises GGUFError naming the file.
"""
from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

# GGUF value types (the format's numbering) as struct codes; 8 is a string, 9 an array
_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


class GGUFError(ValueError):
    """The file is not a GGUF file this reader can read: the message names the file and what is wrong."""


class GGUFHeader(NamedTuple):
    metadata: dict       # the key-value header (keys starting "GGUF." left out, as GGUFReader's contents)
    index: list | None   # with index=True: [(name, type number, dims fastest first, offset)], else None
    data_start: int      # where the tensors' data starts (the index's end, aligned); the header's end without it
    byte_order: str      # the struct prefix of the file's byte order, "<" or ">"


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor of a GGUF file: `shape` as the file gives it (fastest dimension first), `data` a
    read-only view of its bytes in the file (a quantised type's as uint8 rows of blocks), as the gguf
    package's reader gives them."""
    name: str
    tensor_type: object  # gguf.GGMLQuantizationType
    shape: tuple
    data: object         # numpy.ndarray


def _unreadable(path, why: str) -> GGUFError:
    return GGUFError(f"{path}: unreadable GGUF, probably truncated or corrupt ({why}); replace the file")


def read_header(path, until=None, index: bool = False) -> GGUFHeader:
    """The key-value header and, with `index`, the tensor index after it. With `until`, reading
    stops at the first key after which `until(metadata so far)` is true (the index is then not read)."""
    path = Path(path)
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            f.seek(0)
            raise GGUFError(f"{path}: not a GGUF file (starts with {f.read(4)!r}, not b'GGUF'); "
                            "pass a .gguf file or a Hugging Face folder")
        try:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError as e:  # an empty file cannot be mapped (four bytes already were read)
            raise GGUFError(f"{path}: unreadable GGUF ({e})") from e
    meta: dict = {}
    try:
        end = "<" if struct.unpack_from("<I", buf, 4)[0] & 0xFFFF else ">"  # a byte-swapped version: big-endian
        version = struct.unpack_from(end + "I", buf, 4)[0]
        if version not in (2, 3):
            raise GGUFError(f"{path}: GGUF version {version} is not supported (2 or 3)")
        n_kv, at = struct.unpack_from(end + "Q", buf, 16)[0], 24

        def scalar(code: str):
            nonlocal at
            value = struct.unpack_from(end + code, buf, at)[0]
            at += struct.calcsize(code)
            return value

        def string() -> str:
            nonlocal at
            n = scalar("Q")
            if at + n > len(buf):
                raise struct.error(f"a string of {n} bytes past the end of the file")
            at += n
            return buf[at - n: at].decode("utf-8")

        def value(kind: int):
            nonlocal at
            if kind == _STRING:
                return string()
            if kind in _SCALAR:
                return scalar(_SCALAR[kind])
            if kind != _ARRAY:
                raise struct.error(f"unknown value type {kind}")
            item, n = scalar("I"), scalar("Q")
            if item in _SCALAR:
                code = f"{end}{n}{_SCALAR[item]}"
                if at + struct.calcsize(code) > len(buf):
                    raise struct.error(f"an array of {n} values past the end of the file")
                out = list(struct.unpack_from(code, buf, at))
                at += struct.calcsize(code)
                return out
            if n * 8 > len(buf) - at:  # every item takes at least 8 bytes (a string's length, an array's head)
                raise struct.error(f"an array of {n} items past the end of the file")
            return [value(item) for _ in range(n)]

        stopped = False
        for _ in range(n_kv):
            key = string()
            meta[key] = value(scalar("I"))
            if until is not None and until(meta):
                stopped = True
                break
        tensors = None
        if index and not stopped:  # each tensor: its name, its dimensions' count and sizes, its type, its data's offset
            n_tensors = struct.unpack_from(end + "Q", buf, 8)[0]
            if n_tensors * 24 > len(buf) - at:  # every entry takes at least 24 bytes
                raise struct.error(f"{n_tensors} tensors past the end of the file")
            tensors = []
            for _ in range(n_tensors):
                name = string()
                n_dims = scalar("I")
                if n_dims * 8 > len(buf) - at:
                    raise struct.error(f"tensor {name} of {n_dims} dimensions past the end of the file")
                dims = [scalar("Q") for _ in range(n_dims)]
                tensors.append((name, scalar("I"), dims, scalar("Q")))
            align = meta.get("general.alignment", 32)
            if isinstance(align, bool) or not isinstance(align, int) or align < 1:
                raise struct.error(f"general.alignment is {align!r}, not a positive integer")
            at += -at % align
    except (struct.error, UnicodeDecodeError, RecursionError) as e:
        raise _unreadable(path, f"{type(e).__name__}: {e}") from e
    finally:
        buf.close()
    return GGUFHeader({k: v for k, v in meta.items() if not k.startswith("GGUF.")}, tensors, at, end)


def gguf_metadata(path, until=None) -> dict:
    """A GGUF file's key-value header as Python values, read without the tensor index or any tensor
    (read_header's `until`)."""
    return read_header(path, until).metadata


def gguf_tensors(path) -> tuple[list[GGUFTensor], dict]:
    """The tensors (views into the mapped file, checked to lie inside it) and the metadata of a GGUF file."""
    import gguf
    import numpy as np

    path = Path(path)
    meta, index, start, end = read_header(path, index=True)
    plain = {gguf.GGMLQuantizationType.F16: np.float16, gguf.GGMLQuantizationType.F32: np.float32,
             gguf.GGMLQuantizationType.F64: np.float64, gguf.GGMLQuantizationType.I8: np.int8,
             gguf.GGMLQuantizationType.I16: np.int16, gguf.GGMLQuantizationType.I32: np.int32,
             gguf.GGMLQuantizationType.I64: np.int64}
    data = np.memmap(path, dtype=np.uint8, mode="r")
    tensors, seen = [], set()
    for name, kind, dims, offset in index:
        if name in seen:
            raise _unreadable(path, f"tensor {name} twice")
        seen.add(name)
        try:
            ggml_type = gguf.GGMLQuantizationType(kind)
        except ValueError:
            raise _unreadable(path, f"tensor {name} has unknown type {kind}") from None
        block, type_size = gguf.GGML_QUANT_SIZES[ggml_type]
        n = math.prod(dims)  # Python's integers: a forged size cannot wrap around
        shape = tuple(reversed(dims))
        if n % block or (shape and shape[-1] % block):
            raise _unreadable(path, f"tensor {name} of {dims} is not whole {ggml_type.name} blocks of {block}")
        first, n_bytes = start + offset, n // block * type_size
        if first + n_bytes > len(data):
            raise _unreadable(path, f"tensor {name} ends at byte {first + n_bytes}, past the file's {len(data)}")
        raw = data[first:first + n_bytes]
        if ggml_type in plain:
            view = raw.view(np.dtype(plain[ggml_type]).newbyteorder(end)).reshape(shape)
        else:
            view = raw.reshape(gguf.quants.quant_shape_to_byte_shape(shape, ggml_type))
        tensors.append(GGUFTensor(name, ggml_type, tuple(dims), view))
    return tensors, meta
