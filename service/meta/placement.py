"""Which live worker takes an actor: the least loaded for its capacity."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Sequence

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.catalog.models import Actor, Worker


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


def place_unplaced(session: Session, actor_ids: Sequence[int]) -> bool:
    """Give the actors among ``actor_ids`` that were placed when no worker was live, and
    have not started, a live worker now; False while there is none (they would start
    orphaned, and their graph would recover at once)."""
    unplaced = list(
        session.execute(
            select(Actor).where(
                Actor.id.in_(actor_ids), Actor.worker_id.is_(None), Actor.first_epoch.is_(None)
            )
        ).scalars()
    )
    if not unplaced:
        return True
    if not reassign(session, unplaced):
        return False
    session.flush()
    return True


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
