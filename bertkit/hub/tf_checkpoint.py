"""Read a TensorFlow checkpoint (a "tensor bundle") without TensorFlow.

A checkpoint `PREFIX` is two kinds of file:

- `PREFIX.index`: a table in LevelDB's SSTable format. Its keys are variable names; the empty key
  holds a BundleHeaderProto (number of data shards, endianness), every other key a
  BundleEntryProto (dtype, shape, shard, offset, size, masked CRC32C of the bytes).
- `PREFIX.data-SSSSS-of-NNNNN`: the tensors' raw bytes, each at its entry's offset.

The table is data blocks, a meta-index block, an index block (last key of each data block ->
its block handle) and a 48-byte footer (two block handles, padding, a magic number). Every block is
followed by a compression byte and the masked CRC32C of the block and that byte. TensorFlow writes
bundle indexes uncompressed (since 1.2, before the original BERT release); compressed ones are refused.
Every CRC is checked: a damaged file is a one-line error, never silently wrong weights.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from pathlib import Path

import google_crc32c
import torch

from ..errors import BertkitError

TABLE_MAGIC = 0xDB4775248B80FB57
FOOTER_SIZE = 48  # two block handles padded to 40 bytes, then the 8-byte magic number
BLOCK_TRAILER_SIZE = 5  # compression type (1 byte) + masked CRC32C (4 bytes)

# tensorflow/core/framework/types.proto: DataType -> torch dtype (the ones weights come in).
DTYPES: dict[int, torch.dtype] = {
    1: torch.float32, 2: torch.float64, 3: torch.int32, 4: torch.uint8, 5: torch.int16, 6: torch.int8,
    9: torch.int64, 10: torch.bool, 14: torch.bfloat16, 17: torch.uint16, 19: torch.float16,
    22: torch.uint32, 23: torch.uint64,
}
DTYPE_NAMES = {7: "string", 8: "complex64", 18: "complex128", 21: "variant"}


def crc32c(data: bytes) -> int:
    return google_crc32c.value(bytes(data) if isinstance(data, bytearray) else data)


def unmask_crc(masked: int) -> int:
    """LevelDB / TensorFlow store CRCs "masked" (rotated and offset) so that a CRC of data that
    itself holds CRCs stays well distributed; this undoes it."""
    rotated = (masked - 0xA282EAD8) & 0xFFFFFFFF
    return ((rotated >> 17) | (rotated << 15)) & 0xFFFFFFFF


def mask_crc(crc: int) -> int:
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


# ---------------------------------------------------------------------------- protobuf wire format

def read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """(value, position after it) of the base-128 varint at buf[pos]; IndexError if cut short."""
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def proto_fields(buf: bytes) -> list[tuple[int, int | bytes]]:
    """(field number, value) pairs of a serialized message: varints and fixed ints as int,
    length-delimited fields (strings, sub-messages) as bytes."""
    fields, pos = [], 0
    while pos < len(buf):
        key, pos = read_varint(buf, pos)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, pos = read_varint(buf, pos)
        elif wire_type == 1:
            value, pos = struct.unpack_from("<Q", buf, pos)[0], pos + 8
        elif wire_type == 2:
            length, pos = read_varint(buf, pos)
            value, pos = bytes(buf[pos:pos + length]), pos + length
        elif wire_type == 5:
            value, pos = struct.unpack_from("<I", buf, pos)[0], pos + 4
        else:
            raise ValueError(f"unsupported wire type {wire_type}")
        if pos > len(buf):
            raise ValueError("message cut short")
        fields.append((number, value))
    return fields


def value_of(message: bytes, number: int, default: int = 0) -> int:
    """The last value of field `number` (protobuf's rule for repeated scalars), else the default."""
    found = default
    for n, value in proto_fields(message):
        if n == number:
            found = value
    return found


@dataclass(frozen=True)
class BundleEntry:
    """Where one tensor lies (BundleEntryProto in tensorflow/core/protobuf/tensor_bundle.proto)."""

    dtype: int
    shape: tuple[int, ...]
    shard_id: int
    offset: int
    size: int
    masked_crc32c: int
    sliced: bool  # a partitioned variable, stored as slices under other keys

    @classmethod
    def parse(cls, buf: bytes) -> "BundleEntry":
        scalars = {1: "dtype", 3: "shard_id", 4: "offset", 5: "size", 6: "masked_crc32c"}
        f = dict(dtype=0, shape=(), shard_id=0, offset=0, size=0, masked_crc32c=0, sliced=False)
        for number, value in proto_fields(buf):
            if number in scalars:
                f[scalars[number]] = value
            elif number == 2:  # TensorShapeProto: repeated Dim dim = 2 (Dim: int64 size = 1)
                f["shape"] = tuple(value_of(dim, 1) for n, dim in proto_fields(value) if n == 2)
            elif number == 7:  # repeated TensorSliceProto slices
                f["sliced"] = True
        return cls(**f)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


# ---------------------------------------------------------------------------- SSTable

def _read_block(data: bytes, offset: int, size: int, path: Path) -> bytes:
    end = offset + size + BLOCK_TRAILER_SIZE
    if end > len(data):
        raise BertkitError(f"index is truncated (a block ends at byte {end}, the file has {len(data)})", path=path)
    contents = data[offset:offset + size]
    compression = data[offset + size]
    (stored,) = struct.unpack_from("<I", data, offset + size + 1)
    actual = google_crc32c.extend(crc32c(contents), bytes([compression]))
    if unmask_crc(stored) != actual:
        raise BertkitError(f"index block at byte {offset} fails its CRC32C check (the file is damaged)", path=path)
    if compression != 0:
        kind = {1: "snappy"}.get(compression, f"type {compression}")
        raise BertkitError(f"index block at byte {offset} is {kind}-compressed; only uncompressed indexes "
                           "(what TensorFlow >= 1.2 writes) are supported", path=path)
    return contents


def _block_items(block: bytes):
    """(key, value) pairs of one block: keys share a prefix with the previous key (restart points
    at the end are only for seeking, so a full scan ignores them)."""
    (num_restarts,) = struct.unpack_from("<I", block, len(block) - 4)
    end = len(block) - 4 - 4 * num_restarts
    key, pos = b"", 0
    while pos < end:
        shared, pos = read_varint(block, pos)
        unshared, pos = read_varint(block, pos)
        value_length, pos = read_varint(block, pos)
        key = key[:shared] + block[pos:pos + unshared]
        pos += unshared
        yield key, block[pos:pos + value_length]
        pos += value_length
    if pos != end:
        raise ValueError("entries overrun the restart array")


def read_table(path: Path) -> dict[bytes, bytes]:
    """Every key and value of an SSTable file, in key order."""
    path = Path(path)
    if not path.is_file():
        raise BertkitError("checkpoint index not found", path=path)
    data = path.read_bytes()
    if len(data) < FOOTER_SIZE or struct.unpack_from("<Q", data, len(data) - 8)[0] != TABLE_MAGIC:
        raise BertkitError("not a TensorFlow checkpoint index (no table footer; truncated or another format)",
                           path=path)
    try:
        footer = data[len(data) - FOOTER_SIZE:]
        _, pos = read_varint(footer, read_varint(footer, 0)[1])  # skip the meta-index handle
        index_offset, pos = read_varint(footer, pos)
        index_size, _ = read_varint(footer, pos)
        items = {}
        for _, handle in _block_items(_read_block(data, index_offset, index_size, path)):
            block_offset, pos = read_varint(handle, 0)
            block_size, _ = read_varint(handle, pos)
            items.update(_block_items(_read_block(data, block_offset, block_size, path)))
    except (IndexError, ValueError, struct.error) as e:
        raise BertkitError(f"checkpoint index is malformed ({e or type(e).__name__})", path=path) from None
    return items


# ---------------------------------------------------------------------------- tensor bundle

class TensorBundle:
    """A checkpoint's index, and its tensors on request: `bundle.entries[name]`, `bundle.read(name)`."""

    def __init__(self, prefix: str | Path):
        self.prefix = Path(prefix)
        self.index_path = Path(f"{self.prefix}.index")
        table = read_table(self.index_path)
        header = table.pop(b"", None)
        if header is None:
            raise BertkitError("checkpoint index has no bundle header (an old V1 checkpoint, or another kind of table)",
                               path=self.index_path)
        try:
            self.num_shards = value_of(header, 1)
            big_endian = value_of(header, 2) == 1
            self.entries = {key.decode("utf-8"): BundleEntry.parse(value) for key, value in table.items()}
        except (IndexError, ValueError, struct.error, UnicodeDecodeError) as e:
            raise BertkitError(f"checkpoint index holds a malformed record ({e})", path=self.index_path) from None
        if big_endian:
            raise BertkitError("big-endian checkpoints are not supported", path=self.index_path)

    def shard_path(self, shard_id: int) -> Path:
        return Path(f"{self.prefix}.data-{shard_id:05d}-of-{self.num_shards:05d}")

    def read(self, name: str) -> torch.Tensor:
        """The tensor stored under `name`, its bytes checked against the stored CRC32C."""
        entry = self.entries[name]
        where = dict(path=self.index_path)
        if entry.sliced:
            raise BertkitError(f"variable {name} is partitioned into slices, which is not supported", **where)
        if entry.dtype not in DTYPES:
            kind = DTYPE_NAMES.get(entry.dtype, f"code {entry.dtype}")
            raise BertkitError(f"variable {name} has dtype {kind}, which is not a weight type", **where)
        dtype = DTYPES[entry.dtype]
        expected = entry.numel * torch.empty((), dtype=dtype).element_size()
        if entry.size != expected:
            raise BertkitError(f"variable {name}: the index says {entry.size} bytes, but shape {list(entry.shape)} "
                               f"of {dtype} needs {expected}", **where)
        shard = self.shard_path(entry.shard_id)
        if not shard.is_file():
            raise BertkitError(f"data shard of variable {name} not found", path=shard)
        buffer = bytearray(entry.size)
        with open(shard, "rb") as f:
            f.seek(entry.offset)
            got = f.readinto(buffer)
        if got != entry.size:
            raise BertkitError(f"data shard is truncated: variable {name} needs bytes {entry.offset}.."
                               f"{entry.offset + entry.size}, the file has {shard.stat().st_size}", path=shard)
        if crc32c(buffer) != unmask_crc(entry.masked_crc32c):
            raise BertkitError(f"variable {name} fails its CRC32C check (the data shard is damaged)", path=shard)
        if not buffer:
            return torch.empty(entry.shape, dtype=dtype)
        return torch.frombuffer(buffer, dtype=dtype).reshape(entry.shape)
