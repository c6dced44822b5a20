"""The failure policy of jobs (``docs/operations.md#failed-jobs``).

A worker names the actor whose work raised (``FailureReport.cause_actor_id``); each
failure counts once per incarnation of the actor's graph against the actor's *job*
(other jobs of a shared graph are not charged). The graph's next recovery waits a
backoff that doubles with each failure of the same cause within the window; the
failure that reaches ``max_attempts`` (or a ``fatal`` one) fails the job: its actors
stop at the graph's committed epoch and the rest of the graph goes on. ``retry`` starts
them again from the job's committed progress.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from sqlalchemy import delete, func, or_, select, update
from sqlalchemy.orm import Session

from service.catalog import events
from service.catalog.models import (
    Actor,
    Graph,
    Job,
    JobFailure,
    Relation,
    SplitProgress,
    VnodeProgress,
)
from service.catalog.queries import load_job, storage_of
from service.db import raw_cursor
from service.meta import metrics
from service.meta.barriers import lock_graph
from service.meta.recovery import request_recovery
from service.meta.scheduler import START_AT_RECOVERY
from service.settings import Settings

log = logging.getLogger(__name__)

_NUMBER = re.compile(r"\d+")
CAUSE_CHARS = 200


@dataclass(frozen=True)
class FailurePolicy:
    backoff_initial_ms: int = 1_000
    backoff_max_ms: int = 60_000
    max_attempts: int = 5
    window_ms: int = 600_000

    @classmethod
    def from_settings(cls, settings: Settings) -> FailurePolicy:
        return cls(
            settings.failure_backoff_initial_ms,
            settings.failure_backoff_max_ms,
            settings.failure_max_attempts,
            settings.failure_window_ms,
        )

    def backoff_ms(self, attempt: int) -> int:
        """The wait before the recovery after the ``attempt``-th failure (1-based)."""
        return int(min(self.backoff_initial_ms * 2 ** min(attempt - 1, 32), self.backoff_max_ms))


def cause_of(message: str) -> str:
    """A failure's cause: its message with numbers masked, so that one cause that names
    an epoch, an offset or an id is the same cause at each attempt."""
    return _NUMBER.sub("N", message)[:CAUSE_CHARS]


def on_actor_failure(
    s: Session, actor_id: int, message: str, *, fatal: bool, policy: FailurePolicy, now_ms: int
) -> None:
    """Count a failure of ``actor_id``'s work against its job: back its graph's recovery
    off, or fail the job. An actor gone (its job dropped) or a job not running counts
    nothing."""
    actor = s.get(Actor, actor_id)
    if actor is None:
        return
    # the graph's row before the job's, as the barrier paths lock them (a collect, a
    # recovery, a round): the other order deadlocked with them
    job = load_job(s, actor.job_id, lock=True, graph_for_update=True)
    if job.state not in ("creating", "created") or job.graph_id is None:
        return
    graph = lock_graph(s, job.graph_id)  # (locked already: the row as an object)
    counted = s.execute(
        select(func.count()).where(
            JobFailure.job_id == job.id, JobFailure.recovery_seq == graph.recovery_seq
        )
    ).scalar_one()
    if counted:
        return  # another of its actors failed in this incarnation: one attempt
    cause = cause_of(message)
    earlier = s.execute(
        select(func.count()).where(
            JobFailure.job_id == job.id,
            JobFailure.cause == cause,
            JobFailure.at_ms > now_ms - policy.window_ms,
        )
    ).scalar_one()
    attempt = int(earlier) + 1
    failing = fatal or attempt >= policy.max_attempts
    backoff = None if failing else policy.backoff_ms(attempt)
    s.add(
        JobFailure(
            job_id=job.id,
            at_ms=now_ms,
            cause=cause,
            message=message[:2000],
            actor_id=actor_id,
            epoch=graph.committed_epoch,
            recovery_seq=graph.recovery_seq,
            backoff_ms=backoff,
        )
    )
    if backoff is not None:
        graph.recover_after_ms = max(graph.recover_after_ms or 0, now_ms + backoff)
        metrics.JOB_FAILURES.labels(str(job.id), "backoff").inc()
        log.warning(
            "job %s: actor %s failed (attempt %s, recovery in %s ms): %s",
            job.id, actor_id, attempt, backoff, message[:200],
        )  # fmt: skip
        return
    why = "fatal" if fatal else f"{attempt} times within {policy.window_ms // 1000} s"
    error = (
        f"actor {actor_id} failed ({why}) at committed epoch {graph.committed_epoch}: "
        f"{message[:1000]}"
    )
    fail_job(s, job, graph, error)
    events.record(
        s,
        "job_failed",
        job.id,
        error=error,
        cause=cause,
        actor_id=actor_id,
        epoch=graph.committed_epoch,
        attempts=attempt,
    )
    metrics.JOB_FAILURES.labels(str(job.id), "failed").inc()
    log.error("job %s failed: %s", job.id, error)


def fail_job(s: Session, job: Job, graph: Graph, error: str) -> None:
    """Mark ``job`` failed and stop its actors at its graph's committed epoch (the next
    recovery, which their failure asked for, starts the others only). A creating graph
    has no other job: it stops until a retry."""
    job.state = "failed"
    job.error = error
    committed = graph.committed_epoch
    s.execute(
        update(Actor)
        .where(
            Actor.job_id == job.id,
            or_(Actor.last_epoch.is_(None), Actor.last_epoch > committed),
        )
        .values(last_epoch=committed)
    )
    if graph.kind == "creating":
        graph.state = "stopped"


def retry(s: Session, job: Job) -> None:
    """Start a failed job again; its failures are forgotten and the actors its failure
    stopped start at its graph's next recovery.

    A job of a creating graph (a snapshot backfill) resumes from its committed progress:
    its graph stood still at its committed epoch and replays the upstream's epochs since.
    A job of the main graph starts its backfill over (its view emptied, as a chain's after
    a recovery): the main graph went on without it, and the upstream changes of the epochs
    it missed are not replayed to keys it had read."""
    assert job.graph_id is not None
    graph = lock_graph(s, job.graph_id)
    s.execute(delete(JobFailure).where(JobFailure.job_id == job.id))
    stopped_at = s.execute(select(func.max(Actor.last_epoch)).where(Actor.job_id == job.id))
    stopped = select(Actor.id).where(
        Actor.job_id == job.id, Actor.last_epoch == stopped_at.scalar()
    )
    restart = update(Actor).where(Actor.id.in_(stopped))
    if graph.kind == "main":
        mv = s.get(Relation, job.mv_relation_id)
        # a CDC table's rows agree with its durable progress: its actor goes on from there
        if mv is not None and job.kind != "cdc":
            storage_of(mv).delete_vnodes(raw_cursor(s), 0, int(mv.schema["vnode_count"]))
        s.execute(delete(VnodeProgress).where(VnodeProgress.job_id == job.id))
        s.execute(delete(SplitProgress).where(SplitProgress.job_id == job.id))
        s.execute(restart.values(last_epoch=None, first_epoch=START_AT_RECOVERY, state="running"))
        job.state = "creating"
        job.finished_epoch = None
    else:
        s.execute(restart.values(last_epoch=None, first_epoch=START_AT_RECOVERY))
        job.state = "creating"
        graph.state = "running"  # request_recovery takes the stopped graph from here
    job.error = None
    graph.recover_after_ms = None
    request_recovery(s, graph.id, "retry")
