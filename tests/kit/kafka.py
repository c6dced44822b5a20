"""A real Kafka-protocol broker for tests: librdkafka's mock cluster.

A client configured with ``test.mock.num.brokers`` starts the cluster in-process, and its
metadata names the broker's address; the cluster lives as long as that client.
Other clients (the service, worker processes, Spark tasks) reach it over TCP. It creates
topics with 4 partitions on first produce, and has no admin API.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import confluent_kafka as ck

MOCK_PARTITIONS = 4


class MockKafka:
    def __init__(self) -> None:
        # no ``debug: mock``: its log lines go through a Python callback from the mock
        # brokers' threads, which then wait for the GIL behind the test's own threads and
        # serve fetches slowly. The metadata names the broker's address instead.
        quiet = logging.getLogger("mock-kafka-clients")
        quiet.propagate = False
        self._owner = ck.Producer({"test.mock.num.brokers": 1, "logger": quiet})
        brokers = self._owner.list_topics(timeout=10).brokers
        if not brokers:
            raise RuntimeError("the mock Kafka cluster did not report its address")
        broker = next(iter(brokers.values()))
        self.bootstrap = f"{broker.host}:{broker.port}"
        self.producer = ck.Producer({"bootstrap.servers": self.bootstrap, "logger": quiet})
        self.produced = 0

    def produce(self, topic: str, docs: Iterable[tuple[int, Any]]) -> None:
        """Append ``(partition, JSON value)`` messages and wait until they are stored."""
        for partition, doc in docs:
            value = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
            while True:
                try:
                    self.producer.produce(topic, value=value, partition=partition)
                    break
                except BufferError:
                    self.producer.poll(0.05)
            self.produced += 1
        left = self.producer.flush(30)
        if left:
            raise RuntimeError(f"{left} messages were not delivered")

    def close(self) -> None:
        self.producer.flush(5)


@contextmanager
def mock_kafka() -> Iterator[MockKafka]:
    cluster = MockKafka()
    try:
        yield cluster
    finally:
        cluster.close()
