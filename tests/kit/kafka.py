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
        self._quiet = quiet
        self.producer = ck.Producer({"bootstrap.servers": self.bootstrap, "logger": quiet})
        self._bulk: ck.Producer | None = None
        self._transactional: ck.Producer | None = None
        self.produced = 0

    def produce(self, topic: str, docs: Iterable[tuple[int, Any]]) -> None:
        """Append ``(partition, JSON value)`` messages and wait until they are stored."""
        self._send(self.producer, topic, docs)

    def load(self, topic: str, docs: Iterable[tuple[int, Any]]) -> None:
        """``produce`` for a large backlog: the messages go in as few batches as librdkafka
        makes (about 1 MB), since the mock broker returns one stored batch per fetch and
        every reader of the topic (``verify`` too) would pay for many small ones."""
        if self._bulk is None:
            self._bulk = ck.Producer(
                {
                    "bootstrap.servers": self.bootstrap,
                    "logger": self._quiet,
                    "linger.ms": 200,
                    "batch.num.messages": 100_000,
                    "batch.size": 16_000_000,
                    "queue.buffering.max.messages": 1_000_000,
                }
            )
        self._send(self._bulk, topic, docs)

    def transaction(self, topic: str, partition: int, docs: Iterable[Any], commit: bool) -> None:
        """One transaction of one transactional producer: its messages to ``partition``,
        then a commit (or an abort), whose marker takes an offset of the partition.
        (The mock broker does not tell consumers which transactions were aborted, so even
        ``read_committed`` readers get the messages of an aborted one.)"""
        if self._transactional is None:
            self._transactional = ck.Producer(
                {
                    "bootstrap.servers": self.bootstrap,
                    "logger": self._quiet,
                    "transactional.id": f"kit-{id(self)}",
                }
            )
            self._transactional.init_transactions(30)
        p = self._transactional
        p.begin_transaction()
        self._send(p, topic, ((partition, d) for d in docs))  # stored: an abort has to undo it
        if commit:
            p.commit_transaction(30)
        else:
            p.abort_transaction(30)

    def _send(self, producer: ck.Producer, topic: str, docs: Iterable[tuple[int, Any]]) -> None:
        for partition, doc in docs:
            value = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
            while True:
                try:
                    producer.produce(topic, value=value, partition=partition)
                    break
                except BufferError:
                    producer.poll(0.05)
            self.produced += 1
        left = producer.flush(30)
        if left:
            raise RuntimeError(f"{left} messages were not delivered")

    def close(self) -> None:
        for p in (self.producer, self._bulk, self._transactional):
            if p is not None:
                p.flush(5)


@contextmanager
def mock_kafka() -> Iterator[MockKafka]:
    cluster = MockKafka()
    try:
        yield cluster
    finally:
        cluster.close()
