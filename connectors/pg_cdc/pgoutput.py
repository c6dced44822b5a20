"""A pure decoder of Postgres's ``pgoutput`` logical replication messages, protocol
version 1 (https://www.postgresql.org/docs/current/protocol-logicalrep-message-formats.html).

One call decodes one message (the payload of one ``XLogData``): no server, no state.
Column values stay as the server sent them (text format, in the replication session's
client encoding), or as markers: ``None`` for SQL NULL and ``UNCHANGED`` for an
unchanged TOASTed value (``'u'``: an update that did not touch an out-of-line value
sends this instead of it). ``values.py`` turns text into our Python values.
"""

from __future__ import annotations

import datetime as dt
import struct
from dataclasses import dataclass
from enum import Enum
from typing import Final

from .errors import PgCdcError

__all__ = [
    "UNCHANGED",
    "Begin",
    "Commit",
    "DecodeError",
    "Delete",
    "Insert",
    "LogicalMessage",
    "Origin",
    "PgOutputMessage",
    "Relation",
    "RelationColumn",
    "Truncate",
    "TupleValue",
    "Type",
    "Update",
    "decode",
]

# Postgres timestamps count microseconds from 2000-01-01 00:00 UTC
PG_EPOCH: Final = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)


class _Unchanged(Enum):
    UNCHANGED = "unchanged-toast"

    def __repr__(self) -> str:
        return "UNCHANGED"


UNCHANGED: Final = _Unchanged.UNCHANGED
# a column's value: text bytes, None (NULL), or UNCHANGED (an unchanged TOASTed value)
TupleValue = bytes | None | _Unchanged


class DecodeError(PgCdcError, ValueError):
    """The bytes are not a pgoutput message of protocol version 1."""

    code = "cdc_decode_error"


@dataclass(frozen=True, slots=True)
class Begin:
    final_lsn: int  # the LSN of the transaction's commit record
    commit_time: dt.datetime
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    flags: int
    commit_lsn: int  # the LSN of the commit record
    end_lsn: int  # the LSN just past it: the transaction's position in the stream
    commit_time: dt.datetime


@dataclass(frozen=True, slots=True)
class Origin:
    lsn: int
    name: str


@dataclass(frozen=True, slots=True)
class RelationColumn:
    name: str
    type_oid: int
    type_modifier: int
    key: bool  # part of the replica identity


@dataclass(frozen=True, slots=True)
class Relation:
    """A table's description, sent before its first change in a session and again
    after any change to it (columns, types, replica identity)."""

    relation_id: int
    namespace: str
    name: str
    replica_identity: str  # 'd' default, 'n' nothing, 'f' full, 'i' index
    columns: tuple[RelationColumn, ...]


@dataclass(frozen=True, slots=True)
class Type:
    type_oid: int
    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class Insert:
    relation_id: int
    new: tuple[TupleValue, ...]


@dataclass(frozen=True, slots=True)
class Update:
    """``old`` is the old row (``old_kind`` 'O': replica identity FULL), or its key
    columns with the others NULL ('K': the key changed), or None (neither)."""

    relation_id: int
    old_kind: str | None
    old: tuple[TupleValue, ...] | None
    new: tuple[TupleValue, ...]


@dataclass(frozen=True, slots=True)
class Delete:
    relation_id: int
    old_kind: str  # 'O' the whole old row, 'K' its key columns (the others NULL)
    old: tuple[TupleValue, ...]


@dataclass(frozen=True, slots=True)
class Truncate:
    cascade: bool
    restart_identity: bool
    relation_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class LogicalMessage:
    transactional: bool
    lsn: int
    prefix: str
    content: bytes


PgOutputMessage = (
    Begin | Commit | Origin | Relation | Type | Insert | Update | Delete | Truncate | LogicalMessage
)


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if n < 0 or end > len(self.buf):
            raise DecodeError(f"message ends early: {n} bytes wanted at {self.pos}")
        out = self.buf[self.pos : end]
        self.pos = end
        return out

    def unpack(self, fmt: str) -> int:
        s = struct.Struct("!" + fmt)
        (v,) = s.unpack(self.take(s.size))
        return int(v)

    def byte(self) -> str:
        return chr(self.take(1)[0])

    def string(self) -> str:
        end = self.buf.find(b"\x00", self.pos)
        if end < 0:
            raise DecodeError(f"unterminated string at {self.pos}")
        out = self.buf[self.pos : end]
        self.pos = end + 1
        return out.decode("utf-8")

    def timestamp(self) -> dt.datetime:
        return PG_EPOCH + dt.timedelta(microseconds=self.unpack("q"))

    def tuple_data(self) -> tuple[TupleValue, ...]:
        values: list[TupleValue] = []
        for _ in range(self.unpack("h")):
            kind = self.byte()
            if kind == "n":
                values.append(None)
            elif kind == "u":
                values.append(UNCHANGED)
            elif kind in ("t", "b"):
                values.append(self.take(self.unpack("i")))
            else:
                raise DecodeError(f"unknown column value kind {kind!r}")
        return tuple(values)

    def done(self) -> None:
        if self.pos != len(self.buf):
            raise DecodeError(f"{len(self.buf) - self.pos} bytes left after the message")


def decode(payload: bytes) -> PgOutputMessage:
    """Decode one pgoutput message (protocol version 1)."""
    r = _Reader(bytes(payload))
    kind = r.byte() if payload else ""
    msg: PgOutputMessage
    if kind == "B":
        msg = Begin(r.unpack("Q"), r.timestamp(), r.unpack("I"))
    elif kind == "C":
        msg = Commit(r.unpack("B"), r.unpack("Q"), r.unpack("Q"), r.timestamp())
    elif kind == "O":
        msg = Origin(r.unpack("Q"), r.string())
    elif kind == "R":
        relid, ns, name, ident = r.unpack("I"), r.string(), r.string(), r.byte()
        cols = []
        for _ in range(r.unpack("h")):
            flags, col = r.unpack("B"), r.string()
            cols.append(RelationColumn(col, r.unpack("I"), r.unpack("i"), bool(flags & 1)))
        msg = Relation(relid, ns, name, ident, tuple(cols))
    elif kind == "Y":
        msg = Type(r.unpack("I"), r.string(), r.string())
    elif kind == "I":
        relid = r.unpack("I")
        if r.byte() != "N":
            raise DecodeError("an insert without its new tuple")
        msg = Insert(relid, r.tuple_data())
    elif kind == "U":
        relid = r.unpack("I")
        sub = r.byte()
        old_kind, old = None, None
        if sub in ("K", "O"):
            old_kind, old = sub, r.tuple_data()
            sub = r.byte()
        if sub != "N":
            raise DecodeError(f"an update with {sub!r} where its new tuple belongs")
        msg = Update(relid, old_kind, old, r.tuple_data())
    elif kind == "D":
        relid, sub = r.unpack("I"), r.byte()
        if sub not in ("K", "O"):
            raise DecodeError(f"a delete with {sub!r} where its old tuple belongs")
        msg = Delete(relid, sub, r.tuple_data())
    elif kind == "T":
        n, options = r.unpack("I"), r.unpack("B")
        relids = tuple(r.unpack("I") for _ in range(n))
        msg = Truncate(bool(options & 1), bool(options & 2), relids)
    elif kind == "M":
        flags, lsn, prefix = r.unpack("B"), r.unpack("Q"), r.string()
        msg = LogicalMessage(bool(flags & 1), lsn, prefix, r.take(r.unpack("I")))
    else:
        raise DecodeError(f"unknown pgoutput message type {kind!r}")
    r.done()
    return msg
