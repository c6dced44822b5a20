"""The barrier loop: one leader per deployment (a Postgres advisory lock) ticks every
``barrier_interval_ms``: expires workers, recovers graphs, injects barriers, trims
history, and now and then wakes garbage collection (and, every main round, the
building of MVs' epoch indexes), which run on threads of their own (``chores``).
Other replicas wait for the lock.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from typing import NamedTuple

import psycopg2
from sqlalchemy import select
from sqlalchemy.orm import Session

from service import migrate
from service.catalog.models import Barrier
from service.clock import Clock, system_clock
from service.db import Database, Prepared
from service.meta import barriers, creating, exports, gc, imports, metrics, recovery, sources
from service.meta.chores import Chore
from service.meta.indexer import EpochIndexer
from service.meta.signal import BarrierSignal
from service.meta.spawner import EmbeddedWorkerSpawner
from service.settings import Settings

log = logging.getLogger(__name__)

LEADER_LOCK_ID = 0x6D76_6C64  # "mvld"
GC_EVERY_TICKS = 50
# between two relations of a GC pass: a pass over hundreds of relations at once held
# the API's requests back (p99), bench/HISTORY.md 2026-11-29 09:40
GC_PAUSE_S = 0.02
INDEXER_EVERY_S = 5.0  # besides every main round's wake: a missed one is not lost
INDEXER_GAP_S = 0.2  # at most five looks a second for MVs whose index is due
# between the rounds run at once when asked for (``BarrierSignal.request_barrier``):
# requests meanwhile share the next one. A snapshot job ends in a chain of them (the
# barrier of its last reads, the one ending phase 1, its replay, the merge), each asked
# for by the collect of the last, and at 50 ms each waited out most of the gap
REQUESTED_ROUND_GAP_S = 0.02
# ``run`` injects the main graph's barriers and the creating graphs' at alternate half
# intervals. Injected together, every worker woke at once: a snapshot backfill's epoch
# of reads ran exactly when the upstream's actors handled their barrier, and on a
# shared machine that slowed the upstream's barriers even for a throttled backfill
# (bench/HISTORY.md#staggered-injection). A creating graph's barriers need not line up
# with the upstream's in time, only in kind and order (docs/architecture.md#snapshot-backfill).
MAIN = frozenset({"main"})
CREATING = frozenset({"creating"})
# leases, orphans and the sweeps of exports and imports in the regular main rounds: at
# most every half second, whatever the interval. Leases last seconds; at 100 ms barriers
# these looks were a quarter of the idle loop's time (bench/HISTORY.md, 2026-11-28 10:30)
LEASES_EVERY_S = 0.5
# a snapshot backfill's phase-1 barriers (its fake epochs) in the regular rounds: at
# most one a second, whatever the interval. They only report reads and checkpoint their
# positions; at 100 ms they cost its reads a third of their speed on two cores (the
# handling of each, its collects and commits took the cores the reads ran on), and
# phase 1 needs no upstream cadence (docs/architecture.md#snapshot-backfill). Rounds
# asked for (the reads ran out, a pause, a new rate) inject at once.
PHASE1_EVERY_MS = 1000


# every graph, and whether it is a creating graph running phase 1's fake epochs (its
# barriers are due at most every ``PHASE1_EVERY_MS``)
_GRAPHS = Prepared(
    "loop_graphs",
    {},
    """
    SELECT g.id, g.kind, g.state,
      g.kind = 'creating' AND g.state = 'running' AND g.current_epoch > 0
        AND g.current_epoch < coalesce(j.snapshot_epoch, 0) AS in_phase1
    FROM graphs g LEFT JOIN jobs j ON j.id = g.job_id ORDER BY g.id
    """,
)


class _Listed(NamedTuple):
    id: int
    kind: str
    state: str
    in_phase1: bool


class MetaLoop:
    def __init__(
        self,
        settings: Settings,
        db: Database,
        clock: Clock = system_clock,
        signal: BarrierSignal | None = None,
        spawner: EmbeddedWorkerSpawner | None = None,
        watcher: sources.SourceWatcher | None = None,
    ) -> None:
        self.spawner = spawner
        self.watcher = watcher or sources.SourceWatcher(db, settings.barrier_interval_ms / 1000)
        self.signal = signal or BarrierSignal()
        self.settings = settings
        self.db = db
        self.clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock_conn: psycopg2.extensions.connection | None = None
        self.is_leader = threading.Event()
        self.ticks = 0
        self.creating_rounds = 0  # regular rounds of the creating graphs (``run``)
        # the last list of the graphs had a creating graph (or none was listed yet)
        self.creating_listed = True
        self.leases_checked_at = -math.inf  # monotonic time of the last ``_expire_workers``
        # off this thread: a large MV's epoch index, or a large GC, takes a while
        self.indexer = EpochIndexer(db)
        self.index_chore = Chore(
            "epoch-indexer",
            self.indexer.run_once,
            self.is_leader,
            every_s=INDEXER_EVERY_S,
            min_gap_s=INDEXER_GAP_S,
            on_stop=self.indexer.cancel,
        )
        self.gc_chore = Chore(
            "gc", lambda: gc.run_gc(db, settings.gc_retention_ms, GC_PAUSE_S), self.is_leader
        )

    # leadership -------------------------------------------------------------

    def _try_lead(self) -> bool:
        try:
            if self._lock_conn is None or self._lock_conn.closed:
                self._lock_conn = psycopg2.connect(self.db.libpq_url)
                self._lock_conn.autocommit = True
            with self._lock_conn.cursor() as cur:
                if self.is_leader.is_set():
                    cur.execute("SELECT 1")  # still connected: still holding the lock
                    return True
                cur.execute("SELECT pg_try_advisory_lock(%s)", (LEADER_LOCK_ID,))
                won = bool(cur.fetchone()[0])
        except psycopg2.Error:
            self._drop_lock_conn()
            return False
        if won:
            self.is_leader.set()
            metrics.IS_LEADER.set(1)
            log.info("this control plane is now the barrier leader")
            self._on_become_leader()
        return won

    def _drop_lock_conn(self, *, stopping: bool = False) -> None:
        # stop calling ourselves leader before the lock goes: another control plane
        # may win it the moment the connection closes
        if self.is_leader.is_set():
            if stopping:
                log.info("released barrier leadership")
            else:
                log.warning("lost barrier leadership")
        self.is_leader.clear()
        metrics.IS_LEADER.set(0)
        if self._lock_conn is not None:
            with contextlib.suppress(psycopg2.Error):
                self._lock_conn.close()
        self._lock_conn = None

    def _on_become_leader(self) -> None:
        """A new leader cannot know what the old one had in flight: recover those graphs."""
        with self.db.transaction() as s:
            graphs = s.execute(
                select(Barrier.graph_id).where(Barrier.state != "committed").distinct()
            ).scalars()
            for g in list(graphs):
                recovery.request_recovery(s, g, "control plane restarted")

    # ticks ----------------------------------------------------------------

    def tick(
        self, kinds: frozenset[str] = MAIN | CREATING, *, regular: bool = False, asked: bool = False
    ) -> None:
        """One round of the leader's duties for the graphs of ``kinds`` (tests call it
        directly, for every graph). Workers, orphans and history are looked after in
        the rounds that include the main graph (leases in regular ones at most every
        ``LEASES_EVERY_S``). ``regular``: a round at the interval,
        not one asked for (``PHASE1_EVERY_MS``). ``asked``: a round asked for, whose
        barriers go out before the workers' leases are looked at (it answers a worker
        waiting for them; an orphan it finds is recovered a round later)."""
        now = self.clock()
        phase1_due = True
        if regular and "creating" in kinds:
            every = max(1, -(-PHASE1_EVERY_MS // self.settings.barrier_interval_ms))
            phase1_due = self.creating_rounds % every == 0
            self.creating_rounds += 1
        if "main" in kinds and not asked and not (regular and self._leases_checked_lately()):
            self._expire_workers()
        if regular and kinds == CREATING and not self.creating_listed:
            # the main round half an interval ago listed no creating graph: one created
            # since asked for a round of its own (``BarrierSignal``), or was created by
            # another replica and waits for the next main round's list, as its asks do
            return
        # one statement, outside a transaction (two round trips fewer a round)
        graphs = [_Listed(*row) for row in self.db.rows_alone(_GRAPHS, {})]
        # only this loop injects barriers: a creating graph the list missed (created
        # since) has none yet, so the main graph's round may leave out what concerns
        # creating graphs (their merges, lag caps and merge holds) as if it came later
        creating_graphs = any(g.kind == "creating" for g in graphs)
        self.creating_listed = creating_graphs
        changed = False
        for g in graphs:
            # a creating graph in phase 1 has nothing to do in a round not due for it:
            # the barrier after its reads ran out, and the one ending phase 1, are asked
            # for (the worker's poll, the collect that consumed the snapshot), due ones
            # at the latest
            if g.kind in kinds and (phase1_due or not g.in_phase1):
                with self.db.loop_transaction() as s:
                    changed |= self._tick_graph(
                        s, g.id, g.kind, g.state, now, phase1_due, creating_graphs
                    )
        if changed:
            self.signal.notify()  # a round that changed nothing wakes no long poll
        if "main" not in kinds:
            return
        if asked:
            self._expire_workers()
        self.index_chore.wake()  # a job created since the last round may want its index
        self.ticks += 1
        if self.ticks % GC_EVERY_TICKS == 0:
            for g in graphs:
                with self.db.transaction() as s:
                    floor = creating.replay_floor(s) if g.kind == "main" else None
                    barriers.trim_history(s, g.id, keep_after=floor)
            with self.db.transaction() as s:
                sources.trim(s)
            self.gc_chore.wake()

    def _leases_checked_lately(self) -> bool:
        return time.monotonic() - self.leases_checked_at < LEASES_EVERY_S

    def _expire_workers(self) -> None:
        self.leases_checked_at = time.monotonic()
        with self.db.transaction() as s:
            recovery.expire_workers(s)
            orphaned = recovery.graphs_with_orphans(s)
            for g in orphaned:
                recovery.request_recovery(s, g, "actor without a live worker")
            exports.sweep(s)
            imports.sweep(s)
            if self.spawner is not None and (
                recovery.graphs_with_orphans_any_state(s)
                or exports.any_queued(s)
                or imports.any_queued(s)
            ):
                self.spawner.ensure()

    def _tick_graph(
        self,
        s: Session,
        graph_id: int,
        kind: str,
        state: str,
        now: int,
        phase1_due: bool,
        creating_graphs: bool,
    ) -> bool:
        """One graph's round; False: it changed nothing (a creating graph that injected
        nothing)."""
        if state == "recovering":
            recovery.recover(s, graph_id, now)
        elif kind == "creating":
            return bool(
                creating.inject(
                    s,
                    graph_id,
                    checkpoint_frequency=self.settings.checkpoint_frequency,
                    max_inflight=self.settings.max_pending_barriers,
                    phase1_due=phase1_due,
                )
            )
        else:
            if creating_graphs:
                for job_id in creating.merge_caught_up(s):
                    log.info("job %s caught up with its upstream: merged", job_id)
            if creating_graphs and creating.upstream_held(s):
                # collects alone may not commit what a merge hold kept back
                barriers.settle(s, graph_id)
                return True
            barriers.inject(
                s,
                graph_id,
                now,
                checkpoint_frequency=self.settings.checkpoint_frequency,
                max_inflight=self.settings.max_pending_barriers,
                source_marks=self.watcher.marks(),
                merge_hold=creating_graphs,
            )
        return True

    def run(self) -> None:
        half = self.settings.barrier_interval_ms / 2000
        next_at = time.monotonic()
        waiting_logged = migrated = False
        requested: frozenset[str] = frozenset()
        rounds = 0
        while not self._stop.is_set():
            try:
                migrated = migrated or migrate.at_head(self.db.engine)
                if not migrated:
                    if not waiting_logged:
                        log.warning("barrier loop waits for the catalog migrations to reach head")
                        waiting_logged = True
                elif self._try_lead():
                    if requested:
                        # e.g. a new job's actors (or a pause, a new rate) ride the next
                        # main barrier: it goes out now, not up to an interval later; the
                        # regular rounds keep their times
                        self.tick(requested, asked=True)
                    else:
                        self.tick(MAIN if rounds % 2 == 0 else CREATING, regular=True)
                        rounds += 1
            except Exception:
                # give up leadership: the next leader (maybe us) starts with a recovery
                log.exception("barrier loop tick failed")
                self._drop_lock_conn()
            if requested:
                # a burst of requests gets one more round after this one, not one each
                self._stop.wait(min(REQUESTED_ROUND_GAP_S, max(0.0, next_at - time.monotonic())))
            else:
                next_at = max(next_at + half, time.monotonic())
            requested = self.signal.wait_for_barrier_request(max(0.0, next_at - time.monotonic()))
        self._drop_lock_conn(stopping=True)

    def start(self) -> None:
        self.watcher.start()
        self.index_chore.start()
        self.gc_chore.start()
        self._thread = threading.Thread(target=self.run, name="barrier-loop", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.signal.request_barrier()  # ends the loop's wait
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.watcher.stop()
        self.index_chore.stop()
        self.gc_chore.stop()
        if self.spawner is not None:
            self.spawner.stop()
