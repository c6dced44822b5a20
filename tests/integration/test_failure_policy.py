"""The failure policy: a job whose actor fails again and again backs its graph's recovery
off, then fails; the other jobs of its graph go on; a retry starts it again.

The barrier loop is driven by hand (``tick``) and the fake worker reports the failures,
naming the actor that caused them, as a real worker does."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from service.catalog.models import Graph
from service.db import Database
from service.meta.failures import FailurePolicy, cause_of
from service.meta.loop import MetaLoop
from tests.integration.test_health_and_errors import assert_error
from tests.integration.test_meta_creating import TABLE, collect, graph_of_job, snapshot_job
from tests.kit.e2e import wait_for
from tests.kit.meta import WORKER, FakeWorker, actors_of, make_job, manual_api, scalar

POLICY = {
    "failure_backoff_initial_ms": 1,
    "failure_backoff_max_ms": 4,
    "failure_max_attempts": 5,
}


@pytest.fixture
def api(db: Database, fresh_db_url: str) -> Iterator[tuple[TestClient, MetaLoop]]:
    with manual_api(db, fresh_db_url, **POLICY) as api:
        yield api


def _graph(db: Database, graph_id: int = 1) -> Graph:
    with db.transaction() as s:
        graph = s.execute(select(Graph).where(Graph.id == graph_id)).scalar_one()
        s.expunge(graph)
        return graph


def _fail(client: TestClient, w: FakeWorker, actor_id: int, message: str, **extra: Any) -> None:
    body = {"message": message, "cause_actor_id": actor_id} | extra
    r = client.post(f"/v1/workers/{w.worker_id}/failures", json=body, headers=WORKER)
    assert r.status_code == 202, r.text


def _recovered(db: Database, loop: MetaLoop) -> bool:
    loop.tick()
    return _graph(db).state == "running"


def _failures_counted(client: TestClient, job_id: int, outcome: str) -> float:
    """The job's ``backfill_job_failures_total`` sample as ``/metrics`` shows it."""
    prefix = f'backfill_job_failures_total{{job_id="{job_id}",outcome="{outcome}"}} '
    lines = [ln for ln in client.get("/metrics").text.splitlines() if ln.startswith(prefix)]
    return float(lines[0].removeprefix(prefix)) if lines else 0.0


def test_backoff_doubles_to_its_bound() -> None:
    policy = FailurePolicy(backoff_initial_ms=1_000, backoff_max_ms=60_000)
    assert [policy.backoff_ms(n) for n in range(1, 9)] == [
        1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 60_000, 60_000,
    ]  # fmt: skip
    assert policy.backoff_ms(10_000) == 60_000
    assert cause_of("offset 12 at epoch 99: boom") == cause_of("offset 7 at epoch 3: boom")


def test_a_job_failing_always_backs_off_then_fails_alone_and_a_retry_restarts_it(
    api: tuple[TestClient, MetaLoop], db: Database
) -> None:
    client, loop = api
    w = FakeWorker(client).register()
    bad = make_job(db, "bad", parallelism=2)
    counted_before = {o: _failures_counted(client, bad, o) for o in ("failed", "backoff")}
    good = make_job(db, "good", parallelism=1)
    loop.tick()
    loop.tick()
    w.collect_all()
    [bad_actor, other_bad_actor] = [a.id for a in actors_of(db, bad)]

    for attempt in range(1, 5):
        # both of its actors fail in one incarnation: one attempt
        _fail(client, w, bad_actor, f"boom at offset {attempt}")
        _fail(client, w, other_bad_actor, "boom at offset 0")
        assert _graph(db).recover_after_ms is not None
        wait_for(lambda: _recovered(db, loop), 30, "the recovery after the backoff")
        w.collect_all()
        assert client.get(f"/v1/jobs/{bad}").json()["state"] == "creating"

    _fail(client, w, bad_actor, "boom at offset 5")
    failed = client.get(f"/v1/jobs/{bad}").json()
    assert failed["state"] == "failed"
    error = failed["error"]
    epoch = _graph(db).committed_epoch
    assert f"actor {bad_actor}" in error and "boom at offset 5" in error
    assert f"epoch {epoch}" in error

    progress = client.get(f"/v1/jobs/{bad}/progress").json()
    assert progress["error"] == error
    backoffs = [f["backoff_ms"] for f in progress["failures"]]
    assert backoffs == [1, 2, 4, 4, None]  # doubled, bounded; the last one failed the job
    assert [f["actor_id"] for f in progress["failures"]] == [bad_actor] * 5
    # as times: a whole second's has no fraction in its text ("...:42Z" after "...:42.1Z")
    ats = [dt.datetime.fromisoformat(f["at"]) for f in progress["failures"]]
    assert ats == sorted(ats)

    events = client.get(f"/v1/jobs/{bad}/events", params={"follow": "false"}).text
    assert "event: job_failed" in events and f'"actor_id": {bad_actor}' in events
    # the counters are the process's: earlier tests' job of the same id counted too
    assert _failures_counted(client, bad, "failed") - counted_before["failed"] == 1
    assert _failures_counted(client, bad, "backoff") - counted_before["backoff"] == 4

    # the graph recovers without the failed job: its actors get no barrier, the other
    # job is created
    wait_for(lambda: _recovered(db, loop), 30, "the recovery after the failure")
    loop.tick()
    polled = {a["actor_id"] for a in w.poll()}
    assert bad_actor not in polled and other_bad_actor not in polled
    w.collect_all(finished=True)
    loop.tick()
    w.collect_all(finished=True)
    assert client.get(f"/v1/jobs/{good}").json()["state"] == "created"
    assert client.get(f"/v1/jobs/{bad}").json()["state"] == "failed"
    assert_error(client.post(f"/v1/jobs/{good}/retry"), 409, "conflict")

    # a retry forgets the failures and starts the job again, which then finishes
    r = client.post(f"/v1/jobs/{bad}/retry")
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "creating" and r.json()["error"] is None
    assert client.get(f"/v1/jobs/{bad}/progress").json()["failures"] == []
    assert_error(client.post(f"/v1/jobs/{bad}/retry"), 409, "conflict")
    wait_for(lambda: _recovered(db, loop), 30, "the recovery of the retry")
    assert {bad_actor, other_bad_actor} <= {a["actor_id"] for a in w.poll()}

    def created() -> bool:
        loop.tick()
        w.collect_all(finished=True)
        return bool(client.get(f"/v1/jobs/{bad}").json()["state"] == "created")

    wait_for(created, 30, "the retried job created")
    assert "event: retried" in client.get(f"/v1/jobs/{bad}/events", params={"follow": "false"}).text


def test_a_fatal_failure_fails_the_job_at_once_and_a_drop_removes_it(
    api: tuple[TestClient, MetaLoop], db: Database
) -> None:
    client, loop = api
    w = FakeWorker(client).register()
    job = make_job(db, "j", parallelism=1)
    loop.tick()
    loop.tick()
    w.collect_all()
    [actor] = [a.id for a in actors_of(db, job)]
    _fail(client, w, actor, "poison message at partition 0 offset 3: not JSON", fatal=True)
    body = client.get(f"/v1/jobs/{job}").json()
    assert body["state"] == "failed" and "partition 0 offset 3" in body["error"]
    assert client.delete(f"/v1/jobs/{job}").status_code == 204
    assert client.get(f"/v1/jobs/{job}").status_code == 404


def test_failures_without_a_named_actor_charge_no_job(
    api: tuple[TestClient, MetaLoop], db: Database
) -> None:
    client, loop = api
    w = FakeWorker(client).register()
    job = make_job(db, "j", parallelism=1)
    loop.tick()
    loop.tick()
    w.collect_all()
    for _ in range(6):
        r = client.post(f"/v1/workers/{w.worker_id}/failures", json={"message": "boom"})
        assert r.status_code == 202
        wait_for(lambda: _recovered(db, loop), 30, "the recovery")
        w.collect_all()
    assert client.get(f"/v1/jobs/{job}").json()["state"] == "creating"
    assert client.get(f"/v1/jobs/{job}/progress").json()["failures"] == []


def test_a_failed_snapshot_job_stops_its_graph_and_resumes_from_committed_progress(
    db: Database, fresh_db_url: str
) -> None:
    with manual_api(db, fresh_db_url, failure_max_attempts=1) as (client, loop):
        w = FakeWorker(client).register()
        job = snapshot_job(client, loop, parallelism=1)["id"]
        loop.tick()
        collect(w, "consuming")
        loop.tick()
        collect(w, "consuming")
        graph = graph_of_job(db, job)
        assert graph is not None and graph.committed_epoch > 0
        [actor] = [a.id for a in actors_of(db, job)]
        _fail(client, w, actor, "boom")
        assert client.get(f"/v1/jobs/{job}").json()["state"] == "failed"
        for _ in range(3):
            loop.tick()  # the main graph goes on; the job's graph stands still
        stopped = graph_of_job(db, job)
        assert stopped is not None and stopped.state == "stopped"
        assert stopped.current_epoch == graph.current_epoch
        assert all(a["barriers"] == [] for a in w.poll())

        assert client.post(f"/v1/jobs/{job}/retry").json()["state"] == "creating"
        loop.tick()
        [a] = w.poll()
        initial = a["barriers"][0]
        assert (initial["kind"], initial["prev"]) == ("initial", graph.committed_epoch)
        assert len(a["restore"]["vnodes"]) == TABLE["vnode_count"]  # its committed progress

        def created() -> bool:
            loop.tick()
            collect(w, "consumed")
            return bool(client.get(f"/v1/jobs/{job}").json()["state"] == "created")

        wait_for(created, 30, "the retried snapshot job created")


def test_a_failure_report_locks_the_graph_before_the_job(
    api: tuple[TestClient, MetaLoop], db: Database
) -> None:
    """The barrier paths lock a graph's row, then write its jobs; a failure report that
    locked the job first deadlocked with them (seen while a replay failed at every poll)."""
    client, loop = api
    w = FakeWorker(client).register()
    job = make_job(db, "locks", parallelism=1)
    loop.tick()
    w.collect_all()
    [actor] = [a.id for a in actors_of(db, job)]
    other = db.engine.raw_connection()
    try:
        cur = other.cursor()
        cur.execute("SELECT 1 FROM graphs WHERE id = 1 FOR UPDATE")  # a barrier path's lock
        report = threading.Thread(target=_fail, args=(client, w, actor, "boom"))
        report.start()
        waiting = "SELECT count(*) FROM pg_locks WHERE NOT granted AND locktype = 'transactionid'"
        wait_for(lambda: scalar(db, waiting) > 0, 30, "the report waiting for the graph")
        # it holds nothing of the job while it waits: the barrier path can go on to it
        cur.execute("SELECT 1 FROM jobs WHERE id = %s FOR UPDATE NOWAIT", [job])
        other.rollback()
        report.join(timeout=30)
        assert not report.is_alive()
    finally:
        other.close()
    assert _graph(db).recover_after_ms is not None  # the failure counted
