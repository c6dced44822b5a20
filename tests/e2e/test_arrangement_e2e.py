"""End to end: a real control plane, a real worker, a concurrent writer, exact MVs."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
from sqlalchemy import text

from service.db import Database
from service.settings import Settings
from spark_workers.runtime import Worker
from spark_workers.settings import WorkerSettings
from state_store.locks import GRAPH_GATE_LOCK
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


@pytest.fixture
def cluster(db: Database, fresh_db_url: str) -> Iterator[tuple[httpx.Client, Worker]]:
    # large epochs through Spark, small (rate-limited) ones on the driver
    worker_settings = WorkerSettings(spark_min_rows=20_000, spark_epoch_rows=60_000)
    with running_cluster(db, fresh_db_url, worker_settings) as c:
        yield c


def test_arrangement_backfill_is_exact_under_concurrent_writes(
    cluster: tuple[httpx.Client, Worker],
) -> None:
    http, worker = cluster
    load(http, 200_000)
    with Writer(http, "orders", 200_000, seed=1) as writer:
        body = {
            "name": "big_orders",
            "upstream": {"table": "orders"},
            "columns": ["id", "amount"],
            "filter": {"col": "amount", "op": ">=", "value": 50},
            "backfill": "arrangement",
            "parallelism": 3,
        }
        r = http.post("/v1/jobs", json=body)
        assert r.status_code == 202, r.text
        job = r.json()["id"]
        wait_for(
            lambda: http.get(f"/v1/jobs/{job}").json()["state"] == "created", what="job created"
        )
        assert_exact(http, job, times=3)
    assert writer.batches > 5
    v = http.get(f"/v1/jobs/{job}/verify").json()
    assert v["equal"] and v["mv_rows"] == v["expected_rows"] > 50_000
    progress = http.get(f"/v1/jobs/{job}/progress").json()
    assert progress["phase"] == "done" and progress["percent"] == 100
    # large epochs went through Spark: a job spanning epochs (the view runs inside Postgres)
    assert worker.spark is not None and worker.spark.rounds_jobs > 0


def test_pause_rate_limits_and_rescale_keep_the_view_exact(
    cluster: tuple[httpx.Client, Worker], db: Database
) -> None:
    http, worker = cluster
    load(http, 10_000)
    with Writer(http, "orders", 10_000, seed=2):
        job = create_job(http, "mv", rate_limit=2_000)
        wait_for(
            lambda: http.get(f"/v1/jobs/{job}/progress").json()["rows"] > 0, what="some progress"
        )
        assert http.post(f"/v1/jobs/{job}/pause").json()["paused"] is True
        pause_in_effect(db)
        paused_rows = http.get(f"/v1/jobs/{job}/progress").json()["rows"]
        pause_in_effect(db)  # several more epochs commit
        assert http.get(f"/v1/jobs/{job}/progress").json()["rows"] == paused_rows  # no reads
        assert http.post(f"/v1/jobs/{job}/resume").json()["paused"] is False
        assert http.patch(f"/v1/jobs/{job}", json={"rate_limit": 0}).json()["rate_limit"] == 0
        r = http.patch(f"/v1/jobs/{job}", json={"rate_limit": 3_000, "parallelism": 4})
        assert r.status_code == 200
        wait_for(
            lambda: http.get(f"/v1/jobs/{job}/progress").json()["rows"] > paused_rows,
            what="resumed",
        )
        r = http.patch(f"/v1/jobs/{job}", json={"parallelism": 1, "rate_limit": None})
        assert r.json()["parallelism"] == 1
        wait_created(http, job)
        assert_exact(http, job)
    assert_exact(http, job, times=1)
    # rate-limited epochs stay on the driver, which ran the view inside Postgres
    assert worker.driver_pushdowns > 0


@pytest.fixture
def small_rounds_cluster(db: Database, fresh_db_url: str) -> Iterator[tuple[httpx.Client, Worker]]:
    # Spark from 1,000 rows on, a job spanning epochs in rounds of 1,600 // 16 = 100 rows
    # (two cores): 800 rounds for 80k rows, several seconds' worth, which the mutations
    # below come in the middle of (a barrier brings them within some 100 ms)
    worker_settings = WorkerSettings(spark_min_rows=1_000, spark_epoch_rows=1_600)
    with running_cluster(db, fresh_db_url, worker_settings) as c:
        yield c


def test_mutations_end_a_spark_job_spanning_epochs_and_the_view_stays_exact(
    small_rounds_cluster: tuple[httpx.Client, Worker], db: Database
) -> None:
    """A pause, then a rescale, each reach the actors while their Spark job spanning epochs
    (``spark_workers.rounds``) is under way: the job ends at the barrier that carries the
    mutation, with what its rounds read accounted, and the view stays exact. The test
    holds the graph's gate meanwhile, as a recovery would: no round starts, so the job
    cannot run to its end before the mutation comes (barriers do not take the gate)."""
    http, worker = small_rounds_cluster
    load(http, 80_000)
    with db.engine.begin() as conn:  # the planner's estimate sizes the rounds
        conn.execute(text("ANALYZE"))
    with Writer(http, "orders", 80_000, seed=3):
        job = create_job(http, "mv")
        first = wait_for(
            lambda: (j := worker.rounds) is not None and j.rounds > 0 and j,
            what="a Spark job spanning epochs, some of its rounds accounted",
        )
        with _gate_held(db):
            assert http.post(f"/v1/jobs/{job}/pause").json()["paused"] is True
            wait_for(lambda: worker.rounds is not first, what="the pause ended it")
        pause_in_effect(db)  # (and the job's last rounds are accounted)
        assert 0 < first.rounds < len(first.batches), "the job was not ended in its middle"
        paused_rows = http.get(f"/v1/jobs/{job}/progress").json()["rows"]
        pause_in_effect(db)
        assert http.get(f"/v1/jobs/{job}/progress").json()["rows"] == paused_rows  # no reads
        assert http.post(f"/v1/jobs/{job}/resume").json()["paused"] is False
        second = wait_for(
            lambda: (j := worker.rounds) is not None and j is not first and j,
            what="another Spark job spanning epochs",
        )
        with _gate_held(db):
            assert http.patch(f"/v1/jobs/{job}", json={"parallelism": 3}).status_code == 200
            wait_for(lambda: worker.rounds is not second, what="the rescale ended it")
        wait_created(http, job)
        assert second.rounds < len(second.batches), "the job was not ended in its middle"
        assert_exact(http, job)
    assert_exact(http, job, times=1)
    with db.engine.connect() as conn:  # the jobs' queues and rounds went with them
        assert conn.exec_driver_sql("SELECT count(*) FROM work_queues").scalar() == 0
        assert conn.exec_driver_sql("SELECT count(*) FROM work_rounds").scalar() == 0


@contextmanager
def _gate_held(db: Database) -> Iterator[None]:
    """The main graph's gate (``state_store.locks.GRAPH_GATE_LOCK``), held exclusively."""
    with db.engine.connect() as conn:
        conn.execute(text("SELECT pg_advisory_xact_lock(:space, 1)"), {"space": GRAPH_GATE_LOCK})
        yield
        conn.rollback()


def pause_in_effect(db: Database) -> None:
    """Wait until a mutation requested before this call has been carried and committed.

    Injecting a barrier reads the queued mutations in its own transaction: a barrier
    injected after one that was injected after this call started carries the mutation
    (if no earlier one did), and once its ``prev`` is committed, so is everything read
    before the mutation took effect.
    """

    def current() -> int:
        with db.engine.connect() as conn:
            return int(
                conn.execute(text("SELECT current_epoch FROM graphs WHERE id = 1")).scalar_one()
            )

    def committed() -> int:
        with db.engine.connect() as conn:
            return int(
                conn.execute(text("SELECT committed_epoch FROM graphs WHERE id = 1")).scalar_one()
            )

    e1 = current()
    e2 = wait_for(lambda: (c := current()) > e1 and c, what="a new barrier")
    wait_for(lambda: current() > e2, what="another barrier")
    wait_for(lambda: committed() >= e2, what="the pause committed")


def _graph_state(db: Database, graph_id: int = 1) -> str:
    with db.engine.connect() as conn:
        q = text("SELECT state FROM graphs WHERE id = :g")
        return str(conn.execute(q, {"g": graph_id}).scalar_one())


def test_a_job_created_before_any_worker_exists(db: Database, fresh_db_url: str) -> None:
    settings = Settings(
        database_url=fresh_db_url, barrier_interval_ms=50, spawn_embedded_worker=False
    )
    with live_server(settings, db) as url, http_client(url, timeout=60) as http:
        load(http, 5_000)
        with Writer(http, "orders", 5_000, seed=3):
            job = create_job(http, "early")
            # it waits for a worker (not started orphaned: no recovery of its graph)
            wait_for(
                lambda: http.get(f"/v1/jobs/{job}").json()["waiting_for_worker"],
                what="the job waiting for a worker",
            )
            assert _graph_state(db) == "running"
            worker = Worker(url, "late")
            t = threading.Thread(target=worker.run, daemon=True)
            t.start()
            wait_created(http, job)
            assert_exact(http, job)
        worker.stop_event.set()
        t.join(timeout=30)


def test_kill_9_of_the_worker_mid_backfill(db: Database, fresh_db_url: str) -> None:
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
        with Writer(http, "orders", 20_000, seed=4):
            first = start_worker("victim")
            job = create_job(http, "survivor", rate_limit=5_000)
            wait_for(
                lambda: http.get(f"/v1/jobs/{job}/progress").json()["rows"] > 2_000,
                what="mid-backfill",
            )
            before = http.get(f"/v1/jobs/{job}/progress").json()
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=30)
            start_worker("heir")
            after = http.get(f"/v1/jobs/{job}/progress").json()
            assert after["rows"] >= before["rows"]  # committed progress never goes back
            wait_created(http, job)
            assert_exact(http, job)
            metrics = http.get("/metrics").text
            assert "backfill_recoveries_total" in metrics
            view = http.get(f"/v1/jobs/{job}").json()
            assert view["recoveries"] >= 1 and view["recovering"] is False


def test_cancelling_jobs_mid_backfill_leaves_the_other_jobs_alone(
    cluster: tuple[httpx.Client, Worker], db: Database
) -> None:
    """A worker whose actors' job is dropped under them (a Spark write into a view that
    is gone, a collect for an actor that is gone) forgets those actors: the drop is no
    failure of the worker's other actors, whose graph goes on without a recovery."""
    http, worker = cluster
    load(http, 100_000)
    with db.engine.begin() as conn:  # the planner's estimate sizes the epochs for Spark
        conn.execute(text("ANALYZE"))

    def recoveries() -> int:
        with db.engine.connect() as conn:
            return int(
                conn.execute(text("SELECT recovery_seq FROM graphs WHERE id = 1")).scalar_one()
            )

    keep = create_job(http, "keep", columns=["id", "amount"], rate_limit=20_000)
    before = recoveries()
    doomed = []
    for i in range(3):
        job = create_job(http, f"doomed{i}", columns=["id", "amount"])
        doomed.append(job)
        wait_for(
            lambda job=job: http.get(f"/v1/jobs/{job}/progress").json()["rows"] > 0,
            what="the doomed job under way",
        )
        assert http.delete(f"/v1/jobs/{job}").status_code == 204
    wait_created(http, keep)
    assert_exact(http, keep)
    assert recoveries() == before, "dropping a job recovered the graph of the others"
    assert http.get(f"/v1/jobs/{keep}/progress").json()["recent_recoveries"] == []
    assert not {r.job_id for r in worker.runners.values()} & set(doomed)


def test_with_barriers_ten_minutes_apart_a_small_backfill_is_created_at_once(
    db: Database, fresh_db_url: str
) -> None:
    """The job's first barrier goes out when it is created, and the one that reports its
    finish as soon as the worker read everything: the job is created in seconds, not two
    intervals later."""
    with running_cluster(
        db, fresh_db_url, WorkerSettings(spark_mode="never"), barrier_interval_ms=600_000
    ) as (http, _):
        load(http, 5_000)  # its wait asks for rounds (barriers minutes apart)
        job = create_job(http, "soon")
        wait_created(http, job, timeout=120)
        v = http.get(f"/v1/jobs/{job}/verify").json()
        assert v["equal"] and v["mv_rows"] == 5_000, v
