"""End to end for the rearranged chain: exact views under writes, and a restart from an
empty view after its worker is killed (a chain has no mid-backfill progress)."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import httpx
import pytest
from sqlalchemy import text

from service.db import Database
from service.settings import Settings
from spark_workers.runtime import Worker
from spark_workers.settings import WorkerSettings
from tests.kit.auth import http_client
from tests.kit.e2e import (
    Writer,
    assert_exact,
    create_job,
    load,
    running_cluster,
    wait_created,
    wait_for,
)
from tests.kit.live import live_server, worker_processes

pytestmark = [pytest.mark.slow, pytest.mark.spark]


@pytest.fixture
def cluster(db: Database, fresh_db_url: str) -> Iterator[tuple[httpx.Client, Worker]]:
    worker_settings = WorkerSettings(spark_min_rows=20_000, spark_epoch_rows=30_000)
    with running_cluster(db, fresh_db_url, worker_settings, "chain") as c:
        yield c


def test_chain_backfill_is_exact_under_concurrent_writes(
    cluster: tuple[httpx.Client, Worker], db: Database
) -> None:
    http, worker = cluster
    load(http, 80_000)
    with db.engine.begin() as conn:  # the planner's estimate sizes the epochs for Spark
        conn.execute(text("ANALYZE"))
    with Writer(http, "orders", 80_000, seed=11) as writer:
        job = create_job(
            http,
            "chained",
            "chain",
            columns=["id", "amount"],
            filter={
                "or": [
                    {"col": "amount", "op": "<", "value": 30},
                    {"col": "id", "op": "in", "value": [5, 7]},
                ]
            },
        )
        wait_created(http, job)
        assert_exact(http, job, times=3)
    assert writer.batches > 5
    v = http.get(f"/v1/jobs/{job}/verify").json()
    assert v["equal"] and v["mv_rows"] == v["expected_rows"] > 20_000
    assert http.get(f"/v1/jobs/{job}").json()["kind"] == "chain"
    # the snapshot went through Spark: a job spanning epochs (the view runs inside Postgres)
    assert worker.spark is not None and worker.spark.rounds_jobs > 0


def test_a_killed_chain_restarts_from_an_empty_view(db: Database, fresh_db_url: str) -> None:
    settings = Settings(
        database_url=fresh_db_url,
        barrier_interval_ms=50,
        worker_lease_ms=1_000,
        spawn_embedded_worker=False,
    )
    with (
        live_server(settings, db) as url,
        worker_processes(url) as start_worker,
        http_client(url, timeout=60) as http,
    ):
        load(http, 20_000)
        with Writer(http, "orders", 20_000, seed=12) as writer:
            first = start_worker("victim")
            job = create_job(http, "chain_survivor", "chain", rate_limit=4_000)
            wait_for(
                lambda: http.get(f"/v1/jobs/{job}/progress").json()["rows"] > 2_000,
                what="mid-backfill",
            )
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=30)
            # deletes made while nobody runs the job must not survive in the restarted view
            done = writer.batches
            wait_for(lambda: writer.batches >= done + 5, what="writes while the job is down")
            start_worker("heir")
            wait_created(http, job)
            assert_exact(http, job)
            view = http.get(f"/v1/jobs/{job}").json()
            assert view["recoveries"] >= 1 and view["recovering"] is False
