"""CDC tables through the API and a worker's actor (issue 36): a table of ours mirroring
an upstream Postgres table (``logical_pg_url``, a second embedded server with
``wal_level = logical``). The create mirrors the schema and writes nothing on a 4xx; DML
into it is refused; the drop takes its slot and publication along; and the actor
(``spark_workers.cdc_actor``), driven with the meta by hand, writes like DML so every
committed epoch's table equals the upstream at the LSN recorded with it, across a
restore, while the slot confirms no further than that LSN."""

from __future__ import annotations

import random
import time
from dataclasses import replace
from typing import Any

import psycopg2
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from backfill_core.executors.cdc import ChunkRead
from backfill_core.protocol import Assignment, BarrierMessage
from connectors import pg_cdc as cdc
from service.catalog.models import CdcEpoch, CdcTable, Graph, Relation
from service.catalog.queries import get_relation, storage_of, table_row_count
from service.db import Database, raw_cursor
from service.embedded_pg import to_libpq_url
from service.meta.loop import MetaLoop
from spark_workers import cdc_actor
from spark_workers.actors import ActorFailed
from spark_workers.cdc_actor import CdcRunner
from tests.integration.test_pg_cdc import run
from tests.kit.meta import FakeWorker
from tests.kit.pg_logical import random_change

pytestmark = pytest.mark.db

DEADLINE_S = 60.0


def _pg(dsn: str, table: str = "public.orders", **extra: Any) -> dict[str, Any]:
    return {"name": "orders", "postgres": {"dsn": dsn, "table": table, **extra}}


def _upstream_objects(url: str) -> tuple[list[str], list[str]]:
    """The upstream's slots (of its database) and publications."""
    conn = psycopg2.connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT slot_name FROM pg_replication_slots WHERE database = current_database()"
            )
            slots = sorted(r[0] for r in cur.fetchall())
            cur.execute("SELECT pubname FROM pg_publication")
            pubs = sorted(r[0] for r in cur.fetchall())
    finally:
        conn.close()
    return slots, pubs


def _nothing_written(db: Database, url: str) -> None:
    with db.transaction() as s:
        assert s.execute(select(Relation.name)).scalars().all() == []
        assert s.execute(select(CdcTable.relation_id)).scalars().all() == []
    assert _upstream_objects(url) == ([], [])


@pytest.fixture
def api(manual: tuple[TestClient, MetaLoop]) -> TestClient:
    return manual[0]


def test_create_mirrors_the_schema_refuses_dml_and_drop_takes_slot_and_publication(
    api: TestClient, db: Database, upstream: str
) -> None:
    run(
        upstream,
        "CREATE TABLE orders (id bigint, region text, amount numeric(10, 2) NOT NULL, "
        "at timestamptz, PRIMARY KEY (region, id))",
    )
    r = api.post("/v1/tables", json=_pg(upstream))
    assert r.status_code == 201, r.text
    body = r.json()
    assert [(c["name"], c["type"], c["nullable"]) for c in body["columns"]] == [
        ("id", "bigint", False),
        ("region", "text", False),
        ("amount", "numeric", False),
        ("at", "timestamptz", True),
    ]
    assert body["primary_key"] == ["region", "id"]
    pg = body["postgres"]
    assert pg["table"] == "public.orders" and pg["job_id"] is not None
    assert "dsn" not in pg and "password" not in r.text.lower()
    assert api.get("/v1/tables/orders").json()["postgres"] == pg
    slots, pubs = _upstream_objects(upstream)
    assert slots == [pg["slot"]] and pubs == [pg["publication"]]
    # its job: kind cdc, one actor; it cannot be dropped, nor rescaled, on its own
    job = api.get(f"/v1/jobs/{pg['job_id']}").json()
    assert job["kind"] == "cdc" and job["upstream"] == {"postgres": "public.orders"}
    assert job["mv_table"] == "orders" and job["parallelism"] == 1
    r = api.delete(f"/v1/jobs/{pg['job_id']}")
    assert r.status_code == 409 and r.json()["error"]["code"] == "job_is_cdc", r.text
    r = api.patch(f"/v1/jobs/{pg['job_id']}", json={"parallelism": 2})
    assert r.status_code == 409 and r.json()["error"]["code"] == "job_is_cdc", r.text
    # its rows change only upstream
    ops = {"ops": [{"op": "insert", "row": {"id": 1, "region": "eu", "amount": "1.00"}}]}
    r = api.post("/v1/tables/orders/dml", json=ops)
    assert r.status_code == 409 and r.json()["error"]["code"] == "table_is_mirrored", r.text
    r = api.post(
        "/v1/tables/orders/dml",
        content=b"id,region,amount\n1,eu,1.00\n",
        headers={"Content-Type": "text/csv"},
    )
    assert r.status_code == 409 and r.json()["error"]["code"] == "table_is_mirrored", r.text
    r = api.post("/v1/tables/orders/imports", json={"format": "csv", "path": "/tmp/x"})
    assert r.status_code == 409 and r.json()["error"]["code"] == "table_is_mirrored", r.text
    assert api.get("/v1/imports").json() == {"imports": []}
    # a second one of the same name: 409, and nothing more upstream
    assert api.post("/v1/tables", json=_pg(upstream)).status_code == 409
    assert _upstream_objects(upstream) == ([pg["slot"]], [pg["publication"]])
    # drop: the job, the table, the slot and the publication the service made
    assert api.delete("/v1/tables/orders").status_code == 204
    assert api.get(f"/v1/jobs/{pg['job_id']}").status_code == 404
    _nothing_written(db, upstream)


def test_named_publication_and_slot_are_used_and_left(
    api: TestClient, db: Database, upstream: str
) -> None:
    run(
        upstream,
        "CREATE TABLE orders (id int PRIMARY KEY, v text)",
        "ALTER TABLE orders REPLICA IDENTITY FULL",
        "CREATE PUBLICATION mine FOR TABLE orders",
        "SELECT pg_create_logical_replication_slot('mine_"
        + upstream.rsplit("/", 1)[1][:12]
        + "', 'pgoutput')",
    )
    slot = "mine_" + upstream.rsplit("/", 1)[1][:12]
    r = api.post("/v1/tables", json=_pg(upstream, publication="mine", slot=slot))
    assert r.status_code == 201, r.text
    assert r.json()["postgres"] | {"host": "", "job_id": 0} == {
        "host": "",
        "job_id": 0,
        "table": "public.orders",
        "publication": "mine",
        "slot": slot,
    }
    assert api.delete("/v1/tables/orders").status_code == 204
    assert _upstream_objects(upstream) == ([slot], ["mine"])  # the user's: left


@pytest.mark.parametrize(
    ("ddl", "table", "extra", "status", "code", "details"),
    [
        ("CREATE TABLE orders (id int, v text)", "orders", {}, 422, "cdc_no_primary_key", {}),
        (
            "CREATE TABLE orders (id int PRIMARY KEY, spot point)",
            "orders",
            {},
            422,
            "cdc_unsupported_column",
            {"column": "spot", "type": "point"},
        ),
        ("", "public.missing", {}, 422, "cdc_table_not_found", {"field": "postgres.table"}),
        ("", "not a table!", {}, 422, "invalid", {"field": "postgres.table"}),
        (
            "CREATE TABLE orders (id int PRIMARY KEY)",
            "orders",
            {"publication": "nope"},
            422,
            "cdc_publication_mismatch",
            {"field": "postgres.publication"},
        ),
        (
            "CREATE TABLE orders (id int PRIMARY KEY)",
            "orders",
            {"slot": "nope"},
            422,
            "invalid",
            {"field": "postgres.slot"},
        ),
    ],
)
def test_a_bad_upstream_is_a_clear_4xx_that_writes_nothing(
    api: TestClient,
    db: Database,
    upstream: str,
    ddl: str,
    table: str,
    extra: dict[str, Any],
    status: int,
    code: str,
    details: dict[str, Any],
) -> None:
    if ddl:
        run(upstream, ddl)
    r = api.post("/v1/tables", json=_pg(upstream, table, **extra))
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == code, r.text
    assert details.items() <= err["details"].items(), r.text
    _nothing_written(db, upstream)


def test_wal_level_privilege_unreachable_and_body_shapes(
    api: TestClient, db: Database, upstream: str, pg_server_url: str
) -> None:
    # the catalog's own server: wal_level = replica
    r = api.post("/v1/tables", json=_pg(to_libpq_url(pg_server_url), "public.relations"))
    assert r.status_code == 422, r.text
    assert r.json()["error"]["code"] == "cdc_logical_replication_off"
    assert "wal_level = logical" in r.json()["error"]["message"]
    # a role that may not replicate
    run(upstream, "CREATE TABLE orders (id int PRIMARY KEY)")
    role = "r" + upstream.rsplit("/", 1)[1].split("?")[0][-10:]
    run(upstream, f"CREATE ROLE {role} LOGIN PASSWORD 'sekrit-pw'")
    base, _, query = upstream.partition("?")
    scheme, rest = base.split("://", 1)
    hostpart = rest.split("@", 1)[-1]
    as_role = f"{scheme}://{role}:sekrit-pw@{hostpart}" + (f"?{query}" if query else "")
    r = api.post("/v1/tables", json=_pg(as_role, "public.orders"))
    assert r.status_code == 422, r.text
    assert r.json()["error"]["code"] == "cdc_insufficient_privilege"
    assert "sekrit-pw" not in r.text
    run(upstream, f"DROP ROLE {role}")
    # nobody there
    r = api.post(
        "/v1/tables",
        json=_pg("postgresql://u:sekrit-pw@127.0.0.1:1/none?connect_timeout=2", "orders"),
    )
    assert r.status_code == 422, r.text
    assert r.json()["error"]["code"] == "cdc_upstream_unreachable"
    assert "sekrit-pw" not in r.text
    # not a DSN: not echoed
    r = api.post("/v1/tables", json=_pg("host='unterminated sekrit-pw", "orders"))
    assert r.status_code == 422 and "sekrit-pw" not in r.text, r.text
    # exactly one of the two shapes
    both = _pg(upstream) | {"columns": [{"name": "id", "type": "int"}], "primary_key": ["id"]}
    r = api.post("/v1/tables", json=both)
    assert r.status_code == 422 and "either" in r.text, r.text
    r = api.post("/v1/tables", json={"name": "orders"})
    assert r.status_code == 422 and "postgres" in r.text, r.text
    _nothing_written(db, upstream)


# -- the actor, driven with the meta by hand ---------------------------------------------


class Oracle:
    """Every committed upstream transaction with its commit LSN, from a slot of the
    test's own (made before any row): the upstream table at any LSN, replayed."""

    def __init__(self, url: str) -> None:
        self.conn = cdc.connect(url)
        self.table = cdc.introspect(self.conn, cdc.TableRef.parse("t"))
        cdc.ensure_replica_identity_full(self.conn, self.table)
        cdc.ensure_publication(self.conn, self.table, "oracle")
        start = cdc.ensure_slot(self.conn, "oracle_" + url.rsplit("/", 1)[1][:16])
        self.stream = cdc.ChangeStream(
            url,
            self.table,
            slot="oracle_" + url.rsplit("/", 1)[1][:16],
            publication="oracle",
            skip_upto=start,
        )
        self.log: list[tuple[int, Any]] = []  # (lsn, event)

    def catch_up(self, lsn: int) -> None:
        deadline = time.monotonic() + DEADLINE_S
        while self.stream.position < lsn:
            assert time.monotonic() < deadline, "the oracle's stream did not get there"
            batch = self.stream.poll(0.1)
            self.log += [(e.lsn, e) for e in batch.cdc_events()]

    def at(self, lsn: int) -> dict[tuple[Any, ...], tuple[Any, ...]]:
        self.catch_up(lsn)
        rows: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        for at, e in self.log:
            if at > lsn:
                break
            if e.row is None:
                rows.pop(e.key, None)
            else:
                rows[e.key] = e.row
        return rows

    def close(self) -> None:
        self.stream.close()
        self.conn.close()

    def nothing_between(self, recorded: int, confirmed: int) -> bool:
        """No change of the table committed in ``(recorded, confirmed]``: a slot
        confirmed there loses nothing the committed epoch lacks. (psycopg2 confirms a
        keepalive's WAL end once everything it received is confirmed: beyond the
        recorded LSN, but with no change of the table in between.)"""
        if confirmed <= recorded:
            return True
        self.catch_up(confirmed)
        return not any(recorded < at <= confirmed for at, _ in self.log)


def _burst(cur: Any, rng: random.Random, n: int, step: int) -> None:
    """``n`` upstream transactions: inserts, updates, deletes, key changes, several
    statements in one."""
    for i in range(n):
        random_change(cur, rng, 700, step * 1000 + i)


def _ours_at(db: Database, epoch: int) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    with db.transaction() as s:
        table = storage_of(get_relation(s, "t"))
        rows = table.snapshot(raw_cursor(s), epoch, (0, table.schema.vnode_count))
        return {table.key_of(r): r for _, r in rows}


def _recorded(db: Database) -> tuple[int, CdcEpoch | None]:
    """The committed epoch and what was recorded at or below it (LSN and position)."""
    with db.transaction() as s:
        committed = s.execute(select(Graph.committed_epoch).where(Graph.id == 1)).scalar_one()
        rec = s.execute(
            select(CdcEpoch)
            .where(CdcEpoch.epoch <= committed)
            .order_by(CdcEpoch.epoch.desc())
            .limit(1)
        ).scalar_one_or_none()
        if rec is not None:
            s.expunge(rec)
    return committed, rec


def _upto(
    rows: dict[tuple[Any, ...], tuple[Any, ...]], rec: CdcEpoch
) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    """The upstream's rows our table holds at ``rec``: those up to its position."""
    if rec.state == "finished":
        return rows
    if rec.current_pos is None:
        return {}
    pos = tuple(rec.current_pos)
    return {k: v for k, v in rows.items() if k <= pos}


def _collect_all(worker: FakeWorker, runner: CdcRunner, conn: Any) -> None:
    for a in worker.poll():
        for b in a["barriers"]:
            out = runner.on_barrier(conn, BarrierMessage.from_json(b))
            extra = {
                k: v for k, v in out.to_json().items() if k in ("progress", "rows", "finished")
            }
            r = worker.collect(out.actor_id, b, **extra)
            assert r.status_code == 200, r.text


def test_the_actor_keeps_every_committed_epoch_equal_to_the_upstream_at_its_lsn(
    manual: tuple[TestClient, MetaLoop],
    db: Database,
    upstream: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Chunks of the backfill merged with the stream while the upstream changes, new
    incarnations restored from the durable progress midway: at every committed epoch the
    table equals the upstream at the LSN recorded with it (up to the position the
    backfill reached then), and the slot never confirmed beyond that LSN."""
    monkeypatch.setattr(cdc_actor, "CHUNK_ROWS", 40)  # many chunks
    api, loop = manual
    run(upstream, "CREATE TABLE t (id int PRIMARY KEY, v int)")
    oracle = Oracle(upstream)
    run(upstream, "INSERT INTO t SELECT i, 0 FROM generate_series(1, 600, 2) i")
    worker = FakeWorker(api).register()
    r = api.post("/v1/tables", json={"name": "t", "postgres": {"dsn": upstream, "table": "t"}})
    assert r.status_code == 201, r.text
    slot, job_id = r.json()["postgres"]["slot"], r.json()["postgres"]["job_id"]
    conn = psycopg2.connect(db.libpq_url)
    writer = psycopg2.connect(upstream)
    writer.autocommit = True
    upconn = cdc.connect(upstream)
    rng = random.Random(36)
    loop.tick()
    [a] = worker.poll()
    runner = CdcRunner(Assignment.from_json(a), conn)
    checked: set[int] = set()

    def check() -> tuple[int, CdcEpoch | None]:
        committed, rec = _recorded(db)
        if rec is not None and committed not in checked:
            checked.add(committed)
            ours = _ours_at(db, committed)
            assert ours == _upto(oracle.at(rec.lsn), rec)
            with db.transaction() as s:  # the row-count deltas, as DML keeps them
                assert table_row_count(s, get_relation(s, "t").id, committed) == len(ours)
            state = cdc.slot_state(upconn, slot)
            assert state is not None
            assert oracle.nothing_between(rec.lsn, state.confirmed_flush_lsn), (state, rec.lsn)
        return committed, rec

    try:
        with writer.cursor() as wcur:
            for step in range(45):
                loop.tick()
                _collect_all(worker, runner, conn)
                if step < 35:
                    _burst(wcur, rng, 6, step)
                for _ in range(2):
                    runner.step(conn)
                if step in (12, 25):
                    # a new incarnation (its worker killed): from the durable progress
                    saved = runner._saved
                    runner.close()
                    runner = CdcRunner(Assignment.from_json(worker.poll()[0]), conn)
                    assert runner.executor.progress == saved
                check()
        deadline = time.monotonic() + DEADLINE_S
        while True:  # quiescence: the backfill over, the table is the upstream's
            assert time.monotonic() < deadline, "the backfill did not end"
            loop.tick()
            _collect_all(worker, runner, conn)
            runner.step(conn)
            committed, rec = check()
            if rec is not None and rec.state == "finished" and rec.lsn >= runner.executor.lsn:
                break
        final = {oracle.table.key_of(r): r for r in _upstream_rows(upconn, oracle.table)}
        assert _ours_at(db, committed) == final
        assert len(checked) > 10
        progress = api.get(f"/v1/jobs/{job_id}/progress").json()["cdc"]
        assert progress["phase"] == "streaming" and progress["chunks"] > 5, progress
        assert progress["confirmed_lsn"] is not None, progress
        lag = f'backfill_cdc_slot_lag_bytes{{job_id="{job_id}",kind="cdc",name="cdc_t"}}'
        assert lag in api.get("/metrics").text
        rows = api.get("/v1/tables/t/rows", params={"limit": 1000}).json()["rows"]
        assert sorted((x["id"], x["v"]) for x in rows) == sorted(final.values())
    finally:
        runner.close()
        oracle.close()
        conn.close()
        writer.close()
        upconn.close()


def _upstream_rows(conn: Any, table: cdc.UpstreamTable) -> list[tuple[Any, ...]]:
    return list(cdc.read_chunk(conn, table, ChunkRead(1, None, 100_000), low=0).rows)


@pytest.mark.parametrize(
    ("change", "code", "fatal"),
    [
        ("TRUNCATE t", "cdc_truncate_unsupported", True),
        (
            "ALTER TABLE t ADD COLUMN w int; INSERT INTO t VALUES (99, 1, 1)",
            "cdc_upstream_schema_changed",
            True,
        ),
        ("unreachable", "cdc_upstream_unreachable", False),
    ],
)
def test_upstream_trouble_fails_the_actor_with_its_code(
    manual: tuple[TestClient, MetaLoop],
    db: Database,
    upstream: str,
    change: str,
    code: str,
    fatal: bool,
) -> None:
    """A TRUNCATE or a schema change upstream fails the job (fatal: trying again cannot
    help); an unreachable upstream fails the actor only, for the failure policy to retry
    with backoff. The error names the connector's code."""
    api, loop = manual
    run(upstream, "CREATE TABLE t (id int PRIMARY KEY, v int)", "INSERT INTO t VALUES (1, 1)")
    FakeWorker(api).register()
    r = api.post("/v1/tables", json={"name": "t", "postgres": {"dsn": upstream, "table": "t"}})
    assert r.status_code == 201, r.text
    loop.tick()
    conn = psycopg2.connect(db.libpq_url)
    worker = FakeWorker(api)
    worker.worker_id = 1
    [a] = worker.poll()
    runner = CdcRunner(Assignment.from_json(a), conn)
    try:
        runner.step(conn)
        if change == "unreachable":
            runner.close()
            bad = Assignment.from_json(a)
            ref = replace(bad.job.cdc, dsn="postgresql://u:sekrit@127.0.0.1:1/x?connect_timeout=2")
            runner = CdcRunner(replace(bad, job=replace(bad.job, cdc=ref)), conn)
        else:
            run(upstream, *change.split("; "))
        deadline = time.monotonic() + DEADLINE_S
        with pytest.raises(ActorFailed) as failed:
            while time.monotonic() < deadline:
                runner.step(conn)
        assert failed.value.fatal is fatal and str(failed.value).startswith(code), failed.value
        assert "sekrit" not in str(failed.value)
    finally:
        runner.close()
        conn.close()


def test_pause_resume_and_throttle_steer_the_chunk_reads(
    manual: tuple[TestClient, MetaLoop],
    db: Database,
    upstream: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Pause, resume and a rate limit reach the CDC actor as for every kind (a flow
    mutation at a barrier): paused, it reads no chunk; throttled, no epoch's chunks
    read more rows than the limit allows; resumed, the backfill ends. The job's generic
    progress counts the rows read against the upstream's row count."""
    monkeypatch.setattr(cdc_actor, "CHUNK_ROWS", 10)
    api, loop = manual
    run(upstream, "CREATE TABLE t (id int PRIMARY KEY, v int)")
    run(upstream, "INSERT INTO t SELECT i, 0 FROM generate_series(1, 200) i")
    worker = FakeWorker(api).register()
    r = api.post("/v1/tables", json={"name": "t", "postgres": {"dsn": upstream, "table": "t"}})
    assert r.status_code == 201, r.text
    job_id = r.json()["postgres"]["job_id"]
    conn = psycopg2.connect(db.libpq_url)
    loop.tick()
    [a] = worker.poll()
    runner = CdcRunner(Assignment.from_json(a), conn)

    def epoch_rounds(n: int) -> list[int]:
        """Rows read by chunks in each of ``n`` epochs (a barrier, then reads)."""
        read = []
        for _ in range(n):
            before = runner.executor.row_count
            loop.tick()
            _collect_all(worker, runner, conn)
            for _ in range(3):
                runner.step(conn)
            read.append(runner.executor.row_count - before)
        return read

    try:
        assert api.post(f"/v1/jobs/{job_id}/pause").status_code == 200
        paused = epoch_rounds(4)
        assert runner.executor.paused and paused[1:] == [0, 0, 0], paused
        r = api.patch(f"/v1/jobs/{job_id}", json={"rate_limit": 5})
        assert r.status_code == 200, r.text
        assert api.post(f"/v1/jobs/{job_id}/resume").status_code == 200
        throttled = epoch_rounds(6)
        assert runner.executor.rate_limit == 5 and not runner.executor.paused
        # the generic progress: the rows the chunks read, of the upstream's count
        progress = api.get(f"/v1/jobs/{job_id}/progress").json()
        assert progress["total_estimate"] == 200, progress
        assert 0 < progress["rows"] <= progress["cdc"]["rows"], progress
        assert 0 < progress["percent"] < 100, progress
        assert sum(throttled) > 0, throttled
        # a budget of rate x elapsed per epoch (the loop's ticks are ms apart); unthrottled,
        # an epoch's three rounds read three chunks of 10
        assert all(n <= 10 for n in throttled), throttled
        r = api.patch(f"/v1/jobs/{job_id}", json={"rate_limit": None})
        assert r.status_code == 200, r.text
        deadline = time.monotonic() + DEADLINE_S
        while not runner.executor.finished:
            assert time.monotonic() < deadline, "the backfill did not end once resumed"
            epoch_rounds(1)
        assert runner.executor.row_count == 200
        job = api.get(f"/v1/jobs/{job_id}").json()
        assert job["paused"] is False and job["rate_limit"] is None, job
    finally:
        runner.close()
        conn.close()
