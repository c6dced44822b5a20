"""Use cases that steer a job: pause, resume, throttle, rescale, drop.

Each queues what it changes as a mutation of the job's graph (or a recovery, for a
rescale) in the transaction that changes the job's row; ``steered`` then asks for the
graph's next round (``docs/architecture.md#steering-a-job``).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from backfill_core.executors.source import split_key
from service.catalog import events, reader_views
from service.catalog.models import MAIN_GRAPH_ID, Actor, EpochPin, Job, JobProgress, Relation
from service.catalog.queries import load_job, storage_of
from service.db import Database, raw_cursor, retry_deadlocks
from service.errors import Conflict, Invalid
from service.meta import failures
from service.meta.barriers import enqueue_mutation
from service.meta.indexer import stop_build
from service.meta.recovery import request_recovery
from service.meta.scheduler import place_job_actors
from service.meta.signal import BarrierSignal
from service.usecases.jobs import MAX_PARALLELISM


def steered(signal: BarrierSignal, job: Job) -> Job:
    """A job created, paused, resumed, throttled or rescaled: the mutation (or recovery) it
    queued rides the next round of its graph, which this process's barrier loop (when it
    leads) then runs at once.

    Only its graph's: a snapshot job's creating graph needs no main barrier, and one
    injected with the job's first barrier reached the upstream's actors exactly when the
    job's start (its actors' first reads) loaded the machine (``bench_coupling``: the
    slowest upstream barriers of a throttled phase 1 were at its start)."""
    signal.request_barrier(("main",) if job.graph_id == MAIN_GRAPH_ID else ("creating",))
    return job


def _live_actors(s: Session, job_id: int) -> list[int]:
    """The job's actors a flow mutation (pause, resume, throttle) names: those not
    stopped, including any placed but not started yet. Actors placed later (a rescale, a
    recovery) start from the job's row instead (``paused``, ``rate_limit``)."""
    return list(
        s.execute(
            select(Actor.id)
            .where(Actor.job_id == job_id, Actor.last_epoch.is_(None))
            .order_by(Actor.id)
        ).scalars()
    )


def _not_cdc(s: Session, job: Job, what: str) -> None:
    """A CDC table's job goes with its table, and has one actor."""
    if job.kind == "cdc":
        table = s.get(Relation, job.mv_relation_id) if job.mv_relation_id else None
        raise Conflict(
            f"job {job.id} mirrors table {table.name if table else '?'!r} and cannot be {what}",
            {"kind": job.kind, "table": table.name if table else None},
            code="job_is_cdc",
        )


def set_paused(db: Database, job_id: int, paused: bool) -> Job:
    with db.transaction() as s:
        job = load_job(s, job_id, lock=True)
        if job.state not in ("creating", "created"):
            raise Conflict(f"job {job_id} is {job.state}", {"state": job.state})
        if job.paused != paused:
            job.paused = paused
            assert job.graph_id is not None
            # the job's actors only: the graph's other jobs keep their own paused flags
            key = "pause" if paused else "resume"
            enqueue_mutation(s, job.graph_id, {key: _live_actors(s, job.id)})
            events.record(s, "paused" if paused else "resumed", job.id)
        return job


@retry_deadlocks
def update_job(
    db: Database, job_id: int, rate_limit: Any, parallelism: int | None, set_rate: bool
) -> Job:
    with db.transaction() as s:
        job = load_job(s, job_id, lock=True)
        if job.state not in ("creating", "created"):
            raise Conflict(f"job {job_id} is {job.state}", {"state": job.state})
        assert job.graph_id is not None
        if set_rate and rate_limit != job.rate_limit:
            job.rate_limit = rate_limit
            actors = _live_actors(s, job.id)
            enqueue_mutation(s, job.graph_id, {"throttle": {str(a): rate_limit for a in actors}})
            events.record(s, "throttled", job.id, rate_limit=rate_limit)
        if parallelism is not None and parallelism != job.parallelism:
            _not_cdc(s, job, "rescaled: a replication slot is one stream, read by one actor")
            splits: list[str] | None = None
            if job.upstream_source_id is not None:
                # every split the job's actors own now (partitions added since included)
                owned = s.execute(
                    select(Actor.splits).where(Actor.job_id == job.id, Actor.last_epoch.is_(None))
                ).scalars()
                splits = sorted({x for part in owned for x in part}, key=split_key)
                vnode_count, most = 0, len(splits)
            else:
                up = s.get(Relation, job.upstream_relation_id)
                assert up is not None
                vnode_count = most = int(up.schema["vnode_count"])
            if not 1 <= parallelism <= min(MAX_PARALLELISM, most):
                raise Invalid(
                    f"parallelism must be in 1..{min(MAX_PARALLELISM, most)}",
                    {"field": "parallelism"},
                )
            # rescale through recovery: the new actors restart from the committed
            # per-vnode (per-split) progress at the same initial barrier, after the MV
            # rolled back
            s.execute(delete(Actor).where(Actor.job_id == job.id))
            job.parallelism = parallelism
            place_job_actors(s, job, vnode_count, at_recovery=True, splits=splits)
            request_recovery(s, job.graph_id, "rescale")
            events.record(s, "rescaled", job.id, parallelism=parallelism)
        return job


def retry_job(db: Database, job_id: int) -> Job:
    """Start a failed job again (``service/meta/failures.py``: from its committed progress
    in a creating graph, from the start in the main graph)."""
    with db.transaction() as s:
        job = load_job(s, job_id, lock=True)
        if job.state != "failed":
            raise Conflict(f"job {job_id} is {job.state}, not failed", {"state": job.state})
        if job.finished_epoch is not None and job.kind in ("chain", "snapshot"):
            # it would start over in the main graph, from a fixed snapshot its pin no
            # longer keeps (released when it was created)
            raise Conflict(
                f"job {job_id} ({job.kind}) failed after it was created and cannot start "
                "over: drop it and create it again",
                {"state": job.state, "kind": job.kind},
            )
        failures.retry(s, job)
        events.record(s, "retried", job.id)
        return job


def drop_job(db: Database, job_id: int) -> None:
    """Cancel a creating job or drop a created one: the MV and all its state go away."""
    with db.transaction() as s:
        job = load_job(s, job_id, lock=True)
        _not_cdc(s, job, "dropped: drop its table (DELETE /v1/tables/{name})")
        mv = s.get(Relation, job.mv_relation_id) if job.mv_relation_id else None
        if mv is not None:
            readers = list(
                s.execute(
                    select(Job.name).where(Job.upstream_relation_id == mv.id, Job.id != job.id)
                ).scalars()
            )
            if readers:
                raise Conflict(f"job(s) {', '.join(readers)} read this view", {"jobs": readers})
        s.execute(delete(EpochPin).where(EpochPin.holder == f"job:{job.id}"))
        s.execute(delete(JobProgress).where(JobProgress.job_id == job.id))
        events.record(s, "cancelled" if job.state == "creating" else "dropped", job.id)
        if mv is not None and mv.graph_id != MAIN_GRAPH_ID:
            mv.graph_id = MAIN_GRAPH_ID  # its creating graph goes with the job
            s.flush()
        s.delete(job)
        s.flush()
        if mv is not None:
            if not mv.epoch_indexed:
                stop_build(raw_cursor(s), mv.id)  # a build would hold the drop up
            reader_views.drop_view_of(raw_cursor(s), mv)
            storage_of(mv).drop(raw_cursor(s))
            s.delete(mv)
