"""The workers as an operator sees them: their liveness, capacity, heartbeats and the
actors placed on them (``GET /v1/workers``, ``backfill workers list``)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy import select

from service.catalog.models import Actor, Worker
from service.db import Database


@dataclass(frozen=True)
class PlacedActor:
    id: int
    job_id: int
    graph_id: int
    state: str


@dataclass(frozen=True)
class WorkerInfo:
    id: int
    name: str
    state: str
    capacity: int
    registered_at: dt.datetime
    last_heartbeat_at: dt.datetime
    lease_expires_at: dt.datetime
    actors: list[PlacedActor]


def list_workers(db: Database, *, include_gone: bool = False) -> list[WorkerInfo]:
    """Workers by id with their live actors (those not stopped); ``include_gone`` adds
    the dead and deregistered ones."""
    with db.transaction() as s:
        query = select(Worker).order_by(Worker.id)
        if not include_gone:
            query = query.where(Worker.state == "alive")
        workers = list(s.execute(query).scalars())
        placed: dict[int, list[PlacedActor]] = {w.id: [] for w in workers}
        actors = s.execute(
            select(Actor)
            .where(Actor.worker_id.in_(list(placed)), Actor.last_epoch.is_(None))
            .order_by(Actor.id)
        ).scalars()
        for a in actors:
            placed[a.worker_id or 0].append(PlacedActor(a.id, a.job_id, a.graph_id, a.state))
        return [
            WorkerInfo(
                w.id,
                w.name,
                w.state,
                w.capacity,
                w.registered_at,
                w.last_heartbeat_at,
                w.lease_expires_at,
                placed[w.id],
            )
            for w in workers
        ]
