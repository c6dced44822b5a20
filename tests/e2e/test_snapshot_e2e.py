"""End to end for the snapshot backfill: a creating graph of its own on fake epochs while
the snapshot is read, the upstream's epochs replayed after it, the merge into the main
graph; exact at every epoch it replayed, and after recoveries in either phase."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager

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
from tests.kit.live import RestartableServer, worker_processes
from tests.kit.meta import main_committed_epochs, scalar

pytestmark = [pytest.mark.slow, pytest.mark.spark]


@pytest.fixture
def cluster(db: Database, fresh_db_url: str) -> Iterator[tuple[httpx.Client, Worker]]:
    worker_settings = WorkerSettings(spark_min_rows=20_000, spark_epoch_rows=30_000)
    # history is checked after the job is created: keep it
    with running_cluster(db, fresh_db_url, worker_settings, "snap", gc_retention_ms=3_600_000) as c:
        yield c


def progress(http: httpx.Client, job: int) -> dict:  # type: ignore[type-arg]
    r = http.get(f"/v1/jobs/{job}/progress")
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def gc_epoch(db: Database, table: str) -> int:
    with db.engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT gc_epoch FROM relations WHERE name = :n"), {"n": table}
            ).scalar_one()
        )


def assert_exact_at(http: httpx.Client, job: int, epochs: list[int]) -> None:
    bad = []
    for e in epochs:
        v = http.get(f"/v1/jobs/{job}/verify", params={"epoch": e}).json()
        if not v.get("equal"):
            bad.append(
                (
                    epochs.index(e),
                    v.get("mv_rows"),
                    v.get("expected_rows"),
                    v.get("missing", [])[:2],
                    v.get("unexpected", [])[:2],
                )
            )
    assert not bad, (len(epochs), bad[:5], bad[-5:], len(bad))


def test_snapshot_backfill_is_exact_at_every_replayed_epoch(
    cluster: tuple[httpx.Client, Worker], db: Database
) -> None:
    http, worker = cluster
    load(http, 60_000)
    # the worker sizes epochs for Spark by the planner's estimate: have it now, not
    # whenever autovacuum gets to the table (it may have seen it a quarter loaded)
    with db.engine.begin() as conn:
        conn.execute(text("ANALYZE"))
    phases: set[str] = set()
    with Writer(http, "orders", 60_000, seed=21) as writer:
        job = create_job(
            http,
            "snapped",
            "snapshot",
            columns=["id", "amount"],
            filter={"col": "amount", "op": ">=", "value": 20},
        )
        view = http.get(f"/v1/jobs/{job}").json()
        snapshot_epoch = int(view["snapshot_epoch"])
        assert view["kind"] == "snapshot" and snapshot_epoch > 0
        # a few upstream epochs that change nothing: the replay skips them (the MV must
        # be exact at them all the same)
        with writer.paused():
            open_epoch = scalar(db, "SELECT current_epoch FROM graphs WHERE id = 1")

            def quiet_now() -> list[int]:
                return [e for e in main_committed_epochs(db) if e > open_epoch]

            wait_for(lambda: len(quiet_now()) >= 3, what="quiet epochs")
            quiet = quiet_now()

        last: dict = {}  # type: ignore[type-arg]

        def created() -> bool:
            last.update(progress(http, job))
            phases.add(last["phase"])
            return last["state"] == "created"

        try:
            wait_for(created, what="job created")
        except AssertionError:
            last.pop("vnodes")
            raise AssertionError(f"not created: {last}, phases {phases}") from None
        assert_exact(http, job, times=3)
    assert {"snapshot", "done"} <= phases, phases
    stream = http.get(f"/v1/jobs/{job}/events", params={"follow": "false"}).text
    assert "event: phase_changed" in stream and '"phase": "log_store"' in stream
    finished = int(http.get(f"/v1/jobs/{job}").json()["finished_epoch"])
    assert finished > snapshot_epoch
    # the epochs the writer wrote in while the job replayed its log store are exact (each
    # check compares whole tables: a spread of 30 of them, the first and the last included)
    replayed = sorted({e for e in writer.epochs if snapshot_epoch < e <= finished})
    assert len(replayed) > 3, (len(writer.epochs), snapshot_epoch, finished)
    step = max(1, len(replayed) // 30)
    assert_exact_at(http, job, [snapshot_epoch, *replayed[::step], replayed[-1], finished])
    assert snapshot_epoch < quiet[0] and quiet[-1] < finished
    assert not set(quiet) & set(writer.epochs)
    assert_exact_at(http, job, quiet)
    v = http.get(f"/v1/jobs/{job}/verify").json()
    assert v["equal"] and v["mv_rows"] == v["expected_rows"] > 20_000
    # the snapshot went through Spark: a job spanning epochs (its view runs in Postgres)
    assert worker.spark is not None and worker.spark.rounds_jobs > 0
    # the creating graph is gone, the job lives in the main graph
    assert int(http.get(f"/v1/jobs/{job}").json()["committed_epoch"]) >= finished


@contextmanager
def restartable_cluster(
    settings: Settings, db: Database
) -> Iterator[tuple[RestartableServer, Callable[[str], subprocess.Popen[bytes]], httpx.Client]]:
    """A control plane that can restart at its address, a starter of worker processes
    (terminated at the end) and a client: for the kill -9 and restart scenarios."""
    with (
        RestartableServer(settings, db) as server,
        worker_processes(server.url) as start_worker,
        http_client(server.url, timeout=60) as http,
    ):
        yield server, start_worker, http


def test_snapshot_backfill_survives_kill_9_rescale_gc_and_control_plane_restart(
    db: Database, fresh_db_url: str
) -> None:
    settings = Settings(
        database_url=fresh_db_url,
        barrier_interval_ms=50,
        worker_lease_ms=1_000,
        spawn_embedded_worker=False,
        gc_retention_ms=0,  # garbage collection keeps only what pins and readers need
    )
    with restartable_cluster(settings, db) as (server, start_worker, http):
        load(http, 20_000)
        with Writer(http, "orders", 20_000, seed=22) as writer:
            first = start_worker("victim")
            job = create_job(http, "snap_survivor", "snapshot", rate_limit=3_000)
            # with a 1 s lease a heartbeat late by a moment shows as waiting_for_worker
            wait_for(
                lambda: (p := progress(http, job))["rows"] > 2_000 and p["phase"] == "snapshot",
                what="mid-snapshot",
            )
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=30)
            done = writer.batches
            wait_for(lambda: writer.batches >= done + 5, what="writes while the job is down")
            start_worker("heir")
            wait_for(lambda: progress(http, job)["rows"] > 8_000, what="the heir reading")
            # held still (rate 0), the job cannot finish: garbage collection runs up to its
            # pin and no further
            r = http.patch(f"/v1/jobs/{job}", json={"rate_limit": 0})
            assert r.status_code == 200, r.text
            snapshot_epoch = int(http.get(f"/v1/jobs/{job}").json()["snapshot_epoch"])
            wait_for(lambda: gc_epoch(db, "orders") > 0, what="a garbage collection")
            assert http.get(f"/v1/jobs/{job}").json()["state"] == "creating"
            assert gc_epoch(db, "orders") <= snapshot_epoch
            r = http.patch(f"/v1/jobs/{job}", json={"parallelism": 3, "rate_limit": None})
            assert r.status_code == 200, r.text
            # the control plane goes away and comes back on the same address
            with writer.paused():
                server.restart()
            wait_created(http, job)
            assert_exact(http, job)
        stream = http.get(f"/v1/jobs/{job}/events", params={"follow": "false"}).text
        # the kill and the rescale recover; the restart only when barriers were in flight
        assert stream.count("event: recovered") >= 2 and "event: created" in stream
        assert "event: rescaled" in stream
        recoveries = progress(http, job)["recent_recoveries"]
        assert 1 <= len(recoveries) <= 5 and all(r["reason"] for r in recoveries)
        assert len(progress(http, job)["vnodes"]) == 256


def test_snapshot_backfill_survives_kill_9_and_a_restart_while_it_replays_its_log_store(
    db: Database, fresh_db_url: str
) -> None:
    settings = Settings(
        database_url=fresh_db_url,
        barrier_interval_ms=20,  # many upstream epochs queue while the snapshot is read
        max_pending_barriers=2,  # and are replayed a few at a time: a window for the kill
        worker_lease_ms=1_000,
        spawn_embedded_worker=False,
        gc_retention_ms=3_600_000,  # the replayed epochs are checked afterwards
    )
    with restartable_cluster(settings, db) as (server, start_worker, http):
        load(http, 10_000)
        with Writer(http, "orders", 10_000, seed=23) as writer:
            first = start_worker("replayer")
            # phase 1 takes seconds (rate limited): many upstream epochs to replay
            job = create_job(http, "replay_survivor", "snapshot", rate_limit=1_000)
            snapshot_epoch = int(http.get(f"/v1/jobs/{job}").json()["snapshot_epoch"])

            def replaying_with_epochs_to_go() -> bool:
                p = progress(http, job)
                assert p["state"] == "creating", p["state"]
                # an epoch with writes replayed and committed, more still to go
                done = int(p["committed_epoch"])
                return (
                    p["phase"] == "log_store"
                    and any(snapshot_epoch < e <= done for e in list(writer.epochs))
                    and (p["log_store_lag_epochs"] or 0) >= 10
                )

            wait_for(replaying_with_epochs_to_go, what="replaying its log store")
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=30)
            # the dead worker can neither replay further nor merge: the kill hit phase 2
            killed_at = progress(http, job)
            assert killed_at["state"] == "creating" and killed_at["phase"] == "log_store"
            killed_epoch = int(killed_at["committed_epoch"])
            assert killed_epoch > snapshot_epoch
            # and the control plane goes away and comes back meanwhile
            with writer.paused():
                server.restart()
            assert progress(http, job)["phase"] == "log_store"
            start_worker("heir")
            wait_created(http, job)
            assert_exact(http, job)
        stream = http.get(f"/v1/jobs/{job}/events", params={"follow": "false"}).text
        assert "event: recovered" in stream and "event: created" in stream
        # exact at the epochs replayed before and after the kill (a spread of them)
        finished = int(http.get(f"/v1/jobs/{job}").json()["finished_epoch"])
        replayed = sorted({e for e in writer.epochs if snapshot_epoch < e <= finished})
        assert any(e <= killed_epoch for e in replayed)
        assert any(e > killed_epoch for e in replayed)
        step = max(1, len(replayed) // 30)
        assert_exact_at(http, job, [snapshot_epoch, *replayed[::step], replayed[-1], finished])


def test_with_barriers_ten_minutes_apart_a_small_snapshot_job_is_created_at_once(
    db: Database, fresh_db_url: str
) -> None:
    """Each step of a snapshot job that would wait for the next round goes at once: its
    first barrier, the barrier after its snapshot is read, the one after phase 1, and
    the merge after its last barrier."""
    with running_cluster(
        db, fresh_db_url, WorkerSettings(spark_mode="never"), barrier_interval_ms=600_000
    ) as (http, _):
        load(http, 5_000, committed=False)
        # nothing is committed yet (the first barrier commits no epoch): the create asks
        # for rounds and waits for the first commit instead of answering "retry"
        body = {"name": "soon", "upstream": {"table": "orders"}, "backfill": "snapshot"}
        r = http.post("/v1/jobs", json=body)
        assert r.status_code == 202, r.text
        job = r.json()["id"]
        wait_created(http, job, timeout=120)
        v = http.get(f"/v1/jobs/{job}/verify").json()
        assert v["equal"] and v["mv_rows"] == 5_000, v
        # the total was exact from the start, and rows is what was consumed
        p = progress(http, job)
        assert (p["rows"], p["total_estimate"], p["percent"]) == (5_000, 5_000, 100.0), p
