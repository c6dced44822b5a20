"""Source backfill through Spark: Kafka offset ranges read by Spark tasks, checked end to
end against the topic (and the tasks' visibility rule against the executor's)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from backfill_core.epoch import EpochPair
from backfill_core.executors.messages import Barrier
from backfill_core.executors.source import SourceBackfill, SplitProgress
from service.db import Database
from spark_workers.kafka_datasource import backfill_stop, range_summary
from spark_workers.runtime import Worker
from spark_workers.settings import WorkerSettings
from spark_workers.spark_path import SparkPath
from tests.e2e.test_source_e2e import TOPIC, caught_up, create_job, create_source, doc
from tests.kit.e2e import assert_exact, running_cluster, wait_created, wait_for
from tests.kit.executors import account_offsets, account_split_summary
from tests.kit.kafka import MOCK_PARTITIONS, MockKafka, Producer

INITIAL = 60_000


def _backfilling(offset: int | None, target: int | None) -> SourceBackfill:
    ex = SourceBackfill(1, ["0"], restore={"0": SplitProgress(offset=offset, target_offset=target)})
    ex.on_barrier(Barrier(EpochPair(1 << 16, 2 << 16)), [])
    return ex


@given(
    st.lists(st.integers(0, 2), min_size=0, max_size=30),  # gaps between offsets
    st.integers(0, 2),  # a gap before the high watermark (transaction markers)
    st.integers(-1, 20),
    st.one_of(st.none(), st.integers(0, 30)),
    st.integers(1, 40),
    st.booleans(),
)
def test_a_task_summary_accounts_like_the_driver(
    gaps: list[int], tail: int, last: int, ahead: int | None, limit: int, cut: bool
) -> None:
    """What a task reads and reports gives the executor the state ``SplitOffsets``
    gives it for the same rows: reading stops at the target (``cut``), and were a range
    ever read further, the rows after the target would be hidden (``last_visible``)."""
    offset = None if last < 0 else last  # the split's last offset backfilled
    target = None if ahead is None else last + 1 + ahead
    topic, o = [], last + 1
    for g in gaps:
        o += g
        topic.append(o)
        o += 1
    high = o + tail
    stop = backfill_stop(high, target) if cut else high
    offsets = [x for x in topic if x < stop][:limit]
    end = offsets[-1] + 1 if len(offsets) == limit else stop  # as the reader got
    driver, spark = _backfilling(offset, target), _backfilling(offset, target)
    (read,) = driver.plan_reads(limit)
    assert spark.plan_reads(limit) == [read]
    visible = account_offsets(driver, read, offsets, end=end)
    s = range_summary(offsets, target)
    account_split_summary(
        spark, read, s.count, s.last_offset, s.visible, last_visible=s.last_visible, end=end
    )
    assert s.visible == visible
    assert spark.progress == driver.progress and spark.exhausted == driver.exhausted
    if cut:
        assert s.visible == s.count  # nothing after the target is read


@pytest.fixture
def spark_epochs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The open epochs of the source reads that went through Spark."""
    epochs: list[int] = []
    original = SparkPath._run_source_job

    def recording(self: SparkPath, runners: Any, max_rows: int) -> int:
        epoch = runners[0].executor.open_epoch
        n = original(self, runners, max_rows)
        if n:
            epochs.append(epoch)
        return n

    monkeypatch.setattr(SparkPath, "_run_source_job", recording)
    return epochs


@pytest.fixture
def cluster(
    db: Database, fresh_db_url: str, kafka: MockKafka
) -> Iterator[tuple[httpx.Client, Worker]]:
    # two Spark jobs of 40k rows: the first reads 10k per partition, the second reaches
    # every partition's target (so the tasks' visibility rule decides what shows)
    worker = WorkerSettings(spark_min_rows=10_000, spark_epoch_rows=40_000)
    with running_cluster(db, fresh_db_url, worker, "source-spark", gc_retention_ms=600_000) as c:
        # start Spark before the topic grows: the mock broker reads a topic of many
        # small batches slowly, and verify reads all of it
        wait_for(lambda: c[1].spark is not None, what="the worker registered")
        assert c[1].spark is not None
        c[1].spark.warm_up()
        yield c


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.kafka
def test_source_backfill_through_spark_is_exact(
    cluster: tuple[httpx.Client, Worker], kafka: MockKafka, spark_epochs: list[int]
) -> None:
    http, worker = cluster
    # produced before the source exists: all of it is backfill
    kafka.produce("events", [(i % MOCK_PARTITIONS, doc(i)) for i in range(INITIAL)])
    create_source(http, kafka)
    # a quarter of the other tests' pace: ``verify`` reads the whole topic, and the mock
    # broker serves one stored batch per fetch
    producer = Producer(kafka, TOPIC, doc, INITIAL, seed=21, every_s=0.2)
    producer.thread.start()
    began = time.monotonic()
    try:
        job = create_job(
            http,
            "spark_events",
            columns=["_partition", "_offset", "id", "note"],
            filter={
                "or": [{"col": "amount", "op": ">=", "value": 30}, {"col": "id", "op": "is_null"}]
            },
        )
        wait_created(http, job)
        created = time.monotonic() - began
        assert_exact(http, job, times=2)
    finally:
        producer.stop.set()
        producer.thread.join(timeout=30)
    assert producer.batches > 5
    assert worker.spark is not None and worker.spark.source_jobs > 0, "Spark was not used"
    assert spark_epochs
    # at every epoch a Spark job wrote in, the view holds no message the shared source
    # had not reached by then (a row after a split's target would be one)
    for epoch in spark_epochs:
        v = http.get(f"/v1/jobs/{job}/verify", params={"epoch": epoch}).json()
        assert v["unexpected"] == [], (epoch, v)
    everything = [doc(i) for i in range(producer.next)]
    kept = sum(1 for d in everything if not isinstance(d, bytes) and d["amount"] >= 30)
    wait_for(lambda: caught_up(http, job, kept), what="the source caught up with the topic")
    # the messages that are not rows, skipped by the tasks and the driver alike, counted
    poison = sum(1 for d in everything if isinstance(d, bytes))
    splits = http.get(f"/v1/jobs/{job}/progress").json()["splits"]
    assert sum(s["skipped"] for s in splits) == poison
    print(
        f"created in {created:.1f}s, Spark jobs at epochs {spark_epochs}, "
        f"{producer.next - INITIAL} messages appended meanwhile"
    )
