"""The change stream: logical replication from the slot with ``pgoutput``, decoded
(``pgoutput.py``), assembled into whole committed transactions of typed row changes
(``TransactionAssembler``, pure), over psycopg2's streaming replication protocol
(``ChangeStream``).

Why streaming and not ``pg_logical_slot_peek_binary_changes``: a peek decodes the WAL
from the slot's confirmed position again at every call, so between two confirmations
(an epoch apart) each poll would decode the whole backlog anew; the walsender decodes
each record once and pushes it. The slot's confirmed LSN moves only by ``confirm``
(sent at once as the flush position of a standby status update). One exception is
psycopg2's: once everything received is confirmed, it answers a keepalive by confirming
the keepalive's WAL end, which holds no change of the publication (it moves the slot
over other tables' WAL only).

Positions are commit LSNs' ends (``Commit.end_lsn``): a transaction's changes all
carry it, the stream position ``position`` is the end of the last transaction
delivered or the WAL end of a later keepalive (every commit below it delivered), and a
slot confirmed at ``L`` restarts with the first transaction ending after ``L``.
"""

from __future__ import annotations

import datetime as dt
import select
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final

import psycopg2
import psycopg2.extras

from backfill_core.changes import Op, Row
from backfill_core.executors.cdc import CdcEvent, key_change

from . import pgoutput as po
from .chunks import DeliveredTransactions
from .errors import (
    PgCdcError,
    ReplicaIdentityNotFull,
    TruncateUnsupported,
    UpstreamSchemaChanged,
    UpstreamUnreachable,
)
from .upstream import UpstreamTable, connect
from .values import parse_text

__all__ = [
    "ChangeStream",
    "RowChange",
    "StreamBatch",
    "Transaction",
    "TransactionAssembler",
    "TruncateChange",
]

STATUS_INTERVAL_S: Final = 10.0


@dataclass(frozen=True, slots=True)
class RowChange:
    """An insert, update or delete of one row: keys and rows in our schema's column
    order with our values. ``old_row`` is the whole old row when the table has REPLICA
    IDENTITY FULL (None for an insert, or without it); ``old_key`` is None for an insert,
    ``new_key``/``new_row`` None for a delete. An update may change the key."""

    op: Op
    old_key: Row | None
    new_key: Row | None
    old_row: Row | None
    new_row: Row | None


@dataclass(frozen=True, slots=True)
class TruncateChange:
    cascade: bool
    restart_identity: bool


@dataclass(frozen=True, slots=True)
class Transaction:
    """A committed upstream transaction's changes to the table, in order. ``lsn`` is
    its position (the end of its commit record); ``commit_lsn`` the record's start."""

    xid: int
    commit_lsn: int
    lsn: int
    commit_time: dt.datetime
    changes: tuple[RowChange | TruncateChange, ...]

    def cdc_events(
        self, truncated_keys: Callable[[], Iterable[Row]] | None = None
    ) -> list[CdcEvent]:
        """The changes as the executor takes them (``CdcBackfill.on_changes``): a key
        change as a delete and an insert. A TRUNCATE becomes a delete of each key
        ``truncated_keys`` names then (the rows the table holds), and without it
        ``TruncateUnsupported``."""
        out: list[CdcEvent] = []
        for c in self.changes:
            if isinstance(c, TruncateChange):
                if truncated_keys is None:
                    raise TruncateUnsupported(f"TRUNCATE at {self.lsn} and no keys to delete")
                out.extend(CdcEvent(self.lsn, Op.DELETE, k, None) for k in truncated_keys())
            elif c.op is Op.DELETE:
                assert c.old_key is not None
                out.append(CdcEvent(self.lsn, Op.DELETE, c.old_key, None))
            else:
                assert c.new_key is not None and c.new_row is not None
                if c.old_key is not None and c.old_key != c.new_key:
                    out.extend(key_change(self.lsn, c.old_key, c.new_key, c.new_row))
                else:
                    out.append(CdcEvent(self.lsn, c.op, c.new_key, c.new_row))
        return out


@dataclass(slots=True)
class _Open:
    begin: po.Begin
    changes: list[RowChange | TruncateChange] = field(default_factory=list)


class TransactionAssembler:
    """Decoded pgoutput messages in, whole transactions of ``table`` out (pure).
    Changes to other tables of the publication are left out, as are transactions
    without a change to ``table``. A relation message describing the table with other
    columns or types than ``table`` raises ``UpstreamSchemaChanged``."""

    def __init__(self, table: UpstreamTable) -> None:
        self.table = table
        self._open: _Open | None = None
        self._columns = [(c.name, c.type) for c in table.schema.columns]
        self._keys = table.key_indices

    @property
    def in_transaction(self) -> bool:
        return self._open is not None

    def feed(self, msg: po.PgOutputMessage) -> Transaction | None:
        """Take one message; the transaction it completes, if it is a commit."""
        if isinstance(msg, po.Begin):
            self._open = _Open(msg)
        elif isinstance(msg, po.Commit):
            txn, self._open = self._open, None
            if txn is None:
                raise po.DecodeError(f"a commit at {msg.end_lsn} without its begin")
            return Transaction(
                txn.begin.xid, msg.commit_lsn, msg.end_lsn, msg.commit_time, tuple(txn.changes)
            )
        elif isinstance(msg, po.Relation):
            if msg.relation_id == self.table.oid:
                self._check_relation(msg)
        elif isinstance(msg, po.Insert | po.Update | po.Delete):
            if msg.relation_id == self.table.oid:
                self._current().changes.append(self._row_change(msg))
        elif isinstance(msg, po.Truncate) and self.table.oid in msg.relation_ids:
            self._current().changes.append(TruncateChange(msg.cascade, msg.restart_identity))
        return None  # origin, type and logical messages say nothing about the rows

    def _current(self) -> _Open:
        if self._open is None:
            raise po.DecodeError("a change outside a transaction")
        return self._open

    def _check_relation(self, rel: po.Relation) -> None:
        got = [(c.name, c.type_oid) for c in rel.columns]
        want = list(zip(self.table.schema.names, self.table.type_oids, strict=True))
        if got != want:
            raise UpstreamSchemaChanged(
                f"{self.table.ref} changed upstream: columns (name, type oid) {got}, "
                f"ours are {want}"
            )

    def _row(self, values: tuple[po.TupleValue, ...], old: Row | None) -> Row:
        if len(values) != len(self._columns):
            raise UpstreamSchemaChanged(f"a row of {len(values)} columns for {self.table.ref}")
        out = []
        for i, ((name, t), v) in enumerate(zip(self._columns, values, strict=True)):
            if v is po.UNCHANGED:
                # an unchanged TOASTed value: the old row (REPLICA IDENTITY FULL) has it
                if old is None:
                    raise ReplicaIdentityNotFull(
                        f"an update of {self.table.ref} left column {name!r} out (unchanged "
                        "and TOASTed) and sent no old row: it needs REPLICA IDENTITY FULL"
                    )
                out.append(old[i])
            else:
                out.append(parse_text(t, v, name))
        return tuple(out)

    def _key(self, row: Row) -> Row:
        return tuple(row[i] for i in self._keys)

    def _row_change(self, msg: po.Insert | po.Update | po.Delete) -> RowChange:
        if isinstance(msg, po.Insert):
            new = self._row(msg.new, None)
            return RowChange(Op.INSERT, None, self._key(new), None, new)
        if isinstance(msg, po.Delete):
            old = self._row(msg.old, None)
            full = old if msg.old_kind == "O" else None
            return RowChange(Op.DELETE, self._key(old), None, full, None)
        old_row = self._row(msg.old, None) if msg.old is not None else None
        new = self._row(msg.new, old_row if msg.old_kind == "O" else None)
        old_key = self._key(old_row) if old_row is not None else self._key(new)
        full = old_row if msg.old_kind == "O" else None
        return RowChange(Op.UPDATE, old_key, self._key(new), full, new)


@dataclass(frozen=True, slots=True)
class StreamBatch:
    """What one poll delivered: whole transactions in commit order, and ``position``:
    every transaction ending at or below it is delivered (``on_changes(..., upto=)``)."""

    transactions: list[Transaction]
    position: int

    def cdc_events(
        self, truncated_keys: Callable[[], Iterable[Row]] | None = None
    ) -> list[CdcEvent]:
        return [e for t in self.transactions for e in t.cdc_events(truncated_keys)]


class ChangeStream:
    """The slot's changes to ``table``, pulled by ``poll``; not thread-safe.

    ``skip_upto``: the LSN the caller has applied (our table is exact there): the
    stream delivers only transactions ending after it. The slot restarts from its
    confirmed LSN, which moves only by ``confirm``; a broken replication connection is
    made again at the next poll and what it delivered already is skipped."""

    def __init__(
        self,
        dsn: str,
        table: UpstreamTable,
        *,
        slot: str,
        publication: str,
        skip_upto: int = 0,
        status_interval_s: float = STATUS_INTERVAL_S,
    ) -> None:
        self.dsn = dsn
        self.table = table
        self.slot = slot
        self.publication = publication
        self.position = skip_upto
        self.delivered = DeliveredTransactions()
        self.confirmed = 0
        self._status_interval_s = status_interval_s
        self._conn: Any = None
        self._cur: Any = None
        self._assembler = TransactionAssembler(table)
        self._failed: PgCdcError | None = None

    def __enter__(self) -> ChangeStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._conn is not None:
            conn, self._conn, self._cur = self._conn, None, None
            conn.close()

    def _connect(self) -> None:
        try:
            conn = connect(
                self.dsn, connection_factory=psycopg2.extras.LogicalReplicationConnection
            )
            cur = conn.cursor()
            cur.start_replication(
                slot_name=self.slot,
                decode=False,
                start_lsn=0,  # the slot's confirmed LSN
                status_interval=self._status_interval_s,
                options={"proto_version": "1", "publication_names": self.publication},
            )
        except psycopg2.OperationalError as e:
            raise UpstreamUnreachable(f"cannot stream slot {self.slot!r}: {e}") from e
        self._conn, self._cur = conn, cur
        self._assembler = TransactionAssembler(self.table)
        if self.confirmed:
            cur.send_feedback(flush_lsn=self.confirmed, force=True)

    def confirm(self, lsn: int) -> None:
        """Let the slot confirm ``lsn`` (the caller applied and committed everything up
        to it): the upstream may free the WAL before it, and a restart resumes after it."""
        if lsn <= self.confirmed:
            return
        self.confirmed = lsn
        if self._cur is not None:
            try:
                self._cur.send_feedback(flush_lsn=lsn, force=True)
            except psycopg2.Error:
                self.close()  # sent again by the next connection

    def poll(self, timeout_s: float = 0.0, max_transactions: int = 1000) -> StreamBatch:
        """Whole transactions that arrived, waiting up to ``timeout_s`` for a first one;
        at most ``max_transactions``. An error of the stream's contents (a schema
        change, an undecodable message) is raised once the transactions before it are
        delivered (at the next poll), and at every poll after."""
        if self._failed is not None:
            raise self._failed
        if self._cur is None:
            self._connect()
        deadline = time.monotonic() + timeout_s
        out: list[Transaction] = []
        try:
            while len(out) < max_transactions:
                msg = self._cur.read_message()
                if msg is None:
                    if not self._assembler.in_transaction:
                        # a keepalive's WAL end: every commit below it has been sent
                        self.position = max(self.position, int(self._cur.wal_end))
                    left = deadline - time.monotonic()
                    if out or left <= 0:
                        break
                    select.select([self._conn], [], [], min(left, 1.0))
                    continue
                txn = self._assembler.feed(po.decode(msg.payload))
                if txn is None:
                    continue
                if txn.lsn > self.position:  # else delivered before a reconnection
                    self.position = txn.lsn
                    if txn.changes:
                        self.delivered.add(txn.xid, txn.lsn)
                        out.append(txn)
        except PgCdcError as e:  # for good: the stream cannot go past it
            self._failed = e
            if not out:
                raise
        except (psycopg2.OperationalError, psycopg2.InterfaceError) as e:
            self.close()
            if not out:
                raise UpstreamUnreachable(f"the stream of slot {self.slot!r} broke: {e}") from e
        return StreamBatch(out, self.position)
