"""A Spark job spanning epochs (``spark_workers.rounds``): an unthrottled table backfill
whose view runs inside Postgres reads its whole snapshot in one job's rounds, which go on
while the worker handles barriers (``docs/architecture.md#spark-jobs-spanning-epochs``).

One such job runs at a time on a worker: its tasks hold Spark's cores until it is over.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from backfill_core.executors.messages import BarrierKind
from spark_workers.actors import Fenced, ReadsFrom
from spark_workers.reads.driver import read_table
from spark_workers.reads.interface import CHUNK_ROWS, ReadContext
from spark_workers.rounds import RoundsJob, rounds_eligible
from spark_workers.spark_path import round_rows

if TYPE_CHECKING:
    from backfill_core.protocol import Assignment
    from spark_workers.reads.interface import Runner

log = logging.getLogger(__name__)


class SpanningReads:
    def __init__(self, ctx: ReadContext) -> None:
        self.ctx = ctx
        self.job: RoundsJob | None = None  # the job that runs, if one does

    @property
    def running(self) -> bool:
        """A job runs (its rounds may be over, not yet accounted)."""
        return self.job is not None

    def eligible(self, runner: Runner) -> bool:
        """Whether the runner's reads could run as rounds: the settings allow rounds, the
        view runs inside Postgres, the backfill is unthrottled and not paused."""
        s, spark = self.ctx.settings, self.ctx.spark
        return (
            s.spark_rounds
            and spark is not None
            and spark.pushdown
            and runner.reads_from is ReadsFrom.STATE_STORE
            and rounds_eligible(runner)
        )

    def wants(self, runner: Runner) -> bool:
        """The job's actors are its own while it runs: nothing else reads for them."""
        return self.job is not None and any(r is runner for r in self.job.runners)

    def start(self, large: Sequence[Runner]) -> None:
        """Start a job for the first job among ``large`` whose actors can read so, unless
        one runs."""
        spark = self.ctx.spark
        if self.job is not None or spark is None:
            return
        by_job: dict[int, list[Runner]] = {}
        for r in large:
            if self.eligible(r):
                by_job.setdefault(r.job_id, []).append(r)
        for runners in by_job.values():
            _, cores = spark.active_session()
            rows = round_rows(self.ctx.settings.spark_epoch_rows, cores)
            job = RoundsJob(spark, runners, self.ctx.conn, rows, on_done=self.ctx.want_barrier)
            if job.start():
                self.job = job
                log.info("Spark rounds %s: %s groups", job.token, len(job.batches))
            return

    def read(self, runners: Sequence[Runner], budget: int) -> bool:
        """The job's tasks read for its actors: nothing to do here."""
        return False

    def before_barrier(self, assignments: list[Assignment]) -> None:
        """Account for the rounds of the epoch the barriers close, or end the job when it
        is over or the barriers change its actors."""
        job = self.job
        if job is None:
            return
        runners = self.ctx.runners
        ids = {r.actor_id for r in job.runners}
        mine = [a for a in assignments if a.actor_id in ids]
        barriers = [b for a in mine for b in a.barriers]
        if (
            len(mine) < len(ids)
            or any(b.kind is BarrierKind.INITIAL for b in barriers)
            or any(runners.get(r.actor_id) is not r for r in job.runners)
        ):
            # a recovery rolls its rounds back; actors no longer here were dropped with
            # their job (or stopped: a mutation ended the job before)
            self.stop(account=False)
            return
        changed = any(b.mutation for b in barriers)
        if changed or not job.running:
            self.stop(account=True)
            if not changed:
                # the actors' reads left in this epoch (rows that came after their rounds)
                # before the barrier closing it, which can then report them done
                for r in job.runners:
                    if runners.get(r.actor_id) is r:
                        with self.ctx.unless_dropped([r]):
                            read_table(r, self.ctx.conn, CHUNK_ROWS)
        elif barriers:
            # every actor of the job has the same last barrier: the epochs they will be at
            # are released at once; otherwise once they opened them (``RoundsJob.release``)
            lasts = [a.barriers[-1] if a.barriers else None for a in mine]
            first = lasts[0]
            same = first is not None and all(b is not None and b.curr == first.curr for b in lasts)
            job.close(job.next_epochs(first) if first is not None and same else None)
            job.account(self.ctx.conn)

    def after_barrier(self) -> None:
        if self.job is not None:
            self.job.release()  # its rounds go on while the barriers are collected

    def supersede(self, graph_id: int) -> None:
        if self.job is not None and self.job.runners[0].graph_id == graph_id:
            self.stop(account=False)

    def stop(self, *, account: bool) -> None:
        """Stop the job, if one runs; with ``account``, its rounds count (its actors go
        on), and an error of its own is raised."""
        job, self.job = self.job, None
        if job is None:
            return
        conn = self.ctx.conn
        job.stop()
        try:
            if account and conn is not None:
                job.account(conn)
        finally:
            if conn is not None:
                job.forget(conn)
        log.info("Spark rounds %s ended after %s rounds", job.token, job.rounds)
        # a job dropped under its rounds (a write into a view that is gone) fails them: no
        # failure of this worker's other actors
        if (
            account
            and job.error is not None
            and not self.ctx.forget_if_dropped([r.actor_id for r in job.runners])
        ):
            fences = [job.fence] if job.fence is not None else []
            # its graph recovered meanwhile: a round met its fence (or failed for a
            # reason the recovery makes moot)
            if self.ctx.recovered_graph(fences) is not None:
                graph_id = job.runners[0].graph_id
                raise Fenced(
                    graph_id, f"Spark rounds of graph {graph_id} were fenced off"
                ) from job.error
            raise job.error
