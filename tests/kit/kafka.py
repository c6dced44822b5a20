"""A real Kafka-protocol broker for tests: librdkafka's mock cluster.

A client configured with ``test.mock.num.brokers`` starts the cluster in-process and, with
``debug: mock``, logs its ``bootstrap.servers``; the cluster lives as long as that client.
Other clients (the service, worker processes, Spark tasks) reach it over TCP. It creates
topics with 4 partitions on first produce, and has no admin API.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import confluent_kafka as ck

MOCK_PARTITIONS = 4


class _AddressCatcher(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.address: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        m = re.search(r"bootstrap\.servers=(\S+)", record.getMessage())
        if m and self.address is None:
            self.address = m.group(1).rstrip(",")


class MockKafka:
    def __init__(self) -> None:
        catcher = _AddressCatcher()
        self._log = logging.getLogger(f"mock-kafka-{id(self)}")
        self._log.propagate = False
        self._log.addHandler(catcher)
        self._log.setLevel(logging.DEBUG)
        self._owner = ck.Producer(
            {"test.mock.num.brokers": 1, "debug": "mock", "logger": self._log}
        )
        deadline = time.monotonic() + 10
        while catcher.address is None:
            if time.monotonic() > deadline:
                raise RuntimeError("the mock Kafka cluster did not report its address")
            self._owner.poll(0.05)
        self.bootstrap = catcher.address
        quiet = logging.getLogger("mock-kafka-clients")
        quiet.propagate = False
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
