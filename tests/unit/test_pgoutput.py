"""The pgoutput decoder on bytes built by hand to the protocol's layout (version 1), the
text values of every mapped type, the transaction assembler and the snapshot check of
chunk reads: no server (``connectors/pg_cdc``)."""

from __future__ import annotations

import datetime as dt
import struct
from decimal import Decimal

import pytest

from backfill_core.changes import Op
from backfill_core.executors.cdc import CdcEvent
from backfill_core.schema import Column, ColumnType, TableSchema
from connectors.pg_cdc import pgoutput as po
from connectors.pg_cdc.chunks import DeliveredTransactions, invisible
from connectors.pg_cdc.errors import (
    ReplicaIdentityNotFull,
    TruncateUnsupported,
    UnsupportedValue,
    UpstreamSchemaChanged,
)
from connectors.pg_cdc.stream import RowChange, TransactionAssembler, TruncateChange
from connectors.pg_cdc.upstream import TableRef, UpstreamTable, format_lsn, parse_lsn
from connectors.pg_cdc.values import parse_text

T0 = 757_382_400_000_000  # 2024-01-01 00:00 UTC in microseconds since 2000-01-01
WHEN = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)


def s(text: str) -> bytes:
    return text.encode() + b"\x00"


def tup(*values: bytes | None | str) -> bytes:
    """TupleData: bytes as text ('t'), None as NULL ('n'), "u" as unchanged TOAST."""
    out = struct.pack("!h", len(values))
    for v in values:
        if v is None:
            out += b"n"
        elif v == "u":
            out += b"u"
        else:
            assert isinstance(v, bytes)
            out += b"t" + struct.pack("!i", len(v)) + v
    return out


def begin(final_lsn: int, xid: int) -> bytes:
    return b"B" + struct.pack("!QqI", final_lsn, T0, xid)


def commit(commit_lsn: int, end_lsn: int) -> bytes:
    return b"C" + struct.pack("!BQQq", 0, commit_lsn, end_lsn, T0)


def relation(relid: int, cols: list[tuple[str, int]], ident: bytes = b"f") -> bytes:
    out = b"R" + struct.pack("!I", relid) + s("public") + s("t") + ident
    out += struct.pack("!h", len(cols))
    for name, oid in cols:
        out += struct.pack("!B", 1) + s(name) + struct.pack("!Ii", oid, -1)
    return out


def insert(relid: int, new: bytes) -> bytes:
    return b"I" + struct.pack("!I", relid) + b"N" + new


def update(relid: int, new: bytes, old: bytes | None = None, kind: bytes = b"O") -> bytes:
    head = b"U" + struct.pack("!I", relid)
    return head + (kind + old if old is not None else b"") + b"N" + new


def delete(relid: int, old: bytes, kind: bytes = b"O") -> bytes:
    return b"D" + struct.pack("!I", relid) + kind + old


# -- the decoder --------------------------------------------------------------------


def test_begin_commit_origin_type_and_message() -> None:
    assert po.decode(begin(0x1_0000_0010, 777)) == po.Begin(0x1_0000_0010, WHEN, 777)
    assert po.decode(commit(100, 148)) == po.Commit(0, 100, 148, WHEN)
    assert po.decode(b"O" + struct.pack("!Q", 5) + s("node1")) == po.Origin(5, "node1")
    assert po.decode(b"Y" + struct.pack("!I", 16400) + s("public") + s("mood")) == po.Type(
        16400, "public", "mood"
    )
    msg = b"M" + struct.pack("!BQ", 1, 42) + s("pfx") + struct.pack("!I", 3) + b"abc"
    assert po.decode(msg) == po.LogicalMessage(True, 42, "pfx", b"abc")


def test_relation() -> None:
    raw = b"R" + struct.pack("!I", 16384) + s("sch") + s("tab") + b"d" + struct.pack("!h", 2)
    raw += struct.pack("!B", 1) + s("id") + struct.pack("!Ii", 23, -1)
    raw += struct.pack("!B", 0) + s("name") + struct.pack("!Ii", 1043, 36)
    assert po.decode(raw) == po.Relation(
        16384,
        "sch",
        "tab",
        "d",
        (po.RelationColumn("id", 23, -1, True), po.RelationColumn("name", 1043, 36, False)),
    )


def test_row_messages_with_nulls_and_unchanged_toast() -> None:
    assert po.decode(insert(7, tup(b"1", None, b""))) == po.Insert(7, (b"1", None, b""))
    assert po.decode(update(7, tup(b"1", "u"))) == po.Update(7, None, None, (b"1", po.UNCHANGED))
    assert po.decode(update(7, tup(b"2", b"x"), tup(b"1", None), b"K")) == po.Update(
        7, "K", (b"1", None), (b"2", b"x")
    )
    assert po.decode(update(7, tup(b"1", b"y"), tup(b"1", b"x"))) == po.Update(
        7, "O", (b"1", b"x"), (b"1", b"y")
    )
    assert po.decode(delete(7, tup(b"1", None), b"K")) == po.Delete(7, "K", (b"1", None))
    assert po.decode(delete(7, tup(b"1", b"x"))) == po.Delete(7, "O", (b"1", b"x"))
    raw = b"T" + struct.pack("!IBII", 2, 3, 7, 8)
    assert po.decode(raw) == po.Truncate(True, True, (7, 8))
    assert po.decode(b"T" + struct.pack("!IBI", 1, 0, 7)) == po.Truncate(False, False, (7,))


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"Z",  # unknown message type
        begin(1, 2)[:-1],  # cut short
        begin(1, 2) + b"\x00",  # bytes left over
        b"I" + struct.pack("!I", 7) + b"X" + tup(b"1"),  # no 'N'
        insert(7, tup(b"1"))[:-1],
        b"I" + struct.pack("!I", 7) + b"N" + struct.pack("!h", 1) + b"q",  # unknown value kind
        b"U" + struct.pack("!I", 7) + b"Q",
        b"D" + struct.pack("!I", 7) + b"N" + tup(b"1"),
        b"O" + struct.pack("!Q", 5) + b"unterminated",
    ],
)
def test_malformed_messages_are_decode_errors(raw: bytes) -> None:
    with pytest.raises(po.DecodeError) as e:
        po.decode(raw)
    assert e.value.code == "cdc_decode_error"


def test_lsn_text() -> None:
    assert parse_lsn("16/B374D848") == 0x16_B374D848
    assert format_lsn(0x16_B374D848) == "16/B374D848"
    assert parse_lsn(format_lsn(0)) == 0


# -- text values, as the upstream prints them with our session settings -------------


@pytest.mark.parametrize(
    ("t", "text", "value"),
    [
        (ColumnType.SMALLINT, "-32768", -32768),
        (ColumnType.INT, "2147483647", 2147483647),
        (ColumnType.BIGINT, "-9223372036854775808", -(2**63)),
        (ColumnType.DOUBLE, "1.5", 1.5),
        (ColumnType.DOUBLE, "-0", 0.0),
        (ColumnType.DOUBLE, "1e+300", 1e300),
        (ColumnType.DOUBLE, "0.30000000000000004", 0.1 + 0.2),
        (ColumnType.NUMERIC, "12.340", Decimal("12.340")),
        (ColumnType.NUMERIC, "-0.000001", Decimal("-0.000001")),
        (ColumnType.TEXT, "h\u00e9llo \u2603", "h\u00e9llo \u2603"),
        (ColumnType.TEXT, "", ""),
        (ColumnType.BOOLEAN, "t", True),
        (ColumnType.BOOLEAN, "f", False),
        (ColumnType.BOOLEAN, "true", True),
        (ColumnType.BOOLEAN, "false", False),
        (ColumnType.DATE, "2024-02-29", dt.date(2024, 2, 29)),
        (ColumnType.TIMESTAMP, "2024-02-29 12:34:56", dt.datetime(2024, 2, 29, 12, 34, 56)),
        (
            ColumnType.TIMESTAMP,
            "2024-02-29 12:34:56.789",
            dt.datetime(2024, 2, 29, 12, 34, 56, 789000),
        ),
        (
            ColumnType.TIMESTAMPTZ,
            "2024-02-29 12:34:56.000001+00",
            dt.datetime(2024, 2, 29, 12, 34, 56, 1, tzinfo=dt.UTC),
        ),
        (ColumnType.JSONB, '{"a": [1, 2.5, null, "x"]}', {"a": [1, 2.5, None, "x"]}),
        (ColumnType.BYTEA, "\\x00ff10", b"\x00\xff\x10"),
        (ColumnType.BYTEA, "\\x", b""),
    ],
)
def test_text_values_of_every_mapped_type(t: ColumnType, text: str, value: object) -> None:
    got = parse_text(t, text.encode(), "c")
    assert got == value and type(got) is type(value)
    assert parse_text(t, None) is None


@pytest.mark.parametrize(
    ("t", "text"),
    [
        (ColumnType.DOUBLE, "NaN"),
        (ColumnType.DOUBLE, "Infinity"),
        (ColumnType.NUMERIC, "NaN"),
        (ColumnType.DATE, "infinity"),
        (ColumnType.DATE, "0044-03-15 BC"),
        (ColumnType.TIMESTAMP, "10000-01-01 00:00:00"),
        (ColumnType.TIMESTAMPTZ, "-infinity"),
        (ColumnType.BOOLEAN, "yes"),
        (ColumnType.BYTEA, "\\001"),  # escape format: not ours
        (ColumnType.INT, "2147483648"),
    ],
)
def test_values_ours_cannot_hold(t: ColumnType, text: str) -> None:
    with pytest.raises(UnsupportedValue) as e:
        parse_text(t, text.encode(), "c")
    assert e.value.code == "cdc_unsupported_value"


# -- the assembler ------------------------------------------------------------------

REL = 16384
TABLE = UpstreamTable(
    TableRef("public", "t"),
    REL,
    TableSchema.build([Column("id", ColumnType.INT, False), Column("v", ColumnType.TEXT)], ["id"]),
    (23, 25),
    "f",
)
COLS = [("id", 23), ("v", 25)]


def feed(asm: TransactionAssembler, *raw: bytes) -> list[object]:
    return [t for m in raw if (t := asm.feed(po.decode(m))) is not None]


def test_assembler_yields_whole_transactions_of_the_table() -> None:
    asm = TransactionAssembler(TABLE)
    got = feed(
        asm,
        begin(90, 5),
        relation(REL, COLS),
        relation(999, [("x", 23)]),  # another table of the publication
        insert(REL, tup(b"1", b"a")),
        insert(999, tup(b"7")),
        update(REL, tup(b"1", b"b"), tup(b"1", b"a")),
        update(REL, tup(b"2", b"b"), tup(b"1", b"b")),  # a key change
        delete(REL, tup(b"2", b"b")),
        delete(REL, tup(b"3", None), b"K"),
        commit(100, 148),
    )
    assert len(got) == 1
    txn = got[0]
    assert (txn.xid, txn.commit_lsn, txn.lsn, txn.commit_time) == (5, 100, 148, WHEN)
    assert txn.changes == (
        RowChange(Op.INSERT, None, (1,), None, (1, "a")),
        RowChange(Op.UPDATE, (1,), (1,), (1, "a"), (1, "b")),
        RowChange(Op.UPDATE, (1,), (2,), (1, "b"), (2, "b")),
        RowChange(Op.DELETE, (2,), None, (2, "b"), None),
        RowChange(Op.DELETE, (3,), None, None, None),
    )
    assert txn.cdc_events() == [
        CdcEvent(148, Op.INSERT, (1,), (1, "a")),
        CdcEvent(148, Op.UPDATE, (1,), (1, "b")),
        CdcEvent(148, Op.DELETE, (1,), None),
        CdcEvent(148, Op.INSERT, (2,), (2, "b")),
        CdcEvent(148, Op.DELETE, (2,), None),
        CdcEvent(148, Op.DELETE, (3,), None),
    ]
    # a transaction of other tables only: nothing of ours in it
    assert feed(asm, begin(150, 6), insert(999, tup(b"8")), commit(150, 170))[0].changes == ()


def test_unchanged_toast_comes_from_the_old_row() -> None:
    """REPLICA IDENTITY FULL sends the whole old row, out-of-line values included; an
    update leaving such a value alone marks it 'u' in the new row: the old row's is
    taken. Without an old row it cannot be known: ReplicaIdentityNotFull."""
    asm = TransactionAssembler(TABLE)
    (txn,) = feed(
        asm,
        begin(90, 5),
        update(REL, tup(b"1", "u"), tup(b"1", b"big" * 1000)),
        commit(100, 148),
    )
    assert txn.changes[0].new_row == (1, "big" * 1000)
    with pytest.raises(ReplicaIdentityNotFull) as e:
        feed(asm, begin(190, 6), update(REL, tup(b"1", "u")), commit(200, 248))
    assert e.value.code == "cdc_replica_identity_not_full"


def test_truncate_needs_the_keys_it_deletes() -> None:
    asm = TransactionAssembler(TABLE)
    (txn,) = feed(asm, begin(90, 5), b"T" + struct.pack("!IBII", 2, 0, 999, REL), commit(100, 148))
    assert txn.changes == (TruncateChange(False, False),)
    with pytest.raises(TruncateUnsupported) as e:
        txn.cdc_events()
    assert e.value.code == "cdc_truncate_unsupported"
    assert txn.cdc_events(lambda: [(1,), (4,)]) == [
        CdcEvent(148, Op.DELETE, (1,), None),
        CdcEvent(148, Op.DELETE, (4,), None),
    ]
    # a truncate of other tables only is none of ours
    other = b"T" + struct.pack("!IBI", 1, 0, 999)
    assert feed(asm, begin(190, 6), other, commit(200, 248))[0].changes == ()


@pytest.mark.parametrize(
    "cols", [[("id", 23)], [("id", 20), ("v", 25)], [("id", 23), ("w", 25)], [*COLS, ("x", 23)]]
)
def test_a_relation_unlike_ours_is_a_schema_change(cols: list[tuple[str, int]]) -> None:
    asm = TransactionAssembler(TABLE)
    feed(asm, begin(90, 5), relation(REL, COLS))  # ours: fine
    with pytest.raises(UpstreamSchemaChanged) as e:
        feed(asm, relation(REL, cols))
    assert e.value.code == "cdc_upstream_schema_changed"


def test_changes_outside_a_transaction_are_decode_errors() -> None:
    with pytest.raises(po.DecodeError):
        feed(TransactionAssembler(TABLE), insert(REL, tup(b"1", b"a")))
    with pytest.raises(po.DecodeError):
        feed(TransactionAssembler(TABLE), commit(1, 2))


# -- the snapshot check of chunk reads ----------------------------------------------


def test_snapshot_visibility_of_delivered_transactions() -> None:
    # xmin 100, xmax 110, 103 and 107 running: 105 committed and seen, 110 not yet
    snap = "100:110:103,107"
    assert invisible(snap, [99, 105, 103, 110, 111]) == [103, 110, 111]
    # 64-bit xids across the 32-bit wraparound: the epoch comes from xmax
    epoch = 3 << 32
    snap = f"{epoch - 5}:{epoch + 10}:{epoch + 2}"
    assert invisible(snap, [0xFFFFFFFE, 1, 2, 10]) == [2, 10]
    assert invisible(f"{epoch + 5}:{epoch + 6}:", [0xFFFFFFF0, 5, 6]) == [6]
    # xmax just below the next epoch: xid 5 is of the next one (began after the snapshot)
    top = epoch + 0xFFFFFFF0
    assert invisible(f"{top}:{top}:", [5, 0xFFFFFFEF]) == [5]


def test_delivered_transactions_are_checked_until_seen() -> None:
    d = DeliveredTransactions()
    d.add(5, 100)
    d.add(6, 200)
    assert d.due(150) == [5]
    assert sorted(d.due(200)) == [5, 6]
    d.seen([5])
    assert d.due(200) == [6] and len(d) == 1
