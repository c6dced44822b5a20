"""End to end for CDC tables (issue 36): a control plane (restarted midway) and worker
processes (one killed with SIGKILL midway) mirror an upstream Postgres table
(``logical_pg_url``) that a writer changes all along (inserts, updates, deletes,
primary-key changes, several statements per transaction). At committed epochs the table
equals the upstream at the LSN recorded with them (replayed from a slot of the test's
own), the slot never confirms past that LSN, and a view over the table (default kind)
verifies against it."""

from __future__ import annotations

import os
import random
import signal
import threading
from typing import Any

import httpx
import psycopg2
import pytest

from backfill_core.executors.cdc import ChunkRead
from connectors import pg_cdc as cdc
from connectors.pg_cdc.upstream import APPLICATION_NAME
from service.db import Database
from service.settings import Settings
from spark_workers.settings import WorkerSettings
from tests.integration.test_cdc_tables import Oracle, _burst, _ours_at, _recorded, _upto
from tests.integration.test_pg_cdc import run
from tests.kit.auth import http_client
from tests.kit.e2e import assert_exact, running_cluster, wait_created, wait_for
from tests.kit.live import RestartableServer, worker_processes

pytestmark = [pytest.mark.slow, pytest.mark.db]

INITIAL = 12_000
RATE = 400  # rows/s of the backfill until lifted: the faults land mid-backfill


class UpstreamWriter:
    """Random transactions on the upstream until stopped."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.done = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        rng = random.Random(36)
        conn = psycopg2.connect(self.url)
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                step = 0
                while not self.stop.wait(0.02):
                    _burst(cur, rng, 3, step + 100)
                    step += 1
                    self.done += 3
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.errors.append(e)
        finally:
            conn.close()


def _job(http: httpx.Client, job: int) -> tuple[dict[str, Any], dict[str, Any]]:
    return http.get(f"/v1/jobs/{job}").json(), http.get(f"/v1/jobs/{job}/progress").json()


def test_cdc_table_is_exact_through_kill_and_control_plane_restart(
    db: Database, fresh_db_url: str, upstream: str
) -> None:
    settings = Settings(
        database_url=fresh_db_url,
        barrier_interval_ms=200,
        worker_lease_ms=3_000,
        spawn_embedded_worker=False,
    )
    env = {**os.environ, "BACKFILL_SPARK_MODE": "never"}
    run(upstream, "CREATE TABLE t (id int PRIMARY KEY, v int)")
    oracle = Oracle(upstream)
    run(upstream, f"INSERT INTO t SELECT i, 0 FROM generate_series(1, {INITIAL * 2}, 2) i")
    upconn = cdc.connect(upstream)
    writer = UpstreamWriter(upstream)
    checked: set[int] = set()

    def check() -> None:
        """At the committed epoch: the slot (read first: it only moves on) confirmed no
        further than the LSN recorded, and our table is the upstream's there."""
        state = cdc.slot_state(upconn, slot)
        committed, rec = _recorded(db)
        if rec is None:
            return
        assert state is not None
        assert oracle.nothing_between(rec.lsn, state.confirmed_flush_lsn), (state, rec.lsn)
        if committed not in checked:
            checked.add(committed)
            assert _ours_at(db, committed) == _upto(oracle.at(rec.lsn), rec), committed

    with (
        RestartableServer(settings, db) as server,
        worker_processes(server.url, env) as start_worker,
        http_client(server.url, timeout=120) as http,
    ):
        victim = start_worker("victim")
        r = http.post("/v1/tables", json={"name": "t", "postgres": {"dsn": upstream, "table": "t"}})
        assert r.status_code == 201, r.text
        slot, job = r.json()["postgres"]["slot"], r.json()["postgres"]["job_id"]
        assert http.patch(f"/v1/jobs/{job}", json={"rate_limit": RATE}).status_code == 200
        writer.thread.start()
        try:
            # mid-backfill: a chunk or more merged, the job still creating
            wait_for(
                lambda: (p := _job(http, job)[1]["cdc"]) is not None and p["chunks"] >= 2,
                what="chunks merged",
            )
            check()
            os.kill(victim.pid, signal.SIGKILL)
            victim.wait()
            start_worker("heir")
            before = _job(http, job)[1]["cdc"]["chunks"]
            wait_for(lambda: _job(http, job)[1]["cdc"]["chunks"] > before + 1, what="heir reads")
            view, p = _job(http, job)
            assert view["state"] == "creating" and p["cdc"]["phase"] == "backfilling", (view, p)
            check()
            server.restart()
            before = _job(http, job)[1]["cdc"]["chunks"]
            wait_for(lambda: _job(http, job)[1]["cdc"]["chunks"] > before, what="after restart")
            check()
            # a view over the table, of the default kind, while it backfills
            v = http.post("/v1/jobs", json={"name": "big", "upstream": {"table": "t"}})
            assert v.status_code in (201, 202), v.text
            view_job = int(v.json()["id"])
            assert http.patch(f"/v1/jobs/{job}", json={"rate_limit": None}).status_code == 200
            wait_created(http, job, timeout=180)
            wait_created(http, view_job, timeout=180)
            for _ in range(5):
                wait_for(lambda: _recorded(db)[0] not in checked or None, what="a new commit")
                check()
                assert_exact(http, view_job, times=1)
        finally:
            writer.stop.set()
            writer.thread.join(timeout=60)
        assert not writer.errors, writer.errors
        # quiescence: the table equals the upstream now
        final = {
            r[:1]: r
            for r in cdc.read_chunk(upconn, oracle.table, ChunkRead(1, None, 1_000_000), low=0).rows
        }

        def caught_up() -> bool:
            check()
            committed, rec = _recorded(db)
            return rec is not None and _ours_at(db, committed) == final

        wait_for(caught_up, 120, "the table caught up with the upstream")
        assert_exact(http, view_job, times=2)
        progress = _job(http, job)[1]["cdc"]
        assert progress["phase"] == "streaming" and progress["confirmed_lsn"], progress
        assert progress["slot_lag_bytes"] is not None, progress
        assert len(checked) >= 5 and writer.done > 0
        # the drop takes the slot along
        assert http.delete(f"/v1/jobs/{view_job}").status_code in (202, 204)
        wait_for(lambda: http.delete("/v1/tables/t").status_code == 204, 60, "drop")
        assert cdc.slot_state(upconn, slot) is None
    oracle.close()
    upconn.close()


def test_an_unreachable_upstream_makes_the_job_wait_and_recover(
    db: Database, fresh_db_url: str, upstream: str, logical_pg_url: str
) -> None:
    """The upstream refuses connections for a while (its database closed to them, the
    CDC table's connections ended): the actor fails with the connector's code, the
    failure policy backs off and retries, the job neither fails nor goes silent, and
    once the upstream is back the table catches up with what changed meanwhile."""
    run(upstream, "CREATE TABLE t (id int PRIMARY KEY, v int)", "INSERT INTO t VALUES (1, 1)")
    database = upstream.split("?")[0].rsplit("/", 1)[1]
    with running_cluster(
        db,
        fresh_db_url,
        WorkerSettings(spark_mode="never"),
        barrier_interval_ms=100,
        failure_backoff_initial_ms=200,
        failure_backoff_max_ms=1_000,
        failure_max_attempts=1_000,
    ) as (http, _):
        r = http.post("/v1/tables", json={"name": "t", "postgres": {"dsn": upstream, "table": "t"}})
        assert r.status_code == 201, r.text
        job = r.json()["postgres"]["job_id"]
        wait_created(http, job)
        writer = psycopg2.connect(upstream)  # open before the doors close: it stays
        writer.autocommit = True
        admin = psycopg2.connect(logical_pg_url)
        admin.autocommit = True
        try:
            with admin.cursor() as cur:
                cur.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false')
                cur.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = %s AND application_name = %s",
                    [database, APPLICATION_NAME],
                )
            with writer.cursor() as cur:
                cur.execute("INSERT INTO t VALUES (2, 2)")
                cur.execute("UPDATE t SET v = 10 WHERE id = 1")

            def failed_on_the_upstream() -> bool:
                p = _job(http, job)[1]
                return any("cdc_upstream_unreachable" in f["message"] for f in p["failures"])

            wait_for(failed_on_the_upstream, 60, "the actor's failure")
            assert _job(http, job)[0]["state"] == "created"
            with admin.cursor() as cur:
                cur.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')

            def caught_up() -> bool:
                rows = http.get("/v1/tables/t/rows").json()["rows"]
                return sorted((x["id"], x["v"]) for x in rows) == [(1, 10), (2, 2)]

            wait_for(caught_up, 60, "the table caught up")
            assert _job(http, job)[0]["state"] == "created"
        finally:
            with admin.cursor() as cur:
                cur.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')
            admin.close()
            writer.close()
