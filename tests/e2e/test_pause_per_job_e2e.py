"""End to end (issue 30, item 2): pause and resume apply to one job, not to its graph.

Three arrangement jobs share the main graph. Pausing one must leave the others reading;
resuming one must leave another the user paused paused; a paused job stays paused across
a rescale. Throughout, every actor on the worker has its job's paused flag as the
catalog (the API) tells it, once the barrier carrying the change has committed.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from sqlalchemy import text

from service.db import Database
from spark_workers.runtime import Worker
from spark_workers.settings import WorkerSettings
from tests.kit.e2e import (
    Writer,
    assert_exact,
    create_job,
    load,
    running_cluster,
    wait_created,
    wait_for,
)

ROWS = 8_000
# rows/s per actor: some seconds per job, so that none finishes before it is paused
RATE = 1_000


@pytest.fixture
def cluster(db: Database, fresh_db_url: str) -> Iterator[tuple[httpx.Client, Worker]]:
    # 200 ms barriers: at 50 ms a worker sharing its process (and GIL) with the server
    # and a writer fell behind the barriers of eleven actors and commits lagged by ~15 s
    settings = WorkerSettings(spark_mode="never")
    with running_cluster(db, fresh_db_url, settings, barrier_interval_ms=200) as c:
        yield c


def mutations_in_effect(db: Database) -> None:
    """Wait until every mutation queued before this call went out (one per barrier) and
    the barriers carrying them committed: every actor applied them."""

    def main_graph(column: str) -> int:
        with db.engine.connect() as conn:
            return int(conn.execute(text(f"SELECT {column} FROM graphs WHERE id = 1")).scalar_one())

    def queued() -> int:
        with db.engine.connect() as conn:
            q = "SELECT count(*) FROM pending_mutations WHERE graph_id = 1"
            return int(conn.execute(text(q)).scalar_one())

    wait_for(lambda: queued() == 0, what="the mutations injected")
    # the barrier that carried the last one opened this epoch or an earlier one
    carried = main_graph("current_epoch")
    wait_for(lambda: main_graph("committed_epoch") >= carried, what="the mutations committed")


def rows(http: httpx.Client, job: int) -> int:
    return int(http.get(f"/v1/jobs/{job}/progress").json()["rows"])


def paused_in_catalog(http: httpx.Client, job: int) -> bool:
    return bool(http.get(f"/v1/jobs/{job}").json()["paused"])


def assert_actors_follow_the_catalog(http: httpx.Client, worker: Worker, jobs: list[int]) -> None:
    """Each of the jobs' actors on the worker is paused exactly when its job is (call once
    the barrier carrying the last pause or resume committed: see ``mutations_in_effect``)."""
    flags = {job: paused_in_catalog(http, job) for job in jobs}
    actors = [r for r in list(worker.runners.values()) if r.job_id in flags]
    assert {r.job_id for r in actors} == set(flags), "a job has no actor on the worker"
    got = {(r.actor_id, r.job_id): r.executor.paused for r in actors}
    assert got == {(a, job): flags[job] for a, job in got}, f"catalog: {flags}"


def test_pausing_or_resuming_a_job_leaves_the_other_jobs_of_its_graph_alone(
    cluster: tuple[httpx.Client, Worker], db: Database
) -> None:
    http, worker = cluster
    load(http, ROWS)
    with Writer(http, "orders", ROWS, seed=5):
        a, b = (
            create_job(http, name, columns=["id", "amount"], rate_limit=RATE) for name in ("a", "b")
        )
        for job in (a, b):
            wait_for(lambda job=job: rows(http, job) > 0, what=f"job {job} under way")
        # c paused as soon as it is created: its actors, added by a barrier of their own,
        # may start before or after the pause, and are paused once it committed
        c = create_job(http, "c", columns=["id", "amount"], rate_limit=RATE)
        jobs = [a, b, c]

        # a (mid-backfill) and c paused: b goes on and is created, a and c do not move
        for job in (c, a):
            assert http.post(f"/v1/jobs/{job}/pause").json()["paused"] is True
        mutations_in_effect(db)
        held = {job: rows(http, job) for job in (a, c)}
        assert_actors_follow_the_catalog(http, worker, jobs)

        def b_created() -> bool:
            assert {job: rows(http, job) for job in held} == held, "a paused job read on"
            assert_actors_follow_the_catalog(http, worker, jobs)
            return bool(http.get(f"/v1/jobs/{b}").json()["state"] == "created")

        wait_for(b_created, what="the job not paused created")
        assert all(rows(http, job) < ROWS for job in held), "a paused job finished"

        # c, paused, rescaled: its new actors start paused
        assert http.patch(f"/v1/jobs/{c}", json={"parallelism": 3}).status_code == 200
        wait_for(
            lambda: len([r for r in list(worker.runners.values()) if r.job_id == c]) == 3,
            what="c's new actors",
        )
        mutations_in_effect(db)
        assert_actors_follow_the_catalog(http, worker, jobs)

        # a resumed: it finishes, c (paused by the user) stays paused
        assert http.post(f"/v1/jobs/{a}/resume").json()["paused"] is False
        mutations_in_effect(db)
        held = {c: rows(http, c)}

        def a_created() -> bool:
            assert rows(http, c) == held[c], "resuming a resumed c"
            assert_actors_follow_the_catalog(http, worker, jobs)
            return bool(http.get(f"/v1/jobs/{a}").json()["state"] == "created")

        wait_for(a_created, what="the resumed job created")
        assert paused_in_catalog(http, c) and rows(http, c) == held[c]

        # c resumed: it finishes too
        assert http.post(f"/v1/jobs/{c}/resume").json()["paused"] is False
        mutations_in_effect(db)
        assert_actors_follow_the_catalog(http, worker, jobs)
        wait_created(http, c)
        for job in jobs:
            assert_exact(http, job)
    for job in jobs:
        assert_exact(http, job, times=1)
        assert not paused_in_catalog(http, job)
