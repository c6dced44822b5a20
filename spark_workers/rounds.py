"""A pushed-down Spark job that spans epochs (an unthrottled table backfill's snapshot).

A job of one epoch ends before the worker handles the barrier that closes the epoch,
and a Spark job costs a fixed overhead besides its statements: the start of its tasks,
its tail (one task still at work), its end, the gap until the next one. Fewer, larger jobs
would hold every barrier of the graph for as long
(``docs/architecture.md#spark-jobs-spanning-epochs``).

Here the job's groups (whole vnodes, ``spark_path.round_rows`` rows each about) are
planned once, for everything the actors have left, and each runs as a *round*: a
transaction of its own at the epoch the driver released (``pushdown_tasks._run_rounds``).
Barriers never wait for rounds. When one closing the released epoch comes, the driver
moves the job on to the next epoch, waits for the rounds still at the one it left (that
epoch's own lock), accounts for them with the executors (as the reads of that epoch they
are) and handles the barrier, while the tasks go on. Any barrier that changes the actors
(a mutation, a recovery's ``initial``) ends the job first. The executors never see a
round of another epoch than the one it wrote at.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from backfill_core.executors.interface import VnodeSummary
from backfill_core.executors.messages import SnapshotBatchRead
from backfill_core.protocol import BarrierMessage
from spark_workers.spark_path import job_epochs

if TYPE_CHECKING:
    from spark_workers.actors import ActorRunner
    from spark_workers.spark_path import SparkPath

log = logging.getLogger(__name__)

WHOLE_VNODES = 1 << 40  # a group's limit: its vnodes are read to their ends
# the epochs the job's rounds run at (none: the driver is handling barriers)
_RELEASE = "UPDATE work_queues SET read_epoch = %s, write_epoch = %s WHERE token = %s"


def rounds_eligible(runner: ActorRunner) -> bool:
    """Whether the actor's snapshot reads can run as rounds: a table backfill (the snapshot
    backfill's phase 1 too: its rounds read at its snapshot epoch, write at its fake epochs)
    whose view runs inside Postgres, unthrottled (a throttled one reads its budget per epoch)."""
    ex = runner.executor
    return runner.pushed_where is not None and ex.budget is None and not ex.paused


class RoundsJob:
    """One such Spark job of one job's actors on this worker, run in a thread.

    Only the worker's main thread calls the methods below; the thread only runs the
    Spark job (and ``on_done`` when it is over)."""

    def __init__(
        self,
        path: SparkPath,
        runners: list[ActorRunner],
        conn: Any,
        round_rows: int,
        on_done: Callable[[], None],
    ) -> None:
        self.path = path
        self.runners = runners
        self.token = uuid.uuid4().hex
        self.batches: list[tuple[ActorRunner, SnapshotBatchRead]] = []
        for r in runners:
            groups = max(1, -(-r.remaining_estimate(conn) // round_rows))
            for b in r.executor.plan_reads(groups * WHOLE_VNODES, groups):
                self.batches.append((r, b))
        self.error: BaseException | None = None
        # the (graph, recovery sequence) its tasks fence their rounds with, once started
        self.fence: tuple[int, int] | None = None
        self.rounds = 0  # accounted so far
        self.epochs: set[int] = set()  # the epochs they were written at
        self.released: tuple[int, int] | None = None  # (read, write) epochs
        self._on_done = on_done
        self._thread: threading.Thread | None = None

    def start(self) -> bool:
        """Start the Spark job (False: nothing to read)."""
        if not self.batches:
            return False
        read_epoch, write_epoch = self._epochs()
        plan = self.path.pushdown_plan(self.batches, self.token, read_epoch, rounds=True)
        self.fence = (plan.write.graph_id, plan.write.recovery_seq)
        self.path.queue_statement(
            "INSERT INTO work_queues (token, read_epoch, write_epoch) VALUES (%s, %s, %s)",
            self.token,
            read_epoch,
            write_epoch,
        )
        self.released = (read_epoch, write_epoch)
        self.path.rounds_jobs += 1
        self._thread = threading.Thread(
            target=self._run, args=(plan.to_text(),), name="spark-rounds", daemon=True
        )
        self._thread.start()
        return True

    def _epochs(self) -> tuple[int, int]:
        """(read, write) epochs of the rounds now: the runners' snapshot and open epochs."""
        return job_epochs(self.runners)

    def _run(self, plan: str) -> None:
        from spark_workers.pushdown_tasks import run_group

        try:
            spark, cores = self.path.active_session()
            n = min(len(self.batches), cores)
            tasks = spark.sparkContext.parallelize(range(n), n)
            tasks.flatMap(functools.partial(run_group, plan)).collect()
        except BaseException as e:
            self.error = e
        finally:
            try:
                self._on_done()
            except Exception as e:
                log.warning("could not ask for a barrier after the Spark rounds: %s", e)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def account(self, conn: Any) -> int:
        """Account for the rounds done at the runners' open epoch or before (before: none
        may be) with the executors; rounds of the epoch released next stay."""
        upto = min(r.executor.open_epoch for r in self.runners)
        with conn.cursor() as cur:
            cur.execute(
                "DELETE FROM work_rounds WHERE token = %s AND write_epoch <= %s "
                "RETURNING grp, read_epoch, write_epoch, summary",
                [self.token, upto],
            )
            done = sorted(cur.fetchall())
        conn.commit()
        from spark_workers.spark_path import key_from_json

        total = 0
        for grp, read_epoch, write_epoch, summary in done:
            r, b = self.batches[grp]
            ex = r.executor
            if (read_epoch, write_epoch) != (ex.snapshot_epoch, ex.open_epoch):
                raise RuntimeError(
                    f"round {grp} ran at epochs {(read_epoch, write_epoch)}, "
                    f"not at the actor's {(ex.snapshot_epoch, ex.open_epoch)}"
                )
            got = {int(v): (int(n), key_from_json(r, last)) for v, n, last in json.loads(summary)}
            summary = VnodeSummary(got)
            ex.account(replace(b, epoch=read_epoch), summary)
            total += summary.rows
            self.rounds += 1
            if write_epoch not in self.epochs:
                self.epochs.add(write_epoch)
                self.path.round_epochs += 1
        return total

    def _moved(self, statement: str, *params: Any) -> None:
        """``statement`` moves the job's queue away from the released epoch (to another
        epoch, none, or gone); then wait for the rounds still at that epoch (they hold its
        lock, ``pushdown_tasks.epoch_lock``, shared): they are over, and can be accounted.
        Rounds at the next epoch go on meanwhile."""
        from spark_workers.pushdown_tasks import epoch_lock

        moved_from = self.released
        self.path.queue_statement(statement, *params)
        if moved_from is not None:
            self.path.queue_statement(
                "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                epoch_lock(self.token, moved_from[1]),
            )

    def close(self, then: tuple[int, int] | None = None) -> None:
        """Before a barrier closing the released epoch is handled: no round runs at it
        any more, and those that did are over (and can be accounted). ``then``: the
        (read, write) epochs the runners will be at once they handled the barriers that
        came, released at once: the rounds go on meanwhile (the barriers' changes are at
        or before each vnode's position, the rounds' reads after it)."""
        read_epoch, write_epoch = then if then is not None else (None, None)
        self._moved(_RELEASE, read_epoch, write_epoch, self.token)
        self.released = then

    def next_epochs(self, barrier: BarrierMessage) -> tuple[int, int]:
        """The (read, write) epochs the runners are at once they handled ``barrier``, as
        their executors will make them: an arrangement backfill reads at the epoch the
        barrier closes, the others at their fixed snapshot."""
        kinds = {r.kind for r in self.runners}
        read = barrier.prev if kinds == {"arrangement"} else self._epochs()[0]
        return read, barrier.curr

    def release(self) -> None:
        """Let the tasks go on at the runners' open epoch (once all of them opened it),
        unless it is released already; an epoch released in advance must be it."""
        epochs = {(r.executor.snapshot_epoch, r.executor.open_epoch) for r in self.runners}
        if len(epochs) != 1 or not self.running or self.released in epochs:
            return
        if self.released is not None:
            raise RuntimeError(
                f"epochs {self.released} were released for rounds, "
                f"but the actors are at {sorted(epochs)}"
            )
        read_epoch, write_epoch = epochs.pop()
        self.path.queue_statement(_RELEASE, read_epoch, write_epoch, self.token)
        self.released = (read_epoch, write_epoch)

    def stop(self, timeout_s: float = 60.0) -> None:
        """End the job: the rounds under way finish, the tasks start no other; wait for
        them."""
        from spark_workers.spark_path import DELETE_QUEUE

        try:
            self._moved(DELETE_QUEUE, self.token)
            self.released = None
        except Exception as e:  # the tasks then run to the end of their groups
            log.warning("could not end the Spark rounds %s: %s", self.token, e)
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.warning("the Spark rounds %s did not stop within %s s", self.token, timeout_s)

    def forget(self, conn: Any) -> None:
        """Drop what is left of the job's rounds (its actors are gone or restart)."""
        try:
            with conn.cursor() as cur:
                cur.execute(
                    "DELETE FROM work_rounds WHERE token = %s "
                    "OR created_at < now() - interval '1 hour'",
                    [self.token],
                )
            conn.commit()
        except Exception as e:  # rows of a gone job cost nothing; a later job sweeps them
            log.warning("could not delete the rounds of %s: %s", self.token, e)
