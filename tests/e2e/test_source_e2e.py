"""End to end for source backfill: a Kafka topic (librdkafka's mock cluster) that is
written to all along, a job that backfills it and then follows the shared source, and
the view checked against the topic's messages at committed epochs: every offset the
source had reached, exactly once."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.db import Database
from service.settings import Settings
from spark_workers.runtime import Worker
from tests.kit.auth import http_client
from tests.kit.e2e import assert_exact, running_cluster, wait_created, wait_for
from tests.kit.kafka import MOCK_PARTITIONS, MockKafka
from tests.kit.live import live_server

pytestmark = [pytest.mark.slow, pytest.mark.kafka]

TOPIC = "events"


def doc(i: int) -> Any:
    if i % 997 == 0:
        return b"not json"  # still one row (of NULLs) for its offset
    return {"id": i, "amount": i % 100, "note": f"n{i}"}


class Producer:
    """Appends batches to random partitions until stopped. Each batch goes to one
    partition: the mock broker returns one stored batch per fetch, so a topic of many
    one-message batches would be read unrealistically slowly."""

    def __init__(self, kafka: MockKafka, start: int, seed: int) -> None:
        self.kafka = kafka
        self.next = start
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.batches = 0
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.wait(0.05):
            n, partition = self.rng.randint(1, 60), self.rng.randrange(MOCK_PARTITIONS)
            self.kafka.produce(
                TOPIC, [(partition, doc(i)) for i in range(self.next, self.next + n)]
            )
            self.next += n
            self.batches += 1


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
    with running_cluster(db, fresh_db_url, Settings(), "source") as c:
        yield c


def test_source_backfill_is_exact_while_the_topic_grows(
    cluster: tuple[httpx.Client, Worker], kafka: MockKafka
) -> None:
    http, _ = cluster
    kafka.produce(TOPIC, [(i % MOCK_PARTITIONS, doc(i)) for i in range(20_000)])
    create_source(http, kafka)
    producer = Producer(kafka, 20_000, seed=3)
    producer.thread.start()
    try:
        job = create_job(
            http,
            "cheap_events",
            columns=["_partition", "_offset", "id", "amount"],
            filter={
                "or": [{"col": "amount", "op": "<", "value": 50}, {"col": "id", "op": "is_null"}]
            },
            rate_limit=2_000,
        )
        wait_for(
            lambda: http.get(f"/v1/jobs/{job}/progress").json()["rows"] > 3_000,
            what="mid-backfill",
        )
        assert http.patch(f"/v1/jobs/{job}", json={"parallelism": 3}).status_code == 200
        assert http.patch(f"/v1/jobs/{job}", json={"rate_limit": None}).status_code == 200
        wait_created(http, job)
        assert_exact(http, job, times=3)
    finally:
        producer.stop.set()
        producer.thread.join(timeout=30)
    assert producer.batches > 5
    everything = [doc(i) for i in range(producer.next)]
    kept = sum(1 for d in everything if isinstance(d, bytes) or d["amount"] < 50)
    wait_for(lambda: caught_up(http, job, kept), what="the source caught up with the topic")
    progress = http.get(f"/v1/jobs/{job}/progress").json()
    assert progress["phase"] == "done" and progress["percent"] == 100
    assert len(progress["splits"]) == MOCK_PARTITIONS
    assert all(p["state"] == "finished" for p in progress["splits"])
    assert http.get(f"/v1/jobs/{job}").json()["parallelism"] == 3


def test_a_killed_worker_resumes_the_source_backfill_exactly(
    db: Database, fresh_db_url: str, kafka: MockKafka
) -> None:
    settings = Settings(
        database_url=fresh_db_url,
        barrier_interval_ms=200,
        worker_lease_ms=1_000,
        spawn_embedded_worker=False,
    )
    backfill = str(Path(sys.executable).parent / "backfill")
    kafka.produce(TOPIC, [(i % MOCK_PARTITIONS, doc(i)) for i in range(12_000)])
    with live_server(settings, db) as url, http_client(url, timeout=60) as http:
        create_source(http, kafka)
        producer = Producer(kafka, 12_000, seed=4)
        producer.thread.start()
        first = subprocess.Popen([backfill, "worker", "--control-plane", url, "--name", "victim"])
        second = None
        try:
            job = create_job(http, "survivor", rate_limit=3_000)
            assert http.post(f"/v1/jobs/{job}/pause").status_code == 200
            # paused: the shared source goes on, the backfill does not
            start = http.get(f"/v1/jobs/{job}").json()["committed_epoch"]
            wait_for(
                lambda: (
                    http.get(f"/v1/jobs/{job}").json()["committed_epoch"] > start + (2_000 << 16)
                ),
                what="epochs while paused",
            )
            assert http.get(f"/v1/jobs/{job}/progress").json()["rows"] == 0
            assert http.post(f"/v1/jobs/{job}/resume").status_code == 200
            wait_for(
                lambda: http.get(f"/v1/jobs/{job}/progress").json()["rows"] > 2_000,
                what="mid-backfill",
            )
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=30)
            second = subprocess.Popen(
                [backfill, "worker", "--control-plane", url, "--name", "heir"]
            )
            wait_created(http, job)
            assert_exact(http, job, times=2)
            view = http.get(f"/v1/jobs/{job}").json()
            assert view["recoveries"] >= 1 and view["recovering"] is False
            producer.stop.set()
            producer.thread.join(timeout=30)
            wait_for(lambda: caught_up(http, job, producer.next), what="caught up")
        finally:
            producer.stop.set()
            producer.thread.join(timeout=30)
            if second is not None:
                second.terminate()
                second.wait(timeout=30)
            if first.poll() is None:
                first.kill()
