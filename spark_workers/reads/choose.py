"""Which strategy reads for an actor: the one place that decides, from the settings, the
throttle, the rows left and whether the view runs inside Postgres
(``docs/architecture.md#the-workers-read-strategies``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from spark_workers.actors import ReadsFrom
from spark_workers.reads.cdc import CdcReads
from spark_workers.reads.driver import DriverReads
from spark_workers.reads.interface import CHUNK_ROWS
from spark_workers.reads.kafka import KafkaReads
from spark_workers.reads.spanning import SpanningReads
from spark_workers.reads.spark_epoch import SparkEpochReads

if TYPE_CHECKING:
    from spark_workers.reads.interface import ReadContext, ReadStrategy, Runner


class Strategies:
    """The worker's strategies, in the order a round of reads runs them (Spark jobs
    first: the driver's reads meanwhile are small)."""

    def __init__(self, ctx: ReadContext) -> None:
        self.ctx = ctx
        self.spanning = SpanningReads(ctx)
        self.spark_epoch = SparkEpochReads(ctx)
        self.kafka_spark = KafkaReads(ctx, on_spark=True)
        self.driver = DriverReads(ctx)
        self.kafka_driver = KafkaReads(ctx, on_spark=False)
        self.cdc = CdcReads(ctx)
        self.all: tuple[ReadStrategy, ...] = (
            self.spanning,
            self.spark_epoch,
            self.kafka_spark,
            self.driver,
            self.kafka_driver,
            self.cdc,
        )

    def spark_sized(self) -> list[Runner]:
        """Actors whose next reads are large enough for a Spark job (per job on this
        worker): unthrottled or with a budget of at least ``spark_min_rows`` per epoch,
        and, unless ``spark_mode`` is ``always``, with that many rows left in their job
        (source actors: their splits' backlog up to the targets; table actors: the
        planner's estimate of their snapshot)."""
        ctx, s = self.ctx, self.ctx.settings
        if ctx.spark is None or s.spark_mode == "never":
            return []
        eligible = [
            r
            for r in ctx.runners.values()
            if r.reads_from is not ReadsFrom.POSTGRES_CDC  # one stream, on the driver
            and self.has_reads(r)
            and (r.executor.budget is None or r.executor.budget >= s.spark_min_rows)
        ]
        if s.spark_mode == "always":
            return eligible
        remaining: dict[int, int] = {}
        for r in eligible:
            remaining[r.job_id] = remaining.get(r.job_id, 0) + r.remaining_estimate(ctx.conn)
        return [r for r in eligible if remaining[r.job_id] >= s.spark_min_rows]

    def strategy_for(self, runner: Runner, *, spark_sized: bool) -> ReadStrategy:
        """The strategy that reads for ``runner`` in this round of reads (``spark_sized``:
        one of ``spark_sized()``, after ``spanning.start`` had its chance)."""
        if runner.reads_from is ReadsFrom.POSTGRES_CDC:
            return self.cdc
        if self.spanning.wants(runner):
            return self.spanning  # its reads run in the job spanning epochs
        # a job spanning epochs holds Spark's cores until it is over: a job of one epoch
        # for other actors would wait for them, and every barrier with it
        on_spark = spark_sized and not self.spanning.running
        if runner.reads_from is ReadsFrom.KAFKA:
            return self.kafka_spark if on_spark else self.kafka_driver
        return self.spark_epoch if on_spark else self.driver

    def has_reads(self, runner: Runner) -> bool:
        """Whether the runner has reads for a round of reads to run (a job spanning epochs
        reads for its actors on its own)."""
        return not self.spanning.wants(runner) and runner.has_reads()

    def budget(self, strategy: ReadStrategy) -> int:
        """The rows a strategy reads per round: a Spark job's per job and epoch, the
        driver's ``CHUNK_ROWS`` per actor (a barrier waits for one read at most)."""
        if strategy is self.spark_epoch or strategy is self.kafka_spark:
            return self.ctx.settings.spark_epoch_rows
        return CHUNK_ROWS

    def choose(self, runners: Iterable[Runner]) -> list[tuple[ReadStrategy, list[Runner]]]:
        """A round of reads: start a job spanning epochs if one can, then each actor to
        its strategy, in the strategies' order."""
        large = self.spark_sized()
        self.spanning.start(large)
        sized = {r.actor_id for r in large}
        chosen: dict[int, list[Runner]] = {id(s): [] for s in self.all}
        for r in runners:
            chosen[id(self.strategy_for(r, spark_sized=r.actor_id in sized))].append(r)
        return [(s, chosen[id(s)]) for s in self.all]
