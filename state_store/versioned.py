"""One epoch-versioned table in Postgres (``docs/architecture.md#the-state-store``).

Layout: ``(_vnode smallint, <pk>, _epoch bigint, _deleted bool, <values>)`` with a unique
index on ``(_vnode, <pk>, _epoch DESC)`` (snapshot reads walk it and take the first
version of each key) and an index on ``_epoch`` (change logs, rollback and
garbage collection touch only the versions of the epochs they name). An MV's epoch
index is built once its backfill is done (``build_epoch_index``): kept up row by row,
it cost a backfill's writes a third of their time.

Every method takes a psycopg2 cursor and runs in the caller's transaction. Rows are
tuples in the schema's column order; identifiers are always quoted with
``psycopg2.sql``; values always travel as parameters or COPY data.
"""

from __future__ import annotations

import functools
import gc
import hashlib
import io
import json
import operator
import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any, TypeVar

from psycopg2 import errors, sql

from backfill_core.changes import Op, Row, RowChange, Version
from backfill_core.schema import ColumnType, TableSchema
from backfill_core.vnode import compute_vnode, vnode_hasher, vnodes_hasher
from state_store.change_logs import KeyVersion, split_by_range
from state_store.encoding import line_formatter, row_decoder

SCHEMA = "store"
COPY_CHUNK = 1 << 20  # bytes per round of COPY data (psycopg2 sends 8 kB by default)
# lines per piece of a streamed COPY: small enough that Postgres starts parsing early
# and the last piece (which nothing overlaps) is short, big enough to amortize the calls
LINES_PER_CHUNK = 2_000
VNODE, EPOCH, DELETED = "_vnode", "_epoch", "_deleted"
_Keyed = TypeVar("_Keyed", bound=tuple[Any, Any])  # (key, what is written for it)


def _ids(names: Iterable[str], prefix: str | None = None) -> sql.Composed:
    if prefix is None:
        return sql.SQL(", ").join(sql.Identifier(n) for n in names)
    return sql.SQL(", ").join(sql.Identifier(prefix, n) for n in names)


def _as_text(name: str, t: ColumnType) -> sql.Composable:
    if t in (ColumnType.NUMERIC, ColumnType.JSONB):
        return sql.SQL("{}::text").format(sql.Identifier(name))
    if t is ColumnType.TIMESTAMPTZ:
        return sql.SQL("({} AT TIME ZONE 'UTC')").format(sql.Identifier(name))
    return sql.Identifier(name)


_INT_TYPES = (ColumnType.SMALLINT, ColumnType.INT, ColumnType.BIGINT)


def _array_text(t: ColumnType, values: Iterable[Any]) -> Any:
    """An array parameter as the text of one array constant (``'{1,2}'``): the driver's
    ``ARRAY[1, 2, ...]`` is an expression of one node per element, and planning one of
    10,000 keys took longer than running the lookups. Types other than integers and text
    keep the driver's form."""
    if t in _INT_TYPES:
        return "{" + ",".join(map(str, values)) + "}"
    if t is ColumnType.TEXT:
        quoted = (v.replace("\\", "\\\\").replace('"', '\\"') for v in values)
        return '{"' + '","'.join(quoted) + '"}'
    return list(values)


class _PrefetchedStream:
    """A file for ``copy_expert`` whose chunks are made on a thread of its own while the
    driver sends the ones before. The driver releases the GIL while it waits for the
    socket, whose buffer (a local socket's: 200 kB) holds a fraction of a chunk: made
    in the reading thread, each chunk waited for Postgres to take the last one, and the
    two took turns (``bench/HISTORY.md``). ``keep``: keep what was read, for
    ``everything`` (a COPY that fails on a duplicate key is retried as an upsert of the
    same data). ``close`` stops the thread before anything else reads what the chunks
    read (a failed COPY looks its record up)."""

    _END = object()

    def __init__(self, chunks: Iterator[Any], empty: Any, *, keep: bool = False) -> None:
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=4)
        self._empty = empty  # what ``read`` returns at the end: b"" or ""
        self._read: list[Any] | None = [] if keep else None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._make, args=(chunks,), daemon=True)
        self._thread.start()

    def _make(self, chunks: Iterator[Any]) -> None:
        try:
            for chunk in chunks:
                self._queue.put(chunk)
                if self._stop.is_set():  # (checked after the put ``close`` waits out)
                    return
            self._queue.put(self._END)
        except BaseException as e:  # noqa: BLE001 - handed to the reader, which raises it
            self._queue.put(e)

    def _next(self) -> Any:
        got = self._queue.get()
        if got is self._END:
            self._queue.put(got)  # (the driver may read once more)
        elif isinstance(got, BaseException):
            self._queue.put(self._END)
            raise got
        elif self._read is not None:
            self._read.append(got)
        return got

    def read(self, size: int = -1) -> Any:
        got = self._next()
        return self._empty if got is self._END else got

    def everything(self) -> Any:
        """Every chunk, those read and the rest, joined (``keep`` only)."""
        assert self._read is not None
        while self._next() is not self._END:
            pass
        return self._empty.join(self._read)

    def close(self) -> None:
        self._stop.set()
        while self._thread.is_alive():  # take what it put, so that its put returns
            with suppress(queue.Empty):
                self._queue.get(timeout=0.05)
        self._thread.join()

    def __enter__(self) -> _PrefetchedStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic GC off while a write builds its (acyclic) tuples and lines: with
    millions of live rows each collection walks them all, a third of a write's time.
    (Process-wide: of two threads in it at once, the last to leave turns it back on.)"""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def index_ordered(
    cur: Any, q: sql.Composable, params: Sequence[Any], *, generic_plan: bool = False
) -> list[tuple[Any, ...]]:
    """Run a snapshot read with sorts disabled: the key index gives its order.

    Past a position, the planner misjudges a vnode's rows and picks a bitmap scan that
    sorts the vnode's whole rest to return one limited read (a backfill's reads then
    cost what is left of the table, every epoch). Set for this statement only; an
    error aborts the transaction, which undoes the setting. ``generic_plan``: ``q``
    executes a prepared statement, which then keeps one plan for any parameters.
    """
    settings, reset = "SET LOCAL enable_sort = off; ", "SET LOCAL enable_sort TO DEFAULT"
    if generic_plan:
        settings += "SET LOCAL plan_cache_mode = force_generic_plan; "
        reset += "; SET LOCAL plan_cache_mode TO DEFAULT"
    # one round trip for the settings and the read (the last statement's rows come back)
    cur.execute(sql.SQL(settings) + q, params)
    rows: list[tuple[Any, ...]] = cur.fetchall()
    cur.execute(reset)
    return rows


@dataclass(frozen=True)
class Snapshot:
    rows: list[tuple[int, Row]]  # (vnode, row) in (vnode, pk) order


class VersionedTable:
    def __init__(self, name: str, schema: TableSchema) -> None:
        self.name = name
        self.schema = schema
        self.ident = sql.Identifier(SCHEMA, name)
        # names of the table's own objects (indexes, the staging table): a leading "_"
        # that no table name has, and a digest of name and schema, so they never clash
        # with a table, with another table's objects (names are cut at 63 bytes), or with
        # a staging table left in a pooled session by a dropped table of the same name
        digest = hashlib.blake2b(
            json.dumps([name, schema.to_json()], sort_keys=True).encode(), digest_size=6
        ).hexdigest()
        self._internal_prefix = f"_{name[:40]}_{digest}"
        self.identity = (name, digest)  # the table and its schema, as cache keys want them
        self.pk = list(schema.primary_key)
        self.values = [c.name for c in schema.value_columns]
        self.names = list(schema.names)
        self._pk_idx = [schema.index_of(n) for n in self.pk]
        self._dist_idx = [schema.index_of(n) for n in schema.distribution_key]
        self._value_idx = [schema.index_of(n) for n in self.values]
        self._dist_types = list(schema.dist_types)
        self._storage_cols = [VNODE, *self.pk, EPOCH, DELETED, *self.values]
        types = [c.type for c in schema.columns]
        getter = operator.itemgetter(*self._pk_idx)
        self.key_of: Callable[[Row], Row] = (
            getter if len(self._pk_idx) > 1 else (lambda row: (getter(row),))  # type: ignore[assignment]
        )
        dist_at = [self.pk.index(n) for n in schema.distribution_key]
        self._vnode_of_key: Callable[[Row], int] = vnode_hasher(
            self._dist_types, schema.vnode_count, dist_at
        )
        self._vnodes_of_keys = vnodes_hasher(self._dist_types, schema.vnode_count, dist_at)
        self._format_line = line_formatter(
            [schema.column(n).type for n in self.pk],
            [schema.column(n).type for n in self.values],
            self._value_idx,
        )
        self._null_row = (None,) * len(schema.columns)
        self._decode = row_decoder(types)
        self._decode_values = row_decoder([schema.column(n).type for n in self.values])
        # by whether vnodes are a range, and whether the statement gives every version
        self._change_log_texts: dict[tuple[bool, bool], str] = {}
        self.decode_key = row_decoder(list(schema.pk_types))
        self._pk_types = list(schema.pk_types)

    @property
    def storage_columns(self) -> list[str]:
        """The stored table's columns: ``_vnode, <pk>, _epoch, _deleted, <values>``."""
        return list(self._storage_cols)

    # DDL ------------------------------------------------------------------

    def create(self, cur: Any, *, epoch_index: bool = True) -> None:
        """Create the table and its key index; its epoch index too unless told not to
        (``build_epoch_index`` adds it later)."""
        cols = [sql.SQL("{} smallint NOT NULL").format(sql.Identifier(VNODE))]
        for n in self.pk:
            cols.append(
                sql.SQL("{} {} NOT NULL").format(
                    sql.Identifier(n), sql.SQL(self.schema.column(n).type.sql)
                )
            )
        cols.append(sql.SQL("{} bigint NOT NULL").format(sql.Identifier(EPOCH)))
        cols.append(sql.SQL("{} boolean NOT NULL DEFAULT false").format(sql.Identifier(DELETED)))
        for n in self.values:
            cols.append(
                sql.SQL("{} {}").format(sql.Identifier(n), sql.SQL(self.schema.column(n).type.sql))
            )
        cur.execute(sql.SQL("CREATE TABLE {} ({})").format(self.ident, sql.SQL(", ").join(cols)))
        cur.execute(self._key_index_ddl())
        if epoch_index:
            cur.execute(self._epoch_index_ddl(concurrently=False))

    def _key_index_ddl(self) -> sql.Composable:
        key_cols = sql.SQL(", ").join(
            [
                sql.Identifier(VNODE),
                *(sql.Identifier(n) for n in self.pk),
                sql.SQL("{} DESC").format(sql.Identifier(EPOCH)),
            ]
        )
        return sql.SQL("CREATE UNIQUE INDEX {} ON {} ({})").format(
            sql.Identifier(f"{self._internal_prefix}_key"), self.ident, key_cols
        )

    def drop_key_index_for_load(self, cur: Any) -> bool:
        """Before a first load into this table, empty: drop its key index, so that the
        load does not keep it up row by row (``build_key_index`` builds it after the
        rows, in one sort: docs/architecture.md#layout-and-indexes). Only if nobody holds the
        table now; from here to the transaction's end, nobody else reads it. Under a
        savepoint that ``restore_key_index`` returns to; whether the index was dropped."""
        cur.execute("SAVEPOINT first_load")
        try:
            cur.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE NOWAIT").format(self.ident))
        except errors.LockNotAvailable:
            cur.execute("ROLLBACK TO SAVEPOINT first_load")
            cur.execute("RELEASE SAVEPOINT first_load")
            return False
        cur.execute(
            sql.SQL("DROP INDEX {}").format(sql.Identifier(SCHEMA, f"{self._internal_prefix}_key"))
        )
        return True

    def build_key_index(self, cur: Any) -> None:
        """The key index after a first load (``drop_key_index_for_load``); a key the load
        wrote twice is the driver's UniqueViolation, and ``restore_key_index`` then
        takes the load back."""
        cur.execute(self._key_index_ddl())
        cur.execute("RELEASE SAVEPOINT first_load")

    def restore_key_index(self, cur: Any) -> None:
        """The table as before ``drop_key_index_for_load``: empty, with its key index."""
        cur.execute("ROLLBACK TO SAVEPOINT first_load")
        cur.execute("RELEASE SAVEPOINT first_load")

    @property
    def epoch_index_name(self) -> str:
        return f"{self._internal_prefix}_epoch"

    def _epoch_index_ddl(self, *, concurrently: bool) -> sql.Composable:
        return sql.SQL("CREATE INDEX {how}{name} ON {t} ({ep})").format(
            how=sql.SQL("CONCURRENTLY " if concurrently else ""),
            name=sql.Identifier(self.epoch_index_name),
            t=self.ident,
            ep=sql.Identifier(EPOCH),
        )

    def epoch_index_state(self, cur: Any) -> str | None:
        """``valid``, ``invalid`` (a concurrent build failed or is under way) or None."""
        cur.execute(
            "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
            [SCHEMA, self.epoch_index_name],
        )
        row = cur.fetchone()
        return None if row is None else ("valid" if row[0] else "invalid")

    def build_epoch_index(self, cur: Any) -> None:
        """Build the epoch index without blocking the table's writers (``cur`` must be in
        autocommit: a concurrent build runs outside a transaction). An invalid one left by
        a failed build is dropped first; the caller makes sure no other build runs."""
        state = self.epoch_index_state(cur)
        if state == "valid":
            return
        if state == "invalid":
            cur.execute(
                sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(
                    sql.Identifier(SCHEMA, self.epoch_index_name)
                )
            )
        cur.execute(self._epoch_index_ddl(concurrently=True))

    def drop(self, cur: Any) -> None:
        cur.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(self.ident))

    # writes ---------------------------------------------------------------

    def vnode_of(self, row: Row) -> int:
        return compute_vnode(
            self._dist_types, [row[i] for i in self._dist_idx], self.schema.vnode_count
        )

    def write(self, cur: Any, epoch: int, versions: Iterable[Version]) -> int:
        """Write versions at ``epoch``; the last write of a key in an epoch wins.

        Fast path: one COPY, its lines formatted on a thread while Postgres parses the
        ones sent before (the server's work and ours overlap: ``_PrefetchedStream``).
        When a key already has a version at this epoch (an earlier write of the same
        epoch) the COPY fails on the unique index and the batch is upserted through a
        staging table instead.
        """
        with collector_paused():
            latest = {self.key_of(v.row): v for v in versions}
            if not latest:
                return 0
            self._copy_lines(cur, self._lines(epoch, latest))
        return len(latest)

    def write_rows(
        self, cur: Any, epoch: int, keys: Sequence[Row], rows: Sequence[Row], vnodes: Sequence[int]
    ) -> int:
        """Write live versions at ``epoch`` of ``rows``, whose keys are ``keys`` (distinct)
        and vnodes ``vnodes`` (``vnode_of_key`` of each): ``write`` of rows a caller has
        keyed and hashed already (a batch of inserts, looked up first), with its rule."""
        if not rows:
            return 0
        with collector_paused():
            fmt, live = self._format_line, f"\t{epoch}\tf"
            buckets = self._buckets(vnodes, zip(keys, rows, strict=True))
            self._copy_lines(
                cur,
                self._chunks(buckets, lambda vn, items: [fmt(vn, k, live, r) for k, r in items]),
            )
        return len(rows)

    def _copy_lines(self, cur: Any, chunks: Iterator[str]) -> None:
        with _PrefetchedStream(chunks, "", keep=True) as stream:
            cur.execute("SAVEPOINT store_write")
            try:
                cur.copy_expert(
                    sql.SQL("COPY {} ({}) FROM STDIN").format(self.ident, _ids(self._storage_cols)),
                    stream,
                    size=COPY_CHUNK,
                )
            except errors.UniqueViolation:
                cur.execute("ROLLBACK TO SAVEPOINT store_write")
                self._upsert(cur, io.StringIO(stream.everything()))
        cur.execute("RELEASE SAVEPOINT store_write")

    def _lines(self, epoch: int, latest: dict[Row, Version]) -> Iterator[str]:
        """COPY text of the versions in (vnode, pk) order, in chunks of lines."""
        fmt = self._format_line
        live = f"\t{epoch}\tf"
        dead = f"\t{epoch}\tt"
        nulls = self._null_row
        buckets = self._buckets(map(self._vnode_of_key, latest), latest.items())
        return self._chunks(
            buckets,
            lambda vn, items: [
                fmt(vn, k, dead, nulls) if v.deleted else fmt(vn, k, live, v.row) for k, v in items
            ],
        )

    def _buckets(self, vnodes: Iterable[int], items: Iterable[_Keyed]) -> list[list[_Keyed]]:
        """``items`` by vnode, each vnode's in input order."""
        buckets: list[list[_Keyed]] = [[] for _ in range(self.schema.vnode_count)]
        appends = [b.append for b in buckets]
        for vnode, item in zip(vnodes, items, strict=True):
            appends[vnode](item)
        return buckets

    @staticmethod
    def _chunks(
        buckets: list[list[_Keyed]], lines_of: Callable[[int, list[_Keyed]], list[str]]
    ) -> Iterator[str]:
        """COPY text of ``(key, _)`` items bucketed by vnode, in (vnode, pk) order, in
        chunks of lines.

        (vnode, pk) order makes the heap follow the key index, so snapshot reads (which
        walk that index) touch neighbouring pages. Bucketing by vnode keeps the input
        order inside each bucket, so input already in key order (bulk loads) sorts in
        linear time, and the sort compares keys only.
        """
        by_key = operator.itemgetter(0)
        lines: list[str] = []
        for vn, items in enumerate(buckets):
            if not items:
                continue
            items.sort(key=by_key)
            lines += lines_of(vn, items)
            if len(lines) >= LINES_PER_CHUNK:
                yield "".join(lines)
                lines = []
        if lines:
            yield "".join(lines)

    def write_csv(self, cur: Any, data: bytes) -> None:
        """Write storage-layout rows given as CSV (``_vnode, <pk>, _epoch, _deleted,
        <values>``), with the same last-write-wins rule as ``write``."""
        if not data:
            return
        cur.execute("SAVEPOINT store_write")
        try:
            cur.copy_expert(
                sql.SQL("COPY {} ({}) FROM STDIN WITH (FORMAT csv)").format(
                    self.ident, _ids(self._storage_cols)
                ),
                io.BytesIO(data),
                size=COPY_CHUNK,
            )
        except errors.UniqueViolation:
            cur.execute("ROLLBACK TO SAVEPOINT store_write")
            self._upsert(cur, io.BytesIO(data), csv=True)
        cur.execute("RELEASE SAVEPOINT store_write")

    def copy_csv_rows(
        self,
        cur: Any,
        epoch: int,
        columns: Sequence[str],
        blocks: Iterable[tuple[Sequence[int], Sequence[Sequence[Any]], Sequence[bytes]]],
        sent: list[int],
        *,
        first_load: bool = False,
        force_not_null: Sequence[str] = (),
        into: sql.Composable | None = None,
    ) -> None:
        """Insert live versions at ``epoch`` of rows given as CSV records of ``columns``,
        in one COPY that sends each record as it is behind its vnode, epoch and deleted
        flag: Postgres reads the values. The records come in blocks, each ``(tags, keys,
        texts)``: a number of the caller's for each record, their primary keys (typed,
        one sequence a key column), and their texts, each ending in a newline; each
        block is a piece of the COPY, its records in vnode order (input order within a
        vnode): records in key order (a load's usual order) reach the key index in its
        order, and a piece's rows of one vnode touch its pages once; unsorted, they cost
        a third of the COPY. ``first_load``: the table is empty and without its key index
        (``drop_key_index_for_load``): the records go as they come, and the epoch and
        deleted flag as the columns' defaults for the COPY, not in each record (an
        eighth of the COPY: bench/HISTORY.md 2026-12-07 07:40). ``force_not_null``:
        columns whose empty field is an empty string, not null. A key with a version at
        ``epoch`` already is the driver's UniqueViolation; any other error is the
        driver's too (its context names the record, ``COPY <table>, line <n>``: the tag
        of record n is ``sent[n - 1]``). ``into``: a staging table of this layout
        (``create_staging``) instead of the table."""
        every_vnode = range(self.schema.vnode_count)
        prefix_of = [b"%d,%d,f," % (vnode, epoch) for vnode in every_vnode]
        sent_columns = [VNODE, EPOCH, DELETED, *columns]
        if first_load:
            prefix_of = [b"%d," % vnode for vnode in every_vnode]
            sent_columns = [VNODE, *columns]
            self._constant_defaults(cur, epoch)
        vnodes_of = self._vnodes_of_keys

        def pieces() -> Iterator[bytes]:
            # no Python step per record: the interpreter's loops over whole blocks
            for tags, keys, texts in blocks:
                vnodes = vnodes_of(keys)
                if not first_load:
                    order = sorted(range(len(vnodes)), key=vnodes.__getitem__)  # stable
                    vnodes = list(map(vnodes.__getitem__, order))
                    texts = list(map(texts.__getitem__, order))
                    tags = list(map(tags.__getitem__, order))
                sent.extend(tags)
                parts: list[bytes] = [b""] * (2 * len(texts))
                parts[::2] = map(prefix_of.__getitem__, vnodes)
                parts[1::2] = texts
                yield b"".join(parts)

        target = self.ident if into is None else into
        options = sql.SQL("FORMAT csv")
        if force_not_null:
            options += sql.SQL(", FORCE_NOT_NULL ({})").format(_ids(force_not_null))
        copy = sql.SQL("COPY {} ({}) FROM STDIN WITH ({})").format(
            target, _ids(sent_columns), options
        )
        with collector_paused(), _PrefetchedStream(pieces(), b"") as stream:
            cur.copy_expert(copy, stream, size=COPY_CHUNK)
        if first_load:
            self._constant_defaults(cur, None)

    def _constant_defaults(self, cur: Any, epoch: int | None) -> None:
        """The epoch and deleted flag of a live version at ``epoch`` as the defaults of
        their columns; none with None (a table only this transaction sees:
        ``drop_key_index_for_load``)."""
        if epoch is None:
            change = sql.SQL("ALTER COLUMN {ep} DROP DEFAULT, ALTER COLUMN {dl} DROP DEFAULT")
        else:
            change = sql.SQL(
                "ALTER COLUMN {ep} SET DEFAULT {at}, ALTER COLUMN {dl} SET DEFAULT false"
            )
        cur.execute(
            sql.SQL("ALTER TABLE {t} ").format(t=self.ident)
            + change.format(
                ep=sql.Identifier(EPOCH), dl=sql.Identifier(DELETED), at=sql.Literal(epoch)
            )
        )

    def has_versions(self, cur: Any, epoch: int) -> tuple[bool, bool]:
        """Whether the table holds any version, and any at ``epoch``."""
        cur.execute(
            sql.SQL(
                "SELECT EXISTS (SELECT 1 FROM {t}), EXISTS (SELECT 1 FROM {t} WHERE {ep} = %s)"
            ).format(t=self.ident, ep=sql.Identifier(EPOCH)),
            [epoch],
        )
        anything, at_epoch = cur.fetchone()
        return bool(anything), bool(at_epoch)

    def create_staging(self, cur: Any) -> sql.Composable:
        """A temporary table of this one's layout and key index, dropped at commit."""
        staging = sql.Identifier(f"{self._internal_prefix}_bulk")
        cur.execute(
            sql.SQL(
                "CREATE TEMP TABLE {} (LIKE {} INCLUDING DEFAULTS INCLUDING INDEXES) ON COMMIT DROP"
            ).format(staging, self.ident)
        )
        return staging

    def insert_from(self, cur: Any, staging: sql.Composable) -> None:
        """Write the versions of ``staging``, the last write of a key in an epoch winning."""
        cols = _ids(self._storage_cols)
        cur.execute(
            sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {}").format(self.ident, cols, cols, staging)
            + self.last_write_wins
        )

    def _written(self, epoch: int, staging: sql.Composable | None) -> sql.Composable:
        """The versions a bulk write made: ``staging``'s, or all of ``epoch``'s."""
        if staging is not None:
            return sql.SQL("{} n").format(staging)
        return sql.SQL("{} n WHERE n.{} = {}").format(
            self.ident, sql.Identifier(EPOCH), sql.Literal(epoch)
        )

    def first_live_key(self, cur: Any, epoch: int, staging: sql.Composable | None) -> Row | None:
        """A key of the versions written (``_written``) whose latest earlier version is
        live: an insert of a key that existed. Earlier: before ``epoch``, or up to it for
        versions still in ``staging``."""
        where = sql.SQL(" AND ") if staging is None else sql.SQL(" WHERE ")
        before = sql.SQL("<") if staging is None else sql.SQL("<=")
        q = sql.SQL(
            "SELECT {keys} FROM {written}{where}(SELECT NOT o.{dl} FROM {t} o WHERE {match} "
            "AND o.{ep} {before} %s ORDER BY o.{ep} DESC LIMIT 1) LIMIT 1"
        ).format(
            keys=_ids(self.pk, "n"),
            written=self._written(epoch, staging),
            where=where,
            dl=sql.Identifier(DELETED),
            t=self.ident,
            match=sql.SQL(" AND ").join(
                sql.SQL("o.{0} = n.{0}").format(sql.Identifier(c)) for c in [VNODE, *self.pk]
            ),
            ep=sql.Identifier(EPOCH),
            before=before,
        )
        cur.execute(q, [epoch])
        row = cur.fetchone()
        return None if row is None else self.decode_key(row)

    def first_nonfinite_key(
        self, cur: Any, epoch: int, columns: Sequence[str], staging: sql.Composable | None
    ) -> Row | None:
        """A key of the versions written whose ``columns`` hold NaN or an infinity."""
        where = sql.SQL(" AND (") if staging is None else sql.SQL(" WHERE (")
        q = sql.SQL("SELECT {keys} FROM {written}{where}{test}) LIMIT 1").format(
            keys=_ids(self.pk, "n"),
            written=self._written(epoch, staging),
            where=where,
            test=sql.SQL(" OR ").join(
                sql.SQL("n.{} IN ('NaN', 'Infinity', '-Infinity')").format(sql.Identifier(c))
                for c in columns
            ),
        )
        cur.execute(q)
        row = cur.fetchone()
        return None if row is None else self.decode_key(row)

    def _upsert(self, cur: Any, buf: Any, csv: bool = False) -> None:
        staging = sql.Identifier(f"{self._internal_prefix}_staging")
        cur.execute(
            sql.SQL(
                "CREATE TEMP TABLE IF NOT EXISTS {} (LIKE {} INCLUDING DEFAULTS) ON COMMIT DELETE ROWS"
            ).format(staging, self.ident)
        )
        cur.execute(sql.SQL("TRUNCATE {}").format(staging))
        cur.copy_expert(
            sql.SQL("COPY {} ({}) FROM STDIN{}").format(
                staging,
                _ids(self._storage_cols),
                sql.SQL(" WITH (FORMAT csv)" if csv else ""),
            ),
            buf,
        )
        cur.execute(
            sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {}").format(
                self.ident, _ids(self._storage_cols), _ids(self._storage_cols), staging
            )
            + self.last_write_wins
        )

    @property
    def last_write_wins(self) -> sql.Composed:
        """The ``ON CONFLICT`` clause of an insert into this table: a key that already
        has a version at the epoch written gets the new one (the store's write rule)."""
        return sql.SQL(" ON CONFLICT ({}) DO UPDATE SET {}").format(
            _ids([VNODE, *self.pk, EPOCH]),
            sql.SQL(", ").join(
                sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c))
                for c in [DELETED, *self.values]
            ),
        )

    # reads ----------------------------------------------------------------

    def snapshot(
        self,
        cur: Any,
        epoch: int,
        vnodes: tuple[int, int],
        *,
        after: tuple[int, Row] | None = None,
        limit: int | None = None,
    ) -> list[tuple[int, Row]]:
        """Rows visible at ``epoch`` in vnodes ``[lo, hi)``, in (vnode, pk) order, after
        ``after`` = (vnode, pk) if given.

        The rest of the bound's vnode is one query, the vnodes after it another, which
        reads one vnode after the other: a row comparison spanning the vnode column, or
        a range of vnodes in one scan, make the planner sort everything after the bound
        to return one page (pages then cost what the rest of the table does).
        """
        lo, hi = vnodes
        out: list[tuple[int, Row]] = []
        if after is not None:
            after_vnode, after_key = after
            if after_vnode >= hi:
                return []
            if after_vnode >= lo:
                out = self.snapshot_reads(cur, epoch, [(after_vnode, after_key, limit)])
                if limit is not None and len(out) >= limit:
                    return out
                lo = after_vnode + 1
        if lo >= hi:
            return out
        cols = _ids(self.names)
        q = sql.SQL(
            "SELECT _vnodes.vn, {xcols} FROM generate_series(%s::int, %s::int) AS _vnodes(vn) "
            "CROSS JOIN LATERAL (SELECT {cols} FROM (SELECT DISTINCT ON ({pk}) {cols}, {dl} "
            "FROM {t} WHERE {vn} = _vnodes.vn AND {ep} <= %s ORDER BY {pk}, {ep} DESC) s "
            "WHERE NOT {dl} LIMIT %s) x LIMIT %s"
        ).format(
            xcols=_ids(self.names, "x"),
            cols=cols,
            pk=_ids(self.pk),
            dl=sql.Identifier(DELETED),
            t=self.ident,
            vn=sql.Identifier(VNODE),
            ep=sql.Identifier(EPOCH),
        )
        left = None if limit is None else limit - len(out)
        # a nested loop over the vnodes in order: rows come out in (vnode, pk) order
        return out + self._index_ordered(cur, q, [lo, hi - 1, epoch, left, left])

    def snapshot_multi(
        self, cur: Any, epoch: int, starts: Sequence[tuple[int, Row | None]], limit: int
    ) -> list[tuple[int, Row]]:
        """Read vnodes (each after its pk) with one shared row limit: a ``SnapshotBatchRead``.

        One round trip for what would be one query per vnode: the branches of a
        ``UNION ALL``, each a vnode's rows in key order up to the limit, and the limit of
        them all. Postgres promises no order of the branches (a parallel append
        interleaves them); the accounting (``flow.account_batch``) needs none.
        """
        if not starts:
            return []
        q, params = self._snapshot_branches(epoch, [(v, a, limit) for v, a in starts])
        q = sql.SQL("SELECT * FROM ({}) u LIMIT %s").format(q)
        return self._index_ordered(cur, q, [*params, limit])

    def snapshot_reads_query(
        self,
        epoch: int,
        reads: Sequence[tuple[int, Row | None, int]],
        *,
        as_text: bool = False,
        param: Callable[[], sql.Composable] = sql.Placeholder,
    ) -> tuple[sql.Composed, list[Any]]:
        """One query for several vnode reads ``(vnode, after pk, limit)``, each with its
        own limit, in the order given: ``(vnode, *columns)`` rows.

        ``as_text`` casts numeric and jsonb to text (exact, and cheap to move on) and
        gives timestamptz as UTC wall time (an unambiguous form for CSV readers).
        ``param`` makes each placeholder, in the order of the parameters returned.
        """
        return self._snapshot_branches(epoch, reads, as_text=as_text, param=param)

    def _snapshot_branches(
        self,
        epoch: int,
        reads: Sequence[tuple[int, Row | None, int]],
        *,
        as_text: bool = False,
        param: Callable[[], sql.Composable] = sql.Placeholder,
    ) -> tuple[sql.Composed, list[Any]]:
        outer: sql.Composable = _ids(self.names)
        if as_text:
            outer = sql.SQL(", ").join(_as_text(c.name, c.type) for c in self.schema.columns)
        branches = []
        for _, after, _ in reads:
            # placeholders in the order of ``snapshot_params``: vnode, epoch, after, limit
            conds = [
                sql.SQL("{} = {} AND {} <= {}").format(
                    sql.Identifier(VNODE), param(), sql.Identifier(EPOCH), param()
                )
            ]
            if after is not None:
                conds.append(
                    sql.SQL("({}) > ({})").format(
                        _ids(self.pk), sql.SQL(", ").join(param() for _ in self.pk)
                    )
                )
            branches.append(
                sql.SQL(
                    "(SELECT {vn}, {outer} FROM (SELECT DISTINCT ON ({pk}) {vn}, {cols}, {dl} FROM {t} "
                    "WHERE {conds} ORDER BY {pk}, {ep} DESC) s WHERE NOT {dl} LIMIT {limit})"
                ).format(
                    vn=sql.Identifier(VNODE),
                    outer=outer,
                    cols=_ids(self.names),
                    pk=_ids(self.pk),
                    dl=sql.Identifier(DELETED),
                    t=self.ident,
                    conds=sql.SQL(" AND ").join(conds),
                    ep=sql.Identifier(EPOCH),
                    limit=param(),
                )
            )
        return sql.SQL(" UNION ALL ").join(branches), self.snapshot_params(epoch, reads)

    @staticmethod
    def snapshot_params(epoch: int, reads: Sequence[tuple[int, Row | None, int]]) -> list[Any]:
        """The parameters of ``snapshot_reads_query`` for these reads (a prepared form of
        the query takes them without composing it again)."""
        params: list[Any] = []
        for vnode, after, limit in reads:
            params += [vnode, epoch]
            if after is not None:
                params += list(after)
            params.append(limit)
        return params

    def snapshot_reads(
        self, cur: Any, epoch: int, reads: Sequence[tuple[int, Row | None, int]]
    ) -> list[tuple[int, Row]]:
        """Several vnode reads ``(vnode, after pk, limit)`` in one round trip."""
        if not reads:
            return []
        q, params = self._snapshot_branches(epoch, reads)
        return self._index_ordered(cur, q, params)

    def _index_ordered(
        self, cur: Any, q: sql.Composable, params: list[Any]
    ) -> list[tuple[int, Row]]:
        decode = self._decode
        return [(r[0], decode(r[1:])) for r in index_ordered(cur, q, params)]

    def change_log(
        self, cur: Any, epoch: int, vnodes: tuple[int, int] | Sequence[int]
    ) -> list[RowChange]:
        """The changes of ``epoch`` in the given vnodes, in (vnode, pk) order."""
        return self.change_log_range(cur, epoch - 1, epoch, vnodes)

    def change_log_range(
        self, cur: Any, after: int, upto: int, vnodes: tuple[int, int] | Sequence[int]
    ) -> list[RowChange]:
        """Net change per key over epochs ``(after, upto]``, in (vnode, pk) order.

        ``vnodes`` is a half-open range ``(lo, hi)`` or a list of vnodes. The old row is
        the key's latest version at or below ``after``; the new one its latest in the range.
        """
        ranged = isinstance(vnodes, tuple) and len(vnodes) == 2
        vparams: list[Any] = [vnodes[0], vnodes[1]] if ranged else [list(vnodes)]
        cur.execute(self._change_log_text(cur, ranged), [after, upto, *vparams, after])
        n_cols = len(self.names)
        out: list[RowChange] = []
        for r in cur.fetchall():
            vnode = r[0]
            new = self._decode(r[1 : 1 + n_cols])
            deleted, had_old = r[1 + n_cols], r[2 + n_cols]
            old = self._with_values(new, r[3 + n_cols :]) if had_old else None
            if deleted:
                if old is not None:
                    out.append(RowChange(Op.DELETE, vnode, old, None))
            elif old is None:
                out.append(RowChange(Op.INSERT, vnode, None, new))
            else:
                out.append(RowChange(Op.UPDATE, vnode, old, new))
        return out

    def change_logs(
        self, cur: Any, bounds: Sequence[int], vnodes: tuple[int, int] | Sequence[int]
    ) -> list[list[RowChange]]:
        """``change_log_range`` of each range ``(bounds[i], bounds[i + 1]]`` (``bounds``
        ascending), in one statement: a replay's epochs of one poll cost one read."""
        if len(bounds) < 2:
            return []
        ranged = isinstance(vnodes, tuple) and len(vnodes) == 2
        vparams: list[Any] = [vnodes[0], vnodes[1]] if ranged else [list(vnodes)]
        cur.execute(
            self._change_log_text(cur, ranged, every_version=True),
            [bounds[0], bounds[-1], *vparams, bounds[0]],
        )
        n_cols = len(self.names)
        versions = []
        for r in cur.fetchall():
            new = self._decode(r[1 : 1 + n_cols])
            base = self._with_values(new, r[4 + n_cols :]) if r[3 + n_cols] else None
            versions.append(
                KeyVersion(r[0], self.key_of(new), r[1 + n_cols], r[2 + n_cols], new, base)
            )
        return split_by_range(versions, bounds)

    def _with_values(self, row: Row, raw_values: Sequence[Any]) -> Row:
        """``row``'s key with the given stored values (an older version of its key)."""
        merged = list(row)
        for i, v in zip(self._value_idx, self._decode_values(raw_values), strict=True):
            merged[i] = v
        return tuple(merged)

    def _change_log_text(self, cur: Any, ranged: bool, *, every_version: bool = False) -> str:
        """``_change_log_query`` as text, composed once: it cost several round trips' time
        a barrier."""
        key = (ranged, every_version)
        text = self._change_log_texts.get(key)
        if text is None:
            query = self._change_log_query(ranged, every_version=every_version)
            text = self._change_log_texts[key] = query.as_string(cur)
        return text

    def _change_log_query(self, ranged: bool, *, every_version: bool = False) -> sql.Composed:
        """``change_log_range``'s statement, for a range of vnodes or a list;
        ``every_version``: each version in the range with its epoch, in (vnode, pk, epoch)
        order, beside the key's latest version at or below the range (``change_logs``)."""
        if ranged:
            vcond = sql.SQL("{vn} >= %s AND {vn} < %s").format(vn=sql.Identifier(VNODE))
        else:
            vcond = sql.SQL("{vn} = ANY(%s)").format(vn=sql.Identifier(VNODE))
        key = [VNODE, *self.pk]
        match = sql.SQL(" AND ").join(
            sql.SQL("o.{0} = n.{0}").format(sql.Identifier(c)) for c in key
        )
        old_vals = (sql.SQL(", ") + _ids(self.values, "o")) if self.values else sql.SQL("")
        if every_version:
            text = (
                "SELECT n.{vn}, {ncols}, n.{ep}, n.{dl}, (o.{ep} IS NOT NULL AND NOT o.{dl}){ov} "
                "FROM (SELECT * FROM {t} WHERE {ep} > %s AND {ep} <= %s AND {vcond}) n "
            )
            order = "ORDER BY {nkey}, n.{ep}"
        else:
            text = (
                "SELECT n.{vn}, {ncols}, n.{dl}, (o.{ep} IS NOT NULL AND NOT o.{dl}){ov} "
                "FROM (SELECT DISTINCT ON ({key}) * FROM {t} WHERE {ep} > %s AND {ep} <= %s "
                "AND {vcond} ORDER BY {key}, {ep} DESC) n "
            )
            order = "ORDER BY {nkey}"
        return sql.SQL(
            text + "LEFT JOIN LATERAL (SELECT {ep}, {dl}{ovsel} FROM {t} o WHERE {match} "
            "AND o.{ep} <= %s ORDER BY o.{ep} DESC LIMIT 1) o ON true " + order
        ).format(
            vn=sql.Identifier(VNODE),
            ncols=_ids(self.names, "n"),
            dl=sql.Identifier(DELETED),
            ep=sql.Identifier(EPOCH),
            ov=old_vals,
            key=_ids(key),
            t=self.ident,
            vcond=vcond,
            ovsel=(sql.SQL(", ") + _ids(self.values)) if self.values else sql.SQL(""),
            match=match,
            nkey=_ids(key, "n"),
        )

    def latest_versions(self, cur: Any, epoch: int, keys: Sequence[Row]) -> dict[Row, Row]:
        """The rows visible at ``epoch`` for the given primary keys (absent keys omitted).

        The keys travel as one array per key column (``unnest``): a ``VALUES`` list of
        10,000 keys cost more to compose and parse than the lookups themselves."""
        if not keys:
            return {}
        columns: list[Any] = [_array_text(ColumnType.SMALLINT, map(self._vnode_of_key, keys))]
        columns += [_array_text(t, [k[i] for k in keys]) for i, t in enumerate(self._pk_types)]
        cur.execute(self._latest_query, [*columns, epoch])
        out = {}
        decode, key_of = self._decode, self.key_of
        for r in cur.fetchall():
            if not r[-1]:
                row = decode(r[:-1])
                out[key_of(row)] = row
        return out

    def live_keys(
        self, cur: Any, epoch: int, keys: Sequence[Row], vnodes: Sequence[int]
    ) -> set[Row]:
        """Those of ``keys`` (of vnodes ``vnodes``) whose latest version at or before
        ``epoch`` is live: ``latest_versions`` without the rows (the check of inserts)."""
        if not keys:
            return set()
        columns: list[Any] = [_array_text(ColumnType.SMALLINT, vnodes)]
        columns += [_array_text(t, [k[i] for k in keys]) for i, t in enumerate(self._pk_types)]
        cur.execute(self._live_keys_query, [*columns, epoch])
        return set(map(self.decode_key, cur.fetchall()))

    def _key_arrays(self) -> sql.Composed:
        # the bare type: a collation (text's "C") has no place in a cast and no effect on =
        arrays = [sql.SQL("%s::smallint[]")] + [
            sql.SQL("%s::{}[]").format(sql.SQL(self.schema.column(n).type.sql.split(" COLLATE")[0]))
            for n in self.pk
        ]
        return sql.SQL("unnest({}) AS k({})").format(
            sql.SQL(", ").join(arrays), _ids([VNODE, *self.pk])
        )

    @functools.cached_property
    def _live_keys_query(self) -> sql.Composed:
        return sql.SQL(
            "SELECT {keys} FROM {arrays} WHERE (SELECT NOT v.{dl} FROM {t} v WHERE {match} "
            "AND v.{ep} <= %s ORDER BY v.{ep} DESC LIMIT 1)"
        ).format(
            keys=_ids(self.pk, "k"),
            arrays=self._key_arrays(),
            dl=sql.Identifier(DELETED),
            t=self.ident,
            match=sql.SQL(" AND ").join(
                sql.SQL("v.{0} = k.{0}").format(sql.Identifier(c)) for c in [VNODE, *self.pk]
            ),
            ep=sql.Identifier(EPOCH),
        )

    @functools.cached_property
    def _latest_query(self) -> sql.Composed:
        return sql.SQL(
            "SELECT {cols}, {dl} FROM {arrays} CROSS JOIN LATERAL "
            "(SELECT * FROM {t} v WHERE {match} AND v.{ep} <= %s ORDER BY v.{ep} DESC LIMIT 1) x"
        ).format(
            cols=_ids(self.names, "x"),
            dl=sql.Identifier("x", DELETED),
            arrays=self._key_arrays(),
            t=self.ident,
            match=sql.SQL(" AND ").join(
                sql.SQL("v.{0} = k.{0}").format(sql.Identifier(c)) for c in [VNODE, *self.pk]
            ),
            ep=sql.Identifier(EPOCH),
        )

    def vnode_of_key(self, key: Row) -> int:
        return self._vnode_of_key(key)

    def next_epoch_with_changes(self, cur: Any, after: int, upto: int | None = None) -> int | None:
        q = sql.SQL("SELECT min({ep}) FROM {t} WHERE {ep} > %s").format(
            ep=sql.Identifier(EPOCH), t=self.ident
        )
        params: list[Any] = [after]
        if upto is not None:
            q = q + sql.SQL(" AND {} <= %s").format(sql.Identifier(EPOCH))
            params.append(upto)
        cur.execute(q, params)
        value = cur.fetchone()[0]
        return int(value) if value is not None else None

    def max_epoch(self, cur: Any) -> int | None:
        cur.execute(
            sql.SQL("SELECT max({ep}) FROM {t}").format(ep=sql.Identifier(EPOCH), t=self.ident)
        )
        value = cur.fetchone()[0]
        return int(value) if value is not None else None

    # maintenance ------------------------------------------------------------

    def delete_vnodes(self, cur: Any, lo: int, hi: int) -> int:
        """Remove every version of vnodes ``[lo, hi)`` (a backfill that starts over)."""
        cur.execute(
            sql.SQL("DELETE FROM {} WHERE {vn} >= %s AND {vn} < %s").format(
                self.ident, vn=sql.Identifier(VNODE)
            ),
            [lo, hi],
        )
        return int(cur.rowcount)

    def rollback(self, cur: Any, committed_epoch: int) -> int:
        """Remove every version written after ``committed_epoch``."""
        cur.execute(
            sql.SQL("DELETE FROM {} WHERE {} > %s").format(self.ident, sql.Identifier(EPOCH)),
            [committed_epoch],
        )
        return int(cur.rowcount)

    def gc(self, cur: Any, safe_epoch: int, since_epoch: int = 0) -> int:
        """Drop versions no read at or after ``safe_epoch`` can see.

        Keeps, per key, the latest version at or below ``safe_epoch`` (unless it is a
        tombstone) and everything above it. Only keys written in
        ``(since_epoch, safe_epoch]`` are visited: earlier ones were compacted by the
        previous run, so the cost follows the changes, not the table size. Requires
        that nothing is written at or below ``since_epoch`` after that run (GC stays
        below committed epochs, and writes go to uncommitted ones).
        """
        if safe_epoch <= since_epoch:
            return 0
        key = [VNODE, *self.pk]
        q = sql.SQL(
            "WITH k AS (SELECT DISTINCT {key} FROM {t} WHERE {ep} > %s AND {ep} <= %s), "
            "latest AS (SELECT DISTINCT ON ({vkey}) {vkey}, v.{ep}, v.{dl} FROM {t} v JOIN k USING ({key}) "
            "WHERE v.{ep} <= %s ORDER BY {vkey}, v.{ep} DESC) "
            "DELETE FROM {t} d USING latest l WHERE {match} "
            "AND (d.{ep} < l.{ep} OR (d.{ep} = l.{ep} AND l.{dl}))"
        ).format(
            key=_ids(key),
            vkey=_ids(key, "v"),
            t=self.ident,
            ep=sql.Identifier(EPOCH),
            dl=sql.Identifier(DELETED),
            match=sql.SQL(" AND ").join(
                sql.SQL("d.{0} = l.{0}").format(sql.Identifier(c)) for c in key
            ),
        )
        cur.execute(q, [since_epoch, safe_epoch, safe_epoch])
        return int(cur.rowcount)

    def count_versions(self, cur: Any) -> int:
        cur.execute(sql.SQL("SELECT count(*) FROM {}").format(self.ident))
        return int(cur.fetchone()[0])
