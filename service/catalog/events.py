"""Job events: recorded in the transaction that makes them true, read as a stream.

Kinds: ``job_created``, ``paused``, ``resumed``, ``throttled``, ``rescaled``,
``recovered``, ``phase_changed`` (a snapshot backfill read its snapshot and replays the
upstream's epochs since), ``created`` (the backfill finished), ``cancelled`` (dropped while
creating), ``dropped``.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from service.catalog.models import Event
from service.db import Database

PAGE = 500


def record(s: Session, kind: str, job_id: int | None, **data: Any) -> None:
    s.add(Event(kind=kind, job_id=job_id, data=data))


def record_many(s: Session, kind: str, rows: list[tuple[int, dict[str, Any]]]) -> None:
    if rows:
        s.execute(insert(Event), [{"kind": kind, "job_id": j, "data": d} for j, d in rows])


def after(db: Database, last_id: int, job_id: int | None = None, limit: int = PAGE) -> list[Event]:
    """Events with an id above ``last_id`` (of one job, or all), oldest first."""
    with db.transaction() as s:
        q = select(Event).where(Event.id > last_id)
        if job_id is not None:
            q = q.where(Event.job_id == job_id)
        return list(s.execute(q.order_by(Event.id).limit(limit)).scalars())


def before_recent(db: Database, count: int, job_id: int | None = None) -> int:
    """The id just below the ``count`` latest events (of one job, or all): a stream
    that starts after it begins with them."""
    with db.transaction() as s:
        q = select(Event.id).order_by(Event.id.desc()).offset(count - 1).limit(1)
        if job_id is not None:
            q = q.where(Event.job_id == job_id)
        nth = s.execute(q).scalar_one_or_none()
    return 0 if nth is None else int(nth) - 1
