"""A Spark job per job and epoch (``SparkPath.run_epoch``): table actors with many rows
left whose reads cannot run as a job spanning epochs (throttled, paused, or a view
without a SQL form), or while such a job holds nothing yet."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from spark_workers.reads.interface import ReadContext, ReadsOfOneRound

if TYPE_CHECKING:
    from spark_workers.reads.interface import Runner


class SparkEpochReads(ReadsOfOneRound):
    def __init__(self, ctx: ReadContext) -> None:
        self.ctx = ctx

    def read(self, runners: Sequence[Runner], budget: int) -> bool:
        if not runners:
            return False
        spark = self.ctx.spark
        assert spark is not None
        with self.ctx.unless_dropped(runners):
            spark.run_epoch(runners, budget)
        return True
