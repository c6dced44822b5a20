"""Recovery of a graph (``docs/architecture.md#recovery``).

Stop injecting, forget uncommitted barriers, roll the graph's derived tables (MVs) back
to its committed epoch, re-place actors whose worker is gone, then inject an
``initial`` barrier from the committed epoch; actors restore committed progress.

User tables are not rolled back: DML acknowledged to a client is durable. The changes
it made in epochs after the committed one are read again by the actors, which
restart from the committed epoch.
"""

from __future__ import annotations

import datetime as dt
import logging

from sqlalchemy import delete, or_, select, update
from sqlalchemy.orm import Session

from service.catalog import events
from service.catalog.models import Actor, Barrier, BarrierCollect, Graph, Job, Relation, Worker
from service.catalog.queries import storage_of
from service.db import raw_cursor
from service.meta import creating, metrics, sources
from service.meta.barriers import gate_graph, lock_graph
from service.meta.epochs import next_epoch
from service.meta.placement import reassign

log = logging.getLogger(__name__)


def request_recovery(session: Session, graph_id: int, reason: str) -> None:
    graph = lock_graph(session, graph_id)
    if graph.state == "running":  # a stopped graph (its job failed) waits for a retry
        graph.state = "recovering"
        graph.recovery_reason = reason


def expire_workers(session: Session) -> list[int]:
    """Declare workers with lapsed leases dead; their graphs go into recovery."""
    now = dt.datetime.now(dt.UTC)
    dead = list(
        session.execute(
            select(Worker)
            .where(Worker.state == "alive", Worker.lease_expires_at <= now)
            .with_for_update()
        ).scalars()
    )
    for w in dead:
        w.state = "dead"
        log.warning("worker %s (%s) lease expired", w.id, w.name)
    if dead:
        graphs = session.execute(
            select(Actor.graph_id).where(Actor.worker_id.in_([w.id for w in dead])).distinct()
        ).scalars()
        for g in list(graphs):
            request_recovery(session, g, "worker lease expired")
    return [w.id for w in dead]


def graphs_with_orphans(session: Session) -> list[int]:
    """Running graphs with a live actor on no worker or on a dead one."""
    q = (
        select(Actor.graph_id)
        .outerjoin(Worker, Worker.id == Actor.worker_id)
        .join(Graph, Graph.id == Actor.graph_id)
        .where(
            Graph.state == "running",
            Actor.first_epoch.is_not(None),  # added already (pending adds wait for their barrier)
            Actor.last_epoch.is_(None),
            or_(Actor.worker_id.is_(None), Worker.state != "alive"),
        )
        .distinct()
    )
    return list(session.execute(q).scalars())


def graphs_with_orphans_any_state(session: Session) -> list[int]:
    """Graphs (running or recovering) with a live actor that has no live worker."""
    q = (
        select(Actor.graph_id)
        .outerjoin(Worker, Worker.id == Actor.worker_id)
        .where(Actor.last_epoch.is_(None), or_(Actor.worker_id.is_(None), Worker.state != "alive"))
        .distinct()
    )
    return list(session.execute(q).scalars())


def recover(session: Session, graph_id: int, now_ms: int) -> bool:
    """Run recovery of one graph; False while no live worker can take its actors."""
    # the rounds of Spark jobs spanning epochs hold no lock of the graph's row (barriers
    # need not wait for them), but its gate: those under way end before the rollback, and
    # later ones see the new incarnation
    gate_graph(session, graph_id)
    graph = lock_graph(session, graph_id)
    if graph.recover_after_ms is not None and now_ms < graph.recover_after_ms:
        return False  # a failing job's backoff (``service/meta/failures.py``)
    committed = graph.committed_epoch
    reason = graph.recovery_reason or "recovery"
    # a creating graph starts again at the epoch after its committed one, which the last
    # committed barrier opened: forget that barrier too
    forgotten = (
        Barrier.curr_epoch > committed if graph.kind == "creating" else Barrier.state != "committed"
    )
    uncommitted = select(Barrier.curr_epoch).where(Barrier.graph_id == graph_id, forgotten)
    session.execute(
        delete(BarrierCollect).where(
            BarrierCollect.graph_id == graph_id, BarrierCollect.curr_epoch.in_(uncommitted)
        )
    )
    session.execute(delete(Barrier).where(Barrier.graph_id == graph_id, forgotten))
    if graph.kind == "main":
        sources.rollback(session, committed)
    cur = raw_cursor(session)
    for rel in session.execute(
        select(Relation).where(Relation.graph_id == graph_id, Relation.kind == "mv")
    ).scalars():
        storage_of(rel).rollback(cur, committed)

    actors = list(
        session.execute(
            select(Actor).where(
                Actor.graph_id == graph_id,
                or_(Actor.last_epoch.is_(None), Actor.last_epoch > committed),
            )
        ).scalars()
    )
    alive = {w for w in session.execute(select(Worker.id).where(Worker.state == "alive")).scalars()}
    orphans = [a for a in actors if a.worker_id not in alive]
    if orphans and not reassign(session, orphans):
        graph.state = "recovering"
        graph.recovery_reason = reason
        return False

    upstream_epoch = None
    if graph.kind == "creating":
        # a snapshot backfill resumes phase 1 on fake epochs, or phase 2 at the upstream
        # epoch after its committed one
        nxt = creating.recovery_epoch(session, graph)
        if nxt is None:
            graph.state = "recovering"
            graph.recovery_reason = reason
            return False
        curr, upstream_epoch = nxt
    else:
        curr = next_epoch(max(graph.current_epoch, committed), now_ms)
    # stops and adds decided by forgotten barriers are undone; every live actor restarts
    session.execute(
        update(Actor)
        .where(Actor.graph_id == graph_id, Actor.last_epoch > committed)
        .values(last_epoch=None)
    )
    session.execute(
        update(Actor)
        .where(
            Actor.graph_id == graph_id, Actor.last_epoch.is_(None), Actor.first_epoch.is_not(None)
        )
        .values(first_epoch=curr)
    )
    session.add(
        Barrier(
            graph_id=graph_id,
            prev_epoch=committed,
            curr_epoch=curr,
            kind="initial",
            upstream_epoch=upstream_epoch,
        )
    )
    graph.current_epoch = curr
    graph.recovery_seq += 1
    graph.state = "running"
    graph.recovery_reason = None
    graph.recover_after_ms = None
    session.flush()
    metrics.RECOVERIES.labels(str(graph_id), reason).inc()
    jobs = session.execute(
        select(Job.id).where(Job.graph_id == graph_id, Job.state.in_(("creating", "created")))
    ).scalars()
    events.record_many(
        session,
        "recovered",
        [
            (j, {"reason": reason, "recovery_seq": graph.recovery_seq, "epoch": committed})
            for j in jobs
        ],
    )
    log.warning("graph %s recovered from epoch %s (%s)", graph_id, committed, reason)
    from service.meta.barriers import try_complete

    try_complete(session, graph)
    return True
