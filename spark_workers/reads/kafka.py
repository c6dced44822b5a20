"""Kafka reads of source actors: librdkafka's consumer on the driver, or, for a large
backlog, Spark tasks reading offset ranges (``SparkPath.run_source_epoch``,
``spark_workers.kafka_datasource``), one Spark job per job and open epoch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from spark_workers.reads.interface import ReadContext, ReadsOfOneRound

if TYPE_CHECKING:
    from spark_workers.reads.interface import Runner


class KafkaReads(ReadsOfOneRound):
    """Source actors' backfill reads; ``on_spark``: through a Spark job, else on the
    driver (``SourceRunner.read_some``)."""

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
                if runner.read_some(self.ctx.conn, budget) >= 0:
                    did = True
        return did
