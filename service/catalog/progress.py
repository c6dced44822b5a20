"""What a progress read needs, in one statement: dashboards poll it many times a second
(``bench/bench_progress_polling.py``), so it costs one round trip and no ORM objects."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any, Literal

from sqlalchemy import text

from backfill_core.epoch import lag_ms
from backfill_core.executors.source import split_key
from service.catalog.models import MAIN_GRAPH_ID
from service.catalog.queries import WAITING_FOR_WORKER_SQL
from service.db import Database
from service.errors import NotFound

RECENT_RECOVERIES = 5


@dataclass(frozen=True, slots=True)
class VnodeRow:
    vnode: int
    state: str
    current_pos: list[Any] | None
    row_count: int


@dataclass(frozen=True, slots=True)
class SplitRow:
    split: str
    state: str
    offset: int | None
    target_offset: int | None
    num_consumed_rows: int
    skipped: int = 0
    last_skipped_offset: int | None = None


@dataclass(frozen=True, slots=True)
class Kept:
    """The job's progress as the commits keep it (never goes back)."""

    consumed_rows: int
    rows_per_s: float
    total_estimate: int | None  # the upstream's row estimate when the job was created


@dataclass(frozen=True, slots=True)
class Recovery:
    at: dt.datetime
    reason: str | None


@dataclass(frozen=True, slots=True)
class Failure:
    """A failed attempt of the job (``service/meta/failures.py``)."""

    at_ms: int
    actor_id: int
    epoch: int
    message: str
    backoff_ms: int | None  # None: it failed the job


@dataclass(frozen=True)
class LogStoreLag:
    """Where a snapshot backfill's creating graph is against its upstream."""

    phase: Literal["snapshot", "log_store", "finishing"]
    lag_ms: int  # upstream committed epoch - replayed epoch, in physical time
    lag_epochs: int  # upstream epochs closed and committed, not yet replayed


@dataclass(frozen=True)
class ProgressSnapshot:
    """Everything a progress read needs, read in one statement."""

    job_id: int
    kind: str
    state: str
    snapshot_epoch: int | None
    vnodes: list[VnodeRow]
    splits: list[SplitRow]
    kept: Kept | None
    upstream_estimate: int
    committed_epoch: int
    log_store: LogStoreLag | None = None
    recoveries: list[Recovery] = field(default_factory=list)  # the latest first
    waiting_for_worker: bool = False
    error: str | None = None
    failures: list[Failure] = field(default_factory=list)  # within the window, oldest first


_PROGRESS = text(
    f"""
    SELECT j.kind, j.state, j.snapshot_epoch, j.error, g.kind AS graph_kind,
      g.committed_epoch, g.current_epoch, m.committed_epoch AS main_committed,
      p.job_id IS NOT NULL AS kept, p.consumed_rows, p.rows_per_s, p.total_estimate,
      (SELECT c.reltuples FROM pg_class c
        WHERE c.oid = to_regclass('store.' || quote_ident(r.storage_table))) AS estimate,
      (SELECT coalesce(jsonb_agg(jsonb_build_array(v.vnode, v.state, v.current_pos, v.row_count)
                                 ORDER BY v.vnode), '[]'::jsonb)
        FROM vnode_progress v WHERE v.job_id = j.id) AS vnodes,
      (SELECT coalesce(jsonb_agg(jsonb_build_array(x.split, x.state, x."offset",
                                                   x.target_offset, x.num_consumed_rows,
                                                   x.skipped, x.last_skipped_offset)),
                       '[]'::jsonb)
        FROM split_progress x WHERE x.job_id = j.id) AS splits,
      (SELECT coalesce(jsonb_agg(jsonb_build_array(e.created_at, e.data->>'reason')
                                 ORDER BY e.id DESC), '[]'::jsonb)
        FROM (SELECT id, created_at, data FROM events
              WHERE job_id = j.id AND kind = 'recovered' ORDER BY id DESC LIMIT :recent) e
      ) AS recoveries,
      (SELECT coalesce(jsonb_agg(jsonb_build_array(f.at_ms, f.actor_id, f.epoch, f.message,
                                                   f.backoff_ms) ORDER BY f.id), '[]'::jsonb)
        FROM job_failures f WHERE f.job_id = j.id) AS failures,
      CASE WHEN g.kind = 'creating' AND j.snapshot_epoch IS NOT NULL THEN
        (SELECT count(*) FROM barriers b
          WHERE b.graph_id = :main
            AND b.prev_epoch > greatest(g.committed_epoch, j.snapshot_epoch)
            AND b.prev_epoch <= m.committed_epoch)
      END AS lag_epochs,
      {WAITING_FOR_WORKER_SQL} AS waiting_for_worker
    FROM jobs j
    LEFT JOIN graphs g ON g.id = j.graph_id
    LEFT JOIN graphs m ON m.id = :main
    LEFT JOIN job_progress p ON p.job_id = j.id
    LEFT JOIN relations r ON r.id = j.upstream_relation_id
    WHERE j.id = :job
    """
)


def _log_store_lag(row: Any) -> LogStoreLag | None:
    if row.graph_kind != "creating" or row.snapshot_epoch is None:
        return None
    replayed = max(row.committed_epoch, row.snapshot_epoch)
    phase: Literal["snapshot", "log_store", "finishing"]
    if row.committed_epoch < row.snapshot_epoch:
        phase = "snapshot"
    elif row.current_epoch > row.main_committed:
        phase = "finishing"  # its last barrier opened an epoch the upstream has not committed
    else:
        phase = "log_store"
    return LogStoreLag(phase, lag_ms(row.main_committed, replayed), int(row.lag_epochs))


def progress_snapshot(db: Database, job_id: int) -> ProgressSnapshot:
    row = db.first_alone(
        _PROGRESS, {"job": job_id, "main": MAIN_GRAPH_ID, "recent": RECENT_RECOVERIES}
    )
    if row is None:
        raise NotFound(f"job {job_id} does not exist", {"id": job_id})
    kept = (
        Kept(int(row.consumed_rows), float(row.rows_per_s), row.total_estimate)
        if row.kept
        else None
    )
    return ProgressSnapshot(
        job_id=job_id,
        kind=row.kind,
        state=row.state,
        snapshot_epoch=row.snapshot_epoch,
        vnodes=[VnodeRow(*v) for v in row.vnodes],
        splits=sorted((SplitRow(*x) for x in row.splits), key=lambda p: split_key(p.split)),
        kept=kept,
        upstream_estimate=max(0, int(row.estimate)) if row.estimate is not None else 0,
        committed_epoch=int(row.committed_epoch or 0),
        log_store=_log_store_lag(row),
        recoveries=[Recovery(dt.datetime.fromisoformat(at), why) for at, why in row.recoveries],
        waiting_for_worker=bool(row.waiting_for_worker),
        error=row.error,
        failures=[Failure(*f) for f in row.failures],
    )
