"""The source actor on a worker (``spark_workers.source_actor.SourceRunner``) against a
real Kafka-protocol broker and the meta driven by hand: its writes pass the zombie fence
(issue 39), and a split moved to it by a split change resumes from its committed
progress."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg2
import pytest
from sqlalchemy import select

from backfill_core.executors.source import SplitState
from backfill_core.protocol import Assignment, BarrierMessage, CollectRequest
from service.api.app import create_app
from service.catalog.models import Actor
from service.catalog.queries import get_relation, storage_of
from service.db import Database, raw_cursor
from service.meta import barriers
from service.meta.loop import MetaLoop
from service.meta.sources import SourceWatcher
from service.settings import Settings
from spark_workers.actors import Fenced
from spark_workers.reads.kafka import read_kafka
from spark_workers.source_actor import SourceRunner
from tests.integration.test_sources import ScriptedProbe, spec
from tests.kit.auth import api_client
from tests.kit.kafka import MOCK_PARTITIONS, MockKafka
from tests.kit.meta import FakeWorker

pytestmark = pytest.mark.kafka
PER_SPLIT = 10  # messages produced to each partition before the job starts


@contextmanager
def _source_job(
    db: Database, url: str, kafka: MockKafka, parallelism: int
) -> Iterator[tuple[Any, MetaLoop, FakeWorker, Any]]:
    """A source with PER_SPLIT messages per partition, a job over it, the meta by hand, a
    fake worker registered, and a connection as a worker's actor holds one."""
    parts = range(MOCK_PARTITIONS)
    kafka.produce(
        "clicks", [(p, {"user_id": p * 100 + i}) for p in parts for i in range(PER_SPLIT)]
    )
    ScriptedProbe.marks = {p: (0, PER_SPLIT) for p in range(MOCK_PARTITIONS)}
    settings = Settings(database_url=url, run_barrier_loop=False, worker_lease_ms=60_000)
    loop = MetaLoop(settings, db, watcher=SourceWatcher(db, 1.0, probe_factory=ScriptedProbe))
    conn = psycopg2.connect(db.libpq_url)
    try:
        with api_client(create_app(settings, db)) as client:
            worker = FakeWorker(client).register()
            assert client.post("/v1/sources", json=spec(kafka)).status_code == 201
            job = {"name": "per_user", "upstream": {"source": "clicks"}}
            r = client.post("/v1/jobs", json=job | {"parallelism": parallelism})
            assert r.status_code == 202, r.text
            loop.watcher.refresh()
            yield client, loop, worker, conn
    finally:
        conn.close()


def _mv_versions(db: Database) -> int:
    with db.transaction() as s:
        return storage_of(get_relation(s, "per_user")).count_versions(raw_cursor(s))


def _collect(worker: FakeWorker, report: CollectRequest, barrier: dict[str, Any]) -> None:
    extra = {k: v for k, v in report.to_json().items() if k in ("progress", "rows", "finished")}
    r = worker.collect(report.actor_id, barrier, **extra)
    assert r.status_code == 200, r.text


def test_a_source_actor_of_an_earlier_incarnation_writes_nothing(
    db: Database, fresh_db_url: str, kafka: MockKafka
) -> None:
    with _source_job(db, fresh_db_url, kafka, 1) as (client, loop, worker, conn):
        loop.tick()
        loop.tick()
        [a] = worker.poll()
        zombie = SourceRunner(Assignment.from_json(a))
        try:
            for b in a["barriers"]:
                zombie.on_barrier(conn, BarrierMessage.from_json(b))
            assert read_kafka(zombie, conn, 5) > 0  # the live incarnation writes
            written = _mv_versions(db)
            assert written > 0

            r = client.post(f"/v1/workers/{worker.worker_id}/failures", json={"message": "x"})
            assert r.status_code == 202
            loop.tick()
            [fresh] = worker.poll()
            assert fresh["recovery_seq"] == a["recovery_seq"] + 1
            rolled_back = _mv_versions(db)
            assert rolled_back == 0

            with pytest.raises(Fenced):
                read_kafka(zombie, conn, 5)
            conn.rollback()
            with pytest.raises(Fenced):
                zombie.on_barrier(conn, BarrierMessage.from_json(fresh["barriers"][0]))
            conn.rollback()
            assert _mv_versions(db) == rolled_back
        finally:
            zombie.close()


def test_a_split_moved_to_an_actor_resumes_from_its_committed_progress(
    db: Database, fresh_db_url: str, kafka: MockKafka
) -> None:
    with _source_job(db, fresh_db_url, kafka, 2) as (_, loop, worker, conn):
        loop.tick()
        loop.tick()
        runners = {a["actor_id"]: SourceRunner(Assignment.from_json(a)) for a in worker.poll()}
        try:
            first, second = sorted(runners)

            def epoch() -> list[dict[str, Any]]:
                """A barrier, handled and collected by every actor; its mutations."""
                loop.tick()
                seen = []
                for a in worker.poll():
                    runner = runners[a["actor_id"]]
                    for b in a["barriers"]:
                        _collect(worker, runner.on_barrier(conn, BarrierMessage.from_json(b)), b)
                        seen.append(b.get("mutation") or {})
                    read_kafka(runner, conn, 3)
                return seen

            for _ in range(3):
                epoch()
            moved = runners[first].executor.progress["1"]
            assert moved.state is SplitState.BACKFILLING and moved.offset is not None
            with db.transaction() as s:
                a, b = s.execute(select(Actor).order_by(Actor.id)).scalars()
                assert (a.splits, b.splits) == (["0", "1"], ["2", "3"])
                a.splits, b.splits = ["0"], ["1", "2", "3"]
                change = {str(a.id): ["0"], str(b.id): ["1", "2", "3"]}
                barriers.enqueue_mutation(s, 1, {"splits": change})
            committed_offset = moved.offset  # the epoch's reads after it are not committed
            assert any("splits" in m for m in epoch())
            got = runners[second].executor.progress["1"]
            assert "1" not in runners[first].executor.progress
            assert got.state is SplitState.BACKFILLING
            assert got.offset is not None and got.offset <= committed_offset
        finally:
            for r in runners.values():
                r.close()
