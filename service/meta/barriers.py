"""Barrier injection, collection and commit (``docs/architecture.md#epochs-and-barriers``).

All decisions live in Postgres transactions that lock the graph row, so several
control-plane replicas can serve collects while one leader injects: a barrier is never
committed twice or out of order. Table DML holds the same row ``FOR SHARE``, so the
injection that closes an epoch waits for the DML still writing into it; an import
publishing at an epoch ahead holds that epoch's hold, which the injection closing an
epoch at or past it waits for (``service.meta.epochs.RELEASE_HOLDS``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, delete, or_, select, text, update
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value
from sqlalchemy.orm.util import identity_key

from backfill_core.epoch import physical_time
from service.catalog.models import Actor, Barrier, BarrierCollect, Graph, PendingMutation
from service.db import Prepared, raw_cursor
from service.meta import metrics, sources
from service.meta.epochs import RELEASE_HOLDS, next_epoch
from service.meta.placement import place_unplaced
from service.meta.sources import Marks
from state_store.locks import GRAPH_GATE_LOCK

COMMIT_KINDS = ("checkpoint", "initial")
# how long the main graph keeps from committing the epoch a snapshot backfill is about
# to join it at (see ``service.meta.creating``), at most: the job's last barriers, from
# the moment the last one went out
MERGE_HOLD_MS = 5_000


def lock_graph(session: Session, graph_id: int) -> Graph:
    return session.execute(select(Graph).where(Graph.id == graph_id).with_for_update()).scalar_one()


def gate_graph(session: Session, graph_id: int) -> None:
    """Take the graph's gate (``GRAPH_GATE_LOCK``) exclusively: the rounds of Spark jobs
    spanning epochs under way end first, and the next ones wait for this transaction."""
    session.execute(
        text("SELECT pg_advisory_xact_lock(:space, :graph)"),
        {"space": GRAPH_GATE_LOCK, "graph": graph_id},
    )


def inject(
    session: Session,
    graph_id: int,
    now_ms: int,
    *,
    checkpoint_frequency: int,
    max_inflight: int,
    source_marks: Marks | None = None,
    merge_hold: bool = True,
) -> int | None:
    """Inject the next barrier into a running graph; the epoch it opens (None when held
    back).

    With ``source_marks`` (the main graph) the barrier also fixes how far each source
    advances in the epoch it opens. ``merge_hold`` False: no creating graph exists, so no
    merge hold is looked for (``try_complete``). The graph's row is read and written
    with plain statements, a round's in three round trips when it carries no mutation
    and no source moves (docs/architecture.md#epochs-and-barriers): a Graph object the
    session holds is expired."""
    session.flush()  # what the caller changed, before the plain statements
    with raw_cursor(session) as cur:
        cur.execute(_LOCK_ROUND.ready(cur), {"g": graph_id})
        row = cur.fetchone()
        if row is None or row[0] != "running":
            return None
        _, kind, prev, committed, seq, inflight, pending = row
        if inflight >= max_inflight:
            # what a merge hold kept back may commit now
            _complete(cur, graph_id, kind, committed, _pending(cur, graph_id), merge_hold)
            _expire_graph(session, graph_id)
            return None
        curr = next_epoch(prev, now_ms)
        mutation = pop_mutation(session, graph_id) if pending else None
        if source_marks:
            elapsed = max(0, physical_time(curr) - physical_time(prev)) if prev else 0
            split_change = sources.advance(session, prev, curr, elapsed, source_marks)
            if split_change:
                mutation = {**(mutation or {}), "splits": split_change}
        if mutation:
            apply_lifetimes(session, mutation, curr)
        session.flush()
        seq += 1
        if prev == 0:
            barrier_kind = "initial"
        else:
            barrier_kind = "checkpoint" if seq % checkpoint_frequency == 0 else "barrier"
        params = {
            "g": graph_id,
            "prev": prev,
            "curr": curr,
            "kind": barrier_kind,
            "mutation": None if mutation is None else json.dumps(mutation),
            "seq": seq,
            "closing": prev,
        }
        cur.execute(_INJECT.ready(cur), params)
        pending_rows = cur.fetchall()
        metrics.BARRIERS_INJECTED.labels(str(graph_id), barrier_kind).inc()
        _complete(cur, graph_id, kind, committed, pending_rows, merge_hold)
    _expire_graph(session, graph_id)
    return curr


def _expire_graph(session: Session, graph_id: int) -> None:
    """A Graph object of the session is stale once plain statements wrote its row."""
    held = session.identity_map.get(identity_key(Graph, graph_id))
    if held is not None:
        session.expire(held)


def _next_pending(session: Session, graph_id: int) -> PendingMutation | None:
    return session.execute(
        select(PendingMutation)
        .where(PendingMutation.graph_id == graph_id)
        .order_by(PendingMutation.id)
        .limit(1)
        .with_for_update(skip_locked=True)
    ).scalar_one_or_none()


def next_adds_placed(session: Session, graph_id: int) -> bool:
    """The actors the graph's next mutation adds have a worker (placing those that were
    created while none was live); False while no worker is live for them."""
    pending = _next_pending(session, graph_id)
    return pending is None or place_unplaced(session, pending.mutation.get("add") or [])


def pop_mutation(session: Session, graph_id: int) -> dict[str, Any] | None:
    pending = _next_pending(session, graph_id)
    if pending is None:
        return None
    mutation = dict(pending.mutation)
    if mutation.get("add") and not place_unplaced(session, mutation["add"]):
        # a job created before any worker registered (the embedded one is starting):
        # its actors wait for one here rather than start orphaned and recover
        return None
    session.delete(pending)
    return mutation


def apply_lifetimes(session: Session, mutation: dict[str, Any], curr: int) -> None:
    if mutation.get("add"):
        # an actor starts once: recovery may already have started it
        session.execute(
            update(Actor)
            .where(Actor.id.in_(mutation["add"]), Actor.first_epoch.is_(None))
            .values(first_epoch=curr)
        )
    if mutation.get("stop"):
        session.execute(update(Actor).where(Actor.id.in_(mutation["stop"])).values(last_epoch=curr))


def enqueue_mutation(session: Session, graph_id: int, mutation: dict[str, Any]) -> None:
    session.add(PendingMutation(graph_id=graph_id, mutation=mutation))


def required_actors(graph_id: int, curr: int) -> Any:
    """Actors that must collect the barrier opening ``curr``."""
    return select(Actor.id).where(
        Actor.graph_id == graph_id,
        Actor.first_epoch.is_not(None),
        Actor.first_epoch <= curr,
        or_(Actor.last_epoch.is_(None), Actor.last_epoch >= curr),
    )


# One statement tells, for every uncommitted barrier in order, how many actors must
# collect it and how many did (this runs on every collect: keep it to one round trip).
_PENDING_SQL = """
    SELECT b.curr_epoch, b.prev_epoch, b.kind, b.state, b.upstream_epoch,
      (SELECT count(*) FROM actors a
        WHERE a.graph_id = b.graph_id AND a.first_epoch <= b.curr_epoch
          AND (a.last_epoch IS NULL OR a.last_epoch >= b.curr_epoch)) AS required,
      (SELECT count(*) FROM barrier_collects c JOIN actors a ON a.id = c.actor_id
        WHERE c.graph_id = b.graph_id AND c.curr_epoch = b.curr_epoch
          AND a.first_epoch <= b.curr_epoch
          AND (a.last_epoch IS NULL OR a.last_epoch >= b.curr_epoch)) AS collected
    FROM barriers b
    WHERE b.graph_id = :g AND b.state <> 'committed'
    ORDER BY b.curr_epoch
    """

_PERSIST_VNODES = """
    INSERT INTO vnode_progress (job_id, vnode, state, current_pos, row_count, epoch)
    SELECT a.job_id, (v->>'vnode')::int, v->>'state', v->'current_pos',
           coalesce((v->>'row_count')::bigint, 0), :prev
    FROM barrier_collects c JOIN actors a ON a.id = c.actor_id,
         jsonb_array_elements(coalesce(c.progress->'vnodes', '[]'::jsonb)) v
    WHERE c.graph_id = :g AND c.curr_epoch = :curr
    ON CONFLICT (job_id, vnode) DO UPDATE SET state = EXCLUDED.state,
      current_pos = EXCLUDED.current_pos, row_count = EXCLUDED.row_count, epoch = EXCLUDED.epoch
    """

# Consumed rows never go back (a chain job restarts from zero after a recovery; a CDC
# job's count is its worker's, written with its rows: at most the open epoch ahead), and
# rows/s is measured over windows of at least RATE_WINDOW_MS of epoch time, so both
# follow committed epochs only. Epochs carry milliseconds in their high bits (>> 16).
RATE_WINDOW_MS = 5_000
_JOB_PROGRESS = """
    INSERT INTO job_progress AS j (job_id, consumed_rows, window_rows, window_epoch, rows_per_s)
    SELECT v.job_id, sum(v.n), sum(v.n), :clock, 0
    FROM (SELECT job_id, row_count AS n FROM vnode_progress
          UNION ALL SELECT job_id, num_consumed_rows FROM split_progress
          UNION ALL SELECT job_id, row_count FROM cdc_tables WHERE job_id IS NOT NULL) v
    JOIN jobs x ON x.id = v.job_id
    WHERE x.graph_id = :g AND x.state = 'creating'
    GROUP BY v.job_id
    ON CONFLICT (job_id) DO UPDATE SET
      consumed_rows = greatest(j.consumed_rows, EXCLUDED.consumed_rows),
      rows_per_s = CASE
        WHEN ((:clock >> 16) - (j.window_epoch >> 16)) >= :window
          THEN greatest(0, greatest(j.consumed_rows, EXCLUDED.consumed_rows) - j.window_rows)
               * 1000.0 / ((:clock >> 16) - (j.window_epoch >> 16))
        ELSE j.rows_per_s END,
      window_rows = CASE
        WHEN ((:clock >> 16) - (j.window_epoch >> 16)) >= :window
          THEN greatest(j.consumed_rows, EXCLUDED.consumed_rows) ELSE j.window_rows END,
      window_epoch = CASE
        WHEN ((:clock >> 16) - (j.window_epoch >> 16)) >= :window
          THEN :clock ELSE j.window_epoch END
    """

# a source's messages that are not rows, skipped since the split's last commit: an event
# per split (before the commit overwrites the count)
_SKIPPED_EVENTS = """
    INSERT INTO events (job_id, kind, data)
    SELECT a.job_id, 'messages_skipped', jsonb_build_object(
             'partition', (x->>'split')::int,
             'skipped', (x->>'skipped')::bigint - coalesce(p.skipped, 0),
             'total', (x->>'skipped')::bigint,
             'last_offset', (x->>'last_skipped_offset')::bigint,
             'epoch', CAST(:prev AS bigint))
    FROM barrier_collects c JOIN actors a ON a.id = c.actor_id
    CROSS JOIN jsonb_array_elements(coalesce(c.progress->'splits', '[]'::jsonb)) x
    LEFT JOIN split_progress p ON p.job_id = a.job_id AND p.split = x->>'split'
    WHERE c.graph_id = :g AND c.curr_epoch = :curr
      AND (x->>'skipped')::bigint > coalesce(p.skipped, 0)
    """

_PERSIST_SPLITS = """
    INSERT INTO split_progress (job_id, split, state, "offset", target_offset, num_consumed_rows,
                                skipped, last_skipped_offset, epoch)
    SELECT a.job_id, x->>'split', x->>'state', (x->>'offset')::bigint, (x->>'target_offset')::bigint,
           coalesce((x->>'num_consumed_rows')::bigint, 0), coalesce((x->>'skipped')::bigint, 0),
           (x->>'last_skipped_offset')::bigint, :prev
    FROM barrier_collects c JOIN actors a ON a.id = c.actor_id,
         jsonb_array_elements(coalesce(c.progress->'splits', '[]'::jsonb)) x
    WHERE c.graph_id = :g AND c.curr_epoch = :curr
    ON CONFLICT (job_id, split) DO UPDATE SET state = EXCLUDED.state, "offset" = EXCLUDED."offset",
      target_offset = EXCLUDED.target_offset, num_consumed_rows = EXCLUDED.num_consumed_rows,
      skipped = EXCLUDED.skipped, last_skipped_offset = EXCLUDED.last_skipped_offset,
      epoch = EXCLUDED.epoch
    """

# The seed trims the state of a split a split change drops (``trim_state``) and keeps
# that of a split moving to another actor, which restores it. So here: a job's split
# no actor of it owns any more (stopped at a committed epoch counts as gone, a stop
# recovery may still undo does not) loses its row, and its rows leave the kept total,
# which otherwise never goes back. Jobs owning no split now (being dropped) keep theirs.
_TRIM_SPLITS = """
    WITH owned AS (
      SELECT a.job_id, x AS split FROM actors a, jsonb_array_elements_text(a.splits) x
      WHERE a.graph_id = :g AND (a.last_epoch IS NULL OR a.last_epoch > :prev)
    ), trimmed AS (
      DELETE FROM split_progress p USING jobs j
      WHERE j.id = p.job_id AND j.graph_id = :g
        AND EXISTS (SELECT 1 FROM owned o WHERE o.job_id = p.job_id)
        AND NOT EXISTS (SELECT 1 FROM owned o WHERE o.job_id = p.job_id AND o.split = p.split)
      RETURNING p.job_id, p.num_consumed_rows
    )
    UPDATE job_progress k SET consumed_rows = greatest(0, k.consumed_rows - t.n),
      window_rows = greatest(0, k.window_rows - t.n)
    FROM (SELECT job_id, sum(num_consumed_rows) AS n FROM trimmed GROUP BY job_id) t
    WHERE k.job_id = t.job_id
    """

_FINISH_ACTORS = """
    UPDATE actors SET state = 'finished'
    WHERE state <> 'finished' AND id IN (
      SELECT actor_id FROM barrier_collects
      WHERE graph_id = :g AND curr_epoch <= :curr AND finished)
    """

# a job is created with its event
_FINISH_JOBS = """
    WITH finished AS (
      UPDATE jobs j SET state = 'created', finished_epoch = :prev, updated_at = now()
      WHERE j.graph_id = :g AND j.state = 'creating'
        AND EXISTS (SELECT 1 FROM graphs g WHERE g.id = :g AND g.kind = 'main')
        AND EXISTS (SELECT 1 FROM actors a WHERE a.job_id = j.id AND a.last_epoch IS NULL)
        AND NOT EXISTS (SELECT 1 FROM actors a WHERE a.job_id = j.id AND a.last_epoch IS NULL
                        AND a.state <> 'finished')
      RETURNING j.id
    )
    INSERT INTO events (job_id, kind, data)
    SELECT id, 'created', jsonb_build_object('epoch', CAST(:prev AS bigint)) FROM finished
    """

# backfill pins (a chain's fixed snapshot) end when the job is created
_UNPIN_CREATED = """
    DELETE FROM epoch_pins p USING jobs j
    WHERE p.holder = 'job:' || j.id AND j.graph_id = :g AND j.state = 'created'
    """

_MARK_COMMITTED = """
    UPDATE barriers SET state = 'committed', committed_at = clock_timestamp()
    WHERE graph_id = :g AND state <> 'committed' AND curr_epoch <= :curr
    RETURNING extract(epoch FROM committed_at - injected_at)
    """


# the parameters of the statements below, as PREPARE declares them
_TYPES = {
    "g": "integer",
    "prev": "bigint",
    "curr": "bigint",
    "clock": "bigint",
    "window": "bigint",
    "closing": "bigint",
    "seq": "bigint",
    "committed": "bigint",
    "kind": "text",
    "mutation": "text",
    "newly": "bigint[]",
    "hold_s": "double precision",
}

_COMMITTED_EPOCH = (
    "UPDATE graphs SET committed_epoch = greatest(committed_epoch, :prev) WHERE id = :g"
)

# A commit's statements, in this order, in one round trip, answered with the barriers'
# latencies: each had had a round trip and SQLAlchemy's handling of its own, at every
# commit of every graph (bench/HISTORY.md, 2026-11-28 16:45 and 23:30).
_COMMIT = Prepared(
    "barrier_commit",
    _TYPES,
    _COMMITTED_EPOCH,
    _PERSIST_VNODES,
    _SKIPPED_EVENTS,  # before the splits' rows are overwritten
    _PERSIST_SPLITS,
    _TRIM_SPLITS,
    _JOB_PROGRESS,
    _FINISH_ACTORS,
    _FINISH_JOBS,
    _UNPIN_CREATED,
    _MARK_COMMITTED,
)
_MARK_COLLECTED = Prepared(
    "barrier_collected",
    _TYPES,
    "UPDATE barriers SET state = 'collected' WHERE graph_id = :g AND curr_epoch = ANY(:newly)",
)
_PENDING = Prepared("barrier_pending", _TYPES, _PENDING_SQL)

# A round's graph row, locked, with its barriers in flight and whether a mutation waits;
# the SELECT after the lock sees what a collect committed while the lock was waited for
_LOCK_ROUND = Prepared(
    "barrier_lock_round",
    _TYPES,
    "SELECT 1 FROM graphs WHERE id = :g FOR UPDATE",
    """
    SELECT g.state, g.kind, g.current_epoch, g.committed_epoch, g.barrier_seq,
      (SELECT count(*) FROM barriers b WHERE b.graph_id = g.id AND b.state <> 'committed'),
      EXISTS (SELECT 1 FROM pending_mutations p WHERE p.graph_id = g.id)
    FROM graphs g WHERE g.id = :g
    """,
)
# A barrier's injection, answered with ``_PENDING``: the holds of publications at or
# below the epoch it closes go first (``RELEASE_HOLDS`` waits for them)
_INJECT = Prepared(
    "barrier_inject",
    _TYPES,
    RELEASE_HOLDS,
    """
    INSERT INTO barriers (graph_id, prev_epoch, curr_epoch, kind, mutation, state)
    VALUES (:g, :prev, :curr, :kind, CAST(:mutation AS jsonb), 'inflight')
    """,
    "UPDATE graphs SET barrier_seq = :seq, current_epoch = :curr WHERE id = :g",
    _PENDING_SQL,
)


# The lowest epoch a creating graph's last barrier opened (a main epoch not committed
# yet): the main graph commits nothing at or after it meanwhile, for MERGE_HOLD_MS after
# that barrier went out at most. The job's replay still in flight then counts too: it
# is what the job has left (the pending-barrier limit bounds it), and a job that always
# has some in flight when the upstream commits the epoch it was to join at would chase
# the upstream for ever, one worker round trip behind.
_MERGE_CEILING = Prepared(
    "barrier_merge_ceiling",
    _TYPES,
    """
    SELECT min(g.current_epoch) FROM graphs g JOIN barriers b
      ON b.graph_id = g.id AND b.curr_epoch = g.current_epoch
    WHERE g.kind = 'creating' AND g.state = 'running' AND g.current_epoch > :committed
      AND b.injected_at > clock_timestamp() - make_interval(secs => :hold_s)
    """,
)


def merge_ceiling(session: Session, graph: Graph) -> int | None:
    """The main epoch a creating graph's last barrier in flight opened (None: no job is
    about to join the main graph, or ``graph`` is not the main graph)."""
    with raw_cursor(session) as cur:
        return _merge_ceiling(cur, graph.kind, graph.committed_epoch)


def _merge_ceiling(cur: Any, kind: str, committed_epoch: int) -> int | None:
    if kind != "main":
        return None
    cur.execute(
        _MERGE_CEILING.ready(cur), {"committed": committed_epoch, "hold_s": MERGE_HOLD_MS / 1000}
    )
    row = cur.fetchone()
    return None if row is None or row[0] is None else int(row[0])


def settle(session: Session, graph_id: int) -> None:
    """Commit what is complete in a running graph (e.g. after a merge hold ends)."""
    graph = lock_graph(session, graph_id)
    if graph.state == "running":
        try_complete(session, graph)


def try_complete(session: Session, graph: Graph, merge_hold: bool = True) -> int | None:
    """Complete barriers in order and commit at the last complete checkpoint.

    The graph row must be locked by the caller. Returns the newly committed epoch.
    ``merge_hold`` False: the caller knows no creating graph exists (none can hold it).
    """
    session.flush()
    with raw_cursor(session) as cur:
        pending = _pending(cur, graph.id)
        committed = _complete(cur, graph.id, graph.kind, graph.committed_epoch, pending, merge_hold)
    if committed is not None and committed > graph.committed_epoch:
        set_committed_value(graph, "committed_epoch", committed)
    return committed


def _pending(cur: Any, graph_id: int) -> list[tuple[Any, ...]]:
    cur.execute(_PENDING.ready(cur), {"g": graph_id})
    return list(cur.fetchall())


def _complete(
    cur: Any,
    graph_id: int,
    kind: str,
    committed_epoch: int,
    pending: list[tuple[Any, ...]],
    merge_hold: bool,
) -> int | None:
    """``try_complete`` on the rows of ``_PENDING``: marks what is complete, commits at
    its last checkpoint (one round trip for both); the epoch committed, if any."""
    complete = 0
    commit_at = None
    clock = None
    ceiling: int | None = None
    ceiling_read = False
    for i, (curr, prev, bkind, _state, upstream, required, collected) in enumerate(pending):
        if collected < required:
            break
        complete = i + 1
        if bkind in COMMIT_KINDS and not ceiling_read and merge_hold:
            ceiling, ceiling_read = _merge_ceiling(cur, kind, committed_epoch), True
        if bkind in COMMIT_KINDS and (ceiling is None or prev < ceiling):
            commit_at = (curr, prev)
            # rows/s is measured in upstream time: a creating graph's epochs are fake
            clock = upstream if upstream is not None else prev
    # the barriers the commit marks go straight to committed (``_MARK_COMMITTED``)
    newly = [
        row[0]
        for row in pending[:complete]
        if row[3] == "inflight" and (commit_at is None or row[0] > commit_at[0])
    ]
    statements = [_MARK_COLLECTED.ready(cur)] if newly else []
    params: dict[str, Any] = {"g": graph_id, "newly": newly}
    if commit_at is not None:
        statements.append(_COMMIT.ready(cur))
        params |= {"curr": commit_at[0], "prev": commit_at[1], "clock": clock}
        params["window"] = RATE_WINDOW_MS
    if statements:
        cur.execute(";\n".join(statements), params)
    committed = None
    if commit_at is not None:
        for (latency,) in cur.fetchall():
            metrics.BARRIER_LATENCY.labels(str(graph_id)).observe(max(0.0, float(latency)))
        committed = commit_at[1]
        committed_epoch = max(committed_epoch, committed)
    metrics.INFLIGHT_BARRIERS.labels(str(graph_id)).set(
        len(pending) - (sum(1 for r in pending if commit_at and r[0] <= commit_at[0]))
    )
    metrics.COMMITTED_EPOCH.labels(str(graph_id)).set(committed_epoch)
    return committed


KEEP_COMMITTED = 200  # committed barriers kept per graph for the API's history


def trim_history(
    session: Session, graph_id: int, keep: int | None = None, keep_after: int | None = None
) -> int:
    """Drop committed barriers (and their collects) beyond the newest ``keep``
    (``KEEP_COMMITTED``); never one closing an epoch after ``keep_after`` (a snapshot
    backfill still replays it)."""
    keep = KEEP_COMMITTED if keep is None else keep
    cutoff = session.execute(
        select(Barrier.curr_epoch)
        .where(Barrier.graph_id == graph_id, Barrier.state == "committed")
        .order_by(Barrier.curr_epoch.desc())
        .offset(keep)
        .limit(1)
    ).scalar_one_or_none()
    if cutoff is None:
        return 0
    session.execute(
        delete(BarrierCollect).where(
            BarrierCollect.graph_id == graph_id, BarrierCollect.curr_epoch <= cutoff
        )
    )
    res = session.execute(
        delete(Barrier).where(
            and_(
                Barrier.graph_id == graph_id,
                Barrier.state == "committed",
                Barrier.curr_epoch <= cutoff,
                Barrier.prev_epoch <= (keep_after if keep_after is not None else cutoff),
            )
        )
    )
    return int(res.rowcount or 0)  # type: ignore[attr-defined]


@dataclass(frozen=True)
class CollectResult:
    status: str  # accepted | duplicate
    committed_epoch: int
