"""Kafka reads of source actors: librdkafka's consumer on the driver (``read_kafka``),
or, for a large backlog, Spark tasks reading offset ranges (``SparkPath.run_source_epoch``,
``spark_workers.kafka_datasource``), one Spark job per job and open epoch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from backfill_core.changes import Version
from backfill_core.executors.source import SplitOffsets
from connectors.kafka import backfill_stop
from spark_workers.actors import fence
from spark_workers.reads.interface import ReadContext, ReadsOfOneRound

if TYPE_CHECKING:
    from spark_workers.reads.interface import Runner
    from spark_workers.source_actor import SourceRunner


class KafkaReads(ReadsOfOneRound):
    """Source actors' backfill reads; ``on_spark``: through a Spark job, else on the
    driver."""

    def __init__(self, ctx: ReadContext, *, on_spark: bool) -> None:
        self.ctx = ctx
        self.on_spark = on_spark

    def read(self, runners: Sequence[Runner], budget: int) -> bool:
        if not runners:
            return False
        if self.on_spark:
            spark = self.ctx.spark
            assert spark is not None
            with self.ctx.unless_dropped(runners):
                spark.run_source_epoch(runners, budget)
            return True
        did = False
        for runner in runners:
            with self.ctx.unless_dropped([runner]):
                if read_kafka(runner, self.ctx.conn, budget) >= 0:
                    did = True
        return did


def read_kafka(runner: SourceRunner, conn: Any, max_rows: int) -> int:
    """Backfill reads of the open epoch, written at once; rows read (-1: none to do)."""
    ex = runner.executor
    reads = ex.plan_reads(max_rows)
    if not reads:
        return -1
    plan = {
        int(r.split): (r.start, backfill_stop(high, r.target), r.limit)
        for r, high in runner.with_high_watermarks(reads)
    }
    got = runner.client.scan_ranges(plan)
    total = 0
    rows = []
    for r in reads:
        scan = got[int(r.split)]
        msgs = scan.messages
        visible = ex.account(r, SplitOffsets([m.offset for m in msgs], end=scan.end))
        rows += runner.rows_of(msgs[:visible])
        total += len(msgs)
    with conn.cursor() as cur:
        fence(cur, runner.graph_id, runner.recovery_seq, runner.actor_id)
        runner.mv.write(cur, ex.open_epoch, [Version(r) for r in runner.view.rows(rows)])
    conn.commit()
    return total
