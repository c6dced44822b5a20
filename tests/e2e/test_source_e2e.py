"""End to end for source backfill: a Kafka topic (librdkafka's mock cluster) that is
written to all along, a job that backfills it and then follows the shared source, and
the view checked against the topic's messages at committed epochs: every offset the
source had reached, exactly once. At the scale of issue #8 (200k messages, rescale 2 -> 4
and kill -9 mid-backfill), and over a topic written only in transactions."""

from __future__ import annotations

import os
import random
import signal
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from connectors.kafka import KafkaClient, KafkaSpec
from service.db import Database
from service.settings import Settings
from spark_workers.runtime import Worker
from spark_workers.settings import WorkerSettings
from tests.kit.auth import http_client
from tests.kit.e2e import assert_exact, running_cluster, wait_created, wait_for
from tests.kit.kafka import MOCK_PARTITIONS, MockKafka, Producer
from tests.kit.live import live_server, worker_processes

pytestmark = [pytest.mark.slow, pytest.mark.kafka]

TOPIC = "events"


def doc(i: int) -> Any:
    if i % 997 == 0:
        return b"not json"  # not a row: skipped (a source's default ``on_error``)
    return valid_doc(i)


def valid_doc(i: int) -> Any:
    return {"id": i, "amount": i % 100, "note": f"n{i}"}


def poison_below(n: int) -> int:
    """How many of ``doc(0) .. doc(n - 1)`` are not rows."""
    return sum(1 for i in range(n) if isinstance(doc(i), bytes))


def create_source(http: httpx.Client, kafka: MockKafka, **extra: Any) -> None:
    r = http.post(
        "/v1/sources",
        json={
            "name": TOPIC,
            "kafka": {"bootstrap_servers": kafka.bootstrap, "topic": TOPIC},
            "columns": [
                {"name": "id", "type": "bigint"},
                {"name": "amount", "type": "int"},
                {"name": "note", "type": "text"},
            ],
        }
        | extra,
    )
    assert r.status_code == 201, r.text


def create_job(http: httpx.Client, name: str, **extra: Any) -> int:
    body = {"name": name, "upstream": {"source": TOPIC}, "parallelism": 2} | extra
    r = http.post("/v1/jobs", json=body)
    assert r.status_code == 202, r.text
    assert r.json()["kind"] == "source"
    return int(r.json()["id"])


def caught_up(http: httpx.Client, job: int, produced: int) -> bool:
    """The shared source reached every message produced, and the view holds them."""
    v = http.get(f"/v1/jobs/{job}/verify").json()
    assert v["equal"], v
    return v["expected_rows"] == produced


@pytest.fixture
def cluster(
    db: Database, fresh_db_url: str, kafka: MockKafka
) -> Iterator[tuple[httpx.Client, Worker]]:
    with running_cluster(db, fresh_db_url, WorkerSettings(), "source") as c:
        yield c


INITIAL = 200_000
RATE = 3_000  # rows/s per actor until lifted: the faults must land mid-backfill
SLOW = 300.0  # s: stages of 200k messages on a machine shared with other test runs


def every_split_finished(http: httpx.Client, job: int) -> bool:
    splits = http.get(f"/v1/jobs/{job}/progress").json()["splits"]
    return all(p["state"] == "finished" for p in splits)


def progress_rows(http: httpx.Client, job: int) -> int:
    return int(http.get(f"/v1/jobs/{job}/progress").json()["rows"])


def still_backfilling(http: httpx.Client, job: int) -> int:
    """The job is creating, part way through the initial messages: its committed rows."""
    view, rows = http.get(f"/v1/jobs/{job}").json(), progress_rows(http, job)
    assert view["state"] == "creating" and 0 < rows < INITIAL, (view, rows)
    return rows


def test_source_backfill_at_scale_is_exact_through_rescale_and_kill(
    db: Database, fresh_db_url: str, kafka: MockKafka
) -> None:
    """200k messages over 4 partitions, a producer writing all along, a rate-limited job
    (paused for a while first), rescaled from 2 to 4 actors and its worker killed with
    SIGKILL, each while it is still backfilling; then the limit is lifted. After
    ``created`` every message up to the source's committed offsets is in the view once."""
    settings = Settings(
        database_url=fresh_db_url,
        barrier_interval_ms=200,
        # verify (200k messages, in this process like the control plane) holds the GIL
        # for long stretches on a busy machine: a 1 s lease would expire now and then
        worker_lease_ms=3_000,
        spawn_embedded_worker=False,
    )
    # the Spark path has its own e2e test; here the worker reads in its driver
    env = {**os.environ, "BACKFILL_SPARK_MODE": "never"}
    kafka.load(TOPIC, [(i % MOCK_PARTITIONS, doc(i)) for i in range(INITIAL)])

    with (
        live_server(settings, db) as url,
        worker_processes(url, env) as worker,
        http_client(url, timeout=180) as http,
    ):
        create_source(http, kafka)
        # as many messages as the other tests' producer, in fewer batches: every reader
        # of the topic (verify too) pays one fetch per batch
        producer = Producer(kafka, TOPIC, doc, INITIAL, seed=4, every_s=0.2, most=240)
        producer.thread.start()
        first = worker("victim")
        try:
            job = create_job(
                http,
                "cheap_events",
                columns=["_partition", "_offset", "id", "amount"],
                filter={
                    "or": [
                        {"col": "amount", "op": "<", "value": 50},
                        {"col": "id", "op": "is_null"},
                    ]
                },
                rate_limit=RATE,
            )
            assert http.post(f"/v1/jobs/{job}/pause").status_code == 200
            # paused: the shared source goes on, the backfill does not
            start = int(http.get(f"/v1/jobs/{job}").json()["committed_epoch"])
            wait_for(
                lambda: (
                    int(http.get(f"/v1/jobs/{job}").json()["committed_epoch"])
                    > start + (2_000 << 16)
                ),
                what="epochs while paused",
            )
            assert progress_rows(http, job) == 0
            assert http.post(f"/v1/jobs/{job}/resume").status_code == 200

            wait_for(lambda: progress_rows(http, job) > 20_000, SLOW, what="mid-backfill")
            at_rescale = still_backfilling(http, job)
            assert http.patch(f"/v1/jobs/{job}", json={"parallelism": 4}).status_code == 200
            wait_for(
                lambda: progress_rows(http, job) > at_rescale + 40_000,
                SLOW,
                what="backfilling with 4 actors",
            )
            recoveries = http.get(f"/v1/jobs/{job}").json()["recoveries"]
            assert recoveries >= 1  # the rescale went through one
            at_kill = still_backfilling(http, job)
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=30)
            worker("heir")
            wait_for(
                lambda: http.get(f"/v1/jobs/{job}").json()["recoveries"] > recoveries,
                SLOW,
                what="recovery from the kill",
            )
            wait_for(
                lambda: progress_rows(http, job) > at_kill + 10_000,
                SLOW,
                what="backfilling on the heir",
            )
            still_backfilling(http, job)
            assert http.patch(f"/v1/jobs/{job}", json={"rate_limit": None}).status_code == 200
            wait_created(http, job, SLOW)
            assert_exact(http, job, times=1)  # caught_up below checks a later epoch
            view = http.get(f"/v1/jobs/{job}").json()
            assert view["recovering"] is False and view["parallelism"] == 4
            producer.stop.set()
            producer.thread.join(timeout=30)
            assert producer.batches > 5
            everything = [doc(i) for i in range(producer.next)]
            kept = sum(1 for d in everything if not isinstance(d, bytes) and d["amount"] < 50)
            wait_for(lambda: caught_up(http, job, kept), SLOW, what="the source caught up")
            progress = http.get(f"/v1/jobs/{job}/progress").json()
            assert progress["phase"] == "done" and progress["percent"] == 100
            assert len(progress["splits"]) == MOCK_PARTITIONS
            # a split caching up finishes once the shared source is past the offset its
            # backfill ended at, with the producer stopped too (the source's end says so);
            # the rows are all there before that (the backfill wrote them), so this may
            # take a barrier or two after the rows caught up
            wait_for(lambda: every_split_finished(http, job), SLOW, what="every split finished")
        finally:
            producer.stop.set()
            producer.thread.join(timeout=30)


def readable(kafka: MockKafka) -> int:
    """How many messages a reader of the source gets from the whole topic."""
    client = KafkaClient(KafkaSpec(kafka.bootstrap, TOPIC, {}))
    try:
        return sum(len(client.read(p, None, hi)) for p, (_, hi) in client.watermarks().items())
    finally:
        client.close()


class Transactions:
    """A transactional producer: batches to one partition each, one in five aborted
    (but never the last of a partition, so every partition ends with a commit marker)."""

    def __init__(self, kafka: MockKafka, seed: int) -> None:
        self.kafka, self.rng, self.next = kafka, random.Random(seed), 0

    def write(self, count: int) -> None:
        for k in range(count):
            n = self.rng.randint(1, 40)
            commit = k % 5 != 3 or k >= count - MOCK_PARTITIONS
            docs = [valid_doc(i) for i in range(self.next, self.next + n)]
            self.kafka.transaction(TOPIC, k % MOCK_PARTITIONS, docs, commit)
            self.next += n


def test_offsets_ending_in_transaction_markers_need_no_new_message(
    cluster: tuple[httpx.Client, Worker], kafka: MockKafka
) -> None:
    """A topic written only in transactions, each partition ending with a commit marker,
    and no message after the job is created: every backfill target (high watermark - 1)
    is a marker that no read returns, yet the job gets ``created`` and every partition
    finishes (the source stands past the markers); the view holds every message a
    read_committed reader gets, once. Then more transactions, which it follows."""
    http, _ = cluster
    txns = Transactions(kafka, seed=8)
    txns.write(40)
    create_source(http, kafka)  # starts at the end: no upstream rows until more are written
    client = KafkaClient(KafkaSpec(kafka.bootstrap, TOPIC, {}))
    try:
        marks = client.watermarks()
        last = {p: client.read(p, None, high)[-1].offset for p, (_, high) in marks.items()}
    finally:
        client.close()
    assert all(last[p] < high - 1 for p, (_, high) in marks.items())  # a marker at the end
    written = readable(kafka)
    job = create_job(http, "committed_events")
    wait_created(http, job)
    wait_for(
        lambda: every_split_finished(http, job),
        what="every partition finished with no new message",
    )
    assert readable(kafka) == written  # nothing was written meanwhile
    assert_exact(http, job, times=2)
    assert caught_up(http, job, written)

    txns.write(20)
    total = readable(kafka)
    wait_for(lambda: caught_up(http, job, total), what="the view followed the transactions")
    assert_exact(http, job, times=2)


def test_the_view_never_runs_ahead_of_a_stalled_source(
    cluster: tuple[httpx.Client, Worker], kafka: MockKafka
) -> None:
    """The shared source is held (rate limit 0) while its topic grows. A backfill reads
    the topic itself, but at every committed epoch the view holds only the messages the
    source had reached then: the backfill stops where the source is, and the source's
    own rows would take it on from there. The seed backfills up to the topic's end, so
    the view ran ahead of the source (until then the upstream rows had kept the target
    in step, but a source with no rows in the job's first epoch gives it none)."""
    http, _ = cluster
    kafka.load(TOPIC, [(i % MOCK_PARTITIONS, doc(i)) for i in range(2_000)])
    create_source(http, kafka, rate_limit=0)  # starts at the topic's end, and stays there
    kafka.load(TOPIC, [(i % MOCK_PARTITIONS, doc(i)) for i in range(2_000, 6_000)])
    job = create_job(http, "behind_the_source")
    reached: set[int] = set()

    def all_the_source_has_at_more_epochs() -> bool:
        v = http.get(f"/v1/jobs/{job}/verify").json()
        brief = {k: x for k, x in v.items() if k != "missing"}
        assert v["unexpected"] == [] and v["expected_rows"] == 2_000 - poison_below(2_000), brief
        if v["equal"]:
            reached.add(int(v["epoch"]))
        return len(reached) >= 3

    wait_for(all_the_source_has_at_more_epochs, what="the backfill up to the source, no further")
    assert progress_rows(http, job) == 2_000
