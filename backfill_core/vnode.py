"""Virtual nodes: ``vnode = crc32(canonical key bytes) % vnode_count``.

Canonical encoding of a distribution key (stable across processes, machines and
Python versions; golden values are pinned by tests). Each value is one tag byte then
its payload, values concatenated in key order:

====================  ====  ==========================================================
type                  tag   payload
====================  ====  ==========================================================
NULL                  0x00  (none)
boolean               0x01  1 byte, 0 or 1
smallint/int/bigint   0x02  8 bytes, signed big-endian (the width does not matter)
double                0x03  8 bytes, IEEE 754 big-endian (-0.0 written as 0.0)
numeric               0x04  u32 length + UTF-8 of the normalized decimal ("1.50" -> "1.5")
text                  0x05  u32 length + UTF-8
bytea                 0x06  u32 length + bytes
date                  0x07  8 bytes, signed big-endian days since 1970-01-01
timestamp             0x08  8 bytes, signed big-endian microseconds since 1970-01-01
timestamptz           0x09  8 bytes, signed big-endian microseconds since the Unix epoch (UTC)
jsonb                 0x0a  u32 length + UTF-8 of JSON with sorted keys, no spaces
====================  ====  ==========================================================
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import struct
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from backfill_core.schema import ColumnType

_UNIX_DATE = dt.date(1970, 1, 1)
_UNIX_NAIVE = dt.datetime(1970, 1, 1)
_UNIX_UTC = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_I64 = struct.Struct(">q")
_F64 = struct.Struct(">d")
_U32 = struct.Struct(">I")
_INT_TYPES = (ColumnType.SMALLINT, ColumnType.INT, ColumnType.BIGINT)
# crc32 is incremental: the integer tag byte's running value seeds the payload's
_INT_TAG_CRC = zlib.crc32(b"\x02")


def _micros(delta: dt.timedelta) -> int:
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _with_len(b: bytes) -> bytes:
    return _U32.pack(len(b)) + b


def _normalized_decimal(d: Decimal) -> str:
    n = d.normalize()
    if n == 0:
        return "0"
    s = format(n, "f")
    return s


def encode_value(t: ColumnType, v: Any) -> bytes:
    if v is None:
        return b"\x00"
    if t is ColumnType.BOOLEAN:
        return b"\x01" + (b"\x01" if v else b"\x00")
    if t in (ColumnType.SMALLINT, ColumnType.INT, ColumnType.BIGINT):
        return b"\x02" + _I64.pack(int(v))
    if t is ColumnType.DOUBLE:
        f = float(v)
        return b"\x03" + _F64.pack(0.0 if f == 0 else f)
    if t is ColumnType.NUMERIC:
        return b"\x04" + _with_len(_normalized_decimal(Decimal(v)).encode())
    if t is ColumnType.TEXT:
        return b"\x05" + _with_len(str(v).encode())
    if t is ColumnType.BYTEA:
        return b"\x06" + _with_len(bytes(v))
    if t is ColumnType.DATE:
        return b"\x07" + _I64.pack((v - _UNIX_DATE).days)
    if t is ColumnType.TIMESTAMP:
        return b"\x08" + _I64.pack(_micros(v - _UNIX_NAIVE))
    if t is ColumnType.TIMESTAMPTZ:
        return b"\x09" + _I64.pack(_micros(v - _UNIX_UTC))
    if t is ColumnType.JSONB:
        text = json.dumps(v, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return b"\x0a" + _with_len(text.encode())
    raise ValueError(f"no canonical encoding for type {t}")


def encode_key(types: Sequence[ColumnType], values: Sequence[Any]) -> bytes:
    return b"".join(encode_value(t, v) for t, v in zip(types, values, strict=True))


def compute_vnode(types: Sequence[ColumnType], values: Sequence[Any], vnode_count: int) -> int:
    if vnode_count <= 0:
        raise ValueError("vnode_count must be positive")
    return zlib.crc32(encode_key(types, values)) % vnode_count


@dataclass(frozen=True, slots=True)
class VnodeBitmap:
    """A set of vnodes out of ``vnode_count``, kept as sorted half-open ranges."""

    vnode_count: int
    ranges: tuple[tuple[int, int], ...]

    @classmethod
    def of(cls, vnode_count: int, vnodes: Iterable[int]) -> VnodeBitmap:
        items = sorted(set(vnodes))
        for v in items:
            if not 0 <= v < vnode_count:
                raise ValueError(f"vnode {v} out of range 0..{vnode_count - 1}")
        ranges: list[tuple[int, int]] = []
        for v in items:
            if ranges and ranges[-1][1] == v:
                ranges[-1] = (ranges[-1][0], v + 1)
            else:
                ranges.append((v, v + 1))
        return cls(vnode_count, tuple(ranges))

    @classmethod
    def full(cls, vnode_count: int) -> VnodeBitmap:
        return cls(vnode_count, ((0, vnode_count),) if vnode_count else ())

    def __iter__(self) -> Iterator[int]:
        for lo, hi in self.ranges:
            yield from range(lo, hi)

    def __len__(self) -> int:
        return sum(hi - lo for lo, hi in self.ranges)

    def __contains__(self, vnode: object) -> bool:
        return isinstance(vnode, int) and any(lo <= vnode < hi for lo, hi in self.ranges)

    def to_json(self) -> list[list[int]]:
        return [[lo, hi] for lo, hi in self.ranges]

    @classmethod
    def from_json(cls, vnode_count: int, data: Iterable[Sequence[int]]) -> VnodeBitmap:
        return cls.of(vnode_count, (v for lo, hi in data for v in range(lo, hi)))


def even_split(vnode_count: int, parts: int) -> list[VnodeBitmap]:
    """Contiguous ranges, sizes differing by at most one; the first ones get the extra."""
    if parts <= 0:
        raise ValueError("parts must be positive")
    base, extra = divmod(vnode_count, parts)
    out = []
    start = 0
    for i in range(parts):
        size = base + (1 if i < extra else 0)
        out.append(VnodeBitmap(vnode_count, ((start, start + size),) if size else ()))
        start += size
    return out


def vnode_hasher(
    types: Sequence[ColumnType], vnode_count: int, positions: Sequence[int] | None = None
) -> Callable[[Sequence[Any]], int]:
    """A fast ``compute_vnode`` for a fixed key type list (hot path of every write).

    The function takes the key values, or with ``positions`` a longer tuple (a primary
    key, a row) whose values at those positions are the key: no tuple is built per call.
    """
    if vnode_count <= 0:
        raise ValueError("vnode_count must be positive")
    at = list(range(len(types))) if positions is None else list(positions)
    if len(at) != len(types):
        raise ValueError("one position per key type")
    if len(types) == 1 and types[0] in _INT_TYPES:
        pack, crc, tag_crc = _I64.pack, zlib.crc32, _INT_TAG_CRC
        null_vnode = crc(b"\x00") % vnode_count
        j = at[0]

        def int_key(values: Sequence[Any]) -> int:
            v = values[j]
            return null_vnode if v is None else crc(pack(v), tag_crc) % vnode_count

        return int_key
    typed = list(types)
    if positions is None:
        return lambda values: zlib.crc32(encode_key(typed, values)) % vnode_count
    return lambda values: zlib.crc32(encode_key(typed, [values[j] for j in at])) % vnode_count


def vnodes_hasher(
    types: Sequence[ColumnType], vnode_count: int, positions: Sequence[int] | None = None
) -> Callable[[Sequence[Sequence[Any]]], list[int]]:
    """``vnode_hasher`` over many keys at once, given as columns (one sequence of values
    per key column; ``positions`` as there, into the columns): the vnode of each key in
    order. A one-column integer key without nulls takes no Python step per key (a bulk
    load's usual case: docs/architecture.md#layout-and-indexes)."""
    one = vnode_hasher(types, vnode_count, positions)  # takes a whole key
    if len(types) == 1 and types[0] in _INT_TYPES:
        pack, crc, modulo = _I64.pack, zlib.crc32, vnode_count.__rmod__
        j = 0 if positions is None else positions[0]

        def int_keys(columns: Sequence[Sequence[Any]]) -> list[int]:
            values = columns[j]
            if None in values:
                return list(map(one, zip(*columns, strict=True)))
            tags = itertools.repeat(_INT_TAG_CRC)
            return list(map(modulo, map(crc, map(pack, values), tags)))

        return int_keys
    return lambda columns: list(map(one, zip(*columns, strict=True)))
