"""Leadership and the closing of epochs: one injector at a time; DML finishes first; a
job created or steered gets its barrier at once."""

from __future__ import annotations

import threading
from typing import Any

import psycopg2
from sqlalchemy import text

from service.api.app import create_app
from service.db import Database
from service.meta.epochs import open_dml_epoch
from service.meta.loop import MetaLoop
from service.settings import Settings
from tests.kit.auth import api_client
from tests.kit.e2e import wait_for
from tests.kit.meta import FakeWorker, actors_of, barriers_of


def _exclusive(loops: list[MetaLoop], violations: list[str]) -> None:
    """Record every moment a loop becomes leader while another one is: leadership can
    only overlap from such a moment, so checking there misses none (sampling could)."""
    for me in loops:
        others = [x.is_leader for x in loops if x is not me]
        become = me.is_leader.set

        def set_leader(become: Any = become, others: list[Any] = others) -> None:
            if any(o.is_set() for o in others):
                violations.append("a second leader")
            become()

        me.is_leader.set = set_leader  # type: ignore[method-assign]


def test_two_control_planes_never_inject_at_once(db: Database, fresh_db_url: str) -> None:
    settings = Settings(database_url=fresh_db_url, barrier_interval_ms=10)
    a, b = MetaLoop(settings, db), MetaLoop(settings, db)
    violations: list[str] = []
    _exclusive([a, b], violations)
    a.start()
    wait_for(lambda: a.is_leader.is_set(), timeout=60)
    b.start()
    wait_for(lambda: len(barriers_of(db)) >= 40, timeout=60)
    assert not b.is_leader.is_set() and not violations
    a.stop()  # the leader goes away; the other takes over
    wait_for(lambda: b.is_leader.is_set(), timeout=60)
    n = len(barriers_of(db))
    wait_for(lambda: len(barriers_of(db)) >= n + 20, timeout=60)
    b.stop()
    assert not violations
    bs = barriers_of(db)
    assert [x.curr_epoch for x in bs] == sorted({x.curr_epoch for x in bs})
    for prev, nxt in zip(bs, bs[1:], strict=False):
        assert nxt.prev_epoch == prev.curr_epoch, (
            "every barrier closes the epoch the previous one opened"
        )


def test_injection_waits_for_dml_of_the_closing_epoch(db: Database, fresh_db_url: str) -> None:
    loop = MetaLoop(Settings(database_url=fresh_db_url, run_barrier_loop=False), db)
    loop.tick()
    with db.sessions() as s, s.begin():
        epoch = open_dml_epoch(s, loop.clock())  # a DML transaction still writing
        ticker = threading.Thread(target=loop.tick)
        ticker.start()
        probe = psycopg2.connect(db.libpq_url)
        probe.autocommit = True

        def injector_waits() -> bool:
            with probe.cursor() as cur:
                cur.execute("SELECT count(*) FROM pg_locks WHERE NOT granted")
                return bool(cur.fetchone()[0])

        wait_for(injector_waits, timeout=60)
        assert barriers_of(db)[-1].curr_epoch == epoch  # not closed yet
        s.execute(text("SELECT 1"))
    ticker.join(timeout=60)
    probe.close()
    closing = barriers_of(db)[-1]
    assert closing.prev_epoch == epoch


def test_a_job_created_or_steered_gets_its_barrier_without_waiting_for_the_interval(
    db: Database, fresh_db_url: str
) -> None:
    """With a barrier every 10 minutes, a new job's actors, a pause and a new rate still
    reach the workers at once: the API asks the barrier loop for a round."""
    settings = Settings(
        database_url=fresh_db_url,
        spawn_embedded_worker=False,
        barrier_interval_ms=600_000,
        worker_lease_ms=60_000,  # the fake worker calls in only when the test does
    )
    with api_client(create_app(settings, db)) as client:
        FakeWorker(client).register()
        table = {
            "name": "orders",
            "columns": [{"name": "id", "type": "bigint"}],
            "primary_key": ["id"],
        }
        assert client.post("/v1/tables", json=table).status_code == 201
        wait_for(lambda: len(barriers_of(db)) >= 1, what="the initial barrier", timeout=60)

        def mutations() -> list[dict[str, Any]]:
            return [b.mutation for b in barriers_of(db) if b.mutation]

        job = {"name": "mv", "upstream": {"table": "orders"}, "backfill": "arrangement"}
        r = client.post("/v1/jobs", json=job | {"parallelism": 2})
        assert r.status_code == 202, r.text
        job_id = r.json()["id"]
        added = sorted(a.id for a in actors_of(db, job_id))
        wait_for(
            lambda: any(sorted(m.get("add", [])) == added for m in mutations()),
            what="the barrier adding the job's actors",
            timeout=60,
        )
        assert client.post(f"/v1/jobs/{job_id}/pause").status_code == 200
        # the pause names the job's actors (not its graph's)
        wait_for(lambda: {"pause": added} in mutations(), what="the pause barrier", timeout=60)
        assert client.patch(f"/v1/jobs/{job_id}", json={"rate_limit": 7}).status_code == 200
        wait_for(
            lambda: any("throttle" in m for m in mutations()),
            what="the barrier with the new rate",
            timeout=60,
        )
