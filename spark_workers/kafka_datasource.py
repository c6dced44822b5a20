"""Spark's Python Data Source for source backfill: Kafka partitions read by offset range
inside Spark tasks, the visible rows written into the MV, summaries sent back.

Format ``backfill_kafka``; one option ``plan`` (``backfill_core.protocol.KafkaPlan`` as
JSON text, built by ``spark_path``): the
source's Kafka settings, the upstream and MV schemas, the job's view, the fence (graph,
recovery sequence) and the open epoch, and per Spark partition a list of ranges
``[read index, kafka partition, start (None: earliest), stop, limit, target]``. Each
task reads its ranges with one confluent-kafka consumer of its own (one assignment),
keeps of each range exactly the rows the executor's ``on_backfill_row`` makes visible
(up to and including the first offset at or beyond the target, none after: nothing
after the target is even read), parses them (``decode_messages``, under the source's ``on_error``), applies the view, and
writes them at the open epoch under the same fence as the table data source. Reading
yields one summary row per range (``SUMMARY_DDL``; ``end_offset``: every message below
it was read, so a range whose offsets end in transaction markers still reaches its
target), which the driver collects and hands to ``SourceBackfill.account`` (a
``SplitSummary``).

Everything happens in the read: there is no data to hand from a reader to a writer
(the rows are written where they are parsed), so no Arrow hop through the JVM. A retried
task reads the same ranges and writes the same rows at the same epoch, which
``VersionedTable.write`` upserts (last write of a key in an epoch wins).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from backfill_core.protocol import KafkaPlan, KafkaRange
from connectors.kafka import backfill_stop

FORMAT = "backfill_kafka"
SUMMARY_DDL = (
    "read INT, rows_read BIGINT, last_offset BIGINT, visible BIGINT, "
    "last_visible BIGINT, written BIGINT, end_offset BIGINT, "
    "skipped BIGINT, first_skipped BIGINT, last_skipped BIGINT, skip_reason STRING"
)


@dataclass(frozen=True, slots=True)
class RangeSummary:
    """What ``SplitSummary`` holds for one read."""

    count: int
    last_offset: int | None
    visible: int
    last_visible: int | None


def range_summary(offsets: Sequence[int], target: int | None) -> RangeSummary:
    """The executor's visibility rule (``split_visible_prefix`` of a backfilling split):
    rows up to and including the first offset at or beyond ``target`` are visible, none
    after it; every row read counts."""
    from backfill_core.executors.source import SplitProgress, split_visible_prefix

    visible = split_visible_prefix(offsets, SplitProgress(target_offset=target))
    return RangeSummary(
        len(offsets),
        offsets[-1] if offsets else None,
        visible,
        offsets[visible - 1] if visible else None,
    )


@dataclass
class KafkaRanges(InputPartition):  # type: ignore[misc]
    index: int


class KafkaBackfillDataSource(DataSource):  # type: ignore[misc]
    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return SUMMARY_DDL

    def reader(self, schema: Any) -> DataSourceReader:
        return KafkaRangeReader(self.options["plan"])


class KafkaRangeReader(DataSourceReader):  # type: ignore[misc]
    def __init__(self, plan: str) -> None:
        self.plan_text = plan

    def partitions(self) -> list[InputPartition]:
        return [KafkaRanges(i) for i in range(len(KafkaPlan.from_text(self.plan_text).partitions))]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        plan = KafkaPlan.from_text(self.plan_text)
        ranges = plan.partitions[partition.index]
        if ranges:
            yield from run_ranges(plan, ranges)


def run_ranges(plan: KafkaPlan, ranges: list[KafkaRange]) -> list[tuple[Any, ...]]:
    """One task: read the ranges, write their visible rows, summarize each range."""
    import psycopg2

    from backfill_core.changes import Version
    from backfill_core.view import View
    from connectors.kafka import KafkaClient, KafkaSpec, decode_messages
    from spark_workers.datasource import fence_task
    from state_store.options import worker_dsn
    from state_store.versioned import VersionedTable

    client = KafkaClient(KafkaSpec.from_json(plan.kafka))
    try:
        got = client.scan_ranges(
            {
                int(p): (start, backfill_stop(int(stop), target), int(limit))
                for _, p, start, stop, limit, target in ranges
            }
        )
    finally:
        client.close()
    schema, write = plan.upstream_schema, plan.write
    view = View.build(schema, write.columns, write.filter)
    out: list[tuple[Any, ...]] = []
    rows: list[tuple[Any, ...]] = []
    for index, p, _, _, _, target in ranges:
        scan = got[int(p)]
        s = range_summary([m.offset for m in scan.messages], target)
        decoded = decode_messages(schema, scan.messages[: s.visible])
        kept = view.rows(decoded.rows)
        rows += kept
        # messages that are not rows: the driver applies the source's ``on_error``
        bad = decoded.skipped[0] if decoded.skipped else None
        out.append(
            (
                int(index),
                s.count,
                s.last_offset,
                s.visible,
                s.last_visible,
                len(kept),
                scan.end,
                bad.count if bad else 0,
                bad.first_offset if bad else None,
                bad.last_offset if bad else None,
                bad.reason if bad else None,
            )
        )
    if rows:
        mv = VersionedTable(write.mv_table, write.mv_schema)
        conn = psycopg2.connect(worker_dsn(write.dsn))
        try:
            with conn.cursor() as cur:
                fence_task(cur, write.graph_id, write.recovery_seq)
                mv.write(cur, write.write_epoch, [Version(r) for r in rows])
            conn.commit()
        finally:
            conn.close()
    return out


__all__ = [
    "FORMAT",
    "KafkaBackfillDataSource",
    "RangeSummary",
    "range_summary",
    "run_ranges",
]
