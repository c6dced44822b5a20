"""Placing actors: P actors per job, contiguous vnode ranges, least-loaded live workers."""

from __future__ import annotations

import datetime as dt
from collections import Counter

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from backfill_core.vnode import even_split
from service.catalog.models import Actor, Job, Worker
from service.meta.barriers import enqueue_mutation


def live_workers(session: Session) -> list[Worker]:
    now = dt.datetime.now(dt.UTC)
    return list(
        session.execute(
            select(Worker)
            .where(Worker.state == "alive", Worker.lease_expires_at > now)
            .order_by(Worker.id)
        ).scalars()
    )


def worker_loads(session: Session) -> Counter[int]:
    rows = session.execute(
        select(Actor.worker_id, func.count())
        .where(Actor.worker_id.is_not(None), Actor.last_epoch.is_(None))
        .group_by(Actor.worker_id)
    ).all()
    return Counter({w: n for w, n in rows})


def pick_worker(workers: list[Worker], loads: Counter[int]) -> Worker | None:
    """The live worker with the most spare capacity (ties: the oldest)."""
    if not workers:
        return None
    best = min(workers, key=lambda w: (loads[w.id] / max(w.capacity, 1), w.id))
    loads[best.id] += 1
    return best


START_AT_RECOVERY = 0  # first_epoch of actors that the next recovery starts


def place_job_actors(
    session: Session, job: Job, vnode_count: int, *, at_recovery: bool = False
) -> list[Actor]:
    """Create the job's actors, started by the next barrier (an ``add`` mutation) or,
    with ``at_recovery``, by the ``initial`` barrier of the next recovery."""
    assert job.graph_id is not None
    workers = live_workers(session)
    loads = worker_loads(session)
    actors = []
    for bitmap in even_split(vnode_count, job.parallelism):
        w = pick_worker(workers, loads)
        actor = Actor(
            job_id=job.id,
            graph_id=job.graph_id,
            worker_id=w.id if w else None,
            vnodes=bitmap.to_json(),
            splits=[],
            first_epoch=START_AT_RECOVERY if at_recovery else None,
        )
        session.add(actor)
        actors.append(actor)
    session.flush()
    if not at_recovery:
        enqueue_mutation(session, job.graph_id, {"add": [a.id for a in actors]})
    return actors


def reassign(session: Session, actors: list[Actor]) -> bool:
    """Move actors to live workers; False when there is no live worker."""
    workers = live_workers(session)
    if not workers:
        return False
    loads = worker_loads(session)
    for a in actors:
        w = pick_worker(workers, loads)
        assert w is not None
        a.worker_id = w.id
    return True
