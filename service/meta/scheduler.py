"""Placing actors: P actors per job, contiguous vnode ranges, least-loaded live workers."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.orm import Session

from backfill_core.vnode import even_split
from service.catalog.models import Actor, Job
from service.meta.barriers import enqueue_mutation
from service.meta.placement import live_workers, pick_worker, worker_loads

START_AT_RECOVERY = 0  # first_epoch of actors that the next recovery starts


def split_ranges(splits: Sequence[str], parallelism: int) -> list[list[str]]:
    """Contiguous, even shares of the splits (the first actors take the remainder)."""
    share, extra = divmod(len(splits), parallelism)
    out, at = [], 0
    for i in range(parallelism):
        n = share + (1 if i < extra else 0)
        out.append(list(splits[at : at + n]))
        at += n
    return out


def place_job_actors(
    session: Session,
    job: Job,
    vnode_count: int,
    *,
    at_recovery: bool = False,
    splits: Sequence[str] | None = None,
) -> list[Actor]:
    """Create the job's actors, started by the next barrier (an ``add`` mutation) or,
    with ``at_recovery``, by the ``initial`` barrier of the next recovery. A job reading
    a source gets ``splits`` spread over its actors instead of vnodes."""
    assert job.graph_id is not None
    workers = live_workers(session)
    loads = worker_loads(session)
    actors = []
    if splits is None:
        shares = [(b.to_json(), []) for b in even_split(vnode_count, job.parallelism)]
    else:
        shares = [([], part) for part in split_ranges(splits, job.parallelism)]
    for vnodes, own_splits in shares:
        w = pick_worker(workers, loads)
        actor = Actor(
            job_id=job.id,
            graph_id=job.graph_id,
            worker_id=w.id if w else None,
            vnodes=vnodes,
            splits=own_splits,
            first_epoch=START_AT_RECOVERY if at_recovery else None,
        )
        session.add(actor)
        actors.append(actor)
    session.flush()
    if not at_recovery:
        enqueue_mutation(session, job.graph_id, {"add": [a.id for a in actors]})
    return actors
