"""Source backfill: a job on a Kafka source backfilling N messages (200k; 50k with
``--quick``) through the real control plane and a real worker, against a plain
confluent-kafka consumer reading the same messages, parsing them the same way and
writing them into the same kind of table, in the same run. The broker is librdkafka's
mock cluster in this process, so both sides pay the same broker costs.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg2

from backfill_core.changes import Version
from backfill_core.schema import Column, ColumnType
from bench._live import live_worker, time_until_created
from bench._pg import fresh_database
from connectors.kafka import KafkaClient, KafkaSpec, decode_messages, source_schema
from service.embedded_pg import to_libpq_url
from state_store.versioned import VersionedTable
from tests.kit.kafka import MOCK_PARTITIONS, MockKafka

TOPIC = "orders"
COLUMNS = [
    Column("id", ColumnType.BIGINT),
    Column("amount", ColumnType.INT),
    Column("note", ColumnType.TEXT),
]
CHUNK = 20_000


def _produce(kafka: MockKafka, n: int) -> None:
    per = n // MOCK_PARTITIONS
    for p in range(MOCK_PARTITIONS):
        for lo in range(0, per, CHUNK):
            docs = [
                {"id": i, "amount": i % 1000, "note": f"order-{i:09d}"}
                for i in range(lo, min(per, lo + CHUNK))
            ]
            kafka.produce(TOPIC, [(p, d) for d in docs])


def _plain_consumer(kafka: MockKafka, url: str, n: int) -> float:
    schema = source_schema(COLUMNS, 256)
    table = VersionedTable("plain_copy", schema)
    conn = psycopg2.connect(to_libpq_url(url))
    try:
        with conn.cursor() as cur:
            table.create(cur)
        conn.commit()
        client = KafkaClient(KafkaSpec(kafka.bootstrap, TOPIC, {}))
        t0 = time.perf_counter()
        ends = {p: high for p, (_, high) in client.watermarks().items()}
        pos = {p: 0 for p in ends}
        read = 0
        while any(pos[p] < ends[p] for p in ends):
            got = client.read_ranges(
                {p: (pos[p], ends[p], CHUNK) for p in ends if pos[p] < ends[p]}
            )
            rows = []
            for p, msgs in got.items():
                if msgs:
                    pos[p] = msgs[-1].offset + 1
                rows += decode_messages(schema, msgs).rows
            with conn.cursor() as cur:
                table.write(cur, 1 << 16, [Version(r) for r in rows])
            conn.commit()
            read += len(rows)
        elapsed = time.perf_counter() - t0
        client.close()
        assert read == n, f"the consumer read {read} messages, not {n}"
        return elapsed
    finally:
        conn.close()


def _source_backfill(kafka: MockKafka, db: Any, url: str, n: int) -> float:
    with live_worker(db, url, 1000, "bench-source") as (http, _):
        r = http.post(
            "/v1/sources",
            json={
                "name": TOPIC,
                "kafka": {"bootstrap_servers": kafka.bootstrap, "topic": TOPIC},
                "columns": [c.to_json() for c in COLUMNS],
            },
        )
        assert r.status_code == 201, r.text
        job = {"name": "orders_mv", "upstream": {"source": TOPIC}, "parallelism": 4}
        return time_until_created(http, job, n)


def run(quick: bool) -> list[dict[str, Any]]:
    n = 50_000 if quick else 200_000
    kafka = MockKafka()
    try:
        _produce(kafka, n)
        with fresh_database() as (url, db):
            baseline = _plain_consumer(kafka, url, n)
            backfill = _source_backfill(kafka, db, url, n)
    finally:
        kafka.close()
    return [
        {
            "name": "source backfill vs a plain consumer",
            "value": round(backfill, 2),
            "baseline": round(baseline, 2),
            "ratio": round(backfill / baseline, 2),
            "target": "report",
            "unit": "s",
            "passed": None,
            "note": f"{n:,} JSON messages in 4 partitions (mock broker), 4 actors, one worker; "
            "baseline: one confluent-kafka consumer parsing and writing the same rows",
        }
    ]
