"""The worker process loop: register, heartbeat, poll barriers, run actors, collect.

Each step: poll, let the read strategies reach the barrier, hand the barriers to the
executors, let the strategies go on, collect. Between barriers the actors' read
strategies (``spark_workers.reads``, chosen per actor there) read and write the rows at
the open epoch; after every round of reads the worker checks (a non-blocking poll)
whether the next barrier is there, so barriers are never held up by snapshot reading,
as in the seeds where the upstream side is always preferred.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import httpx
import psycopg2

from backfill_core.executors.messages import BarrierKind
from backfill_core.protocol import SUPERSEDED, Assignment, CollectRequest, ErrorCode
from spark_workers.actors import ActorFailed, ActorRunner, Fenced
from spark_workers.cdc_actor import CdcRunner
from spark_workers.client import ControlPlaneClient, ProtocolError, WorkerGone
from spark_workers.exports import ExportRunner
from spark_workers.imports import ImportRunner
from spark_workers.log_ids import forget_log_labels, label_log_records
from spark_workers.reads import Strategies
from spark_workers.rounds import RoundsJob
from spark_workers.settings import WorkerSettings, load_worker_settings
from spark_workers.source_actor import SourceRunner
from spark_workers.spark_path import SparkPath
from state_store.options import flush_wal, worker_dsn

Runner = ActorRunner | SourceRunner | CdcRunner

log = logging.getLogger(__name__)


# the store or the control plane away: no fault of the job whose work met it
_NOT_THE_JOBS = (psycopg2.OperationalError, psycopg2.InterfaceError, httpx.HTTPError, Fenced)


def _cause(runners: Sequence[Runner], error: Exception) -> Exception:
    """``error`` as an ``ActorFailed`` when the runners are one job's and the error is
    the job's own."""
    if isinstance(error, (*_NOT_THE_JOBS, ProtocolError, ActorFailed)):
        return error
    if runners and len({r.job_id for r in runners}) == 1:
        return ActorFailed(runners[0].actor_id, error)
    return error


def _close(runner: Runner) -> None:
    """Let go of what a runner holds outside the store (a CDC table's stream: its slot
    is then free for the next incarnation; a source's Kafka consumer)."""
    try:
        runner.close()
    except Exception as e:  # a broken connection is closed all the same
        log.warning("closing actor %s: %s", runner.actor_id, e)


class Worker:
    def __init__(
        self,
        control_plane_url: str,
        name: str | None = None,
        capacity: int = 64,
        settings: WorkerSettings | None = None,
    ) -> None:
        self.settings = settings or load_worker_settings()
        token = self.settings.worker_token
        self.client = ControlPlaneClient(
            control_plane_url, token=token.get_secret_value() if token else None
        )
        self.spark: SparkPath | None = None
        self._warming: threading.Thread | None = None  # the Spark session's warm-up
        self.name = name or f"{socket.gethostname()}-{os.getpid()}"
        self.capacity = capacity
        self.stop_event = threading.Event()
        self.runners: dict[int, Runner] = {}
        self.conn: Any = None
        self.lease_ms = 10_000
        self.must_register = True
        self.barrier_wanted = False  # actors read all they had: the next poll asks for it
        # how the actors' reads move, chosen per actor (``spark_workers.reads``)
        self.reads = Strategies(self)
        # exports and imports run on threads of their own, as Spark jobs beside the actors' work
        self.exports = ExportRunner(self.client, lambda: self.spark, self.stop_event)
        self.imports = ImportRunner(self.client, lambda: self.spark, self.stop_event)

    @property
    def rounds(self) -> RoundsJob | None:
        """The Spark job spanning epochs, if one runs."""
        return self.reads.spanning.job

    @property
    def driver_pushdowns(self) -> int:
        """Driver reads that ran inside Postgres."""
        return self.reads.driver.pushdowns

    # lifecycle --------------------------------------------------------------

    def _register(self) -> None:
        reg = self.client.register(self.name, self.capacity)
        self.lease_ms = reg.lease_ms
        self._stop_reads()
        if self.conn is not None:
            self.conn.close()
        self.conn = psycopg2.connect(worker_dsn(reg.database_url))
        self._forget_runners()
        if self.settings.spark_mode != "never":
            if self.spark is not None and self.spark.dsn != reg.database_url:
                self.spark.stop()
                self.spark = None
            if self.spark is None:
                self.spark = SparkPath(
                    self.settings.spark_master, reg.database_url, pushdown=self.settings.pushdown
                )
                if self.settings.spark_warm_up:
                    self._warming = threading.Thread(
                        target=self._warm_up, args=(self.spark,), name="spark-warm-up", daemon=True
                    )
                    self._warming.start()
        label_log_records(worker_id=self.client.worker_id)
        log.info("registered as worker %s", self.client.worker_id)

    def _warm_up(self, spark: SparkPath) -> None:
        """Beside the loop: a large read that comes meanwhile waits for the session."""
        started = time.monotonic()
        try:
            spark.warm_up()
            log.info("Spark is ready: %.1f s to start it", time.monotonic() - started)
        except Exception as e:  # the first large read starts it again, or says why not
            if not self.stop_event.is_set():
                log.warning("could not start Spark ahead of the first large read: %s", e)

    def _heartbeats(self) -> None:
        while not self.stop_event.wait(self.lease_ms / 3000):
            if self.must_register:
                continue  # nothing to keep alive
            try:
                self.client.heartbeat()
            except Exception as e:  # the main loop notices a dead registration itself
                log.warning("heartbeat failed: %s", e)

    def run(self) -> int:
        threading.Thread(target=self._heartbeats, name="heartbeat", daemon=True).start()
        threading.Thread(target=self.exports.run, name="exports", daemon=True).start()
        threading.Thread(target=self.imports.run, name="imports", daemon=True).start()
        while not self.stop_event.is_set():
            if self.must_register and not self._try_register():
                self.stop_event.wait(1.0)
                continue
            try:
                self._step()
            except WorkerGone:
                log.warning("the control plane declared this worker dead; registering again")
                self.must_register = True
            except httpx.TransportError as e:
                # the control plane is away (restarting or shutting down): wait, then retry
                log.warning("control plane unreachable: %s", e)
                self.stop_event.wait(1.0)
            except Fenced as e:
                self._superseded(e.graph_id, str(e))
            except ProtocolError as e:
                graph_id = self._stale_collect(e)
                if graph_id is None:
                    log.exception("actor failure", extra={"actor_id": e.actor_id})
                    self._fail(str(e))
                else:
                    self._superseded(graph_id, str(e))
            except ActorFailed as e:
                log.exception("failure of actor %s", e.actor_id, extra={"actor_id": e.actor_id})
                self._fail(str(e), e.actor_id, e.fatal)
            except Exception as e:
                log.exception("actor failure")
                self._fail(str(e) or type(e).__name__)
        self._shutdown()
        forget_log_labels()
        return 0

    def _try_register(self) -> bool:
        """Register (again); False while the control plane or Postgres is away, so the
        process outlives their restarts instead of exiting."""
        try:
            self._register()
        except (httpx.TransportError, ProtocolError, psycopg2.Error) as e:
            log.warning("could not register: %s", e)
            return False
        self.must_register = False
        return True

    def _stale_collect(self, e: ProtocolError) -> int | None:
        """The graph of a collect refused as stale (its graph recovered meanwhile)."""
        if e.code not in SUPERSEDED or e.actor_id is None:
            return None
        runner = self.runners.get(e.actor_id)
        return runner.graph_id if runner is not None else None

    def _superseded(self, graph_id: int, why: str) -> None:
        """A recovery of ``graph_id`` overtook this worker's actors there: drop them and
        wait for the recovery's initial barrier. Not a failure: reporting one would only
        recover the graph again, and again."""
        log.info("dropping the actors of graph %s: %s", graph_id, why)
        for strategy in self.reads.all:
            strategy.supersede(graph_id)
        if self.conn is not None:
            self.conn.rollback()
        for actor_id, runner in list(self.runners.items()):
            if runner.graph_id == graph_id:
                _close(self.runners.pop(actor_id))

    def _stop_reads(self) -> None:
        """End every read under way, unaccounted."""
        for strategy in self.reads.all:
            strategy.stop(account=False)

    def _forget_runners(self) -> None:
        """Close and forget every runner (a new registration, a failure, the stop)."""
        for runner in self.runners.values():
            _close(runner)
        self.runners.clear()

    def _fail(self, message: str, cause_actor_id: int | None = None, fatal: bool = False) -> None:
        self._stop_reads()
        self._forget_runners()
        if self.conn is not None:
            try:
                self.conn.rollback()
            except psycopg2.Error:
                self.conn.close()
                self.conn = None
        try:
            self.client.report_failure(message[:2000], cause_actor_id=cause_actor_id, fatal=fatal)
        except (ProtocolError, OSError) as e:
            log.warning("could not report the failure: %s", e)
        if self.conn is None:
            self.must_register = True  # a new connection comes with the registration

    def _shutdown(self) -> None:
        self._stop_reads()
        self._forget_runners()
        try:
            self.client.deregister()
        except Exception as e:
            log.warning("could not deregister: %s", e)
        if self.conn is not None:
            self.conn.close()
        if self.spark is not None:
            self.spark.cancel_warm_up()
            if self._warming is not None:
                # its cancelled jobs end first (well within the 30 s a server gives its
                # embedded worker to stop)
                self._warming.join(timeout=10)
            self.spark.stop()
        self.client.close()

    # work -----------------------------------------------------------------

    def _step(self) -> None:
        busy = any(self.reads.has_reads(r) for r in self.runners.values())
        wanted, self.barrier_wanted = self.barrier_wanted, False
        assignments = self.client.poll(
            timeout_ms=0 if busy else 2_000, barrier_wanted=wanted
        ).assignments
        before = set(self.runners)
        for strategy in self.reads.all:
            strategy.before_barrier(assignments)  # reach the barrier
        # actors forgotten there (dropped with their job under their rounds) are gone for
        # good, though this poll, older than the drop, still lists them
        gone = before - set(self.runners)
        assignments = [a for a in assignments if a.actor_id not in gone]
        collects = self._barriers(assignments)
        if collects and self.conn is not None:
            flush_wal(self.conn)  # what the collects vouch for survives a crash of Postgres
        for strategy in self.reads.all:
            strategy.after_barrier()  # reads go on while the barriers are collected
        self._collect(collects)
        self._read_until_next_barrier()

    def _collect(self, collects: list[CollectRequest]) -> None:
        while collects:
            try:
                self.client.collect_many(collects)
                break
            except ProtocolError as e:
                # a batch is all or nothing: again without the actors dropped meanwhile,
                # or without the graph that recovered meanwhile (its actors wait for the
                # recovery's initial barrier; the other graphs' collects still count)
                dropped = e.actor_id if e.code is ErrorCode.ACTOR_NOT_ASSIGNED else None
                if dropped is not None and self.forget_if_dropped([dropped]):
                    collects = [c for c in collects if c.actor_id != dropped]
                    continue
                graph_id = self._stale_collect(e)
                if graph_id is None:
                    raise
                self._superseded(graph_id, str(e))
                collects = [c for c in collects if c.actor_id in self.runners]

    # what the read strategies use of the worker (``spark_workers.reads.ReadContext``)

    def want_barrier(self) -> None:
        """Ask for a barrier now, not at the interval (from any thread: a Spark job
        spanning epochs is over, its last rounds to be accounted)."""
        self.client.poll(timeout_ms=0, barrier_wanted=True)

    def forget_if_dropped(self, actor_ids: list[int]) -> bool:
        """Forget the actors among ``actor_ids`` that are gone from the catalog (their job
        was cancelled or dropped while they worked: what failed was their own work, so it
        is no failure of this worker's other actors). Whether any was gone."""
        if self.conn is None:
            return False
        self.conn.rollback()
        with self.conn.cursor() as cur:
            cur.execute("SELECT id FROM actors WHERE id = ANY(%s)", (actor_ids,))
            alive = {int(row[0]) for row in cur.fetchall()}
        self.conn.rollback()
        gone = set(actor_ids) - alive
        for actor_id in gone:
            log.info(
                "actor %s was dropped with its job: forgetting it",
                actor_id,
                extra={"actor_id": actor_id},
            )
            runner = self.runners.pop(actor_id, None)
            if runner is not None:
                _close(runner)
        return bool(gone)

    def recovered_graph(self, incarnations: list[tuple[int, int]]) -> int | None:
        """The first graph among these (graph, recovery sequence) pairs that recovered
        since (or is gone). A Spark task's fence failure reaches the driver only as text
        (through Py4J): the driver looks at what the fence looked at instead, and the
        answer is the same, as a graph's recovery sequence only grows."""
        if self.conn is None or not incarnations:
            return None
        self.conn.rollback()
        with self.conn.cursor() as cur:
            cur.execute(
                "SELECT id, recovery_seq FROM graphs WHERE id = ANY(%s)",
                (sorted({g for g, _ in incarnations}),),
            )
            now = {int(g): int(seq) for g, seq in cur.fetchall()}
        self.conn.rollback()
        return next((g for g, seq in incarnations if now.get(g) != seq), None)

    def _runner(self, a: Assignment) -> Runner:
        """The runner of a job's kind: a source's reads Kafka, a CDC table's an upstream
        Postgres, the others the state store."""
        if a.job.kind == "source":
            return SourceRunner(a)
        if a.job.kind == "cdc":
            return CdcRunner(a, self.conn)
        return ActorRunner(a, pushdown=self.settings.pushdown)

    def _barriers(self, assignments: list[Assignment]) -> list[CollectRequest]:
        live = {a.actor_id for a in assignments}
        for actor_id in list(self.runners):
            if actor_id not in live:
                _close(self.runners.pop(actor_id))  # stopped, moved or dropped
        collects = []
        for a in assignments:
            barriers = a.barriers
            runner = self.runners.get(a.actor_id)
            initial = bool(barriers) and barriers[0].kind is BarrierKind.INITIAL
            restart = initial or (bool(barriers) and a.restore is not None)
            if runner is not None and barriers and not initial and runner.graph_id != a.graph_id:
                # a snapshot backfill merged into the main graph: its executor goes on
                runner.rebind(a.graph_id, a.recovery_seq)
                restart = False
            if runner is None or restart or runner.recovery_seq != a.recovery_seq:
                if not barriers:
                    continue  # wait for its first barrier
                if a.restore is None:
                    # its state is gone (this worker failed): only a recovery can restart it
                    raise RuntimeError(f"actor {a.actor_id} lost its state; asking for recovery")
                if runner is not None:
                    _close(runner)  # its previous incarnation
                runner = self._runner(a)
                self.runners[a.actor_id] = runner
            if len(barriers) > 1:
                runner.prefetch(barriers)
            try:
                for b in barriers:
                    collects.append(runner.on_barrier(self.conn, b))
                # one commit for the actor's barriers of this poll: a log store's replay
                # brings a barrier per upstream epoch, each committed on its own before
                self.conn.commit()
            except Exception as e:
                if not self.forget_if_dropped([a.actor_id]):
                    cause = _cause([runner], e)
                    if cause is e:
                        raise
                    raise cause from e
                collects = [c for c in collects if c.actor_id != a.actor_id]
        return collects

    @contextlib.contextmanager
    def unless_dropped(self, runners: Sequence[Runner]) -> Iterator[None]:
        """Reads of actors whose job is dropped meanwhile may fail: forget those actors.
        Reads of actors whose graph recovered meanwhile (a Spark task's fence) are
        superseded (``Fenced``), not failed."""
        try:
            yield
        except Exception as e:
            if self.forget_if_dropped([r.actor_id for r in runners]):
                return
            if isinstance(e, Fenced):
                raise
            graph_id = self.recovered_graph([(r.graph_id, r.recovery_seq) for r in runners])
            if graph_id is None:
                cause = _cause(runners, e)
                if cause is e:
                    raise
                raise cause from e
            raise Fenced(graph_id, f"reads of graph {graph_id} were fenced off: {e}") from e

    def _read_until_next_barrier(self) -> None:
        # unthrottled actors with reads left that run out: should they now, they are done
        # (a throttled one runs out every epoch), and the barrier that reports it is wanted
        # at once, not up to an interval later
        reading = [
            r
            for r in self.runners.values()
            if r.reads_run_out and r.executor.budget is None and self.reads.has_reads(r)
        ]
        while not self.stop_event.is_set():
            did = False
            for strategy, runners in self.reads.choose(list(self.runners.values())):
                if strategy.read(runners, self.reads.budget(strategy)):
                    did = True
            # a round after which nobody has reads left would do nothing: no poll to
            # look for a barrier before it (a throttled actor spends its epoch's budget
            # in one round: the poll cost the control plane a request every epoch)
            if not did or not any(self.reads.has_reads(r) for r in self.runners.values()):
                self.barrier_wanted = any(
                    self.runners.get(r.actor_id) is r
                    and not self.reads.spanning.wants(r)
                    and not r.has_reads()
                    for r in reading
                )
                return
            pending = self.client.poll(timeout_ms=0).assignments
            if any(a.barriers for a in pending):
                return


def run_worker(
    control_plane_url: str,
    name: str | None = None,
    capacity: int = 64,
    settings: WorkerSettings | None = None,
    parent_pid: int | None = None,
) -> int:
    import signal

    worker = Worker(control_plane_url, name, capacity=capacity, settings=settings)
    signal.signal(signal.SIGTERM, lambda *_: worker.stop_event.set())
    signal.signal(signal.SIGINT, lambda *_: worker.stop_event.set())
    if parent_pid is not None:
        threading.Thread(
            target=_stop_when_orphaned,
            args=(parent_pid, worker.stop_event),
            name="parent",
            daemon=True,
        ).start()
    return worker.run()


def _stop_when_orphaned(parent: int, stop_event: threading.Event) -> None:
    """Stop once ``parent`` is gone (this process was handed to another parent, maybe
    before this thread started): the server that started it was killed without a chance
    to stop it."""
    while not stop_event.is_set():
        if os.getppid() != parent:
            log.warning("the process that started this worker exited: stopping")
            stop_event.set()
        stop_event.wait(1.0)
