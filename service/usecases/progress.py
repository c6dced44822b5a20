"""A job's progress as a client reads it: rows, percent, rate, ETA and phase, computed
from one read of the catalog (``service.catalog.progress``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from service.catalog.progress import (
    RECENT_RECOVERIES,
    Failure,
    LogStoreLag,
    ProgressSnapshot,
    Recovery,
    SplitRow,
    VnodeRow,
    progress_snapshot,
)
from service.db import Database

__all__ = ["RECENT_RECOVERIES", "JobProgressReport", "Phase", "job_progress", "report"]

Phase = Literal[
    "waiting_for_worker", "backfilling", "forwarding", "snapshot", "log_store", "finishing", "done"
]


@dataclass(frozen=True)
class JobProgressReport:
    job_id: int
    kind: str
    state: str
    phase: Phase
    rows: int  # consumed as of the committed epoch; never goes back
    total_estimate: int
    percent: float  # at most 99.99 until the job is created, then 100
    rows_per_s: float
    eta_s: float | None  # None: unknown (no rate yet)
    committed_epoch: int
    snapshot_epoch: int | None
    log_store: LogStoreLag | None
    recoveries: list[Recovery]  # the latest first
    vnodes: list[VnodeRow]
    splits: list[SplitRow]
    error: str | None = None  # a failed job's: names the cause, the actor and the epoch
    failures: list[Failure] = field(default_factory=list)  # its failed attempts, oldest first


def job_progress(db: Database, job_id: int) -> JobProgressReport:
    return report(progress_snapshot(db, job_id))


def completion(
    consumed: int, total: int, rows_per_s: float, done: bool
) -> tuple[float, float | None]:
    """Percent done (at most 99.99 until the job is created, then 100) and the seconds
    left at ``rows_per_s`` (None: no rate yet); the progress route's and /metrics'."""
    if done:
        return 100.0, None
    percent = min(99.99, round(100 * consumed / total, 2)) if total else 0.0
    eta = round(max(0, total - consumed) / rows_per_s, 1) if rows_per_s > 0 else None
    return percent, eta


def report(snap: ProgressSnapshot) -> JobProgressReport:
    rows, kept = snap.vnodes, snap.kept
    consumed = max(
        kept.consumed_rows if kept else 0,
        sum(r.row_count for r in rows) + sum(p.num_consumed_rows for p in snap.splits),
    )
    fixed = kept.total_estimate if kept is not None else None
    total = max(fixed or snap.upstream_estimate, consumed)
    done = snap.state == "created"
    rate = 0.0 if done or kept is None else round(kept.rows_per_s, 1)
    percent, eta = completion(consumed, total, rate, done)
    return JobProgressReport(
        job_id=snap.job_id,
        kind=snap.kind,
        state=snap.state,
        phase=_phase(snap, done),
        rows=consumed,
        total_estimate=total,
        percent=percent,
        rows_per_s=rate,
        eta_s=0.0 if done else eta,
        committed_epoch=snap.committed_epoch,
        snapshot_epoch=snap.snapshot_epoch,
        log_store=snap.log_store,
        recoveries=snap.recoveries,
        vnodes=rows,
        splits=snap.splits,
        error=snap.error,
        failures=snap.failures,
    )


def _phase(snap: ProgressSnapshot, done: bool) -> Phase:
    if done:
        return "done"
    if snap.waiting_for_worker:
        return "waiting_for_worker"
    if snap.log_store is not None:
        return snap.log_store.phase
    rows, splits = snap.vnodes, snap.splits
    forwarding = (rows and all(r.state == "completed" for r in rows)) or (
        splits and all(p.state == "finished" for p in splits)
    )
    return "forwarding" if forwarding else "backfilling"
