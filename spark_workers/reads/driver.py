"""Reads on the driver: small or throttled epochs, one round trip per actor and round.

An arrangement's rows come in one group under one limit; the other kinds, and every
kind whose view runs inside Postgres (pushdown), read each vnode under its own share.
With pushdown the read is the same one statement a Spark task runs; otherwise the rows
come here, the view is applied and they go back. ``CHUNK_ROWS`` at a time, so a barrier
waits little for one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from backfill_core.changes import Version
from backfill_core.executors.interface import ReadGrouping, VnodeRows, VnodeSummary
from spark_workers.actors import fence
from spark_workers.reads.interface import ReadContext, ReadsOfOneRound
from state_store.pushdown import write_view

if TYPE_CHECKING:
    from spark_workers.actors import ActorRunner
    from spark_workers.reads.interface import Runner


class DriverReads(ReadsOfOneRound):
    """Table actors' reads on the driver."""

    def __init__(self, ctx: ReadContext) -> None:
        self.ctx = ctx
        self.pushdowns = 0  # reads that ran inside Postgres

    def read(self, runners: Sequence[Runner], budget: int) -> bool:
        did = False
        for runner in runners:
            with self.ctx.unless_dropped([runner]):
                if read_table(runner, self.ctx.conn, budget) >= 0:
                    did = True
                    if runner.pushed_where is not None:
                        self.pushdowns += 1
        return did


def read_table(runner: ActorRunner, conn: Any, max_rows: int) -> int:
    """One snapshot read of the open epoch, written at once; returns rows read (-1: none to do)."""
    ex = runner.executor
    # an arrangement's rows come in one group under one limit (one round trip); the
    # other kinds read each vnode under its own share
    if runner.pushed_where is not None or runner.kind != "arrangement":
        return _read_spread(runner, conn, max_rows)
    reads = ex.plan_reads(max_rows, 1)
    if not reads:
        return -1
    [read] = reads
    with conn.cursor() as cur:
        fence(cur, runner.graph_id, runner.recovery_seq, runner.actor_id)
        rows = runner.upstream.snapshot_multi(cur, read.epoch, read.starts, read.limit)
        kept = ex.account(read, VnodeRows(rows))
        runner.mv.write(cur, ex.open_epoch, [Version(r) for r in runner.view.rows(kept)])
    conn.commit()
    return len(rows)


def _read_spread(runner: ActorRunner, conn: Any, max_rows: int) -> int:
    """One read per pending vnode, each with its share of ``max_rows``, one round trip.

    With pushdown the reads are run and written by one statement inside Postgres
    (``state_store.pushdown``), and the executor accounts for each vnode's summary,
    as for the reads of a Spark task; otherwise the rows come here and go back."""
    ex = runner.executor
    reads = ex.plan_reads(max_rows, grouping=ReadGrouping.EACH)
    if not reads:
        return -1
    spread = [(v, after, r.limit) for r in reads for v, after in r.starts]
    with conn.cursor() as cur:
        fence(cur, runner.graph_id, runner.recovery_seq, runner.actor_id)
        if runner.pushed_where is not None:
            got = write_view(
                cur,
                runner.upstream,
                runner.mv,
                reads[0].epoch,
                spread,
                runner.pushed_where,
                ex.open_epoch,
            )
            total = 0
            for r in reads:
                summary = VnodeSummary({v: got[v] for v, _ in r.starts if v in got})
                ex.account(r, summary)
                total += summary.rows
        else:
            rows = runner.upstream.snapshot_reads(cur, reads[0].epoch, spread)
            by_vnode: dict[int, list[Any]] = {}
            for v, row in rows:
                by_vnode.setdefault(v, []).append((v, row))
            kept = []
            for r in reads:
                kept += ex.account(
                    r, VnodeRows([x for v, _ in r.starts for x in by_vnode.get(v, [])])
                )
            runner.mv.write(cur, ex.open_epoch, [Version(r) for r in runner.view.rows(kept)])
            total = len(rows)
    conn.commit()
    return total
