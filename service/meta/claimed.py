"""What exports and imports share as the workers see them (``service.meta.exports``,
``service.meta.imports``): a worker claims the oldest queued row, reports on the row it
runs, and the leader fails the rows whose worker is gone. What happens when one ends
(an export's pin released, an import published or its staging table dropped) is the
caller's, passed in as a function of the row."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy import exists, select
from sqlalchemy.orm import Session

from backfill_core.protocol import TaskState
from service.catalog.models import Export, Import, Relation, Worker
from service.errors import NotFound
from service.meta.worker_errors import unknown_worker, worker_gone

Row = TypeVar("Row", Export, Import)


def check_alive(s: Session, worker_id: int) -> None:
    state = s.execute(select(Worker.state).where(Worker.id == worker_id)).scalar_one_or_none()
    if state is None:
        raise unknown_worker(worker_id)
    if state != "alive":
        raise worker_gone(worker_id, state)


def claim_oldest(
    s: Session, model: type[Row], worker_id: int, *, dropped: Callable[[Row], None]
) -> tuple[Row, Relation] | None:
    """The oldest queued row, now running on this worker, and its relation; None when
    there is none. Several workers claim at once without waiting for each other
    (``SKIP LOCKED``). A row whose relation was dropped since it was queued is handed
    to ``dropped`` (to fail it) and the claim is None."""
    check_alive(s, worker_id)
    x = s.execute(
        select(model)
        .where(model.state == TaskState.QUEUED.value)
        .order_by(model.id)
        .limit(1)
        .with_for_update(skip_locked=True)
    ).scalar_one_or_none()
    if x is None:
        return None
    rel = s.get(Relation, x.relation_id) if x.relation_id is not None else None
    if rel is None:
        dropped(x)
        return None
    x.state = TaskState.RUNNING.value
    x.worker_id = worker_id
    x.started_at = dt.datetime.now(dt.UTC)
    return x, rel


def lock(s: Session, model: type[Row], kind: str, task_id: int) -> Row:
    """The row ``task_id``, locked; 404 when there is none (``kind``: ``export``,
    ``import``)."""
    x = s.execute(select(model).where(model.id == task_id).with_for_update()).scalar_one_or_none()
    if x is None:
        raise NotFound(f"{kind} {task_id} does not exist", {f"{kind}_id": task_id})
    return x


def apply_report(
    x: Row,
    worker_id: int,
    reported: TaskState,
    *,
    ended: Callable[[Row], None],
    stopped: Callable[[Row], None],
) -> None:
    """A worker's report on the locked row ``x``: an end of the row it runs goes to
    ``ended``; the end of a cancelled row's job to ``stopped`` (its worker no longer
    reads or writes); anything else, a row no longer this worker's included, changes
    nothing."""
    mine = x.worker_id == worker_id
    if mine and x.state == TaskState.RUNNING.value and reported is not TaskState.RUNNING:
        ended(x)
    elif mine and x.state == TaskState.CANCELLED.value and reported.terminal:
        stopped(x)


def end(x: Export | Import, state: TaskState, rows: int | None, error: str | None) -> None:
    """Set what every ended row records: its state, rows, error (cut to 2000
    characters) and when it finished."""
    x.state = state.value
    x.rows = rows
    x.error = None if error is None else error[:2000]
    x.finished_at = dt.datetime.now(dt.UTC)


def sweep_lost(s: Session, model: type[Row], lost: Callable[[Row], None]) -> None:
    """Hand every row running on a worker that is gone to ``lost`` (to fail it)."""
    gone = ~exists().where(Worker.id == model.worker_id, Worker.state == "alive")
    for x in s.execute(
        select(model).where(model.state == TaskState.RUNNING.value, gone).with_for_update()
    ).scalars():
        lost(x)


def any_queued(s: Session, model: type[Export] | type[Import]) -> bool:
    return bool(
        s.execute(select(exists().where(model.state == TaskState.QUEUED.value))).scalar_one()
    )
