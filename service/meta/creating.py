"""Creating graphs (``docs/architecture.md#snapshot-backfill``): a job's own barrier
sequence, decoupled from the upstream, and its merge into the main graph.

Phase 1 runs on *fake* epochs ``k << 16`` (far below any real epoch) while the actors
read the snapshot at ``snapshot_epoch``, at most a barrier a second in the loop's regular
rounds (``service.meta.loop.PHASE1_EVERY_MS``). Once the committed progress shows every vnode
consumed, the barrier ``{last fake, snapshot_epoch}`` ends it. Phase 2 then steps
through the upstream's committed epochs that changed it, one per barrier, each barrier
a checkpoint (so the MV is exact at every epoch the creating graph commits, and at the
skipped ones, which changed nothing), as many per tick as the pending-barrier limit
allows: the job catches up. Its last barrier closes the upstream's
committed epoch ``C`` and opens ``X``, the upstream epoch after it (still open, or closed
by a main barrier in flight). Once that barrier is committed, and the upstream has not
committed ``X`` yet, the actors move into the main graph (keeping their state) and
collect every main barrier from the one closing ``X`` on, so each upstream epoch's
changes reach the MV at that same epoch, and the job is created. From the moment that
barrier is out the main graph commits nothing at or after ``X`` and injects nothing
(for at most ``barriers.MERGE_HOLD_MS``); otherwise a job could chase the upstream
forever.

Every barrier records the upstream's committed epoch (``upstream_epoch``): the executor's
clock in phase 1 and its lag in phase 2.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import delete, func, select, text, update
from sqlalchemy.orm import Session

from backfill_core.executors.snapshot import log_store_lets_upstream_advance
from backfill_core.schema import TableSchema
from service.catalog import events
from service.catalog.models import (
    MAIN_GRAPH_ID,
    Actor,
    Barrier,
    EpochPin,
    Graph,
    Job,
    PendingMutation,
    Relation,
    VnodeProgress,
)
from service.catalog.queries import storage_of
from service.db import Database, raw_cursor
from service.meta import metrics
from service.meta.barriers import (
    apply_lifetimes,
    lock_graph,
    merge_ceiling,
    next_adds_placed,
    pop_mutation,
    try_complete,
)

FAKE_EPOCH_SHIFT = 16
# phase-2 barriers injected per tick at most: enough to outrun the upstream's one
REPLAY_PER_TICK = 32


def fake_epoch_after(epoch: int) -> int:
    return ((epoch >> FAKE_EPOCH_SHIFT) + 1) << FAKE_EPOCH_SHIFT


def _snapshot_consumed(s: Session, job: Job) -> bool:
    """Every vnode consumed, as of the creating graph's committed epoch."""
    upstream = s.get(Relation, job.upstream_relation_id)
    assert upstream is not None
    vnodes = TableSchema.from_json(upstream.schema).vnode_count
    consumed = s.execute(
        select(func.count()).where(
            VnodeProgress.job_id == job.id, VnodeProgress.state == "consumed"
        )
    ).scalar_one()
    return int(consumed) >= vnodes


def next_epoch_of(s: Session, job: Job, prev: int, main: Graph) -> int | None:
    """The ``curr`` of the creating graph's barrier closing ``prev`` (None: wait)."""
    assert job.snapshot_epoch is not None
    if prev < job.snapshot_epoch:
        return job.snapshot_epoch if _snapshot_consumed(s, job) else fake_epoch_after(prev)
    replay = _next_replayed(s, job, prev, main.committed_epoch)
    if replay is not None:
        return replay
    if prev == main.committed_epoch and main.current_epoch > prev:
        return _main_epoch_after(s, prev)  # caught up: the last barrier
    return None


def _next_replayed(s: Session, job: Job, prev: int, committed: int) -> int | None:
    """The upstream epoch the barrier closing ``prev`` opens in phase 2: the first
    committed main epoch after ``prev`` whose change log is not empty, or the committed
    epoch if none is. The epochs skipped changed nothing, so the MV (still at ``prev``)
    equals its view at each of them too (docs/architecture.md#snapshot-backfill)."""
    upto = _first_change_after(s, job, prev, committed)
    bound = Barrier.prev_epoch >= upto if upto is not None else Barrier.prev_epoch == committed
    replay = s.execute(
        select(func.min(Barrier.prev_epoch)).where(
            Barrier.graph_id == MAIN_GRAPH_ID,
            Barrier.prev_epoch > prev,
            Barrier.prev_epoch <= committed,
            bound,
        )
    ).scalar_one()
    return None if replay is None else int(replay)


def _first_change_after(s: Session, job: Job, prev: int, committed: int) -> int | None:
    """The upstream's first epoch in ``(prev, committed]`` with a change (None: none).
    Without its epoch index (an MV still being indexed) the probe would scan the
    upstream: then every epoch counts as changed."""
    upstream = s.get(Relation, job.upstream_relation_id)
    assert upstream is not None
    if not upstream.epoch_indexed or prev >= committed:
        return prev + 1
    with raw_cursor(s) as cur:
        return storage_of(upstream).next_epoch_with_changes(cur, prev, committed)


def _main_epoch_after(s: Session, epoch: int) -> int | None:
    """The epoch the main graph's barrier closing ``epoch`` opened (None: no such
    barrier, e.g. ``epoch`` is still open or a recovery discarded it)."""
    after = s.execute(
        select(func.min(Barrier.curr_epoch)).where(
            Barrier.graph_id == MAIN_GRAPH_ID, Barrier.prev_epoch == epoch
        )
    ).scalar_one()
    return None if after is None else int(after)


def _main(s: Session) -> Graph:
    main = s.get(Graph, MAIN_GRAPH_ID)
    assert main is not None
    return main


def inject(
    s: Session,
    graph_id: int,
    *,
    checkpoint_frequency: int,
    max_inflight: int,
    phase1_due: bool = True,
) -> list[Barrier]:
    """Inject a creating graph's next barriers: one in phase 1, a batch in phase 2.
    Without ``phase1_due`` a barrier of phase 1's fake epochs waits (the barrier that
    ends phase 1 does not: ``service.meta.loop.PHASE1_EVERY_MS``)."""
    graph = s.execute(
        select(Graph).where(Graph.id == graph_id).with_for_update()
    ).scalar_one_or_none()
    if graph is None or graph.state != "running" or graph.job_id is None:
        return []
    if graph.current_epoch == 0 and not next_adds_placed(s, graph_id):
        return []  # its actors wait for a worker to register: no barrier without them
    job = s.get(Job, graph.job_id)
    assert job is not None and job.snapshot_epoch is not None
    main = _main(s)
    inflight = s.execute(
        select(func.count()).where(Barrier.graph_id == graph_id, Barrier.state != "committed")
    ).scalar_one()
    out: list[Barrier] = []
    while inflight + len(out) < max_inflight and len(out) < REPLAY_PER_TICK:
        prev = graph.current_epoch
        curr = next_epoch_of(s, job, prev, main)
        if curr is None or (not phase1_due and prev > 0 and curr < job.snapshot_epoch):
            break
        graph.barrier_seq += 1
        if prev == 0:
            kind = "initial"
        elif prev >= job.snapshot_epoch or graph.barrier_seq % checkpoint_frequency == 0:
            kind = "checkpoint"
        else:
            kind = "barrier"
        mutation = pop_mutation(s, graph_id)
        if mutation:
            apply_lifetimes(s, mutation, curr)
        barrier = Barrier(
            graph_id=graph_id,
            prev_epoch=prev,
            curr_epoch=curr,
            kind=kind,
            mutation=mutation,
            upstream_epoch=main.committed_epoch,
        )
        s.add(barrier)
        graph.current_epoch = curr
        s.flush()
        metrics.BARRIERS_INJECTED.labels(str(graph_id), kind).inc()
        out.append(barrier)
        if curr == job.snapshot_epoch:
            events.record(s, "phase_changed", job.id, phase="log_store", epoch=curr)
        if curr < job.snapshot_epoch or curr > main.committed_epoch:
            # phase 1 goes a barrier at a time; the barrier ending it is followed at
            # once by the replay (one round trip fewer); the last barrier waits
            break
    if out:
        try_complete(s, graph)
    return out


def merge_caught_up(s: Session) -> list[int]:
    """Merge every creating graph that caught up into the main graph. Returns the
    merged job ids.

    Caught up: the creating graph committed everything, and its open epoch ``X`` is a
    main epoch the main graph has not committed yet (open, or closed by a barrier in
    flight). Its actors then collect every main barrier from the one closing ``X`` on.
    """
    main = lock_graph(s, MAIN_GRAPH_ID)
    if main.state != "running":
        return []
    candidates = list(
        s.execute(
            select(Graph)
            .where(
                Graph.kind == "creating",
                Graph.state == "running",
                Graph.current_epoch > main.committed_epoch,
            )
            .with_for_update(skip_locked=True)
        ).scalars()
    )
    merged = []
    for graph in candidates:
        uncommitted = s.execute(
            select(func.count()).where(Barrier.graph_id == graph.id, Barrier.state != "committed")
        ).scalar_one()
        if uncommitted or graph.committed_epoch < job_snapshot_epoch(s, graph):
            continue
        joins_at = _main_epoch_after(s, graph.current_epoch)
        if joins_at is None:
            if graph.current_epoch != main.current_epoch:
                continue  # an epoch a main recovery discarded: replay on instead
            joins_at = main.current_epoch + 1  # whatever the next main barrier opens
        job = s.get(Job, graph.job_id)
        assert job is not None
        s.execute(
            update(Actor)
            .where(Actor.graph_id == graph.id, Actor.last_epoch.is_(None))
            .values(graph_id=MAIN_GRAPH_ID, first_epoch=joins_at)
        )
        # a pause, resume or throttle of the job not injected yet names its actors only:
        # it follows them into the main graph (the graph's deletion would drop it)
        s.execute(
            update(PendingMutation)
            .where(PendingMutation.graph_id == graph.id)
            .values(graph_id=MAIN_GRAPH_ID)
        )
        s.execute(
            update(Relation).where(Relation.id == job.mv_relation_id).values(graph_id=MAIN_GRAPH_ID)
        )
        s.execute(delete(EpochPin).where(EpochPin.holder == f"job:{job.id}"))
        job.graph_id = MAIN_GRAPH_ID
        job.state = "created"
        job.finished_epoch = graph.committed_epoch
        events.record(s, "created", job.id, epoch=graph.committed_epoch, merged=True)
        s.flush()
        s.delete(graph)  # its barriers, collects and stopped actors go with it
        merged.append(job.id)
    s.flush()
    return merged


# Each actor's newest collect in its running creating graph: one probe of the collects'
# key per actor (the main graph asks at every tick). Sorting all the kept collects
# instead parsed every one's progress: a few ms on each upstream barrier for the whole
# of a snapshot backfill.
_REPLAY_REPORTS = text(
    """
    SELECT r.cap, r.curr_epoch, r.phase
    FROM graphs g JOIN actors a ON a.graph_id = g.id
    CROSS JOIN LATERAL (
        SELECT c.progress->>'max_pending_epoch_lag_ms' AS cap,
               c.curr_epoch, c.progress->>'phase' AS phase
        FROM barrier_collects c
        WHERE c.actor_id = a.id AND c.graph_id = g.id
        ORDER BY c.curr_epoch DESC LIMIT 1
    ) r
    WHERE g.kind = 'creating' AND g.state = 'running'
    """
)


def lag_capped(s: Session) -> bool:
    """The seed's lag cap: whether a snapshot backfill replaying the upstream's epochs is
    so far behind that the upstream may not seal another epoch yet (back-pressure).

    Each actor reports its cap (``max_pending_epoch_lag_ms``), which shrinks by half the
    distance of every epoch it replays, so a job that replays more slowly than the
    upstream seals epochs holds the upstream back until it catches up, then merges."""
    main = s.get(Graph, MAIN_GRAPH_ID)
    if main is None:
        return False
    for cap, next_replayed, phase in s.execute(_REPLAY_REPORTS):
        if phase != "log_store" or cap is None:
            continue
        # the collect's barrier opened the epoch the job replays next
        if not log_store_lets_upstream_advance(main.committed_epoch, next_replayed, int(cap)):
            return True
    return False


def upstream_held(s: Session) -> bool:
    """Whether the main graph injects no barrier this tick: a replaying job's lag cap
    holds the upstream back, or a job's last barrier is in flight (the merge hold).

    During the hold the main graph commits nothing at or after the epoch the job joins
    at anyway; new main barriers would only queue on the workers ahead of the job's last
    barrier, and on a busy worker outlast the hold, so that the job misses its merge and
    chases the upstream again, and again. The hold ends after ``MERGE_HOLD_MS`` at the
    latest, so the upstream never waits longer than that for one job."""
    main = s.get(Graph, MAIN_GRAPH_ID)
    if main is None:
        return False
    return lag_capped(s) or merge_ceiling(s, main) is not None


def rounds_wanted(progress: dict[str, Any] | None) -> frozenset[str]:
    """The kinds of graph whose next round need not wait for the interval after a
    snapshot job's collect: its creating graph's while it replays (the next batch, or
    its last barrier, may go out), the main graph's once its last barrier is collected
    (it may merge). An actor that read its share of the snapshot: ``snapshot_read``."""
    phase = (progress or {}).get("phase")
    if phase == "finishing":
        return frozenset({"main"})
    if phase == "log_store":
        return frozenset({"creating"})
    return frozenset()


def snapshot_read(progress: dict[str, Any] | None) -> bool:
    """The collect of an actor that read its share of its job's snapshot."""
    p = progress or {}
    return p.get("phase") == "snapshot" and p.get("finished_snapshot") is True


def phase1_over(db: Database, actor_ids: list[int]) -> bool:
    """Whether the snapshot of some job of these actors is consumed, as of its committed
    epoch: the barrier ending phase 1 may go out now. While others of its actors still
    read, a round asked for at each collect of one that is done gave it a barrier per
    round trip, each costing the reads (bench/HISTORY.md)."""
    with db.transaction() as s:
        jobs = s.execute(
            select(Job).join(Actor, Actor.job_id == Job.id).where(Actor.id.in_(actor_ids))
        ).scalars()
        return any(
            job.snapshot_epoch is not None and _snapshot_consumed(s, job) for job in set(jobs)
        )


def replay_floor(s: Session) -> int | None:
    """The oldest upstream epoch a creating graph has still to replay after (None: none)."""
    floor = s.execute(
        select(func.min(func.greatest(Graph.committed_epoch, Job.snapshot_epoch)))
        .join(Job, Job.id == Graph.job_id)
        .where(Graph.kind == "creating")
    ).scalar_one_or_none()
    return None if floor is None else int(floor)


def job_snapshot_epoch(s: Session, graph: Graph) -> int:
    job = s.get(Job, graph.job_id)
    assert job is not None and job.snapshot_epoch is not None
    return job.snapshot_epoch


def recovery_epoch(s: Session, graph: Graph) -> tuple[int, int] | None:
    """``(curr, upstream_epoch)`` of a creating graph's initial barrier after a recovery."""
    assert graph.job_id is not None
    job = s.get(Job, graph.job_id)
    assert job is not None
    main = _main(s)
    curr = next_epoch_of(s, job, graph.committed_epoch, main)
    return None if curr is None else (curr, main.committed_epoch)
