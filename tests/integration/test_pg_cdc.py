"""The CDC connector against a real upstream: a second embedded Postgres with
``wal_level = logical`` (``logical_pg_url``); ``connectors/pg_cdc``."""

from __future__ import annotations

import datetime as dt
import random
import threading
import time
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import psycopg2
import psycopg2.extensions
import pytest
from psycopg2 import sql

from backfill_core.changes import Op, Row
from backfill_core.epoch import EpochPair
from backfill_core.executors.cdc import (
    CdcBackfill,
    CdcBarrierOutput,
    CdcProgress,
    CdcWrite,
    ChunkRead,
)
from backfill_core.executors.messages import Barrier
from backfill_core.schema import Column, ColumnType
from connectors import pg_cdc as cdc
from connectors.pg_cdc.stream import RowChange, Transaction, TruncateChange
from service.embedded_pg import to_libpq_url
from tests.kit.executors import epoch
from tests.kit.pg_logical import random_change

pytestmark = pytest.mark.db

DEADLINE_S = 30.0


def run(url: str, *statements: str) -> None:
    conn = psycopg2.connect(url)
    conn.autocommit = True
    with conn.cursor() as cur:
        for s in statements:
            cur.execute(s)
    conn.close()


def until(what: Callable[[], Any], deadline_s: float = DEADLINE_S) -> Any:
    """Poll ``what`` until it returns something true; its last value."""
    deadline = time.monotonic() + deadline_s
    while not (got := what()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)
    return got


def setup_cdc(url: str, ddl: str, table: str = "t") -> tuple[Any, cdc.UpstreamTable, int]:
    """The table made, introspected, REPLICA IDENTITY FULL, published, and a slot: the
    upstream connection, the table and the slot's start LSN."""
    run(url, ddl)
    conn = cdc.connect(url)
    t = cdc.introspect(conn, cdc.TableRef.parse(table))
    cdc.ensure_replica_identity_full(conn, t)
    cdc.ensure_publication(conn, t, "p")
    return conn, t, cdc.ensure_slot(conn, "s")


def drain(stream: cdc.ChangeStream, count: int) -> list[Transaction]:
    """At least ``count`` transactions, polled with a deadline."""
    got: list[Transaction] = []
    deadline = time.monotonic() + DEADLINE_S
    while len(got) < count:
        assert time.monotonic() < deadline, f"{len(got)} of {count} transactions"
        got.extend(stream.poll(0.2).transactions)
    return got


# -- introspection --------------------------------------------------------------------

ALL_TYPES = """
CREATE TABLE every (
  k text, n int, s smallint NOT NULL, b bigint, d double precision, x numeric(12, 3),
  v varchar(20), f boolean, day date, ts timestamp, tz timestamptz, j jsonb, raw bytea,
  PRIMARY KEY (k, n)
)"""


def test_introspection_maps_every_type(upstream: str) -> None:
    run(
        upstream,
        ALL_TYPES,
        "CREATE TABLE gen (id int PRIMARY KEY, g int GENERATED ALWAYS AS (id * 2) STORED)",
    )
    with cdc.connect(upstream) as conn:
        t = cdc.introspect(conn, cdc.TableRef.parse("public.every"))
        g = cdc.introspect(conn, cdc.TableRef.parse("gen"))
    C = ColumnType
    assert t.schema.columns == (
        Column("k", C.TEXT, False),
        Column("n", C.INT, False),
        Column("s", C.SMALLINT, False),
        Column("b", C.BIGINT),
        Column("d", C.DOUBLE),
        Column("x", C.NUMERIC),
        Column("v", C.TEXT),
        Column("f", C.BOOLEAN),
        Column("day", C.DATE),
        Column("ts", C.TIMESTAMP),
        Column("tz", C.TIMESTAMPTZ),
        Column("j", C.JSONB),
        Column("raw", C.BYTEA),
    )
    assert t.schema.primary_key == ("k", "n") and t.replica_identity == "d"
    assert t.key_of(("a", 1, *range(11))) == ("a", 1)
    # a generated column is not replicated: it is not ours either
    assert g.schema.names == ("id",)


def _error(url: str, table: str, **kwargs: Any) -> cdc.PgCdcError:
    with pytest.raises(cdc.PgCdcError) as e:
        conn = cdc.connect(url, **kwargs)
        try:
            cdc.introspect(conn, cdc.TableRef.parse(table))
        finally:
            conn.close()
    return e.value


def test_introspection_errors(upstream: str, pg_server_url: str) -> None:
    role = f"r_{uuid.uuid4().hex[:8]}"
    run(
        upstream,
        "CREATE TABLE nokey (a int)",
        "CREATE TABLE odd (id int PRIMARY KEY, u uuid)",
        "CREATE TABLE jkey (j jsonb PRIMARY KEY)",
        'CREATE TABLE "Mixed" (id int PRIMARY KEY, "Name" text)',
        "CREATE TABLE ok (id int PRIMARY KEY)",
        "CREATE VIEW v AS SELECT 1 AS id",
        f"CREATE ROLE {role} LOGIN",
        f"CREATE ROLE {role}_repl LOGIN REPLICATION",
    )
    try:
        assert isinstance(_error(upstream, "missing"), cdc.TableNotFound)
        assert isinstance(_error(upstream, "v"), cdc.TableNotFound)
        assert _error(upstream, "nokey").code == "cdc_no_primary_key"
        odd = _error(upstream, "odd")
        assert isinstance(odd, cdc.UnsupportedColumn)
        assert (odd.code, odd.column, odd.type_name) == ("cdc_unsupported_column", "u", "uuid")
        jkey = _error(upstream, "jkey")
        assert isinstance(jkey, cdc.UnsupportedColumn) and jkey.column == "j"
        # a name that is not an identifier of ours is refused, not mangled
        with pytest.raises(cdc.UnsupportedColumn) as mixed:
            conn = cdc.connect(upstream)
            conn.cursor().execute('CREATE TABLE cased (id int PRIMARY KEY, "Name" text)')
            cdc.introspect(conn, cdc.TableRef.parse("cased"))
        assert mixed.value.column == "Name"
        # no REPLICATION attribute; then REPLICATION but no SELECT on the table
        plain = _error(upstream, "ok", user=role)
        assert plain.code == "cdc_insufficient_privilege"
        assert _error(upstream, "ok", user=f"{role}_repl").code == "cdc_insufficient_privilege"
        # the first embedded server runs with wal_level = replica
        off = _error(to_libpq_url(pg_server_url), "ok")
        assert isinstance(off, cdc.LogicalReplicationOff)
        assert off.code == "cdc_logical_replication_off"
        assert "wal_level = logical" in str(off)  # the advice is for people
        gone = _error("postgresql:///postgres?host=/nonexistent-socket-dir", "ok")
        assert gone.code == "cdc_upstream_unreachable"
    finally:
        run(upstream, f"DROP ROLE {role}", f"DROP ROLE {role}_repl")


@pytest.mark.parametrize("text", ["a.b.c", "Public.t", "t;drop", 'x"y', ""])
def test_table_names_are_identifiers(text: str) -> None:
    with pytest.raises(ValueError):
        cdc.TableRef.parse(text)


# -- publication, slot, replica identity ----------------------------------------------


def test_publication_slot_and_identity_are_idempotent(upstream: str) -> None:
    run(
        upstream,
        "CREATE TABLE t (id int PRIMARY KEY, v text)",
        "CREATE TABLE other (id int PRIMARY KEY)",
        "CREATE PUBLICATION theirs FOR TABLE t, other",
        "CREATE PUBLICATION inserts_only FOR TABLE t WITH (publish = 'insert')",
        "CREATE PUBLICATION elsewhere FOR TABLE other",
        "CREATE PUBLICATION some_rows FOR TABLE t WHERE (id > 5)",
        "CREATE PUBLICATION some_cols FOR TABLE t (id)",
        "CREATE PUBLICATION everything FOR ALL TABLES",
        "SELECT pg_create_physical_replication_slot('wrong_kind')",
    )
    conn = cdc.connect(upstream)
    t = cdc.introspect(conn, cdc.TableRef.parse("t"))
    with pytest.raises(cdc.ReplicaIdentityNotFull):
        cdc.ensure_replica_identity_full(conn, t, alter=False)
    cdc.ensure_replica_identity_full(conn, t)
    cdc.ensure_replica_identity_full(conn, t, alter=False)
    assert cdc.introspect(conn, t.ref).replica_identity == "f"

    assert cdc.ensure_publication(conn, t, "mvb_t") is True
    assert cdc.ensure_publication(conn, t, "mvb_t") is False
    for named in ("theirs", "everything"):
        assert cdc.ensure_publication(conn, t, named, create=False) is False
    for bad in ("inserts_only", "elsewhere", "some_rows", "some_cols", "absent"):
        with pytest.raises(cdc.PublicationMismatch) as e:
            cdc.ensure_publication(conn, t, bad, create=False)
        assert e.value.code == "cdc_publication_mismatch"
    cdc.drop_publication(conn, "mvb_t")
    cdc.drop_publication(conn, "mvb_t")
    assert cdc.ensure_publication(conn, t, "mvb_t") is True

    start = cdc.ensure_slot(conn, "mvb_s")
    run(upstream, "INSERT INTO t VALUES (1, 'a')")
    assert cdc.ensure_slot(conn, "mvb_s") == start  # the same slot, not a new one
    state = cdc.slot_state(conn, "mvb_s")
    assert state is not None and state.confirmed_flush_lsn == start and state.lag_bytes > 0
    with pytest.raises(cdc.SlotMismatch):
        cdc.ensure_slot(conn, "wrong_kind")
    # dropping a slot a stream holds ends the stream's connection
    stream = cdc.ChangeStream(upstream, t, slot="mvb_s", publication="mvb_t")
    assert [c.new_row for c in drain(stream, 1)[0].changes] == [(1, "a")]
    cdc.drop_slot(conn, "mvb_s")
    cdc.drop_slot(conn, "mvb_s")
    assert cdc.slot_state(conn, "mvb_s") is None
    with pytest.raises(cdc.UpstreamUnreachable):
        until(lambda: stream.poll(0.1) and False)
    stream.close()
    for name in ("bad name", "Upper", "x" * 64):
        with pytest.raises(ValueError):
            cdc.ensure_slot(conn, name)
        with pytest.raises(ValueError):
            cdc.ensure_publication(conn, t, name)
    conn.close()


def test_only_the_owner_makes_the_publication_and_identity(upstream: str) -> None:
    role = f"r_{uuid.uuid4().hex[:8]}"
    run(
        upstream,
        "CREATE TABLE t (id int PRIMARY KEY)",
        f"CREATE ROLE {role} LOGIN REPLICATION",
        f"GRANT SELECT ON t TO {role}",
    )
    try:
        conn = cdc.connect(upstream, user=role)
        t = cdc.introspect(conn, cdc.TableRef.parse("t"))
        with pytest.raises(cdc.InsufficientPrivilege):
            cdc.ensure_replica_identity_full(conn, t)
        with pytest.raises(cdc.InsufficientPrivilege):
            cdc.ensure_publication(conn, t, "mine")
        conn.close()
    finally:
        run(upstream, f"DROP OWNED BY {role}", f"DROP ROLE {role}")


# -- the change stream ----------------------------------------------------------------


def test_stream_delivers_every_kind_of_change_in_lsn_order(upstream: str) -> None:
    conn, t, start = setup_cdc(upstream, "CREATE TABLE t (id int PRIMARY KEY, v text, big text)")
    big = "SELECT string_agg(md5(i::text), '') FROM generate_series(1, 400) i"
    run(
        upstream,
        f"INSERT INTO t VALUES (1, 'a', NULL), (2, 'b', ({big}))",
        "UPDATE t SET v = 'bb' WHERE id = 2",  # big stays: TOASTed and unchanged
        "UPDATE t SET id = 3 WHERE id = 1",  # a key change
        "DELETE FROM t WHERE id = 3",
        "BEGIN; INSERT INTO t VALUES (5, NULL, 'x'); UPDATE t SET v = 'e' WHERE id = 5; COMMIT",
        "TRUNCATE t",
    )
    with cdc.connect(upstream).cursor() as cur:
        cur.execute(big)
        (big_value,) = cur.fetchone()
    with cdc.ChangeStream(upstream, t, slot="s", publication="p", skip_upto=start) as stream:
        txns = drain(stream, 6)
    assert len(txns) == 6
    lsns = [x.lsn for x in txns]
    assert lsns == sorted(set(lsns)) and lsns[0] > start
    assert all(x.commit_lsn < x.lsn for x in txns)
    ins, upd, dele = Op.INSERT, Op.UPDATE, Op.DELETE
    assert [x.changes for x in txns] == [
        (
            RowChange(ins, None, (1,), None, (1, "a", None)),
            RowChange(ins, None, (2,), None, (2, "b", big_value)),
        ),
        (RowChange(upd, (2,), (2,), (2, "b", big_value), (2, "bb", big_value)),),
        (RowChange(upd, (1,), (3,), (1, "a", None), (3, "a", None)),),
        (RowChange(dele, (3,), None, (3, "a", None), None),),
        (
            RowChange(ins, None, (5,), None, (5, None, "x")),
            RowChange(upd, (5,), (5,), (5, None, "x"), (5, "e", "x")),
        ),
        (TruncateChange(False, False),),
    ]
    assert [(e.op, e.key) for e in txns[2].cdc_events()] == [(dele, (1,)), (ins, (3,))]
    conn.close()


def test_slot_confirms_only_when_told_and_restarts_there(upstream: str) -> None:
    conn, t, start = setup_cdc(upstream, "CREATE TABLE t (id int PRIMARY KEY)")
    run(upstream, *(f"INSERT INTO t VALUES ({i})" for i in range(1, 5)))

    def confirmed() -> int:
        state = cdc.slot_state(conn, "s")
        assert state is not None
        return state.confirmed_flush_lsn

    stream = cdc.ChangeStream(upstream, t, slot="s", publication="p", status_interval_s=1)
    txns = drain(stream, 4)
    # read all, polled across a status update (one a second): nothing confirmed
    stream.poll(1.5)
    assert confirmed() == start
    stream.confirm(txns[1].lsn)
    until(lambda: confirmed() == txns[1].lsn)
    stream.confirm(txns[0].lsn)  # never backwards
    stream.poll(0.2)
    assert confirmed() == txns[1].lsn
    stream.close()
    # a restart re-reads from the confirmed LSN: the third transaction first
    with cdc.ChangeStream(upstream, t, slot="s", publication="p") as again:
        assert [x.lsn for x in drain(again, 2)] == [x.lsn for x in txns[2:]]
    # the caller skips what it applied already
    with cdc.ChangeStream(upstream, t, slot="s", publication="p", skip_upto=txns[2].lsn) as s3:
        assert [x.lsn for x in drain(s3, 1)] == [txns[3].lsn]
    # lag: the WAL since the confirmed LSN, at least the two transactions not confirmed
    before = cdc.slot_state(conn, "s")
    assert before is not None and before.lag_bytes >= txns[3].lsn - txns[1].lsn
    with cdc.ChangeStream(upstream, t, slot="s", publication="p") as s4:
        s4.confirm(txns[3].lsn)
        s4.poll(0.1)
        after = until(
            lambda: (
                (st := cdc.slot_state(conn, "s")) and st.confirmed_flush_lsn == txns[3].lsn and st
            )
        )
    assert after.lag_bytes >= 0  # the WAL written since (none of ours)
    conn.close()


def test_a_broken_stream_connects_again_and_skips_what_it_delivered(upstream: str) -> None:
    conn, t, start = setup_cdc(upstream, "CREATE TABLE t (id int PRIMARY KEY)")
    run(upstream, "INSERT INTO t VALUES (1)", "INSERT INTO t VALUES (2)")
    stream = cdc.ChangeStream(upstream, t, slot="s", publication="p", skip_upto=start)
    first = drain(stream, 2)
    # the walsender ends: nothing is confirmed, so the slot would send both again
    state = until(lambda: cdc.slot_state(conn, "s"))
    with conn.cursor() as cur:
        cur.execute("SELECT pg_terminate_backend(%s)", [state.active_pid])
    with pytest.raises(cdc.UpstreamUnreachable) as e:
        until(lambda: stream.poll(0.1) and False)
    assert e.value.code == "cdc_upstream_unreachable"
    run(upstream, "INSERT INTO t VALUES (3)")
    again = drain(stream, 1)
    assert [c.new_key for x in first + again for c in x.changes] == [(1,), (2,), (3,)]
    assert first[-1].lsn < again[0].lsn
    stream.close()
    conn.close()


def test_a_schema_change_upstream_ends_the_stream_after_what_came_before(upstream: str) -> None:
    conn, t, start = setup_cdc(upstream, "CREATE TABLE t (id int PRIMARY KEY)")
    run(
        upstream,
        "INSERT INTO t VALUES (1)",
        "ALTER TABLE t ADD COLUMN v text",
        "INSERT INTO t VALUES (2, 'x')",
    )
    with cdc.ChangeStream(upstream, t, slot="s", publication="p", skip_upto=start) as stream:
        (before,) = drain(stream, 1)
        assert [c.new_row for c in before.changes] == [(1,)]
        with pytest.raises(cdc.UpstreamSchemaChanged) as e:
            until(lambda: stream.poll(0.1) and False)
        assert e.value.code == "cdc_upstream_schema_changed"
        with pytest.raises(cdc.UpstreamSchemaChanged) as again:
            stream.poll()  # for good: the table must be set up again
        assert again.value is e.value
    conn.close()


def test_stream_and_chunk_reads_give_the_same_values(upstream: str) -> None:
    conn, t, start = setup_cdc(upstream, ALL_TYPES, "every")
    run(
        upstream,
        "INSERT INTO every VALUES ('B', 1, -32768, 9223372036854775807, 0.1, 1234.5,"
        " 'v\u00e9', true, '2024-02-29', '2024-02-29 12:34:56.789',"
        " '2024-02-29 12:34:56.000001+05:30', '{\"a\": [1, 2.5, null]}', '\\x00ff'),"
        " ('a', 2, 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL),"
        " ('\u00e9', 0, 1, 1, -1e300, -0.001, '', false, '0001-01-01', '1999-12-31 23:59:59',"
        " '1970-01-01 00:00:00+00', '[]', '\\x')",
    )
    with cdc.ChangeStream(upstream, t, slot="s", publication="p", skip_upto=start) as stream:
        (txn,) = drain(stream, 1)
    streamed = {c.new_key: c.new_row for c in txn.changes if isinstance(c, RowChange)}
    chunk = cdc.read_chunk(conn, t, ChunkRead(1, None, 10), low=start)
    assert chunk.ended and len(chunk.rows) == 3
    assert {t.key_of(r): r for r in chunk.rows} == streamed
    # keys in Python's order (text compared bytewise, as COLLATE "C")
    assert [t.key_of(r) for r in chunk.rows] == sorted(streamed)
    first = streamed[("B", 1)]
    assert first == (
        "B",
        1,
        -32768,
        2**63 - 1,
        0.1,
        Decimal("1234.500"),
        "v\u00e9",
        True,
        dt.date(2024, 2, 29),
        dt.datetime(2024, 2, 29, 12, 34, 56, 789000),
        dt.datetime(2024, 2, 29, 7, 4, 56, 1, tzinfo=dt.UTC),
        {"a": [1, 2.5, None]},
        b"\x00\xff",
    )
    conn.close()


# -- chunk reads ----------------------------------------------------------------------


class _HookCursor(psycopg2.extensions.cursor):
    """Runs ``hook`` after each chunk statement, inside the read's transaction."""

    hook: Callable[[], None] | None = None

    def execute(self, query: Any, vars: Any = None) -> None:
        super().execute(query, vars)
        if _HookCursor.hook is not None and isinstance(query, sql.Composable):
            _HookCursor.hook()  # the chunk's statement is the one composed


def test_chunks_in_key_order_with_watermarks_while_a_writer_writes(upstream: str) -> None:
    conn, t, start = setup_cdc(upstream, "CREATE TABLE t (k text PRIMARY KEY, v int)")
    keys = ["a", "B", "\u00e9", "Z", "ab", "b", "A", "\u00c9", "aa", "0"]
    with cdc.connect(upstream).cursor() as cur:
        cur.execute("INSERT INTO t SELECT k, 0 FROM unnest(%s) k", [keys])
    reader = cdc.connect(upstream, cursor_factory=_HookCursor)
    writer = psycopg2.connect(upstream)
    writer.autocommit = True
    wcur = writer.cursor()
    wcur.execute("SET lock_timeout = '10s'")
    written: list[int] = []

    def write() -> None:
        # runs while the chunk's transaction is open: it must not wait for it
        wcur.execute(
            "UPDATE t SET v = v + 1 WHERE k = 'a' RETURNING (pg_current_wal_insert_lsn() - '0/0')::bigint"
        )
        written.append(wcur.fetchone()[0])

    _HookCursor.hook = write
    try:
        got: list[Row] = []
        after: Row | None = None
        lows_highs = []
        while True:
            low = int(until(lambda: cdc.slot_state(conn, "s")).confirmed_flush_lsn)
            c = cdc.read_chunk(reader, t, ChunkRead(len(lows_highs) + 1, after, 3), low=low)
            lows_highs.append((c.low, c.high))
            got.extend((len(lows_highs) - 1, *r) for r in c.rows)
            if c.ended:
                break
            after = t.key_of(c.rows[-1])
    finally:
        _HookCursor.hook = None
    assert [r[1] for r in got] == sorted(keys)  # bytewise: '0' < 'A' < 'B' < 'Z' < 'a' ...
    # this server's collation is C.UTF-8 (code point order, as bytewise): the statement
    # says COLLATE "C" for upstreams whose default collation orders otherwise
    assert 'ORDER BY "src"."k" COLLATE "C" LIMIT' in cdc.chunk_query(t, True).as_string(conn)
    assert len(written) == len(lows_highs) == 4
    # each read's snapshot holds the writer's updates made while the chunks before were
    # open, not the one made while it was (after its statement), whose commit is below
    # the read's high watermark
    ((chunk, value),) = [(r[0], r[2]) for r in got if r[1] == "a"]
    assert value == chunk > 0
    for (low, high), at in zip(lows_highs, written, strict=True):
        assert start <= low <= at <= high
    reader.close()
    writer.close()
    conn.close()


def test_a_chunk_read_waits_for_delivered_transactions_to_be_visible(upstream: str) -> None:
    """A transaction the stream delivered is due in the read's snapshot: one its
    snapshot does not see (here: an xid not yet committed, as a commit whose WAL is
    written but not yet made visible looks) is waited for, then refused."""
    conn, t, start = setup_cdc(upstream, "CREATE TABLE t (id int PRIMARY KEY)")
    open_tx = psycopg2.connect(upstream)
    with open_tx.cursor() as cur:
        cur.execute("SELECT txid_current() % (2^32)::bigint")
        (xid,) = cur.fetchone()
    delivered = cdc.DeliveredTransactions()
    delivered.add(int(xid), start)
    with pytest.raises(cdc.SnapshotBehind) as e:
        cdc.read_chunk(conn, t, ChunkRead(1, None, 5), low=start, delivered=delivered, wait_s=0.2)
    assert e.value.code == "cdc_snapshot_behind"
    open_tx.commit()
    rows = cdc.read_chunk(conn, t, ChunkRead(1, None, 5), low=start, delivered=delivered)
    assert rows.rows == [] and rows.ended and len(delivered) == 0
    open_tx.close()
    conn.close()


# -- the executor driven by the real stream and chunk reads ---------------------------


def test_cdc_backfill_over_a_live_writer_ends_equal_to_the_upstream(upstream: str) -> None:
    """The executor driven by the real stream and chunk reads beside a writer (inserts,
    updates, deletes, key changes, multi-statement transactions), with a crash and a
    restore from the last committed epoch midway."""
    conn, t, start = setup_cdc(upstream, "CREATE TABLE t (id int PRIMARY KEY, v int)")
    run(upstream, "INSERT INTO t SELECT i, 0 FROM generate_series(1, 400, 2) i")
    done = threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        rng = random.Random(36)
        w = psycopg2.connect(upstream)
        w.autocommit = True
        try:
            with w.cursor() as cur:
                for i in range(600):
                    random_change(cur, rng, 500, i)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)
        finally:
            w.close()
            done.set()

    ours: dict[Row, Row] = {}

    def apply(writes: list[CdcWrite]) -> None:
        for w in writes:
            if w.row is None:
                ours.pop(w.key, None)
            else:
                ours[w.key] = w.row

    ex = CdcBackfill(1, t.key_of, start_lsn=start)
    epochs = 0

    def barrier() -> CdcBarrierOutput:
        nonlocal epochs
        epochs += 1
        return ex.on_barrier(Barrier(EpochPair(epoch(epochs - 1), epoch(epochs))))

    def upstream_now() -> dict[Row, Row]:
        c = cdc.read_chunk(conn, t, ChunkRead(1, None, 10_000), low=0)
        return {t.key_of(r): r for r in c.rows}

    thread = threading.Thread(target=writer)
    stream = cdc.ChangeStream(upstream, t, slot="s", publication="p", skip_upto=start)
    barrier()
    thread.start()
    deadline = time.monotonic() + 120
    final: dict[Row, Row] | None = None
    committed = (dict(ours), ex.progress)
    crashed = False
    try:
        while True:
            assert time.monotonic() < deadline, "the backfill did not catch up"
            batch = stream.poll(0.05, max_transactions=20)
            apply(ex.on_changes(batch.cdc_events(), upto=batch.position))
            for read in ex.plan_reads(7):
                rows = cdc.read_chunk(
                    conn, t, read, low=ex.planned_at_lsn, delivered=stream.delivered
                )
                apply(ex.account(read, rows))
            out = barrier()
            if epochs % 3 == 0:
                # a checkpoint commits the epoch (our table and progress); then the slot
                # may confirm the LSN recorded with it
                committed = (dict(ours), CdcProgress.from_row(out.progress["table"][0]))
                stream.confirm(out.lsn)
            if epochs == 10 and not crashed:
                # a crash: back to the last committed epoch; the slot resends from its
                # confirmed LSN, the stream skips what that epoch holds already
                crashed = True
                stream.close()
                ours.clear()
                ours.update(committed[0])
                ex = CdcBackfill(1, t.key_of, restore=committed[1])
                stream = cdc.ChangeStream(
                    upstream, t, slot="s", publication="p", skip_upto=committed[1].lsn
                )
                barrier()
            if done.is_set() and final is None:
                final = upstream_now()
            if final is not None and ex.finished and ours == final:
                break
    finally:
        thread.join()
        stream.close()
    assert not errors
    assert crashed and ex.finished and ex.chunks > 1
    assert ours == upstream_now()
    conn.close()
