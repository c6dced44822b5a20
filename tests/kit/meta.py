"""Test kit for the meta: scripted fake workers speaking the HTTP protocol, and jobs."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg2
from fastapi.testclient import TestClient
from sqlalchemy import event, select, text

from backfill_core.schema import Column, ColumnType, TableSchema
from service.api.app import create_app
from service.catalog.models import Actor, Barrier, Graph, Job
from service.catalog.queries import get_relation
from service.db import Database
from service.meta.loop import MetaLoop
from service.meta.scheduler import place_job_actors
from service.settings import Settings
from service.usecases import tables
from tests.kit.auth import api_client, auth_header

WORKER = auth_header("worker")  # a fake worker speaks with the worker token


@contextmanager
def manual_api(db: Database, url: str, **settings: Any) -> Iterator[tuple[TestClient, MetaLoop]]:
    """The API without its barrier loop, and that loop to drive by hand (``tick``);
    ``settings`` besides. Fake workers get a 60 s lease: they call in only when the
    test does."""
    config = Settings(database_url=url, run_barrier_loop=False, worker_lease_ms=60_000, **settings)
    loop = MetaLoop(config, db)
    with api_client(create_app(config, db)) as client:
        yield client, loop


SCHEMA = TableSchema.build(
    [Column("id", ColumnType.BIGINT), Column("v", ColumnType.TEXT)], ["id"], vnode_count=16
)


def make_job(db: Database, name: str, parallelism: int, *, upstream: str | None = None) -> int:
    """An arrangement-kind job on the main graph whose actors are placed now."""
    if upstream is None:
        upstream = f"{name}_src"
        tables.create_table(db, upstream, SCHEMA)
    tables.create_table(db, f"{name}_mv", SCHEMA, kind="mv")
    with db.transaction() as s:
        up = get_relation(s, upstream)
        mv = get_relation(s, f"{name}_mv")
        job = Job(
            name=name,
            kind="arrangement",
            parallelism=parallelism,
            upstream_relation_id=up.id,
            mv_relation_id=mv.id,
            columns=["id", "v"],
            graph_id=1,
        )
        s.add(job)
        s.flush()
        place_job_actors(s, job, SCHEMA.vnode_count)
        return job.id


@dataclass
class FakeWorker:
    """Plays the worker side of the protocol; each call is one HTTP request."""

    client: TestClient
    name: str = "fake"
    capacity: int = 8
    worker_id: int = 0
    collected: list[tuple[int, int]] = field(default_factory=list)  # (actor, curr)
    incarnations: dict[int, int] = field(default_factory=dict)  # actor -> recovery_seq

    def register(self) -> FakeWorker:
        body = {"name": self.name, "capacity": self.capacity}
        r = self.client.post("/v1/workers", json=body, headers=WORKER)
        assert r.status_code == 201, r.text
        self.worker_id = r.json()["worker_id"]
        return self

    def poll(self, timeout_ms: int = 0) -> list[dict[str, Any]]:
        r = self.client.get(
            f"/v1/workers/{self.worker_id}/barriers",
            params={"timeout_ms": timeout_ms},
            headers=WORKER,
        )
        assert r.status_code == 200, r.text
        assignments: list[dict[str, Any]] = r.json()["assignments"]
        self.incarnations.update({a["actor_id"]: a["recovery_seq"] for a in assignments})
        return assignments

    def collect(self, actor_id: int, barrier: dict[str, Any], **extra: Any) -> Any:
        """Collect ``barrier`` in the incarnation the last poll told for the actor
        (``recovery_seq=`` says another)."""
        body = {
            "actor_id": actor_id,
            "recovery_seq": self.incarnations.get(actor_id, 0),
            "prev_epoch": barrier["prev"],
            "curr_epoch": barrier["curr"],
        } | extra
        return self.client.post(f"/v1/workers/{self.worker_id}/collect", json=body, headers=WORKER)

    def collect_all(self, *, skip_actor: int | None = None, finished: bool = False) -> int:
        """Collect every ready barrier of every actor (in order); returns how many."""
        n = 0
        for a in self.poll():
            if a["actor_id"] == skip_actor:
                continue
            for b in a["barriers"]:
                r = self.collect(a["actor_id"], b, finished=finished, progress=_progress(a, b))
                assert r.status_code == 200, r.text
                self.collected.append((a["actor_id"], b["curr"]))
                n += 1
        return n

    def heartbeat(self) -> int:
        url = f"/v1/workers/{self.worker_id}/heartbeat"
        return self.client.post(url, headers=WORKER).status_code


def _progress(assignment: dict[str, Any], barrier: dict[str, Any]) -> dict[str, Any]:
    """Fake per-vnode progress: the row count is the barrier's curr, so it moves."""
    vnodes = [v for lo, hi in assignment["vnodes"] for v in range(lo, hi)]
    return {
        "vnodes": [
            {
                "vnode": v,
                "state": "in_progress",
                "current_pos": [v],
                "row_count": barrier["curr"] % 1000,
            }
            for v in vnodes
        ]
    }


def committed_epoch(db: Database, graph_id: int = 1) -> int:
    with db.transaction() as s:
        return s.execute(select(Graph.committed_epoch).where(Graph.id == graph_id)).scalar_one()


def barriers_of(db: Database, graph_id: int = 1) -> list[Barrier]:
    with db.transaction() as s:
        return list(
            s.execute(
                select(Barrier).where(Barrier.graph_id == graph_id).order_by(Barrier.curr_epoch)
            ).scalars()
        )


def main_committed_epochs(db: Database) -> list[int]:
    """The epochs the main graph's kept history committed, in order."""
    return [b.prev_epoch for b in barriers_of(db) if b.prev_epoch > 0 and b.state == "committed"]


@contextmanager
def statements(db: Database) -> Iterator[dict[str, list[str]]]:
    """What is sent meanwhile, per engine, one entry a round trip (several statements
    sent together are one entry, joined by ``;``): ``engine`` (transactions of
    requests), ``loop`` (the barrier loop's transactions), ``readers`` (single
    statements outside a transaction). Every cursor of a connection checked out
    meanwhile counts, SQLAlchemy's and plain ones (``raw_cursor``); ``BEGIN``,
    ``COMMIT`` and the pool's pre-ping do not."""
    seen: dict[str, list[str]] = {"engine": [], "loop": [], "readers": []}
    engines = {"engine": db.engine, "loop": db.loop_engine, "readers": db.readers}
    hooks: dict[str, tuple[Any, Any]] = {}
    for name, engine in engines.items():
        counting = _counting_cursor(seen[name])

        def out(dbapi: Any, _record: Any, _proxy: Any, counting: Any = counting) -> None:
            dbapi.cursor_factory = counting

        def back(dbapi: Any, _record: Any) -> None:
            if dbapi is not None:
                dbapi.cursor_factory = psycopg2.extensions.cursor

        hooks[name] = (out, back)
        event.listen(engine, "checkout", out)
        event.listen(engine, "checkin", back)
    try:
        yield seen
    finally:
        for name, engine in engines.items():
            event.remove(engine, "checkout", hooks[name][0])
            event.remove(engine, "checkin", hooks[name][1])


def _counting_cursor(sink: list[str]) -> type[Any]:
    class Counting(psycopg2.extensions.cursor):  # type: ignore[misc]
        def _keep(self, query: Any) -> None:
            if isinstance(query, bytes):
                query = query.decode()
            elif not isinstance(query, str):
                query = query.as_string(self)
            sink.append(" ".join(query.split()))

        def execute(self, query: Any, params: Any = None) -> Any:
            self._keep(query)
            return super().execute(query, params)

        def executemany(self, query: Any, params: Any) -> Any:
            self._keep(query)
            return super().executemany(query, params)

    return Counting


def scalar(db: Database, sql: str, **params: Any) -> Any:
    """One value a query gives, in a connection of its own."""
    with db.engine.connect() as conn:
        return conn.execute(text(sql), params).scalar_one()


def actors_of(db: Database, job_id: int) -> list[Actor]:
    with db.transaction() as s:
        return list(
            s.execute(select(Actor).where(Actor.job_id == job_id).order_by(Actor.id)).scalars()
        )


def key_index(db: Database, table: str = "orders") -> tuple[int, bool] | None:
    """The key index of ``table``'s storage: its OID (a new one when it was built again)
    and whether it is a valid unique index."""
    with db.engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT i.indexrelid::bigint, i.indisunique AND i.indisvalid FROM pg_index i "
                "JOIN pg_class c ON c.oid = i.indexrelid "
                "WHERE i.indrelid = to_regclass(:t) AND c.relname LIKE '%\\_key'"
            ),
            {"t": f"store.{table}"},
        ).one_or_none()
    return None if row is None else (int(row[0]), bool(row[1]))
